"""The Helm chart against the real control plane (deploy/cluster: kube-apiserver with Kueue's
and KubeRay's CRDs and webhooks, kube-scheduler, KWOK nodes):

* every object ``helm template`` renders, for the default values and the production-like
  file, passes a server-side dry-run with strict field validation (an unknown field would be
  refused: the test shows that too);
* the chart's ServiceAccount, ClusterRole, binding and namespace guard, applied as rendered:
  impersonating that ServiceAccount, the Kueue sync brings a workspace's namespace and queues
  into the cluster, the watcher's leader election holds its Lease in the release namespace,
  the watcher follows a run to its end, and ``cluster_check`` passes; with one verb taken
  from the rendered ClusterRole, ``cluster_check`` names it.

Release names are unique per test (the ClusterRole and the admission policy are cluster-
scoped, shared by every test of the session) and what a test creates is deleted after it.
"""

from __future__ import annotations

import copy
import io
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import kube as adapter
from executors.kubernetes import kueue_cluster
from executors.kubernetes.rbac import LEADER_LEASE
from executors.kubernetes.watcher import KubeWatcher
from kube import KubeClient, new_api_client
from kube.leader import LeaderElection
from runs import submission
from runs.models import Run, RunAttempt, RunState
from tests.cluster.plugin import Kube, KubeCluster, wait_for_access
from tests.deploy.helm import PRODUCTION_VALUES, REPO, Body, Helm, helm_binary
from tests.executors.kubernetes.test_cluster_check import h100_flavor_row, run_command
from tests.executors.kubernetes.test_kube_watcher import (
    attempt_of,
    follow,
    fresh,
    handed_to_kueue,
    labelled_job,
    story,
)
from tests.executors.kubernetes.test_kueue_sync import gpu_flavor, make_workspace
from tests.runs.factories import TINY_FILES, TINY_SPEC, zip_bytes
from workspaces.models import Membership, Role

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def helm() -> Helm:
    return Helm(helm_binary())


@pytest.fixture
def uid() -> str:
    return uuid.uuid4().hex[:6]


@pytest.fixture
def admin(kube_cluster: KubeCluster) -> Iterator[KubeClient]:
    client = KubeClient(new_api_client(kube_cluster.kubeconfig))
    yield client
    client.close()


def strict_dry_run(kube_cluster: KubeCluster, obj: Body) -> tuple[int, Body]:
    """POST ``obj`` with dryRun=All and fieldValidation=Strict: the API server validates and
    admits it (webhooks and admission policies included) and stores nothing. (status, the
    answer)."""
    from kubernetes.client.exceptions import ApiException

    resource = kube_cluster.resource(obj["apiVersion"], obj["kind"])
    namespace = obj["metadata"].get("namespace") if resource.namespaced else None
    api = kube_cluster.api_client()
    request = api.param_serialize(
        "POST",
        resource.path(namespace=namespace),  # type: ignore[no-untyped-call]
        query_params=[("dryRun", "All"), ("fieldValidation", "Strict")],
        header_params={"Content-Type": "application/json", "Accept": "application/json"},
        body=obj,
        auth_settings=["BearerToken"],
    )
    try:
        response = api.call_api(*request, _request_timeout=30)
        status, data = int(response.status), response.read()  # type: ignore[no-untyped-call]
    except ApiException as error:
        status, data = int(error.status or 0), error.body
    return status, json.loads(data or b"{}")


@pytest.mark.parametrize("values", ["default", "production"])
def test_every_rendered_object_passes_a_strict_server_side_dry_run(
    helm: Helm, kube: Kube, kube_cluster: KubeCluster, values: str
) -> None:
    namespace = kube.namespace("helm")
    files = (PRODUCTION_VALUES,) if values == "production" else ()
    objects = helm.objects(*files, release=f"tg-{namespace[-6:]}", namespace=namespace)
    assert len(objects) >= 15
    for obj in objects:
        obj["metadata"].setdefault("namespace", namespace)
        status, answer = strict_dry_run(kube_cluster, obj)
        assert status in {200, 201}, (obj["kind"], obj["metadata"]["name"], answer)
        assert answer["kind"] == obj["kind"], answer
        assert answer["metadata"]["name"] == obj["metadata"]["name"]
        assert not answer["metadata"].get("creationTimestamp") or "uid" in answer["metadata"]
    # Nothing was stored.
    for obj in objects:
        if obj["kind"] == "Deployment":
            assert kube.get("apps/v1", "Deployment", obj["metadata"]["name"], namespace) is None
    # Strictness is real: a misspelt field is refused, naming it.
    web = next(o for o in objects if o["kind"] == "Deployment")
    typo = copy.deepcopy(web)
    typo["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    status, answer = strict_dry_run(kube_cluster, typo)
    assert status in {400, 422}, answer
    assert "imagePullPolicyy" in answer["message"]


# -- as the chart's ServiceAccount -------------------------------------------------------------


def install_identity(helm: Helm, kube: Kube, release: str, namespace: str) -> tuple[str, Body]:
    """The chart's ServiceAccount, ClusterRole, ClusterRoleBinding and namespace guard,
    created as rendered; returns the ServiceAccount's user name and the ClusterRole."""
    rendered = helm.objects(release=release, namespace=namespace)
    wanted = {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    role: Body | None = None
    account = ""
    for obj in rendered:
        if obj["kind"] not in wanted:
            continue
        if obj["kind"] == "ServiceAccount":
            obj["metadata"]["namespace"] = namespace
            account = obj["metadata"]["name"]
        if obj["kind"] == "ClusterRole":
            role = obj
        kube.create(obj)
    assert role is not None
    assert account
    return f"system:serviceaccount:{namespace}:{account}", role


def kube_run_in(workspace: Any, user: Any) -> Run:
    """A run of ``workspace`` on the Kubernetes backend, handed over to Kueue (its submit
    delivered, as the backend leaves it once its Job exists)."""
    run = submission.submit(
        workspace=workspace,
        user=user,
        spec_source=TINY_SPEC,
        bundle=io.BytesIO(zip_bytes(TINY_FILES)),
    )
    return handed_to_kueue(run)


def test_the_sync_and_the_watcher_work_as_the_charts_service_account(
    helm: Helm,
    kube: Kube,
    kube_cluster: KubeCluster,
    admin: KubeClient,
    uid: str,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    django_user_model: Any,
) -> None:
    release_namespace = kube.namespace("tg-release")
    user, role = install_identity(helm, kube, f"tg-{uid}", release_namespace)
    settings.TAU_BACKEND = "kubernetes"
    settings.TAU_KUBE_WATCHER_LEASE_NAMESPACE = release_namespace  # as the chart sets it
    monkeypatch.setenv("TAU_KUBECONFIG", str(kube_cluster.kubeconfig))
    adapter.reset_client()
    portal = KubeClient(new_api_client(kube_cluster.kubeconfig, impersonate_user=user))
    slug = f"helm-{uid}"
    try:
        wait_for_access(portal, "create", "clusterqueues", group="kueue.x-k8s.io")
        # The Kueue sync, as the ServiceAccount: namespace, ClusterQueue, LocalQueue, flavor.
        workspace = make_workspace(slug, gpu_flavor(uid), 2)
        outcome = kueue_cluster.sync_workspace(slug, client=portal)
        assert outcome.detail, outcome
        workspace.refresh_from_db()
        namespace = kube.get("v1", "Namespace", workspace.namespace)
        assert namespace is not None
        assert namespace["metadata"]["annotations"]["taugrid.io/created-by"] == "taugrid"
        queue = kube.get(
            "kueue.x-k8s.io/v1beta2", "LocalQueue", workspace.local_queue, workspace.namespace
        )
        assert queue is not None, outcome.detail

        # The watcher's leader election, in the release's namespace.
        election = LeaderElection(
            portal, namespace=release_namespace, name=LEADER_LEASE, lease_seconds=15
        )
        assert election.try_acquire_or_renew()  # creates the Lease
        assert election.try_acquire_or_renew()  # renews it (get and update by name)
        lease = kube.get(
            "coordination.k8s.io/v1", "Lease", "taugrid-kube-watcher", release_namespace
        )
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == election.identity

        # The watcher, as the ServiceAccount, follows a run from queued to succeeded.
        researcher = django_user_model.objects.create_user(username=f"r-{uid}", password=None)
        Membership.objects.create(workspace=workspace, user=researcher, role=Role.RESEARCHER)
        run = kube_run_in(workspace, researcher)
        admin.create(labelled_job(run, gpus=1, queue=workspace.local_queue))
        watcher = KubeWatcher(portal, resync_seconds=300)
        watcher.start()
        try:
            follow(
                watcher,
                f"{run.name} to succeed",
                lambda: fresh(run).state == RunState.SUCCEEDED,
                90,
                story(run),
            )
        finally:
            watcher.stop()
        attempt = attempt_of(run)
        assert (attempt.state, attempt.exit_code) == (RunAttempt.State.SUCCEEDED, 0)
        assert attempt.node_names == ["gpu-h100-1"] or attempt.node_names == ["gpu-h100-2"]

        # cluster_check as the ServiceAccount: ready; with one verb less: that verb, named.
        h100_flavor_row()
        code, table = run_command("--as", user)
        assert code == 0, table
        assert "ready for TauGrid" in table.splitlines()[-1]
        narrower = copy.deepcopy(role)
        rule = next(
            r
            for r in narrower["rules"]
            if r["resources"] == ["localqueues"] and r["apiGroups"] == ["kueue.x-k8s.io"]
        )
        rule["verbs"] = [verb for verb in rule["verbs"] if verb != "create"]
        admin.apply(narrower)
        wait_for_access(portal, "create", "localqueues", group="kueue.x-k8s.io", allowed=False)
        code, table = run_command("--as", user)
        assert code == 1, table
        report = json.loads(run_command("--as", user, "--json")[1])
        failed = [check for check in report["checks"] if check["result"] != "ok"]
        assert [check["check"] for check in failed] == ["permission localqueues.kueue.x-k8s.io"]
        assert failed[0]["detail"].startswith(f"{user} may not create localqueues.kueue.x-k8s.io")
    finally:
        portal.close()
        adapter.reset_client()
        for kind, name in (("ClusterQueue", f"tau-{slug}"), ("ResourceFlavor", f"h100-{uid}")):
            admin.delete("kueue.x-k8s.io/v1beta2", kind, name, missing_ok=True)
        admin.delete("v1", "Namespace", f"tau-{slug}", missing_ok=True)


def test_the_install_notes_say_the_proxy_must_buffer(helm: Helm, kube_cluster: KubeCluster) -> None:
    """NOTES.txt as `helm install` prints it (helm template leaves NOTES out, and helm 3.22's
    client-only dry run still asks a cluster for its version: this one answers)."""

    def notes(*values: str) -> str:
        args = ["install", "taugrid", str(REPO / "deploy" / "helm" / "taugrid"), "--namespace"]
        args += ["taugrid", "--dry-run=client", "--kubeconfig", str(kube_cluster.kubeconfig)]
        for value in values:
            args += ["--set", value]
        return helm.run(*args).stdout.partition("NOTES:")[2]

    with_ingress = ("ingress.enabled=true", "ingress.hosts={portal.example.org}")
    assert "buffering proxy" in notes(*with_ingress)
    assert "WARNING" not in notes(*with_ingress)
    unbuffered = "ingress.annotations.nginx\\.ingress\\.kubernetes\\.io/proxy-request-buffering"
    dropped = notes(*with_ingress, f"{unbuffered}=null")
    assert "WARNING: ingress.annotations no longer ask ingress-nginx to buffer" in dropped
    assert "must buffer requests too" in notes()
