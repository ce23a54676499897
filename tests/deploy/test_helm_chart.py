"""The Helm chart, without a cluster: ``helm lint`` and ``helm template`` (the helm that
``make cluster-build`` builds from Go modules) for the default values and a production-like
file (deploy/helm/taugrid/ci/production-values.yaml), the rendered output pinned by golden
files, static policy checks on every object, values the schema refuses with a message, the
ClusterRole and namespace guard the same as deploy/rbac's, and the settings the chart gives
the portal accepted by ``manage.py check --deploy``.

``UPDATE_GOLDEN=1 pytest tests/deploy/test_helm_chart.py`` rewrites tests/deploy/golden/
after a deliberate change to the chart (never in CI); review the diff like code.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from executors.kubernetes.rbac import HELM_RULES_HEADER, render_rules
from tau.evidence.keys import keyring_document, public_key_bytes
from tests.deploy.helm import (
    CHART,
    GOLDEN,
    PRODUCTION_VALUES,
    REPO,
    Body,
    Helm,
    by_kind_and_name,
    documents,
    helm_binary,
    pod_specs,
)
from tests.portal.test_settings import PRODUCTION_SECRETS, deploy_check

VALUES = {"default": (), "production": (PRODUCTION_VALUES,)}
WORKLOADS = {"web", "worker", "notifier", "beat", "watcher"}


@pytest.fixture(scope="module")
def helm() -> Helm:
    return Helm(helm_binary())


@pytest.fixture(scope="module")
def templates(helm: Helm) -> dict[str, str]:
    """What ``helm template`` writes for each set of values, rendered once for the module."""
    return {name: helm.template(*files).stdout for name, files in VALUES.items()}


@pytest.fixture(scope="module")
def rendered(templates: dict[str, str]) -> dict[str, list[Body]]:
    return {name: documents(text) for name, text in templates.items()}


def test_helm_is_the_pinned_version(helm: Helm) -> None:
    versions = (REPO / "deploy" / "cluster" / "versions.env").read_text()
    pinned = re.search(r"^HELM_VERSION=(\S+)$", versions, re.MULTILINE)
    assert pinned is not None
    assert f'Version:"{pinned.group(1)}"' in helm.run("version").stdout


@pytest.mark.parametrize("values", VALUES)
def test_the_chart_lints_clean(helm: Helm, values: str) -> None:
    args = ["lint", str(CHART), "--strict"]
    for path in VALUES[values]:
        args += ["--values", str(path)]
    done = helm.run(*args)
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout
    assert "[WARNING]" not in done.stdout, done.stdout
    assert "[ERROR]" not in done.stdout, done.stdout


@pytest.mark.parametrize("values", VALUES)
def test_the_rendered_chart_is_pinned_by_a_golden_file(
    templates: dict[str, str], values: str
) -> None:
    text = templates[values]
    path = GOLDEN / f"{values}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        if os.environ.get("CI"):
            pytest.fail("UPDATE_GOLDEN is set in CI: golden files are only rewritten by hand")
        path.write_text(text)
    assert path.exists(), f"{path} is missing: run with UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), (
        f"the chart renders differently from {path.relative_to(REPO)}: if the change is "
        "meant, rerun with UPDATE_GOLDEN=1 and review the diff"
    )


def test_every_part_of_the_portal_is_there(rendered: dict[str, list[Body]]) -> None:
    objects = by_kind_and_name(rendered["default"])
    assert {name for kind, name in objects if kind == "Deployment"} == {
        f"taugrid-{part}" for part in WORKLOADS
    }
    assert objects[("Deployment", "taugrid-web")]["spec"]["replicas"] >= 2
    assert objects[("Deployment", "taugrid-beat")]["spec"]["replicas"] == 1
    assert objects[("Deployment", "taugrid-beat")]["spec"]["strategy"] == {"type": "Recreate"}
    assert objects[("PodDisruptionBudget", "taugrid-web")]["spec"]["minAvailable"] == 1
    migrate = objects[("Job", "taugrid-migrate")]
    assert migrate["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    container = migrate["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "manage.py", "migrate", "--noinput"]
    for kind in ("Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
        assert any(k == kind for k, _ in objects), kind
    assert ("PersistentVolumeClaim", "taugrid-data") in objects
    assert objects[("PersistentVolumeClaim", "taugrid-data")]["spec"]["accessModes"] == [
        "ReadWriteMany"
    ]
    assert {name for kind, name in objects if kind == "NetworkPolicy"} == {
        "taugrid-web",
        "taugrid-no-ingress",
        "taugrid-egress",
    }
    # Optional parts appear when asked for.
    production = by_kind_and_name(rendered["production"])
    assert ("Ingress", "taugrid") in production
    assert production[("Ingress", "taugrid")]["spec"]["tls"] == [
        {"secretName": "taugrid-tls", "hosts": ["taugrid.example.org"]}
    ]
    hpa = production[("HorizontalPodAutoscaler", "taugrid-web")]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 10)
    assert "replicas" not in production[("Deployment", "taugrid-web")]["spec"]  # the HPA's


def test_probes_ask_the_portal_as_its_service_host(rendered: dict[str, list[Body]]) -> None:
    """Django answers only the allowed hosts: the probes send the Service's name, which the
    chart always allows, as their Host header."""
    web = by_kind_and_name(rendered["default"])[("Deployment", "taugrid-web")]
    (container,) = web["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    host = "taugrid.taugrid.svc.cluster.local"
    assert host in env["TAU_ALLOWED_HOSTS"].split(",")
    assert env["TAU_API_URL"] == f"http://{host}:8000"
    for probe, path in (
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ):
        get = container[probe]["httpGet"]
        assert (get["path"], get["port"], get["httpHeaders"]) == (
            path,
            "http",
            [{"name": "Host", "value": host}],
        )


# -- static policy ---------------------------------------------------------------------------


@pytest.mark.parametrize("values", VALUES)
def test_no_container_runs_as_root_or_escalates_or_goes_unbounded(
    rendered: dict[str, list[Body]], values: str
) -> None:
    specs = dict(pod_specs(rendered[values]))
    assert len(specs) == 6  # five Deployments and the migrations Job
    for where, spec in specs.items():
        pod = spec.get("securityContext") or {}
        assert pod.get("runAsNonRoot") is True, where
        assert pod.get("runAsUser", 0) != 0, where
        assert pod.get("seccompProfile") == {"type": "RuntimeDefault"}, where
        for flag in ("hostNetwork", "hostPID", "hostIPC"):
            assert not spec.get(flag), (where, flag)
        for volume in spec.get("volumes") or []:
            assert "hostPath" not in volume, (where, volume["name"])
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            what = f"{where} container {container['name']}"
            context = container.get("securityContext") or {}
            assert context.get("runAsNonRoot") is True, what
            assert context.get("runAsUser", 1) != 0, what
            assert context.get("allowPrivilegeEscalation") is False, what
            assert context.get("privileged") is not True, what
            assert context.get("readOnlyRootFilesystem") is True, what
            assert context.get("capabilities") == {"drop": ["ALL"]}, what
            limits = (container.get("resources") or {}).get("limits") or {}
            assert {"cpu", "memory"} <= set(limits), what
            image = container["image"]
            name = image.split("@")[0].rsplit("/", 1)[-1]
            assert ":" in name, f"{what}: image {image} has no tag"
            assert not name.endswith(":latest"), f"{what}: image {image} is latest"
            # Secrets only by reference: no value of a secret-looking variable in the spec.
            for item in container.get("env") or []:
                secretish = re.search(
                    r"SECRET|PEPPER|PASSWORD|TOKEN|DATABASE_URL|BROKER_URL", item["name"]
                )
                if secretish:
                    assert item["name"].endswith("_FILE"), f"{what}: {item['name']} has a value"
            # Writable paths only where mounted: /tmp and the shared volume.
            writable = {
                m["mountPath"] for m in container.get("volumeMounts") or [] if not m.get("readOnly")
            }
            assert writable <= {"/tmp", "/var/lib/taugrid"}, (what, writable)


@pytest.mark.parametrize("values", VALUES)
def test_the_chart_holds_no_secret_and_mounts_the_named_ones(
    rendered: dict[str, list[Body]], values: str
) -> None:
    assert not [obj for obj in rendered[values] if obj["kind"] in {"Secret", "ConfigMap"}]
    for where, spec in pod_specs(rendered[values]):
        (volume,) = [v for v in spec["volumes"] if v["name"] == "secrets"]
        sources = {
            (s["secret"]["name"], s["secret"]["items"][0]["key"]): s["secret"]["items"][0]["path"]
            for s in volume["projected"]["sources"]
        }
        env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
        for (secret, key), path in sources.items():
            assert env[f"{path}_FILE"] == f"/run/secrets/taugrid/{path}", (where, secret, key)
        if values == "default":
            assert set(sources) == {
                ("taugrid", "secret-key"),
                ("taugrid", "database-url"),
                ("taugrid", "broker-url"),
                ("taugrid", "token-peppers"),
                ("taugrid", "evidence-signing-key"),
            }
        else:
            assert ("taugrid-oidc", "client-secret") in sources
            assert env["TAU_OIDC_ISSUER"] == "https://login.example.org/realms/research"


def test_only_the_pods_that_talk_to_kubernetes_get_a_token(rendered: dict[str, list[Body]]) -> None:
    objects = by_kind_and_name(rendered["default"])
    assert objects[("ServiceAccount", "taugrid")]["automountServiceAccountToken"] is False
    mounts = {
        where: spec["automountServiceAccountToken"]
        for where, spec in pod_specs(rendered["default"])
    }
    assert mounts == {
        "Deployment/taugrid-web": True,
        "Deployment/taugrid-worker": True,
        "Deployment/taugrid-notifier": False,
        "Deployment/taugrid-watcher": True,
        "Deployment/taugrid-beat": False,
        "Job/taugrid-migrate": False,
    }


def test_network_policies_admit_the_ingress_and_run_pods_and_limit_egress(
    rendered: dict[str, list[Body]],
) -> None:
    objects = by_kind_and_name(rendered["production"])
    web = objects[("NetworkPolicy", "taugrid-web")]["spec"]
    (rule,) = web["ingress"]
    sources = rule["from"]
    assert {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}
    } in sources
    assert {
        "namespaceSelector": {
            "matchExpressions": [{"key": "taugrid.io/workspace", "operator": "Exists"}]
        }
    } in sources
    assert {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    } in sources
    closed = objects[("NetworkPolicy", "taugrid-no-ingress")]["spec"]
    assert closed["policyTypes"] == ["Ingress"]
    assert "ingress" not in closed
    egress = objects[("NetworkPolicy", "taugrid-egress")]["spec"]["egress"]
    ports = [sorted(p["port"] for p in rule["ports"]) for rule in egress]
    assert ports[:6] == [[53, 53], [5432], [6379], [443], [587], [443, 6443]]
    assert egress[1]["to"] == [{"ipBlock": {"cidr": "10.10.4.0/24"}}]
    assert egress[2]["to"] == [{"ipBlock": {"cidr": "10.10.5.0/24"}}]


# -- the ClusterRole and the namespace guard are deploy/rbac's ----------------------------------


def test_the_charts_cluster_role_is_the_one_cluster_check_verifies(
    rendered: dict[str, list[Body]],
) -> None:
    chart_rules = (CHART / "files" / "clusterrole-rules.yaml").read_text()
    assert chart_rules == HELM_RULES_HEADER + render_rules(), (
        "deploy/helm/taugrid/files/clusterrole-rules.yaml is stale: "
        ".venv/bin/python -m executors.kubernetes.rbac --helm-rules "
        "> deploy/helm/taugrid/files/clusterrole-rules.yaml"
    )
    shipped = yaml.safe_load((REPO / "deploy" / "rbac" / "clusterrole.yaml").read_text())
    objects = by_kind_and_name(rendered["default"])
    role = objects[("ClusterRole", "taugrid-portal")]
    assert role["rules"] == shipped["rules"]
    for rule in role["rules"]:
        for key in ("apiGroups", "resources", "verbs", "resourceNames"):
            assert "*" not in rule.get(key, []), rule
    binding = objects[("ClusterRoleBinding", "taugrid-portal")]
    assert binding["roleRef"]["name"] == "taugrid-portal"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "taugrid", "namespace": "taugrid"}
    ]


def test_the_charts_namespace_guard_is_deploy_rbacs_for_its_service_account(helm: Helm) -> None:
    objects = by_kind_and_name(helm.objects(release="tg", namespace="research-platform"))
    policy = objects[("ValidatingAdmissionPolicy", "tg-taugrid-namespaces")]
    shipped, _ = yaml.safe_load_all((REPO / "deploy" / "rbac" / "namespace-guard.yaml").read_text())
    expected = json.loads(
        json.dumps(shipped["spec"]).replace(
            "system:serviceaccount:taugrid:taugrid",
            "system:serviceaccount:research-platform:tg-taugrid",
        )
    )
    assert policy["spec"] == expected
    binding = objects[("ValidatingAdmissionPolicyBinding", "tg-taugrid-namespaces")]
    assert binding["spec"] == {"policyName": "tg-taugrid-namespaces", "validationActions": ["Deny"]}


# -- values the schema refuses ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ("image.tag=latest", "at '/image/tag'"),
        ("web.replicass=3", "additional properties 'replicass' not allowed"),
        ("web.replicas=zero", "at '/web/replicas'"),
        ("portal.behindTlsProxy=true", "at '/portal/trustedProxies': minItems"),
        ("portal.extraEnv.TAU_SECRET_KEY=hunter2", "TAU_SECRET_KEY"),
        ("secrets.secretKey.name=", "at '/secrets/secretKey/name'"),
        ("ingress.enabled=true", "at '/ingress/hosts': minItems"),
        ("storage.accessModes[0]=ReadWriteSometimes", "at '/storage/accessModes/0'"),
        ("portal.dataPrefixes.dir=/var/lib/taugrid/prefixes", "at '/portal/dataPrefixes/dir'"),
        ("portal.dataPrefixes.dir=prefixes", "at '/portal/dataPrefixes/dir'"),
        (
            "portal.dataPrefixes.claims[0].workspace=Vision,portal.dataPrefixes.claims[0].claim=x",
            "at '/portal/dataPrefixes/claims/0/workspace'",
        ),
        (
            "portal.dataPrefixes.claims[0].workspace=vision",
            "at '/portal/dataPrefixes/claims/0': missing property 'claim'",
        ),
    ],
)
def test_a_wrong_value_fails_at_install_with_a_message(helm: Helm, setting: str, said: str) -> None:
    done = helm.template(set_values=[setting], check=False)
    assert done.returncode != 0, f"--set {setting} was accepted"
    assert "values don't meet the specifications of the schema" in done.stderr
    assert said in done.stderr, done.stderr


# -- workspaces' data read in place ----------------------------------------------------------

#: The processes that read a workspace's folder of TAU_DATA_PREFIX_DIR: the web (a prefix
#: checked when it is registered, catalog.prefixes.folder_of, and its files verified and
#: served, since they stay there, catalog.in_place; a cluster run's outputs checked at submission,
#: executors.kubernetes.backend.outputs_problems), the workers (a prefix's files hashed,
#: catalog.tasks.ingest_prefix) and the watcher (a cluster run's outputs when an attempt
#: succeeds, catalog.runs.cluster_outputs).
READERS_OF_PREFIXES = {
    "Deployment/taugrid-web",
    "Deployment/taugrid-worker",
    "Deployment/taugrid-watcher",
}


def prefix_mounts(spec: Body) -> dict[str, tuple[str, bool]]:
    """The pod's claims of portal.dataPrefixes: mount path → (claim, read-only). Each such
    volume is mounted, read-only in the volume and the mount alike."""
    volumes = {
        volume["name"]: volume["persistentVolumeClaim"]
        for volume in spec.get("volumes") or []
        if volume["name"].startswith("prefix-")
    }
    (container,) = spec["containers"]
    mounts = [m for m in container.get("volumeMounts") or [] if m["name"] in volumes]
    assert sorted(m["name"] for m in mounts) == sorted(volumes)
    found = {}
    for mount in mounts:
        claim = volumes[mount["name"]]
        assert claim["readOnly"] is mount["readOnly"], mount
        assert mount["name"] == "prefix-" + mount["mountPath"].rsplit("/", 1)[1], mount
        found[mount["mountPath"]] = (claim["claimName"], mount["readOnly"])
    return found


def test_workspaces_claims_are_mounted_where_the_portal_reads_them(
    rendered: dict[str, list[Body]],
) -> None:
    """portal.dataPrefixes (the production values name two workspaces): each claim at
    <dir>/<workspace>, read-only, in the web, worker and watcher pods and no other, and
    TAU_DATA_PREFIX_DIR naming dir for every process (one environment for all). The folder the
    code reads for a workspace is the mounted claim. The default values mount none and leave
    the setting to its default."""
    from django.test import override_settings

    from catalog.prefixes import workspace_folder
    from workspaces.models import Workspace

    expected = {
        "/mnt/taugrid/prefixes/vision": ("vision-data", True),
        "/mnt/taugrid/prefixes/nlp": ("nlp-data", True),
    }
    for where, spec in pod_specs(rendered["production"]):
        env = {item["name"]: item["value"] for item in spec["containers"][0]["env"]}
        assert env["TAU_DATA_PREFIX_DIR"] == "/mnt/taugrid/prefixes", where
        assert prefix_mounts(spec) == (expected if where in READERS_OF_PREFIXES else {}), where
    with override_settings(TAU_DATA_PREFIX_DIR="/mnt/taugrid/prefixes"):
        for slug in ("vision", "nlp"):
            assert str(workspace_folder(Workspace(slug=slug))) in expected
    for where, spec in pod_specs(rendered["default"]):
        names = {item["name"] for item in spec["containers"][0]["env"]}
        assert "TAU_DATA_PREFIX_DIR" not in names, where
        assert prefix_mounts(spec) == {}, where


def test_a_workspaces_claim_can_be_mounted_writable_and_at_another_folder(helm: Helm) -> None:
    """readOnly: false and another dir, for a platform team that asks for them."""
    claims = "portal.dataPrefixes.claims[0]"
    objects = helm.objects(
        set_values=[
            "portal.dataPrefixes.dir=/data/workspaces",
            f"{claims}.workspace=vision-team",
            f"{claims}.claim=vision-team-data",
            f"{claims}.readOnly=false",
        ]
    )
    for where, spec in pod_specs(objects):
        expected = {"/data/workspaces/vision-team": ("vision-team-data", False)}
        assert prefix_mounts(spec) == (expected if where in READERS_OF_PREFIXES else {}), where


@pytest.mark.parametrize(
    ("settings_given", "said"),
    [
        (
            [
                "portal.dataPrefixes.claims[0].workspace=vision",
                "portal.dataPrefixes.claims[0].claim=one",
                "portal.dataPrefixes.claims[1].workspace=vision",
                "portal.dataPrefixes.claims[1].claim=two",
            ],
            "portal.dataPrefixes.claims: the workspace vision is named twice",
        ),
        (
            [
                "portal.dataPrefixes.claims[0].workspace=vision",
                "portal.dataPrefixes.claims[0].claim=one",
                "portal.extraEnv.TAU_DATA_PREFIX_DIR=/elsewhere",
            ],
            "portal.extraEnv.TAU_DATA_PREFIX_DIR: set by portal.dataPrefixes.dir",
        ),
    ],
)
def test_claims_that_cannot_be_mounted_as_asked_fail_the_install(
    helm: Helm, settings_given: list[str], said: str
) -> None:
    done = helm.template(set_values=settings_given, check=False)
    assert done.returncode != 0, f"{settings_given} were accepted"
    assert said in done.stderr, done.stderr


# -- what the chart gives the portal is a valid production configuration ------------------------


@pytest.mark.slow  # runs manage.py check --deploy and a Django process (3-6 s)
def test_the_charts_settings_pass_the_deploy_check(
    rendered: dict[str, list[Body]], tmp_path: Path
) -> None:
    """The workloads' environment as the chart renders it (production values), with the
    Secrets it names written as the files it mounts: settings load and ``manage.py check
    --deploy`` finds nothing."""
    secrets = {
        **PRODUCTION_SECRETS,
        "TAU_OIDC_CLIENT_SECRET": "client-secret-for-the-check",
        "TAU_METRICS_TOKEN": "metrics-token-for-the-check-0123456789",
        "TAU_EMAIL_PASSWORD": "smtp-password-for-the-check",
        "TAU_STORAGE_ACCESS_KEY_ID": "access-key-id-for-the-check",
        "TAU_STORAGE_SECRET_ACCESS_KEY": "secret-access-key-for-the-check",
    }
    for name, value in secrets.items():
        (tmp_path / name).write_text(value)
    earlier = public_key_bytes(Ed25519PrivateKey.generate())
    (tmp_path / "evidence-keyring.json").write_text(
        json.dumps(keyring_document([(earlier, False)]))
    )
    # Every process of the portal gets the same settings: one check covers them all.
    environments = {
        where: [(item["name"], item["value"]) for item in spec["containers"][0]["env"]]
        for where, spec in pod_specs(rendered["production"])
    }
    assert len(environments) == 6
    first, *others = environments.values()
    assert all(other == first for other in others), environments
    env = {
        name: value.replace("/run/secrets/taugrid", str(tmp_path)).replace(
            "/etc/taugrid", str(tmp_path)
        )
        for name, value in first
    }
    env["TAU_VAR_DIR"] = str(tmp_path / "var")
    env.update(PATH=os.environ["PATH"], DJANGO_SETTINGS_MODULE="portal.settings")
    done = deploy_check(env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout, done.stdout
    # And the keyring the chart mounts reads as one.
    read = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); "
            "from evidence.keys import previous_public_keys as p; print(len(p()))",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert read.stdout.strip() == "1", read.stderr


def test_the_workloads_commands_are_the_portals(rendered: dict[str, list[Body]]) -> None:
    """gunicorn reads the web command as meant (no forwarded headers believed, the port the
    Service targets); Celery's and Django's commands exist."""
    from gunicorn.config import Config  # type: ignore[import-untyped]

    objects = by_kind_and_name(rendered["default"])
    command = objects[("Deployment", "taugrid-web")]["spec"]["template"]["spec"]["containers"][0][
        "command"
    ]
    assert command[:2] == ["gunicorn", "portal.wsgi:application"]
    config = Config()
    parsed = config.parser().parse_args(command[2:])
    for name, value in vars(parsed).items():
        if value is not None and name in config.settings:
            config.set(name, value)
    assert config.forwarded_allow_ips == []
    assert config.bind == ["0.0.0.0:8000"]
    assert config.worker_tmp_dir == "/tmp"
    commands = {
        name: obj["spec"]["template"]["spec"]["containers"][0]["command"]
        for (kind, name), obj in objects.items()
        if kind == "Deployment" and name != "taugrid-web"
    }
    assert commands["taugrid-watcher"] == ["python", "manage.py", "run_kube_watcher"]
    assert commands["taugrid-worker"][:3] == ["celery", "--app=portal", "worker"]
    assert commands["taugrid-notifier"][:3] == ["celery", "--app=portal", "worker"]
    assert commands["taugrid-beat"][:3] == ["celery", "--app=portal", "beat"]
    helps: dict[tuple[str, ...], str] = {}  # the worker's and the notifier's are one command
    for argv in (
        commands["taugrid-worker"],
        commands["taugrid-notifier"],
        commands["taugrid-beat"],
    ):
        asked = tuple(argv[1:3])
        if asked not in helps:
            done = subprocess.run(
                [str(Path(sys.executable).parent / "celery"), *asked, "--help"],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
            helps[asked] = done.stdout
        for option in argv[3:]:
            assert option.split("=")[0] in helps[asked], option


@pytest.mark.parametrize("values", VALUES)
def test_notifications_have_workers_of_their_own(
    rendered: dict[str, list[Body]], values: str
) -> None:
    """Issue 30: a slow webhook held the worker that hands runs over. The workers consume the
    default queue only, the notifier only the queue notifications are routed to, with more
    slots than one workspace may use at once."""
    from django.conf import settings

    def option(argv: list[str], name: str) -> str:
        (value,) = [arg.split("=", 1)[1] for arg in argv if arg.startswith(f"{name}=")]
        return value

    objects = by_kind_and_name(rendered[values])
    worker, notifier = (
        objects[("Deployment", name)]["spec"]["template"]["spec"]["containers"][0]["command"]
        for name in ("taugrid-worker", "taugrid-notifier")
    )
    routed = {route["queue"] for route in settings.CELERY_TASK_ROUTES.values()}
    assert routed == {"notifications"}
    assert option(worker, "--queues") == settings.CELERY_TASK_DEFAULT_QUEUE == "celery"
    assert option(notifier, "--queues") == "notifications"
    assert int(option(notifier, "--concurrency")) > settings.TAU_NOTIFY_WORKSPACE_CONCURRENCY


def test_documents_parse_the_way_the_api_server_will(templates: dict[str, str]) -> None:
    """No document that YAML reads one way and a person another: every rendered document
    is one object with apiVersion, kind and a name."""
    for doc in documents(templates["production"]):
        assert {"apiVersion", "kind", "metadata"} <= set(doc), doc
        assert doc["metadata"].get("name"), doc


def test_the_readme_leads_production_with_helm_install_the_secrets_and_the_guide(
    rendered: dict[str, list[Body]],
) -> None:
    """The production section (docs/install.md, once the README's): ``helm install`` first,
    then the Secrets to create (with the very keys the chart's defaults name), and the
    operations guide, which covers every workload the chart renders."""
    readme = (REPO / "docs" / "install.md").read_text()
    section = readme.split("# Production: install on Kubernetes with Helm\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    blocks = re.findall(r"```(?:sh|yaml)\n(.*?)```", section, re.DOTALL)
    assert blocks[0].startswith("helm install taugrid deploy/helm/taugrid --namespace taugrid")
    assert "kubectl --namespace taugrid create secret generic taugrid" in blocks[1]
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["secrets"]
    for ref in defaults.values():
        if ref["name"] == "taugrid":
            assert f"--from-literal={ref['key']}=" in blocks[1] or (
                f"--from-file={ref['key']}=" in blocks[1]
            ), ref
    assert "](operations.md)" in section  # a link to the guide
    guide = (REPO / "docs" / "operations.md").read_text()
    for obj in rendered["default"]:
        if obj["kind"] in {"Deployment", "Job"}:
            assert f"`{obj['metadata']['name']}`" in guide, obj["metadata"]["name"]
    for heading in (
        "## Install",
        "## Upgrade",
        "## Backup and restore",
        "## Rotating secrets",
        "## Scaling",
        "## What to watch",
    ):
        assert heading in guide, heading


BUFFERING = {
    "nginx.ingress.kubernetes.io/proxy-request-buffering": "on",
    "nginx.ingress.kubernetes.io/proxy-buffering": "on",
}


def test_the_ingress_asks_for_a_buffering_proxy_by_default(
    helm: Helm, rendered: dict[str, list[Body]]
) -> None:
    """gunicorn's sync workers are held by slow clients (issue 30): the chart relies on the
    ingress controller to read requests whole and take responses at once, and its default
    annotations ask ingress-nginx for that, with a body limit a submission fits in. A values
    file that adds its own annotations keeps them (the production file raises the body size)."""
    from django.conf import settings

    from runs.submission import MAX_SUBMISSION_BYTES

    enabled = by_kind_and_name(
        helm.objects(set_values=["ingress.enabled=true", "ingress.hosts={portal.example.org}"])
    )
    annotations = enabled[("Ingress", "taugrid")]["metadata"]["annotations"]
    assert BUFFERING.items() <= annotations.items()
    size = annotations["nginx.ingress.kubernetes.io/proxy-body-size"]
    assert size.endswith("m")
    assert int(size[:-1]) * 2**20 >= MAX_SUBMISSION_BYTES
    # An upload's streamed declaration of as many files as a version may hold, with paths
    # of usual lengths (issue 33: about 120-200 bytes a file).
    assert int(size[:-1]) * 2**20 >= settings.TAU_DATA_MAX_FILES * 200
    production = by_kind_and_name(rendered["production"])[("Ingress", "taugrid")]
    assert BUFFERING.items() <= production["metadata"]["annotations"].items()
    assert production["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-body-size"] == (
        "600m"
    )


# -- endpoints reached from outside the cluster ------------------------------------------------

ROUTE_VARIABLES = {
    "TAU_ENDPOINT_ROUTE",
    "TAU_ENDPOINT_HOST",
    "TAU_ENDPOINT_INGRESS_CLASS",
    "TAU_ENDPOINT_TLS_SECRET",
    "TAU_ENDPOINT_INGRESS_ANNOTATIONS",
    "TAU_ENDPOINT_GATEWAY",
}


def route_env(objects: list[Body]) -> dict[str, str]:
    """The TAU_ENDPOINT_* route settings of the portal's processes: the same in every pod."""
    found = []
    for _, spec in pod_specs(objects):
        env = {item["name"]: item.get("value") for item in spec["containers"][0].get("env") or []}
        found.append({name: value for name, value in env.items() if name in ROUTE_VARIABLES})
    assert found
    assert all(each == found[0] for each in found)
    return found[0]


def test_endpoints_route_values_reach_the_portal_s_settings(
    helm: Helm, rendered: dict[str, list[Body]], tmp_path: Path
) -> None:
    """endpoints.route becomes TAU_ENDPOINT_* in every process (the settings check them again
    at start-up, and test_the_charts_settings_pass_the_deploy_check loads the production
    ones): nothing by default; an Ingress with cert-manager in the production values; a
    Gateway, and an Ingress with the platform's wildcard certificate, from values files."""
    from portal.endpoint_routes import endpoint_route

    assert route_env(rendered["default"]) == {}
    production = route_env(rendered["production"])
    assert production == {
        "TAU_ENDPOINT_ROUTE": "ingress",
        "TAU_ENDPOINT_HOST": "{endpoint}-{workspace}.serve.example.org",
        "TAU_ENDPOINT_INGRESS_CLASS": "nginx",
        "TAU_ENDPOINT_INGRESS_ANNOTATIONS": '{"cert-manager.io/cluster-issuer":"letsencrypt"}',
    }
    given = {
        "gateway": {
            "kind": "gateway",
            "host": "{endpoint}.{workspace}.apps.example.org",
            "gateway": {"namespace": "gateway-system", "name": "public"},
        },
        "wildcard": {
            "kind": "ingress",
            "host": "{endpoint}-{workspace}.serve.example.org",
            "tls": {"secretName": "serve-wildcard-tls"},
        },
    }
    expected = {
        "gateway": {
            "TAU_ENDPOINT_ROUTE": "gateway",
            "TAU_ENDPOINT_HOST": "{endpoint}.{workspace}.apps.example.org",
            "TAU_ENDPOINT_GATEWAY": "gateway-system/public",
        },
        "wildcard": {
            "TAU_ENDPOINT_ROUTE": "ingress",
            "TAU_ENDPOINT_HOST": "{endpoint}-{workspace}.serve.example.org",
            "TAU_ENDPOINT_TLS_SECRET": "serve-wildcard-tls",
        },
    }
    for name, route in given.items():
        values = tmp_path / f"{name}.yaml"
        values.write_text(yaml.safe_dump({"endpoints": {"route": route}}))
        env = route_env(helm.objects(values))
        assert env == expected[name], name
    # What the chart gives is what the settings accept.
    for env in (production, *expected.values()):
        accepted = endpoint_route(
            kind=env["TAU_ENDPOINT_ROUTE"],
            host=env["TAU_ENDPOINT_HOST"],
            ingress_class=env.get("TAU_ENDPOINT_INGRESS_CLASS", ""),
            tls_secret=env.get("TAU_ENDPOINT_TLS_SECRET", ""),
            annotations=env.get("TAU_ENDPOINT_INGRESS_ANNOTATIONS", ""),
            gateway=env.get("TAU_ENDPOINT_GATEWAY", ""),
        )
        assert accepted is not None
        assert accepted.kind == env["TAU_ENDPOINT_ROUTE"]


@pytest.mark.parametrize(
    ("route", "said"),
    [
        ({"kind": "loadbalancer"}, "at '/endpoints/route/kind'"),
        ({"kind": "ingress"}, "at '/endpoints/route/host'"),
        ({"kind": "ingress", "host": "serve.example.org"}, "at '/endpoints/route/host'"),
        (
            {"kind": "gateway", "host": "{endpoint}-{workspace}.example.org"},
            "at '/endpoints/route/gateway/name'",
        ),
        (
            {
                "kind": "gateway",
                "host": "{endpoint}-{workspace}.example.org",
                "gateway": {"namespace": "gw", "name": "public"},
                "tls": {"secretName": "wildcard"},
            },
            "endpoints.route.ingressClassName, tls and annotations: for kind ingress only",
        ),
        (
            {
                "kind": "ingress",
                "host": "{endpoint}-{workspace}.example.org",
                "gateway": {"namespace": "gw", "name": "public"},
            },
            "endpoints.route.gateway: for kind gateway only",
        ),
    ],
)
def test_an_endpoints_route_that_cannot_work_fails_the_install(
    helm: Helm, tmp_path: Path, route: dict[str, object], said: str
) -> None:
    values = tmp_path / "route.yaml"
    values.write_text(yaml.safe_dump({"endpoints": {"route": route}}))
    done = helm.template(values, check=False)
    assert done.returncode != 0, f"{route} was accepted"
    assert said in done.stderr, done.stderr


# -- endpoints' metrics: the PodMonitor of their Ray pods -------------------------------------

PODMONITOR_GOLDEN = GOLDEN / "endpoints-podmonitor.yaml"


def test_the_endpoints_podmonitor_selects_the_ray_pods_as_rendered(
    helm: Helm, rendered: dict[str, list[Body]]
) -> None:
    """Off by default (the Operator's CRDs may not be there); on, one PodMonitor, pinned by a
    golden file, that selects exactly what render_endpoint puts on every Ray pod template and
    makes the endpoint's id the target label Ray Serve's metrics are found by
    (telemetry/ray_serve.py), on Ray's metrics port."""
    from executors.kubernetes import labels
    from telemetry.ray_serve import ServeLabelNames

    for values in VALUES:
        assert not [obj for obj in rendered[values] if obj["kind"] == "PodMonitor"]
    text = helm.template(
        set_values=["endpoints.podMonitor.enabled=true", "endpoints.podMonitor.labels.release=prom"]
    ).stdout
    (monitor,) = [obj for obj in documents(text) if obj["kind"] == "PodMonitor"]
    pinned = yaml.safe_dump(monitor, sort_keys=False)
    if os.environ.get("UPDATE_GOLDEN"):
        if os.environ.get("CI"):
            pytest.fail("UPDATE_GOLDEN is set in CI: golden files are only rewritten by hand")
        PODMONITOR_GOLDEN.write_text(pinned)
    assert pinned == PODMONITOR_GOLDEN.read_text()
    assert monitor["metadata"]["labels"]["release"] == "prom"
    spec = monitor["spec"]
    assert spec["podMetricsEndpoints"][0]["port"] == "metrics"
    assert labels.ENDPOINT_ID in spec["podTargetLabels"]
    # The Operator's sanitising of the pod label is the default label name TauGrid asks for.
    assert re.sub(r"[^a-zA-Z0-9_]", "_", labels.ENDPOINT_ID) == ServeLabelNames().endpoint_id
    golden_endpoints = REPO / "tests" / "executors" / "kubernetes" / "golden" / "endpoints"
    services = [
        (path, doc)
        for path in sorted(golden_endpoints.glob("*.yaml"))
        for doc in documents(path.read_text())
        if doc["kind"] == "RayService"
    ]
    assert len(services) >= 5
    for path, service in services:
        cluster = service["spec"]["rayClusterConfig"]
        templates = [cluster["headGroupSpec"]["template"]] + [
            group["template"] for group in cluster.get("workerGroupSpecs") or []
        ]
        for template in templates:
            pod_labels = template["metadata"]["labels"]
            assert spec["selector"]["matchLabels"].items() <= pod_labels.items(), path.name
            for expression in spec["selector"]["matchExpressions"]:
                assert expression["operator"] == "Exists"
                assert expression["key"] in pod_labels, path.name
            assert set(spec["podTargetLabels"]) <= set(pod_labels), path.name


def test_a_podmonitor_interval_that_is_not_a_duration_is_refused(helm: Helm) -> None:
    done = helm.template(
        set_values=["endpoints.podMonitor.enabled=true", "endpoints.podMonitor.interval=often"],
        check=False,
    )
    assert done.returncode != 0
    assert "/endpoints/podMonitor/interval" in done.stderr
