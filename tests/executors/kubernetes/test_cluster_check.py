"""``manage.py cluster_check`` and the permission list it checks (executors/kubernetes/rbac.py).

Without a cluster (a fake adapter, and a real client pointed at a closed port): each failure is
reported with its fix — a CRD missing or not serving the version TauGrid speaks, the API server
unreachable (the adapter's error type, the rest skipped), no configuration, the visibility API
unregistered or down, a denied verb, a flavor whose labels match no node or whose nodes have no
GPUs or only taints it does not tolerate, no GPU nodes (a warning, or a failure once a flavor
names a GPU model); the command prints a table or JSON and exits 1 on a failure only.

On the test cluster (``cluster``; real kube-apiserver RBAC, Kueue, KubeRay, KWOK nodes):

* as the admin, every check passes, with a ResourceFlavor row on the fake gpu-h100 nodes;
* a flavor whose labels match no node fails with the fix;
* as a ServiceAccount bound only to a copy of the shipped ClusterRole (impersonated with
  ``--as``), every check passes; with one verb removed from that copy, the check fails naming
  that permission and ``kubectl apply -f deploy/rbac/``;
* as that ServiceAccount, every operation the list names is performed at least once — the
  namespace, Kueue objects, a suspended queue-labelled Job and a RayJob, Workloads, the
  visibility API, a Secret, an endpoint's RayService (owning its token Secret) and the Ray
  cluster KubeRay makes for it, an endpoint's Ingress (its HTTPRoute by an access review only: no
  Gateway API here), pods and their log, Events, a cordon on a fake node, the leader
  Lease, the CRDs, the two self reviews — and the test fails if the list names an operation
  it did not perform: the list is proven sufficient, not only self-consistent. What it must
  not do (list Secrets, touch another Lease; delete or mark as its own a namespace it did not
  create — refused by deploy/rbac/namespace-guard.yaml) is refused.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from io import StringIO
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar, cast

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError

import kube as adapter
from executors.kubernetes import cluster_check
from executors.kubernetes.cluster_check import RBAC_FIX, Check, Flavor, Report, Result, run_checks
from executors.kubernetes.rbac import LEADER_LEASE, REQUIRED, REQUIRED_CRDS, access_checks
from kube import KubeClient, new_api_client
from kube.errors import error_from_response
from tests.cluster.kueue_objects import (
    GPU_TOLERATION,
    H100_LABELS,
    KUEUE,
    QUEUE_LABEL,
    batch_job,
)
from tests.cluster.plugin import Kube, KubeCluster, wait_for_access, wait_until
from workspaces.models import ResourceFlavor

REPO = Path(__file__).resolve().parents[3]
SHIPPED_ROLE = REPO / "deploy" / "rbac" / "clusterrole.yaml"
NAMESPACE_GUARD = REPO / "deploy" / "rbac" / "namespace-guard.yaml"
# The workspace sync's mark on a namespace it created (executors/kubernetes/kueue.py).
CREATED_BY = {"taugrid.io/created-by": "taugrid"}
GPU = "nvidia.com/gpu"
T = TypeVar("T")
H100_MODEL = H100_LABELS["nvidia.com/gpu.product"]


# =============================================================================================
# Without a cluster: a fake adapter
# =============================================================================================


def node(
    name: str,
    labels: dict[str, str],
    *,
    gpus: int = 0,
    taints: list[dict[str, str]] | None = None,
    ready: bool = True,
    cordoned: bool = False,
) -> dict[str, Any]:
    allocatable = {"cpu": "32", "memory": "128Gi"}
    if gpus:
        allocatable[GPU] = str(gpus)
    spec: dict[str, Any] = {"taints": taints or []}
    if cordoned:
        spec["unschedulable"] = True
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
        "status": {
            "allocatable": allocatable,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


GPU_TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}
H100_NODES = [
    node(f"gpu-{i}", {**H100_LABELS, "pool": "h100"}, gpus=8, taints=[GPU_TAINT]) for i in (1, 2)
]
CPU_NODES = [node("cpu-1", {"pool": "cpu"})]
H100 = Flavor("h100", H100_LABELS, [GPU_TOLERATION], H100_MODEL)


@dataclass
class FakeKube:
    """The adapter's read side as cluster_check uses it, answering from plain data."""

    version: dict[str, Any] | adapter.KubeError = field(
        default_factory=lambda: {"gitVersion": "v1.35.4"}
    )
    served: dict[str, list[str] | adapter.KubeError] = field(
        default_factory=lambda: {
            crd: ["v1beta1", version] for crd, version in REQUIRED_CRDS.items()
        }
    )
    discovery: dict[str, Any] | adapter.KubeError = field(
        default_factory=lambda: {
            "resources": [
                {"name": "clusterqueues/pendingworkloads"},
                {"name": "localqueues/pendingworkloads"},
            ]
        }
    )
    probe: adapter.KubeError = field(
        default_factory=lambda: adapter.NotFound('clusterqueue "x" not found', status=404)
    )
    denied: set[tuple[str, str]] = field(default_factory=set)
    nodes: list[dict[str, Any]] | adapter.KubeError = field(
        default_factory=lambda: [*H100_NODES, *CPU_NODES]
    )
    api: Any = field(
        default_factory=lambda: SimpleNamespace(
            configuration=SimpleNamespace(host="https://fake.example:6443")
        )
    )

    def get_path(self, path: str, **_: Any) -> dict[str, Any]:
        if path == "/version":
            return answer(self.version)
        if path.endswith("/pendingworkloads"):
            raise self.probe
        return answer(self.discovery)

    def whoami(self) -> adapter.Identity:
        return adapter.Identity("system:serviceaccount:taugrid:taugrid", ())

    def served_versions(self, crd: str) -> list[str]:
        return answer(self.served[crd])

    def can_i(self, verb: str, resource: str, **where: Any) -> adapter.AccessReview:
        label = f"{resource}/{where['subresource']}" if where.get("subresource") else resource
        return adapter.AccessReview(allowed=(label, verb) not in self.denied, reason="")

    def list(self, api_version: str, kind: str, *_: Any, **__: Any) -> list[dict[str, Any]]:
        assert (api_version, kind) == ("v1", "Node")
        return answer(self.nodes)


def answer(value: T | adapter.KubeError) -> T:
    if isinstance(value, adapter.KubeError):
        raise value
    return value


def checks(fake: FakeKube, flavors: list[Flavor] | None = None) -> Report:
    return run_checks(cast(KubeClient, fake), [H100] if flavors is None else flavors)


def row(report: Report, name: str) -> Check:
    found = [check for check in report.checks if check.check == name]
    assert len(found) == 1, f"no single row {name!r} in {[c.check for c in report.checks]}"
    return found[0]


def test_a_healthy_cluster_passes_every_check() -> None:
    report = checks(FakeKube())
    assert [(c.check, c.result) for c in report.checks] == [
        ("API server", Result.OK),
        ("Kueue CRDs", Result.OK),
        ("KubeRay CRDs", Result.OK),
        ("Kueue visibility API", Result.OK),
        ("permissions", Result.OK),
        ("flavor h100", Result.OK),
        ("GPU nodes", Result.OK),
    ]
    assert report.ok
    assert report.identity == "system:serviceaccount:taugrid:taugrid"
    assert row(report, "flavor h100").detail == (
        "2 nodes match node labels nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3; "
        "16 nvidia.com/gpu allocatable"
    )
    questions = len(list(access_checks()))
    assert row(report, "permissions").detail == (
        f"all {questions} verbs of the {len(REQUIRED)} rules granted to "
        "system:serviceaccount:taugrid:taugrid"
    )
    table = report.table()
    assert table.splitlines()[0].split() == ["CHECK", "RESULT", "WHAT", "TO", "DO"]
    assert table.endswith("7 ok; ready for TauGrid")


def test_a_crd_missing_or_without_the_version_taugrid_speaks_is_reported() -> None:
    fake = FakeKube()
    fake.served["clusterqueues.kueue.x-k8s.io"] = ["v1beta1"]
    fake.served["rayjobs.ray.io"] = adapter.NotFound("not found", status=404)
    report = checks(fake)
    assert not report.ok
    queues = row(report, "Kueue CRD clusterqueues.kueue.x-k8s.io")
    assert queues.result is Result.FAILED
    assert queues.detail == "serves v1beta1, not v1beta2"
    assert "install Kueue v0.17.0 (v0.16 or newer serves v1beta2)" in queues.fix
    assert "kueue/releases/download/v0.17.0/manifests.yaml" in queues.fix
    ray = row(report, "KubeRay CRD rayjobs.ray.io")
    assert (ray.result, ray.detail) == (Result.FAILED, "not installed (KubeRay)")
    assert "kuberay-operator --version 1.6.0" in ray.fix
    # The CRDs that are fine still say so.
    assert row(report, "Kueue CRDs").detail.startswith("localqueues, workloads, cohorts")
    assert [c.check for c in report.failed] == [
        "Kueue CRD clusterqueues.kueue.x-k8s.io",
        "KubeRay CRD rayjobs.ray.io",
    ]


def test_a_crd_the_identity_may_not_read_points_at_the_rbac() -> None:
    fake = FakeKube()
    fake.served["workloads.kueue.x-k8s.io"] = adapter.Forbidden(
        'cannot get resource "customresourcedefinitions"', status=403
    )
    failed = row(checks(fake), "Kueue CRD workloads.kueue.x-k8s.io")
    assert failed.detail.startswith("Forbidden: cannot get")
    assert failed.fix.startswith(RBAC_FIX)
    assert "kubectl apply -f deploy/rbac/" in failed.fix


def test_the_visibility_api_unregistered_or_down_is_reported() -> None:
    fake = FakeKube(discovery=adapter.NotFound("the server could not find it", status=404))
    failed = row(checks(fake), "Kueue visibility API")
    assert failed.result is Result.FAILED
    assert failed.detail == "visibility.kueue.x-k8s.io/v1beta2 is not registered"
    assert "v1beta2.visibility.kueue.x-k8s.io" in failed.fix

    down = adapter.Unavailable("the server is currently unable to handle the request", status=503)
    failed = row(checks(FakeKube(probe=down)), "Kueue visibility API")
    assert failed.detail == "Unavailable: the server is currently unable to handle the request"
    assert failed.fix.startswith("kubectl get apiservice v1beta2.visibility.kueue.x-k8s.io")

    partial = FakeKube(discovery={"resources": [{"name": "clusterqueues/pendingworkloads"}]})
    failed = row(checks(partial), "Kueue visibility API")
    assert failed.detail.endswith("lacks localqueues/pendingworkloads")


def test_each_permission_missing_a_verb_is_a_row_with_the_fix() -> None:
    fake = FakeKube(denied={("clusterqueues", "patch"), ("pods/log", "get"), ("leases", "update")})
    report = checks(fake)
    assert [c.check for c in report.failed] == [
        "permission clusterqueues.kueue.x-k8s.io",
        "permission pods/log",
        "permission leases.coordination.k8s.io",
    ]
    queues = row(report, "permission clusterqueues.kueue.x-k8s.io")
    assert queues.detail.startswith(
        "system:serviceaccount:taugrid:taugrid may not patch clusterqueues.kueue.x-k8s.io "
        "(needed for each workspace's ClusterQueue"
    )
    assert queues.fix == (
        "helm upgrade TauGrid's release (its ClusterRole), or kubectl apply -f deploy/rbac/ "
        "(the ClusterRole taugrid-portal grants it; bind it to "
        "system:serviceaccount:taugrid:taugrid), or grant patch on "
        "clusterqueues.kueue.x-k8s.io to system:serviceaccount:taugrid:taugrid"
    )
    # A rule on a named object says which.
    lease = row(report, "permission leases.coordination.k8s.io")
    assert f"may not update {LEADER_LEASE} leases.coordination.k8s.io" in lease.detail


def test_an_api_server_that_does_not_answer_fails_first_and_skips_the_rest(
    tmp_path: Path,
) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "c",
                "cluster": {
                    "server": f"https://127.0.0.1:{port}",
                    "insecure-skip-tls-verify": True,
                },
            }
        ],
        "users": [{"name": "u", "user": {"token": "secret-token-never-shown"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    report = cluster_check.check_cluster([H100], kubeconfig=kubeconfig)
    assert [(c.check, c.result) for c in report.checks] == [
        ("API server", Result.FAILED),
        ("everything else", Result.SKIPPED),
    ]
    api = report.checks[0]
    assert api.detail.startswith(
        f"Unavailable: cannot reach the Kubernetes API at https://127.0.0.1:{port}"
    )
    assert api.fix.startswith(f"check that the API server at https://127.0.0.1:{port} is up")
    assert "secret-token-never-shown" not in report.to_json()

    missing = cluster_check.check_cluster([], kubeconfig=tmp_path / "nothing-here")
    assert missing.checks[0].detail.startswith("KubeConfigError: TAU_KUBECONFIG=")
    assert "is not a file" in missing.checks[0].detail
    assert missing.checks[0].fix.startswith("set TAU_KUBECONFIG (or --kubeconfig)")
    assert not missing.ok


def test_an_unauthorized_identity_is_told_to_renew_its_credentials() -> None:
    fake = FakeKube(version=adapter.Unauthorized("Unauthorized", status=401))
    failed = row(checks(fake), "API server")
    assert failed.detail == "Unauthorized: Unauthorized"
    assert failed.fix.startswith("the cluster refused the credentials")


def test_a_flavor_whose_labels_match_no_node_fails_with_the_labels_to_set() -> None:
    a100 = Flavor("a100", {"nvidia.com/gpu.product": "NVIDIA-A100", "pool": "a100"})
    failed = row(checks(FakeKube(), [H100, a100]), "flavor a100")
    assert failed.result is Result.FAILED
    assert (
        failed.detail == "no node matches node labels nvidia.com/gpu.product=NVIDIA-A100,pool=a100"
    )
    assert failed.fix == (
        "correct the node labels of flavor a100 in the admin, or label the pool's nodes: "
        "kubectl label node <node> nvidia.com/gpu.product=NVIDIA-A100 pool=a100"
    )


def test_a_gpu_flavor_on_nodes_without_gpus_fails_and_untolerated_taints_warn() -> None:
    on_cpu = Flavor("wrong", {"pool": "cpu"}, [], gpu_model=H100_MODEL)
    failed = row(checks(FakeKube(), [on_cpu]), "flavor wrong")
    assert failed.result is Result.FAILED
    assert "none has allocatable nvidia.com/gpu" in failed.detail
    assert failed.fix.startswith("run the NVIDIA device plugin")

    intolerant = Flavor("h100", H100_LABELS, [], H100_MODEL)
    warned = row(checks(FakeKube(), [intolerant]), "flavor h100")
    assert warned.result is Result.WARNING
    assert warned.detail.endswith("does not tolerate: nvidia.com/gpu=present:NoSchedule")
    assert '{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}' in warned.fix
    # Kubernetes' own node.kubernetes.io taints (cordon, not-ready) are not the flavor's.
    cordoned = node(
        "c",
        {"pool": "cpu"},
        taints=[{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}],
    )
    assert (
        row(
            checks(FakeKube(nodes=[cordoned]), [Flavor("cpu", {"pool": "cpu"})]), "flavor cpu"
        ).result
        is Result.OK
    )


def test_no_gpu_nodes_warns_until_a_flavor_names_a_gpu_model() -> None:
    cpu = Flavor("cpu", {"pool": "cpu"})
    report = checks(FakeKube(nodes=list(CPU_NODES)), [cpu])
    gpus = row(report, "GPU nodes")
    assert (gpus.result, gpus.detail) == (
        Result.WARNING,
        "no node has allocatable nvidia.com/gpu (CPU-only runs still work)",
    )
    assert report.ok, "a warning is not a failure"

    promised = checks(FakeKube(nodes=list(CPU_NODES)), [cpu, H100])
    assert row(promised, "GPU nodes").result is Result.FAILED
    assert "flavor(s) h100 name a GPU model" in row(promised, "GPU nodes").detail

    down = [node("g", {}, gpus=8, ready=False), node("h", {}, gpus=8, cordoned=True)]
    assert row(checks(FakeKube(nodes=down), []), "GPU nodes").detail == (
        "2 nodes with 16 nvidia.com/gpu allocatable; 0 Ready and not cordoned"
    )


def test_no_flavor_yet_is_a_warning() -> None:
    report = checks(FakeKube(), [])
    assert row(report, "flavors").result is Result.WARNING
    assert report.ok


def test_nodes_the_identity_may_not_list_fail_both_node_checks() -> None:
    report = checks(FakeKube(nodes=adapter.Forbidden('cannot list resource "nodes"', status=403)))
    assert row(report, "flavors").result is Result.FAILED
    assert row(report, "GPU nodes").fix == RBAC_FIX


@pytest.mark.django_db
def test_the_command_prints_json_and_exits_1_only_on_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: dict[str, Any] = {}

    def fake_check(flavors: list[Flavor], **options: Any) -> Report:
        seen.update(options, flavors=flavors)
        return checks(FakeKube(nodes=list(CPU_NODES)), flavors)

    monkeypatch.setattr(
        "executors.kubernetes.management.commands.cluster_check.check_cluster", fake_check
    )
    ResourceFlavor.objects.create(name="cpu", node_labels={"pool": "cpu"})
    out = StringIO()
    call_command("cluster_check", "--json", "--as", "system:serviceaccount:a:b", stdout=out)
    report = json.loads(out.getvalue())
    assert report["ok"] is True
    assert report["counts"] == {"ok": 6, "warning": 1}
    assert report["checks"][-1] == {
        "check": "GPU nodes",
        "result": "warning",
        "detail": "no node has allocatable nvidia.com/gpu (CPU-only runs still work)",
        "fix": "add GPU nodes with the NVIDIA device plugin (GPU Operator), so that they "
        "report allocatable nvidia.com/gpu",
    }
    assert seen == {
        "kubeconfig": None,
        "impersonate_user": "system:serviceaccount:a:b",
        "flavors": [Flavor("cpu", {"pool": "cpu"}, [], "")],
    }

    ResourceFlavor.objects.create(name="h100", node_labels=H100_LABELS, gpu_model=H100_MODEL)
    out = StringIO()
    with pytest.raises(CommandError) as failed:
        call_command("cluster_check", stdout=out)
    assert failed.value.returncode == 1
    assert str(failed.value) == "2 check(s) failed: flavor h100, GPU nodes"
    assert "NOT ready for TauGrid" in out.getvalue()


# =============================================================================================
# On the test cluster
# =============================================================================================


def run_command(*args: str) -> tuple[int, str]:
    """``manage.py cluster_check`` as a platform engineer runs it: (exit code, output)."""
    out = StringIO()
    try:
        call_command("cluster_check", *args, stdout=out)
    except CommandError as error:
        return error.returncode, out.getvalue()
    return 0, out.getvalue()


@pytest.fixture
def cluster_env(kube_cluster: KubeCluster, monkeypatch: pytest.MonkeyPatch) -> KubeCluster:
    """TAU_KUBECONFIG set to the test cluster's admin kubeconfig, TAU_BACKEND left local:
    the check works whatever the backend is."""
    monkeypatch.setenv("TAU_KUBECONFIG", str(kube_cluster.kubeconfig))
    return kube_cluster


def h100_flavor_row() -> ResourceFlavor:
    """The flavor a platform team would define for the fake gpu-h100 pool
    (deploy/cluster/nodes/gpu-h100.yaml)."""
    return ResourceFlavor.objects.create(
        name="h100",
        gpu_model=H100_MODEL,
        node_labels=dict(H100_LABELS),
        tolerations=[dict(GPU_TOLERATION)],
    )


@pytest.mark.cluster
@pytest.mark.django_db
def test_cluster_check_passes_against_the_test_cluster_as_admin(cluster_env: KubeCluster) -> None:
    h100_flavor_row()
    ResourceFlavor.objects.create(name="cpu", node_labels={"taugrid.io/node-pool": "cpu"})
    code, table = run_command()
    assert code == 0, table
    lines = table.splitlines()
    assert lines[0].split() == ["CHECK", "RESULT", "WHAT", "TO", "DO"]
    assert lines[-1].endswith("as taugrid-admin: 8 ok; ready for TauGrid"), table
    width = lines[0].index("RESULT")  # the CHECK column; wrapped lines leave it blank
    rows = [(line[:width].strip(), line[width:]) for line in lines[1:-2] if line[:width].strip()]
    assert [name for name, _ in rows] == [
        "API server",
        "Kueue CRDs",
        "KubeRay CRDs",
        "Kueue visibility API",
        "permissions",
        "flavor cpu",
        "flavor h100",
        "GPU nodes",
    ], table
    assert all(result.startswith("ok: ") for _, result in rows), table
    assert "ok: 2 nodes match node labels taugrid.io/node-pool=cpu" in table

    code, output = run_command("--json")
    report = json.loads(output)
    assert (code, report["ok"], report["identity"]) == (0, True, "taugrid-admin")
    assert {check["result"] for check in report["checks"]} == {"ok"}
    gpus = next(check for check in report["checks"] if check["check"] == "GPU nodes")
    assert gpus["detail"].startswith("2 nodes with 16 nvidia.com/gpu allocatable")


@pytest.mark.cluster
@pytest.mark.django_db
def test_a_flavor_whose_labels_match_no_real_node_fails_with_the_fix(
    cluster_env: KubeCluster,
) -> None:
    h100_flavor_row()
    ResourceFlavor.objects.create(
        name="a100", gpu_model="NVIDIA-A100-SXM4-80GB", node_labels={"taugrid.io/node-pool": "a100"}
    )
    code, table = run_command()
    assert code == 1
    report = json.loads(run_command("--json")[1])
    failed = [check for check in report["checks"] if check["result"] != "ok"]
    assert failed == [
        {
            "check": "flavor a100",
            "result": "FAILED",
            "detail": "no node matches node labels taugrid.io/node-pool=a100",
            "fix": "correct the node labels of flavor a100 in the admin, or label the pool's "
            "nodes: kubectl label node <node> taugrid.io/node-pool=a100",
        }
    ]
    assert "NOT ready for TauGrid" in table


# -- as the portal's ServiceAccount, bound only to the shipped role ---------------------------


@dataclass
class PortalIdentity:
    namespace: str
    user: str
    role: dict[str, Any]
    client: KubeClient


@pytest.fixture
def portal_sa(kube: Kube, kube_cluster: KubeCluster) -> Iterator[PortalIdentity]:
    """A ServiceAccount in a fresh namespace, bound (directly, not through a group) to a
    uniquely named copy of deploy/rbac/clusterrole.yaml, and a client impersonating it."""
    namespace = kube.namespace("cc-portal")
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "taugrid", "namespace": namespace},
        }
    )
    role = yaml.safe_load(SHIPPED_ROLE.read_text())
    role["metadata"]["name"] = kube.unique("taugrid-portal-test")
    kube.create(role)
    kube.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role["metadata"]["name"]},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role["metadata"]["name"],
            },
            "subjects": [{"kind": "ServiceAccount", "name": "taugrid", "namespace": namespace}],
        }
    )
    user = f"system:serviceaccount:{namespace}:taugrid"
    # The namespace guard too, for this ServiceAccount (the shipped one names taugrid:taugrid).
    policy, policy_binding = yaml.safe_load_all(NAMESPACE_GUARD.read_text())
    condition = policy["spec"]["matchConditions"][0]
    condition["expression"] = condition["expression"].replace(
        "system:serviceaccount:taugrid:taugrid", user
    )
    policy["metadata"]["name"] = policy_binding["metadata"]["name"] = role["metadata"]["name"]
    policy_binding["spec"]["policyName"] = policy["metadata"]["name"]
    kube.create(policy)
    kube.create(policy_binding)
    client = KubeClient(new_api_client(kube_cluster.kubeconfig, impersonate_user=user))
    wait_for_access(client, "create", "clusterqueues", group="kueue.x-k8s.io")
    yield PortalIdentity(namespace, user, role, client)
    client.close()


@pytest.mark.cluster
@pytest.mark.django_db
def test_as_the_serviceaccount_bound_to_the_shipped_role_it_passes_and_a_removed_verb_is_named(
    cluster_env: KubeCluster, portal_sa: PortalIdentity
) -> None:
    h100_flavor_row()
    code, table = run_command("--as", portal_sa.user)
    assert code == 0, table
    assert f"as {portal_sa.user}: 7 ok; ready for TauGrid" in table.splitlines()[-1]

    # Take `patch` away from the ClusterQueue rule of this copy (not the shipped name).
    role = portal_sa.role
    rule = next(
        r
        for r in role["rules"]
        if r["resources"] == ["clusterqueues"] and r["apiGroups"] == [KUEUE.split("/")[0]]
    )
    rule["verbs"] = [verb for verb in rule["verbs"] if verb != "patch"]
    admin = KubeClient(new_api_client(cluster_env.kubeconfig))
    try:
        admin.apply(role)
    finally:
        admin.close()
    wait_for_access(
        portal_sa.client, "patch", "clusterqueues", group="kueue.x-k8s.io", allowed=False
    )

    code, table = run_command("--as", portal_sa.user)
    assert code == 1, table
    assert "NOT ready for TauGrid" in table
    report = json.loads(run_command("--as", portal_sa.user, "--json")[1])
    failed = [check for check in report["checks"] if check["result"] != "ok"]
    assert len(failed) == 1, failed
    assert failed[0]["check"] == "permission clusterqueues.kueue.x-k8s.io"
    assert failed[0]["detail"].startswith(
        f"{portal_sa.user} may not patch clusterqueues.kueue.x-k8s.io (needed for"
    )
    assert failed[0]["fix"].startswith(
        "helm upgrade TauGrid's release (its ClusterRole), or kubectl apply -f deploy/rbac/ "
        "(the ClusterRole taugrid-portal"
    )


# -- every operation of the list, as that ServiceAccount --------------------------------------


class AsPortal:
    """Operations as the portal's ServiceAccount, each recorded as (group, resource, verb,
    object name) once it succeeded. The adapter does what the portal does; update (PUT) and
    watch, which it does not offer yet, go through the same ApiClient by hand."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self.done: set[tuple[str, str, str, str | None]] = set()

    def did(self, group: str, resource: str, verb: str, name: str | None = None) -> None:
        self.done.add((group, resource, verb, name))

    def request(
        self, method: str, path: str, *, query: dict[str, Any] | None = None, body: Any = None
    ) -> Any:
        api = self.client.api
        headers = {"Accept": "application/json, */*"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        request = api.param_serialize(
            method,
            path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        return api.call_api(*request, _request_timeout=(5, 15))

    def read(self, path: str, query: dict[str, Any] | None = None) -> bytes:
        response = self.request("GET", path, query=query)
        data: bytes = response.read()
        if not 200 <= response.status <= 299:
            raise error_from_response(response.status, data)
        return data

    def update(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None,
        change: Callable[[dict[str, Any]], None],
        *,
        group: str,
        resource: str,
        named: bool = False,
    ) -> dict[str, Any]:
        """PUT: read, change, write back with the resourceVersion read; again on a Conflict
        (a controller wrote status in between), as a conflict-safe update does."""
        path = self.client.resource(api_version, kind).path(name, namespace)
        for _ in range(10):
            body = self.client.get(api_version, kind, name, namespace)
            change(body)
            response = self.request("PUT", path, body=body)
            data = response.read()
            if response.status == 200:
                self.did(group, resource, "update", name if named else None)
                result: dict[str, Any] = json.loads(data)
                return result
            error = error_from_response(response.status, data)
            if not isinstance(error, adapter.Conflict):
                raise error
        raise error

    def watch(self, api_version: str, kind: str, group: str, resource: str, **query: Any) -> None:
        """Open a watch (all namespaces, as the watcher will), see it accepted, close it."""
        path = self.client.resource(api_version, kind).path()
        response = self.request("GET", path, query={"watch": "true", "timeoutSeconds": 5, **query})
        try:
            if response.status != 200:
                raise error_from_response(response.status, response.read())
        finally:
            response.response.close()
        self.did(group, resource, "watch")

    def read_all(
        self,
        api_version: str,
        kind: str,
        group: str,
        resource: str,
        name: str,
        namespace: str | None = None,
    ) -> dict[str, Any]:
        """get, list (across namespaces) and watch one kind; the object must be in the list."""
        got = self.client.get(api_version, kind, name, namespace)
        self.did(group, resource, "get")
        listed = self.client.list(api_version, kind)
        assert (namespace, name) in {
            (item["metadata"].get("namespace"), item["metadata"]["name"]) for item in listed
        }
        self.did(group, resource, "list")
        self.watch(api_version, kind, group, resource)
        return got


KUEUE_GROUP = "kueue.x-k8s.io"


def label(key: str, value: str) -> Callable[[dict[str, Any]], None]:
    def change(body: dict[str, Any]) -> None:
        body["metadata"].setdefault("labels", {})[key] = value

    return change


MANAGED = {"app.kubernetes.io/managed-by": "taugrid"}


def kueue_objects(prefix: str, workspace: str) -> list[tuple[str, dict[str, Any]]]:
    """(plural, body) of the Kueue objects a workspace gets, in creation order."""
    flavor, cohort, priority, queue = (f"{prefix}-{part}" for part in ("cpu", "co", "high", "cq"))
    return [
        (
            "resourceflavors",
            {
                "apiVersion": KUEUE,
                "kind": "ResourceFlavor",
                "metadata": {"name": flavor, "labels": MANAGED},
                "spec": {"nodeLabels": {"taugrid.io/node-pool": "cpu"}},
            },
        ),
        (
            "cohorts",
            {
                "apiVersion": KUEUE,
                "kind": "Cohort",
                "metadata": {"name": cohort, "labels": MANAGED},
                "spec": {},
            },
        ),
        (
            "workloadpriorityclasses",
            {
                "apiVersion": KUEUE,
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": priority, "labels": MANAGED},
                "value": 100,
                "description": "high",
            },
        ),
        (
            "clusterqueues",
            {
                "apiVersion": KUEUE,
                "kind": "ClusterQueue",
                "metadata": {"name": queue, "labels": MANAGED},
                "spec": {
                    "cohortName": cohort,
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": workspace}
                    },
                    # Less than one job asks: every job stays pending (and listed by the
                    # visibility API), so none of them runs.
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu", "memory"],
                            "flavors": [
                                {
                                    "name": flavor,
                                    "resources": [
                                        {"name": "cpu", "nominalQuota": "500m"},
                                        {"name": "memory", "nominalQuota": "4Gi"},
                                    ],
                                }
                            ],
                        }
                    ],
                },
            },
        ),
        (
            "localqueues",
            {
                "apiVersion": KUEUE,
                "kind": "LocalQueue",
                "metadata": {"name": "team", "namespace": workspace, "labels": MANAGED},
                "spec": {"clusterQueue": queue},
            },
        ),
    ]


def ray_job(name: str, namespace: str, queue: str, priority: str) -> dict[str, Any]:
    head = {"cpu": "1", "memory": "2Gi"}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {QUEUE_LABEL: queue, "kueue.x-k8s.io/priority-class": priority},
        },
        "spec": {
            "suspend": True,
            "entrypoint": "python -c 'print(1)'",
            "shutdownAfterJobFinishes": True,
            "rayClusterSpec": {
                "headGroupSpec": {
                    "rayStartParams": {},
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "ray-head",
                                    "image": "rayproject/ray:2.46.0",
                                    "resources": {"requests": head, "limits": head},
                                }
                            ]
                        }
                    },
                }
            },
        },
    }


def owned_secret(name: str, namespace: str, owner: dict[str, Any]) -> dict[str, Any]:
    """A run token Secret as the backend makes it: owned by the workload, blocking its
    deletion until the Secret is gone."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "ownerReferences": [
                {
                    "apiVersion": owner["apiVersion"],
                    "kind": owner["kind"],
                    "name": owner["metadata"]["name"],
                    "uid": owner["metadata"]["uid"],
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "type": "Opaque",
        "stringData": {"token": "t0k3n"},
    }


def identity_without_finalizers(kube: Kube, cluster: KubeCluster, namespace: str) -> KubeClient:
    """A ServiceAccount that may create Secrets and read Jobs in ``namespace``, nothing more."""
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "no-finalizers", "namespace": namespace},
        }
    )
    kube.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "no-finalizers", "namespace": namespace},
            "rules": [
                {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
                {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get"]},
            ],
        }
    )
    kube.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "no-finalizers", "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "no-finalizers",
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": "no-finalizers", "namespace": namespace}
            ],
        }
    )
    user = f"system:serviceaccount:{namespace}:no-finalizers"
    client = KubeClient(new_api_client(cluster.kubeconfig, impersonate_user=user))
    wait_for_access(client, "create", "secrets", namespace=namespace)
    return client


@pytest.mark.cluster
def test_every_operation_the_list_names_succeeds_as_the_serviceaccount(
    portal_sa: PortalIdentity, kube: Kube, kube_cluster: KubeCluster, tmp_path: Path
) -> None:
    as_portal = AsPortal(portal_sa.client)
    sa = portal_sa.client
    workspace = kube.unique("cc-ws")
    prefix = kube.unique("cc")
    cleanup: list[tuple[str, str, str, str | None]] = [("v1", "Namespace", workspace, None)]
    try:
        # -- the namespace, as the workspace sync makes it: created with its mark -------------
        sa.create(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": workspace, "annotations": CREATED_BY},
            }
        )
        as_portal.did("", "namespaces", "create")
        sa.apply(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": workspace,
                    "labels": {**MANAGED, "taugrid.io/workspace": workspace},
                    "annotations": CREATED_BY,
                },
            }
        )
        as_portal.did("", "namespaces", "patch")
        as_portal.read_all("v1", "Namespace", "", "namespaces", workspace)
        updated = as_portal.update(
            "v1",
            "Namespace",
            workspace,
            None,
            label("taugrid.io/checked", "yes"),
            group="",
            resource="namespaces",
        )
        assert updated["metadata"]["labels"]["taugrid.io/checked"] == "yes"

        # -- the guard: a namespace TauGrid did not create is neither deleted nor marked -------
        bystander = kube.namespace("cc-bystander")
        wait_until(
            "the namespace guard to be in force (a dry-run deletion refused)",
            lambda: (
                True
                if as_portal.request(
                    "DELETE", f"/api/v1/namespaces/{bystander}", query={"dryRun": "All"}
                ).status
                == 403
                else None
            ),
            timeout=30,
            interval=0.2,
        )
        with pytest.raises(adapter.Forbidden) as refused:
            sa.delete("v1", "Namespace", bystander)
        assert "TauGrid deletes only namespaces it created" in refused.value.message
        with pytest.raises(adapter.Forbidden) as refused:
            sa.apply(
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": bystander, "annotations": CREATED_BY},
                }
            )
        assert "only when creating it" in refused.value.message
        assert kube.get("v1", "Namespace", bystander) is not None

        # -- Kueue's objects: full management -------------------------------------------------
        objects = kueue_objects(prefix, workspace)
        for plural, body in objects:
            metadata = body["metadata"]
            namespace = metadata.get("namespace")
            if namespace is None:
                cleanup.append((KUEUE, body["kind"], metadata["name"], None))
            sa.create(body)
            as_portal.did(KUEUE_GROUP, plural, "create")
            labelled = json.loads(json.dumps(body))
            labelled["metadata"]["labels"]["taugrid.io/sync"] = "1"
            sa.apply(labelled)
            as_portal.did(KUEUE_GROUP, plural, "patch")
            as_portal.read_all(
                KUEUE, body["kind"], KUEUE_GROUP, plural, metadata["name"], namespace
            )
            as_portal.update(
                KUEUE,
                body["kind"],
                metadata["name"],
                namespace,
                label("taugrid.io/sync", "2"),
                group=KUEUE_GROUP,
                resource=plural,
            )
        priority, queue = (body["metadata"]["name"] for _, body in objects[2:4])

        # -- a run: its token Secret, a suspended queue-labelled Job, a RayJob -----------------
        secret: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "run-1-token", "namespace": workspace},
            "type": "Opaque",
            "stringData": {"token": "t0k3n"},
        }
        sa.create(secret)
        as_portal.did("", "secrets", "create")
        sa.apply({**secret, "metadata": {**secret["metadata"], "labels": MANAGED}})
        as_portal.did("", "secrets", "patch")
        assert sa.get("v1", "Secret", "run-1-token", workspace)["metadata"]["labels"] == MANAGED
        as_portal.did("", "secrets", "get")
        with pytest.raises(adapter.Forbidden):  # by name only
            sa.list("v1", "Secret", workspace)

        job = batch_job("run-1", workspace, "team")
        job["spec"]["suspend"] = True
        job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = priority
        sa.create(job)
        as_portal.did("batch", "jobs", "create")
        sa.apply(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {
                    "name": "run-1",
                    "namespace": workspace,
                    "labels": {**job["metadata"]["labels"], **MANAGED},
                },
            }
        )
        as_portal.did("batch", "jobs", "patch")
        stored = as_portal.read_all("batch/v1", "Job", "batch", "jobs", "run-1", workspace)
        assert stored["spec"]["suspend"] is True, "over quota: Kueue keeps it suspended"

        sa.create(ray_job("run-2", workspace, "team", priority))
        as_portal.did("ray.io", "rayjobs", "create")
        sa.apply(
            {
                "apiVersion": "ray.io/v1",
                "kind": "RayJob",
                "metadata": {"name": "run-2", "namespace": workspace, "labels": MANAGED},
            }
        )
        as_portal.did("ray.io", "rayjobs", "patch")
        as_portal.read_all("ray.io/v1", "RayJob", "ray.io", "rayjobs", "run-2", workspace)

        # -- each run's token Secret owned by its workload, blocking its deletion: the API
        # server here enforces owner-reference permissions (as OpenShift does), which asks for
        # `update` on the owner's finalizers; without it the same Secret is refused.
        owners = {
            "jobs": sa.get("batch/v1", "Job", "run-1", workspace),
            "rayjobs": sa.get("ray.io/v1", "RayJob", "run-2", workspace),
        }
        for plural, owner in owners.items():
            sa.create(owned_secret(f"{plural}-token", workspace, owner))
            as_portal.did(owner["apiVersion"].split("/")[0], f"{plural}/finalizers", "update")
        lacking = identity_without_finalizers(kube, kube_cluster, workspace)
        try:
            with pytest.raises(adapter.Forbidden) as refused:
                lacking.create(owned_secret("refused-token", workspace, owners["jobs"]))
            assert "blockOwnerDeletion" in refused.value.message
        finally:
            lacking.close()

        # -- Kueue's view: Workloads, and positions from the visibility API ---------------------
        workloads = wait_until(
            "Kueue's Workloads of both runs",
            lambda: found if len(found := sa.list(KUEUE, "Workload", workspace)) == 2 else None,
            timeout=30,
        )
        as_portal.read_all(
            KUEUE, "Workload", KUEUE_GROUP, "workloads", workloads[0]["metadata"]["name"], workspace
        )
        visibility = "/apis/visibility.kueue.x-k8s.io/v1beta2"

        def pending(path: str) -> list[dict[str, Any]] | None:
            items: list[dict[str, Any]] = sa.get_path(path).get("items") or []
            return items if len(items) == 2 else None

        in_queue = wait_until(
            "both runs in the LocalQueue's pending workloads",
            lambda: pending(
                f"{visibility}/namespaces/{workspace}/localqueues/team/pendingworkloads"
            ),
            timeout=30,
        )
        as_portal.did("visibility.kueue.x-k8s.io", "localqueues/pendingworkloads", "get")
        assert sorted(item["positionInLocalQueue"] for item in in_queue) == [0, 1]
        assert pending(f"{visibility}/clusterqueues/{queue}/pendingworkloads") is not None
        as_portal.did("visibility.kueue.x-k8s.io", "clusterqueues/pendingworkloads", "get")

        # -- pods, their log and events (a pod the admin starts on a fake node) ----------------
        log_file = tmp_path / "trainer.log"
        log_file.write_text("2026-12-01T00:00:00.000000000Z stdout F step 1 loss=0.5\n")
        resources = {"cpu": "100m", "memory": "64Mi"}
        kube.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "trainer", "namespace": workspace},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox",
                            "resources": {"requests": resources, "limits": resources},
                        }
                    ],
                },
            }
        )
        kube.create(
            {
                "apiVersion": "kwok.x-k8s.io/v1alpha1",
                "kind": "Logs",
                "metadata": {"name": "trainer", "namespace": workspace},
                "spec": {"logs": [{"containers": ["main"], "logsFile": str(log_file)}]},
            }
        )
        wait_until(
            "the pod Running on a fake node",
            lambda: (
                True
                if (sa.get("v1", "Pod", "trainer", workspace).get("status") or {}).get("phase")
                == "Running"
                else None
            ),
            timeout=30,
        )
        as_portal.read_all("v1", "Pod", "", "pods", "trainer", workspace)

        def log() -> str | None:
            with contextlib.suppress(adapter.KubeError):  # until KWOK has seen the Logs object
                return as_portal.read(
                    f"/api/v1/namespaces/{workspace}/pods/trainer/log", {"container": "main"}
                ).decode()
            return None

        assert wait_until("the pod's log", log, timeout=30) == "step 1 loss=0.5\n"
        as_portal.did("", "pods/log", "get")

        events = wait_until(
            "events in the namespace", lambda: sa.list("v1", "Event", workspace) or None, timeout=30
        )
        as_portal.read_all("v1", "Event", "", "events", events[0]["metadata"]["name"], workspace)

        # -- a multi-worker Job's headless rendezvous Service -----------------------------------
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "run-1", "namespace": workspace, "labels": MANAGED},
            "spec": {"clusterIP": "None", "selector": {"taugrid.io/run": "run-1"}},
        }
        sa.create(service)
        as_portal.did("", "services", "create")
        assert sa.get("v1", "Service", "run-1", workspace)["spec"]["clusterIP"] == "None"
        as_portal.did("", "services", "get")
        sa.delete("v1", "Service", "run-1", workspace)
        as_portal.did("", "services", "delete")

        # -- an endpoint's route from outside (TAU_ENDPOINT_ROUTE): its Ingress made, read and
        # replaced (the garbage collector deletes it with its RayService, and the namespace
        # with the workspace, below) ---------------------------------------------------------
        sa.create(
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "Ingress",
                "metadata": {"name": "ep-1", "namespace": workspace},
                "spec": {
                    "rules": [
                        {
                            "host": "ep-1-team.serve.example.org",
                            "http": {
                                "paths": [
                                    {
                                        "path": "/",
                                        "pathType": "Prefix",
                                        "backend": {
                                            "service": {
                                                "name": "ep-1-serve-svc",
                                                "port": {"number": 8000},
                                            }
                                        },
                                    }
                                ]
                            },
                        }
                    ]
                },
            }
        )
        as_portal.did("networking.k8s.io", "ingresses", "create")
        assert sa.get("networking.k8s.io/v1", "Ingress", "ep-1", workspace)
        as_portal.did("networking.k8s.io", "ingresses", "get")

        def relabel(ingress: dict[str, Any]) -> None:
            ingress["metadata"]["labels"] = MANAGED

        as_portal.update(
            "networking.k8s.io/v1",
            "Ingress",
            "ep-1",
            workspace,
            relabel,
            group="networking.k8s.io",
            resource="ingresses",
        )
        # Its HTTPRoute: this cluster serves no Gateway API (deploy/cluster installs no Gateway
        # CRDs), so what can be shown is the grant, asked of the API server's authorizer.
        for verb in ("get", "create", "update"):
            assert sa.can_i(
                verb, "httproutes", group="gateway.networking.k8s.io", namespace=workspace
            ).allowed, verb
            as_portal.did("gateway.networking.k8s.io", "httproutes", verb)

        # -- an endpoint's RayService: made, read, replaced, owning its token Secret; the Ray
        # cluster KubeRay makes for it read; deleted on stop ----------------------------------
        resources = {"cpu": "100m", "memory": "128Mi"}
        sa.create(
            {
                "apiVersion": "ray.io/v1",
                "kind": "RayService",
                "metadata": {
                    "name": "ep-1",
                    "namespace": workspace,
                    "labels": {**MANAGED, "kueue.x-k8s.io/queue-name": "team"},
                },
                "spec": {
                    "serveConfigV2": "applications: []\n",
                    "rayClusterConfig": {
                        "rayVersion": "2.60.0",
                        "headGroupSpec": {
                            "rayStartParams": {},
                            "template": {
                                "spec": {
                                    "containers": [
                                        {
                                            "name": "ray-head",
                                            "image": "rayproject/ray:2.60.0-py311",
                                            "resources": {
                                                "requests": resources,
                                                "limits": resources,
                                            },
                                        }
                                    ]
                                }
                            },
                        },
                    },
                },
            }
        )
        as_portal.did("ray.io", "rayservices", "create")
        ray_service = sa.get("ray.io/v1", "RayService", "ep-1", workspace)
        as_portal.did("ray.io", "rayservices", "get")
        sa.create(owned_secret("ep-1-endpoint-token", workspace, ray_service))
        as_portal.did("ray.io", "rayservices/finalizers", "update")
        as_portal.update(
            "ray.io/v1",
            "RayService",
            "ep-1",
            workspace,
            relabel,
            group="ray.io",
            resource="rayservices",
        )

        def its_cluster() -> str | None:
            status = sa.get("ray.io/v1", "RayService", "ep-1", workspace).get("status") or {}
            name = (status.get("pendingServiceStatus") or {}).get("rayClusterName")
            return str(name) if name else None

        cluster_name = wait_until("the RayService's Ray cluster", its_cluster, timeout=60)
        # KubeRay records the name a pass before it makes the cluster: list until it is there.
        wait_until(
            "the Ray cluster",
            lambda: (
                any(
                    found["metadata"]["name"] == cluster_name
                    for found in sa.list("ray.io/v1", "RayCluster", workspace)
                )
                or None
            ),
            timeout=30,
        )
        as_portal.did("ray.io", "rayclusters", "list")
        assert sa.get("ray.io/v1", "RayCluster", cluster_name, workspace)
        as_portal.did("ray.io", "rayclusters", "get")
        sa.delete("ray.io/v1", "RayService", "ep-1", workspace)
        as_portal.did("ray.io", "rayservices", "delete")

        # -- cancel: the jobs deleted (their pods go with them) ----------------------------------
        sa.delete("batch/v1", "Job", "run-1", workspace, propagation="Foreground")
        as_portal.did("batch", "jobs", "delete")
        sa.delete("ray.io/v1", "RayJob", "run-2", workspace, propagation="Foreground")
        as_portal.did("ray.io", "rayjobs", "delete")
        sa.delete("v1", "Secret", "run-1-token", workspace)
        as_portal.did("", "secrets", "delete")

        # -- a fake node cordoned and uncordoned ----------------------------------------------
        node_name = kube.unique("cc-node")
        kube.create(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": node_name,
                    "labels": {"taugrid.io/node-pool": "cluster-check"},
                },
            }
        )
        for cordoned in (True, False):
            sa.apply(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": node_name},
                    "spec": {"unschedulable": cordoned},
                }
            )
            assert bool(sa.get("v1", "Node", node_name)["spec"].get("unschedulable")) is cordoned
        as_portal.did("", "nodes", "patch")
        as_portal.read_all("v1", "Node", "", "nodes", node_name)

        # -- the watcher's leader Lease, in the portal's own namespace ------------------------
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": LEADER_LEASE, "namespace": portal_sa.namespace},
            "spec": {"holderIdentity": "watcher-a", "leaseDurationSeconds": 15},
        }
        sa.create(lease)
        as_portal.did("coordination.k8s.io", "leases", "create")
        held = sa.get("coordination.k8s.io/v1", "Lease", LEADER_LEASE, portal_sa.namespace)
        assert held["spec"]["holderIdentity"] == "watcher-a"
        as_portal.did("coordination.k8s.io", "leases", "get", LEADER_LEASE)

        def take_over(lease: dict[str, Any]) -> None:
            lease["spec"]["holderIdentity"] = "watcher-b"

        renewed = as_portal.update(
            "coordination.k8s.io/v1",
            "Lease",
            LEADER_LEASE,
            portal_sa.namespace,
            take_over,
            group="coordination.k8s.io",
            resource="leases",
            named=True,
        )
        assert renewed["spec"]["holderIdentity"] == "watcher-b"
        with pytest.raises(adapter.Forbidden):  # no other Lease (the scheduler's, a node's)
            sa.get("coordination.k8s.io/v1", "Lease", "kube-scheduler", "kube-system")

        # -- what cluster_check itself asks -----------------------------------------------------
        for crd, version in REQUIRED_CRDS.items():
            assert version in sa.served_versions(crd)
            as_portal.did("apiextensions.k8s.io", "customresourcedefinitions", "get", crd)
        assert sa.can_i("get", "pods").allowed
        as_portal.did("authorization.k8s.io", "selfsubjectaccessreviews", "create")
        assert sa.whoami().username == portal_sa.user
        as_portal.did("authentication.k8s.io", "selfsubjectreviews", "create")

        # -- tear the workspace's queues down, as archiving does --------------------------------
        for plural, body in reversed(objects):
            sa.delete(
                KUEUE, body["kind"], body["metadata"]["name"], body["metadata"].get("namespace")
            )
            as_portal.did(KUEUE_GROUP, plural, "delete")
        # ... and the namespace it created, with its workspace.
        sa.delete("v1", "Namespace", workspace)
        as_portal.did("", "namespaces", "delete")
    finally:
        for api_version, kind, name, namespace in reversed(cleanup):
            kube.delete(api_version, kind, name, namespace)

    listed = {
        (permission.group, permission.rbac_resource, verb, name)
        for permission, verb, name in access_checks()
    }
    assert listed - as_portal.done == set(), "named in the list but never exercised"
    assert as_portal.done - listed == set(), "exercised but not in the list"


@pytest.mark.cluster
@pytest.mark.django_db(transaction=True)
def test_the_workspace_sync_works_as_the_serviceaccount_bound_to_the_shipped_role(
    portal_sa: PortalIdentity,
    kube: Kube,
    kube_cluster: KubeCluster,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not only each listed verb: the portal's own code — a workspace in a cohort with a
    priority class, a quota change, a hand edit put back, archiving, deletion — runs as the
    ServiceAccount with nothing but the shipped ClusterRole (and the namespace guard)."""
    from executors.kubernetes import kueue_sync
    from executors.kubernetes.kueue import KUEUE_API
    from executors.kubernetes.tasks import check_kueue_drift
    from tests.executors.kubernetes.test_kueue_sync import gpu_flavor, make_workspace, run_published
    from workspaces.models import Cohort, KueueSync, PriorityClass, Workspace

    uid = kube.unique("sa")[-6:]
    settings.TAU_BACKEND = "kubernetes"
    published: list[int] = []
    monkeypatch.setattr(kueue_sync, "publish", published.append)
    # The portal's shared client is the ServiceAccount's.
    monkeypatch.setattr("kube.api._client", portal_sa.client)
    assert adapter.client().whoami().username == portal_sa.user
    admin = KubeClient(new_api_client(kube_cluster.kubeconfig))
    slug = f"sa-{uid}"
    try:
        cohort = Cohort.objects.create(name=f"cohort-{uid}")
        PriorityClass.objects.create(name=f"high-{uid}", value=5000)
        flavor = gpu_flavor(uid)
        workspace = make_workspace(
            slug, flavor, 8, cohort=cohort, allowed_priorities=[f"high-{uid}"]
        )
        run_published(published)
        rows = list(KueueSync.objects.order_by("pk"))
        assert [(row.state, row.last_error) for row in rows] == [("synced", "")] * len(rows)
        queue = admin.get(KUEUE_API, "ClusterQueue", f"tau-{slug}")
        assert queue["spec"]["cohortName"] == cohort.name
        assert admin.get(KUEUE_API, "WorkloadPriorityClass", f"high-{uid}")["value"] == 5000

        quota = workspace.quotas.get(resource="nvidia.com/gpu")
        quota.nominal = Decimal(4)
        quota.save()
        run_published(published)
        assert KueueSync.latest("workspace", slug).state == "synced"  # type: ignore[union-attr]

        # A hand edit, as `kubectl apply --server-side --force-conflicts` would make it.
        by_hand = KubeClient(new_api_client(kube_cluster.kubeconfig), field_manager="kubectl")
        spec = {**queue["spec"], "preemption": {"withinClusterQueue": "Never"}}
        by_hand.apply(
            {"apiVersion": KUEUE_API, "kind": "ClusterQueue", "metadata": {"name": f"tau-{slug}"},
             "spec": spec}
        )  # fmt: skip
        by_hand.close()
        edited = admin.get(KUEUE_API, "ClusterQueue", f"tau-{slug}")
        assert edited["spec"]["preemption"]["withinClusterQueue"] == "Never"
        assert check_kueue_drift() >= 1
        repaired = admin.get(KUEUE_API, "ClusterQueue", f"tau-{slug}")
        assert repaired["spec"]["preemption"]["withinClusterQueue"] == "LowerPriority"

        workspace.active = False
        workspace.save()
        run_published(published)
        assert KueueSync.latest("workspace", slug).state == "synced"  # type: ignore[union-attr]
        with pytest.raises(adapter.NotFound):
            admin.get(KUEUE_API, "ClusterQueue", f"tau-{slug}")

        namespace = workspace.namespace
        Workspace.unscoped_objects.filter(pk=workspace.pk).delete()
        run_published(published)
        failed = list(KueueSync.objects.exclude(state="synced").values_list("state", "last_error"))
        assert failed == []

        def namespace_gone() -> bool | None:
            try:
                found = admin.get("v1", "Namespace", namespace)
            except adapter.NotFound:
                return True
            # Deleting: the API server finishes once the namespace's contents are gone.
            return True if found["metadata"].get("deletionTimestamp") else None

        wait_until("the namespace TauGrid created deleted", namespace_gone, timeout=60)
    finally:
        for kind in ("ClusterQueue", "Cohort", "ResourceFlavor", "WorkloadPriorityClass"):
            for obj in admin.list(KUEUE_API, kind):
                if uid in obj["metadata"]["name"]:
                    admin.delete(KUEUE_API, kind, obj["metadata"]["name"], missing_ok=True)
        admin.close()
