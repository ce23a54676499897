"""Workspaces → Kueue on the real control plane (deploy/cluster: kube-apiserver, Kueue v0.17
with its webhooks and visibility API, kube-scheduler, KWOK's fake H100 nodes).

What is proven, with Kueue deciding:

* a workspace with a GPU quota added in the admin writes one sync row, whose Celery task is
  published when the admin's transaction commits; the task brings its Namespace, LocalQueue
  and ClusterQueue into the cluster in seconds with the quotas typed; a GPU Job within quota is
  admitted and its pod Runs on a fake H100 node (with the flavor's node labels and
  toleration, put there by Kueue); the next one waits and the visibility API lists it;
  raising the quota in the admin admits it;
* two workspaces in a cohort: one borrows the other's idle GPUs, and when the lender
  submits, Kueue reclaims them (the borrower's Workload is preempted, InCohortReclamation);
* a ClusterQueue edited by hand (another field manager) is put back by the drift check, and
  the audit log names the field; running a sync twice changes nothing (no resourceVersion
  moves);
* objects without TauGrid's label are never changed or deleted: a LocalQueue of the same name
  stops the sync with a message and is left as it was, a namespace that existed is used
  and labelled but not deleted with the workspace, a foreign ResourceFlavor is used as is;
* a Kueue webhook refusal is the workspace's sync error, in Kueue's words, on the admin page,
  and nothing is half-applied;
* a worker killed (SIGKILL) after claiming a sync and applying part of it: the next reconcile
  completes it, nothing is duplicated;
* an archived workspace keeps its queues while runs are live (Kueue's status and a
  registered check say so: "waiting for N live runs"), then loses them, not its namespace.

Names are unique per test (cluster-scoped objects are shared by every test of the session)
and every cluster-scoped object a test makes is deleted after it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone

import kube as adapter
from executors.kubernetes import kueue_cluster, kueue_sync
from executors.kubernetes.kueue import (
    CREATED_BY_ANNOTATION,
    INSTALLATION_LABEL,
    MANAGED_BY_LABEL,
    WORKSPACE_LABEL,
)
from executors.kubernetes.tasks import check_kueue_drift, reconcile_kueue_syncs, sync_kueue
from portal import outbox
from portal.models import AuditEvent
from runs.usage import usage_lines
from tests.cluster.kueue_objects import (
    GPU,
    GPU_TOLERATION,
    H100_LABELS,
    KUEUE,
    TEST_DURATION,
    batch_job,
    conditions,
    is_true,
    workload_of,
)
from tests.cluster.plugin import Kube, KubeCluster, wait_until
from tests.workspaces.test_admin_workspace_form import rendered_form
from workspaces.models import (
    Cohort,
    KueueSync,
    Membership,
    ResourceFlavor,
    Role,
    Workspace,
    WorkspaceQuota,
)

REPO = Path(__file__).resolve().parents[3]
# Long enough that a "running" fake pod is still running when the test looks at it.
KEEP_RUNNING = {TEST_DURATION: "30m"}
# Kueue's quota status and admission follow in a second or two; a loaded machine is slower.
KUEUE_TIMEOUT = 60


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture
def uid() -> str:
    return uuid.uuid4().hex[:6]


@pytest.fixture
def kueue_backend(
    settings: Any, monkeypatch: pytest.MonkeyPatch, kube_cluster: KubeCluster
) -> Iterator[list[int]]:
    """The Kubernetes backend against the test cluster; published sync tasks are recorded
    (their ids, in order) instead of going to a broker: :func:`run_published` runs them as a
    worker would."""
    settings.TAU_BACKEND = "kubernetes"
    settings.TAU_KUEUE_SYNC_RETRY_SECONDS = 1
    monkeypatch.setenv("TAU_KUBECONFIG", str(kube_cluster.kubeconfig))
    adapter.reset_client()
    published: list[int] = []
    monkeypatch.setattr(kueue_sync, "publish", published.append)
    yield published
    adapter.reset_client()


@pytest.fixture
def cleanup(kube_cluster: KubeCluster, uid: str) -> Iterator[None]:
    """After the test: every TauGrid object and namespace whose name has the test's uid."""
    yield
    client = adapter.KubeClient(adapter.new_api_client(kube_cluster.kubeconfig))
    try:
        for kind in ("ClusterQueue", "Cohort", "ResourceFlavor", "WorkloadPriorityClass"):
            for obj in client.list(KUEUE, kind):
                if uid in obj["metadata"]["name"]:
                    client.delete(KUEUE, kind, obj["metadata"]["name"], missing_ok=True)
        for namespace in client.list("v1", "Namespace"):
            if uid in namespace["metadata"]["name"]:
                client.delete("v1", "Namespace", namespace["metadata"]["name"], missing_ok=True)
    finally:
        client.close()


@pytest.fixture
def staff(django_user_model: Any) -> Client:
    user = django_user_model.objects.create_user(
        username="platform", password=None, is_staff=True, is_superuser=True
    )
    client = Client()
    client.force_login(user)
    return client


pytestmark = [pytest.mark.django_db(transaction=True)]
cluster = pytest.mark.cluster


# -- helpers -------------------------------------------------------------------------------------


def run_published(published: list[int]) -> None:
    """Run every published sync task, as a worker would (the task function itself)."""
    while published:
        sync_kueue(published.pop(0))


def gpu_flavor(uid: str) -> ResourceFlavor:
    """A flavor for the test cluster's gpu-h100 pool (deploy/cluster/nodes/gpu-h100.yaml)."""
    return ResourceFlavor.objects.create(
        name=f"h100-{uid}",
        gpu_model=H100_LABELS["nvidia.com/gpu.product"],
        node_labels=dict(H100_LABELS),
        tolerations=[dict(GPU_TOLERATION)],
    )


def make_workspace(slug: str, flavor: ResourceFlavor, gpus: int, **fields: Any) -> Workspace:
    workspace = Workspace.unscoped_objects.create(slug=slug, name=slug, **fields)
    for resource, nominal in ((GPU, gpus), ("cpu", 96), ("memory", 2**40)):
        WorkspaceQuota.objects.create(
            workspace=workspace, flavor=flavor, resource=resource, nominal=Decimal(nominal)
        )
    return workspace


def latest(slug: str) -> KueueSync:
    found = KueueSync.latest(KueueSync.Scope.WORKSPACE, slug)
    assert found is not None, f"no sync of {slug}"
    return found


def get(kube: Kube, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
    api_version = "v1" if kind == "Namespace" else KUEUE
    return kube.get(api_version, kind, name, namespace)


def gpu_quota(queue: dict[str, Any]) -> str:
    for group in queue["spec"]["resourceGroups"]:
        for flavor in group["flavors"]:
            for resource in flavor["resources"]:
                if resource["name"] == GPU:
                    return str(resource["nominalQuota"])
    raise AssertionError(f"no GPU quota in {queue['spec']}")


def managers(obj: dict[str, Any] | None) -> set[str]:
    """The field managers that ever wrote the object (TauGrid's is ``taugrid``)."""
    assert obj is not None
    return {entry["manager"] for entry in obj["metadata"].get("managedFields") or []}


def resource_version(obj: dict[str, Any] | None) -> str:
    assert obj is not None
    return str(obj["metadata"]["resourceVersion"])


def admitted(kube: Kube, job: dict[str, Any]) -> Callable[[], dict[str, Any] | None]:
    def probe() -> dict[str, Any] | None:
        workload = workload_of(kube, job)
        return workload if is_true(workload, "Admitted") else None

    return probe


def pods_of(kube: Kube, job: dict[str, Any]) -> list[dict[str, Any]]:
    return kube.list(
        "v1",
        "Pod",
        job["metadata"]["namespace"],
        label_selector=f"job-name={job['metadata']['name']}",
    )


def pending_in(kube: Kube, namespace: str, queue: str) -> list[dict[str, Any]]:
    path = (
        f"/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/{namespace}"
        f"/localqueues/{queue}/pendingworkloads"
    )
    return list(kube.raw_get(path).get("items") or [])


def admin_change_form(staff: Client, workspace: Workspace) -> tuple[str, dict[str, str]]:
    url = reverse("admin:workspaces_workspace_change", args=[workspace.pk])
    page = staff.get(url)
    assert page.status_code == 200
    return url, rendered_form(page.content.decode())


# -- the whole path, from the admin to a pod on a GPU node ---------------------------------------


@cluster
def test_a_gpu_workspace_from_the_admin_admits_runs_within_its_quota(
    kueue_backend: list[int], cleanup: None, staff: Client, kube: Kube, uid: str
) -> None:
    flavor = gpu_flavor(uid)
    run_published(kueue_backend)  # the flavor (cluster-wide objects)
    slug = f"vision-{uid}"

    add = staff.get(reverse("admin:workspaces_workspace_add"))
    form = rendered_form(add.content.decode())
    form.update(
        {
            "slug": slug,
            "name": "Vision",
            # A workspace is saved with an admin.
            "memberships-0-user": str(
                get_user_model().objects.create_user(username=f"lead-{uid}", password=None).pk
            ),
            "memberships-0-role": "admin",
            "quotas-TOTAL_FORMS": "3",
            **{f"quotas-{i}-flavor": str(flavor.pk) for i in range(3)},
            "quotas-0-resource": GPU,
            "quotas-0-nominal": "8",
            "quotas-1-resource": "cpu",
            "quotas-1-nominal": "96",
            "quotas-2-resource": "memory",
            "quotas-2-nominal": "1Ti",
        }
    )
    response = staff.post(reverse("admin:workspaces_workspace_add"), form)
    assert response.status_code == 302, response.content.decode()[:3000]

    # One sync row for the workspace (its four saves share it), published once committed.
    rows = list(KueueSync.objects.filter(scope="workspace", workspace_slug=slug))
    assert [(row.state, row.attempts) for row in rows] == [("pending", 0)]
    assert kueue_backend == [rows[0].pk]

    started = time.monotonic()
    run_published(kueue_backend)
    took = time.monotonic() - started
    print(f"\nsync of a new workspace took {took:.2f}s")
    assert took < 10
    assert latest(slug).state == "synced"

    namespace, queue_name = f"tau-{slug}", slug
    assert (get(kube, "Namespace", namespace) or {})["metadata"]["labels"][WORKSPACE_LABEL] == slug
    local = get(kube, "LocalQueue", queue_name, namespace)
    assert local is not None
    assert local["spec"]["clusterQueue"] == f"tau-{slug}"
    queue = get(kube, "ClusterQueue", f"tau-{slug}")
    assert queue is not None
    assert queue["spec"]["resourceGroups"] == [
        {
            "coveredResources": ["cpu", "memory", GPU],
            "flavors": [
                {
                    "name": flavor.name,
                    "resources": [
                        {"name": "cpu", "nominalQuota": "96"},
                        {"name": "memory", "nominalQuota": "1Ti"},
                        {"name": GPU, "nominalQuota": "8"},
                    ],
                }
            ],
        }
    ]

    # A GPU job within quota: admitted by Kueue, its pod runs on a fake H100 node.
    first = kube.create(
        batch_job(f"train-{uid}", namespace, queue_name, gpus=8, pod_annotations=KEEP_RUNNING)
    )
    wait_until("the first job admitted", admitted(kube, first), timeout=KUEUE_TIMEOUT)

    def running_pod() -> dict[str, Any] | None:
        pods = [
            p for p in pods_of(kube, first) if (p.get("status") or {}).get("phase") == "Running"
        ]
        return pods[0] if pods else None

    pod = wait_until("its pod running", running_pod, timeout=KUEUE_TIMEOUT)
    assert pod["spec"]["nodeName"].startswith("gpu-h100-")
    # The flavor's node labels and toleration, put on the pod by Kueue at admission.
    assert pod["spec"]["nodeSelector"] == H100_LABELS
    assert GPU_TOLERATION in [
        {key: t.get(key) for key in ("key", "operator", "effect")}
        for t in pod["spec"]["tolerations"]
    ]

    # The next one waits for quota, and Kueue's visibility API lists it.
    second = kube.create(
        batch_job(f"second-{uid}", namespace, queue_name, gpus=8, pod_annotations=KEEP_RUNNING)
    )

    def second_pending() -> dict[str, Any] | None:
        workload = workload_of(kube, second)
        reserved = conditions(workload).get("QuotaReserved")
        return workload if reserved is not None and reserved["status"] == "False" else None

    waiting = wait_until("the second job pending", second_pending, timeout=KUEUE_TIMEOUT)
    assert "insufficient" in conditions(waiting)["QuotaReserved"]["message"]
    listed = wait_until(
        "the visibility API to list it",
        lambda: pending_in(kube, namespace, queue_name) or None,
        timeout=KUEUE_TIMEOUT,
    )
    assert [item["metadata"]["ownerReferences"][0]["name"] for item in listed] == [f"second-{uid}"]
    assert listed[0]["positionInLocalQueue"] == 0

    # Raising the quota in the admin admits it.
    workspace = Workspace.unscoped_objects.get(slug=slug)
    url, form = admin_change_form(staff, workspace)
    gpu_row = next(key for key, value in form.items() if key.endswith("-resource") and value == GPU)
    form[gpu_row.replace("-resource", "-nominal")] = "16"
    response = staff.post(url, form)
    assert response.status_code == 302, response.content.decode()[:3000]
    run_published(kueue_backend)
    assert gpu_quota(get(kube, "ClusterQueue", f"tau-{slug}") or {}) == "16"
    wait_until("the second job admitted", admitted(kube, second), timeout=KUEUE_TIMEOUT)


@cluster
def test_a_second_sync_changes_nothing(
    kueue_backend: list[int], cleanup: None, kube: Kube, uid: str
) -> None:
    slug = f"idem-{uid}"
    cohort = Cohort.objects.create(name=f"idem-{uid}")
    make_workspace(slug, gpu_flavor(uid), 4, cohort=cohort)
    run_published(kueue_backend)
    assert latest(slug).state == "synced"
    objects = [
        ("Namespace", f"tau-{slug}", None),
        ("ClusterQueue", f"tau-{slug}", None),
        ("LocalQueue", slug, f"tau-{slug}"),
        ("ResourceFlavor", f"h100-{uid}", None),
        ("Cohort", f"idem-{uid}", None),
    ]
    before = {name: resource_version(get(kube, kind, name, ns)) for kind, name, ns in objects}

    for scope, slug_ in (("workspace", slug), ("cluster", "")):
        again = kueue_sync.request_sync(scope=scope, workspace_slug=slug_, reason="again")
        assert sync_kueue(again.pk)
        again.refresh_from_db()
        assert again.state == "synced"
        # (Its notes may mention other tests' objects on their way out.)
        assert "Changed:" not in again.detail
        assert "Removed:" not in again.detail
    after = {name: resource_version(get(kube, kind, name, ns)) for kind, name, ns in objects}
    assert after == before
    assert check_kueue_drift() == 0  # and the drift check finds nothing to put back


# -- cohorts: borrowing and reclaiming ----------------------------------------------------------


@cluster
def test_in_a_cohort_one_workspace_borrows_idle_gpus_and_the_lender_reclaims_them(
    kueue_backend: list[int], cleanup: None, kube: Kube, uid: str
) -> None:
    flavor = gpu_flavor(uid)
    cohort = Cohort.objects.create(name=f"lab-{uid}")
    lender = make_workspace(f"lender-{uid}", flavor, 8, cohort=cohort)
    borrower = make_workspace(f"borrower-{uid}", flavor, 0, cohort=cohort)
    run_published(kueue_backend)
    assert {latest(lender.slug).state, latest(borrower.slug).state} == {"synced"}
    assert (get(kube, "ClusterQueue", f"tau-{borrower.slug}") or {})["spec"]["cohortName"] == (
        f"lab-{uid}"
    )

    # The borrower has no GPUs of its own: its job runs on the lender's idle ones.
    borrowed = kube.create(
        batch_job(
            f"borrow-{uid}", borrower.namespace, borrower.local_queue, 4,
            pod_annotations=KEEP_RUNNING,
        )
    )  # fmt: skip
    wait_until("the borrower's job admitted", admitted(kube, borrowed), timeout=KUEUE_TIMEOUT)

    def borrowing() -> str | None:
        queue = get(kube, "ClusterQueue", f"tau-{borrower.slug}") or {}
        for flavor_use in (queue.get("status") or {}).get("flavorsReservation") or []:
            for resource in flavor_use["resources"]:
                if resource["name"] == GPU and resource.get("borrowed") not in (None, "0"):
                    return str(resource["borrowed"])
        return None

    assert wait_until("the borrowed GPUs in the queue's status", borrowing) == "4"

    # The lender submits 8: its quota is lent out, so Kueue reclaims it from the borrower.
    own = kube.create(
        batch_job(
            f"own-{uid}", lender.namespace, lender.local_queue, 8, pod_annotations=KEEP_RUNNING
        )
    )

    def preempted() -> dict[str, Any] | None:
        workload = workload_of(kube, borrowed)
        return workload if is_true(workload, "Preempted") or is_true(workload, "Evicted") else None

    evicted = wait_until("the borrower preempted", preempted, timeout=KUEUE_TIMEOUT)
    found = conditions(evicted)
    assert found["Evicted"]["reason"] == "Preempted"
    assert found["Preempted"]["reason"] == "InCohortReclamation"
    wait_until("the lender's job admitted", admitted(kube, own), timeout=KUEUE_TIMEOUT)


# -- drift, and what is not TauGrid's --------------------------------------------------------


@cluster
def test_a_cluster_queue_edited_by_hand_is_put_back_and_the_audit_log_says_so(
    kueue_backend: list[int], cleanup: None, kube_cluster: KubeCluster, kube: Kube, uid: str
) -> None:
    slug = f"drift-{uid}"
    make_workspace(slug, gpu_flavor(uid), 8)
    run_published(kueue_backend)
    name = f"tau-{slug}"
    queue = get(kube, "ClusterQueue", name) or {}
    index = [r["name"] for r in queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"]]
    path = f"/spec/resourceGroups/0/flavors/0/resources/{index.index(GPU)}/nominalQuota"
    # As `kubectl patch` would: a JSON patch under another field manager.
    kube_cluster.resource(KUEUE, "ClusterQueue").patch(
        name=name,
        body=[{"op": "replace", "path": path, "value": "80"}],
        content_type="application/json-patch+json",
        field_manager="kubectl-patch",
    )
    assert gpu_quota(get(kube, "ClusterQueue", name) or {}) == "80"

    assert check_kueue_drift() == 1
    repaired = get(kube, "ClusterQueue", name) or {}
    assert gpu_quota(repaired) == "8"
    field = f"spec.resourceGroups[0].flavors[0].resources[{index.index(GPU)}].nominalQuota"
    event = AuditEvent.objects.unscoped().get(action="kueue.repaired")
    assert (event.object_type, event.object_repr, event.workspace_slug) == (
        "kueue.ClusterQueue",
        f"ClusterQueue {name}",
        slug,
    )
    assert (event.before, event.after) == ({field: "80"}, {field: "8"})
    assert "Put back after a change by hand" in latest(slug).detail
    assert check_kueue_drift() == 0  # in step again

    # A LocalQueue deleted by hand comes back too.
    kube.delete(KUEUE, "LocalQueue", slug, f"tau-{slug}")
    wait_until(
        "the LocalQueue gone", lambda: get(kube, "LocalQueue", slug, f"tau-{slug}") is None or None
    )
    assert check_kueue_drift() == 1
    assert get(kube, "LocalQueue", slug, f"tau-{slug}") is not None


@cluster
def test_objects_without_taugrids_label_are_never_changed_or_deleted(
    kueue_backend: list[int], cleanup: None, kube: Kube, uid: str
) -> None:
    # Made beforehand by someone else: a namespace, a LocalQueue in it with the name the
    # workspace will use, and a ResourceFlavor with the name of one of TauGrid's flavors.
    namespace = kube.namespace(f"theirs-{uid}")
    theirs = kube.create(
        {
            "apiVersion": KUEUE,
            "kind": "LocalQueue",
            "metadata": {"name": "main", "namespace": namespace},
            "spec": {"clusterQueue": f"their-cq-{uid}"},
        }
    )
    kube.create(
        {"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": f"h100-{uid}"}}
    )

    slug = f"guest-{uid}"
    make_workspace(slug, gpu_flavor(uid), 8, namespace=namespace, local_queue="main")
    run_published(kueue_backend)
    refused = latest(slug)
    assert refused.state == "failed"
    assert refused.last_error.startswith(
        f"LocalQueue {namespace}/main exists and is not this installation's (it has no label "
    )
    # Nothing was touched (Kueue writes their queue's status; TauGrid writes nothing): not
    # their queue, not their namespace, and no ClusterQueue was made either.
    queue = get(kube, "LocalQueue", "main", namespace) or {}
    assert "taugrid" not in managers(queue)
    assert (queue["spec"], queue["metadata"].get("labels")) == (theirs["spec"], None)
    assert "taugrid" not in managers(get(kube, "Namespace", namespace))
    assert get(kube, "ClusterQueue", f"tau-{slug}") is None
    # Their flavor is used as it is.
    cluster_sync = KueueSync.latest("cluster")
    assert cluster_sync is not None
    assert cluster_sync.state == "synced"
    assert f"ResourceFlavor h100-{uid}" in cluster_sync.detail
    flavor = get(kube, "ResourceFlavor", f"h100-{uid}") or {}
    assert "taugrid" not in managers(flavor)
    assert not flavor["spec"]

    # Once they remove their queue, the workspace uses their namespace: labelled, no more.
    kube.delete(KUEUE, "LocalQueue", "main", namespace)
    wait_until(
        "their queue gone", lambda: get(kube, "LocalQueue", "main", namespace) is None or None
    )
    assert sync_kueue(
        kueue_sync.request_sync(scope="workspace", workspace_slug=slug, reason="t").pk
    )
    labelled = get(kube, "Namespace", namespace) or {}
    assert labelled["metadata"]["labels"][WORKSPACE_LABEL] == slug
    assert MANAGED_BY_LABEL not in labelled["metadata"]["labels"]
    assert CREATED_BY_ANNOTATION not in (labelled["metadata"].get("annotations") or {})

    # Deleting the workspace removes its queues, never their namespace (only TauGrid's label),
    # and deleting the flavor row leaves their flavor alone.
    Workspace.unscoped_objects.get(slug=slug).delete()
    ResourceFlavor.objects.filter(name=f"h100-{uid}").delete()
    run_published(kueue_backend)
    assert latest(slug).state == "synced"
    # Deleted, and gone once Kueue's controller has let its finalizer go (a moment; longer
    # when the machine is busy: seen still there right after the sync in a loaded run).
    wait_until(
        "the workspace's ClusterQueue gone",
        lambda: True if get(kube, "ClusterQueue", f"tau-{slug}") is None else None,
        timeout=30,
    )
    kept = get(kube, "Namespace", namespace) or {}
    assert kept["metadata"].get("deletionTimestamp") is None
    assert WORKSPACE_LABEL not in (kept["metadata"].get("labels") or {})
    assert get(kube, "ResourceFlavor", f"h100-{uid}") is not None


@cluster
def test_two_installations_share_a_cluster_and_each_changes_and_removes_only_its_own(
    kueue_backend: list[int], cleanup: None, kube: Kube, uid: str, settings: Any
) -> None:
    """Two portals on one cluster (``TAU_INSTALLATION`` blue and green; one database here, so
    green's rows are blue's rows deleted): what green finds stale but blue made stays."""
    blue, green = f"blue-{uid}", f"green-{uid}"
    slug = f"shared-{uid}"
    settings.TAU_INSTALLATION = blue
    make_workspace(slug, gpu_flavor(uid), 8)
    run_published(kueue_backend)
    assert latest(slug).state == "synced"
    namespace = Workspace.unscoped_objects.get(slug=slug).namespace
    made: dict[str, dict[str, Any]] = {}
    for kind, name, where in (
        ("ClusterQueue", f"tau-{slug}", None),
        ("LocalQueue", slug, namespace),
        ("Namespace", namespace, None),
        ("ResourceFlavor", f"h100-{uid}", None),
    ):
        found = get(kube, kind, name, where)
        assert found is not None, kind
        assert found["metadata"]["labels"][INSTALLATION_LABEL] == blue, kind
        made[kind] = found

    # Green has no such workspace or flavor: to green they are stale, and they are not its.
    settings.TAU_INSTALLATION = green
    Workspace.unscoped_objects.filter(slug=slug).delete()
    ResourceFlavor.objects.filter(name=f"h100-{uid}").delete()
    run_published(kueue_backend)
    assert latest(slug).state == "synced"
    for kind, obj in made.items():
        now = get(kube, kind, obj["metadata"]["name"], obj["metadata"].get("namespace"))
        assert now is not None, kind
        assert now["metadata"].get("deletionTimestamp") is None, kind
        assert now["metadata"]["labels"] == obj["metadata"]["labels"], kind
    # A workspace of green's with the same name is refused, saying whose the queue is.
    make_workspace(slug, gpu_flavor(uid), 4)
    run_published(kueue_backend)
    refused = latest(slug)
    assert refused.state == "failed"
    assert f"belongs to the TauGrid installation {blue!r}, not to this one" in refused.last_error
    assert gpu_quota(get(kube, "ClusterQueue", f"tau-{slug}") or {}) == "8"
    Workspace.unscoped_objects.filter(slug=slug).delete()
    # And so is one of another name in blue's namespace: the namespace keeps blue's labels.
    other = f"other-{uid}"
    make_workspace(other, ResourceFlavor.objects.get(name=f"h100-{uid}"), 4, namespace=namespace)
    run_published(kueue_backend)
    assert latest(other).state == "failed"
    assert f"Namespace {namespace} is another TauGrid installation's" in latest(other).last_error
    labels = (get(kube, "Namespace", namespace) or {})["metadata"]["labels"]
    assert labels == made["Namespace"]["metadata"]["labels"]
    assert get(kube, "ClusterQueue", f"tau-{other}") is None
    Workspace.unscoped_objects.filter(slug=other).delete()
    ResourceFlavor.objects.filter(name=f"h100-{uid}").delete()
    run_published(kueue_backend)

    # Blue, whose rows are gone now too, removes what it made.
    settings.TAU_INSTALLATION = blue
    kueue_sync.request_sync(scope="workspace", workspace_slug=slug, reason="test")
    run_published(kueue_backend)
    assert latest(slug).state == "synced"
    assert going(get(kube, "LocalQueue", slug, namespace))
    assert going(get(kube, "Namespace", namespace))
    wait_until(
        "blue's queue gone", lambda: get(kube, "ClusterQueue", f"tau-{slug}") is None or None
    )
    kueue_sync.request_sync(scope="cluster", reason="test")
    run_published(kueue_backend)
    assert going(get(kube, "ResourceFlavor", f"h100-{uid}"))


def going(obj: dict[str, Any] | None) -> bool:
    """Gone, or being deleted (Kueue's finalizers and namespaces take a moment)."""
    return obj is None or obj["metadata"].get("deletionTimestamp") is not None


@cluster
def test_a_kueue_webhook_refusal_is_the_sync_error_and_nothing_is_half_applied(
    kueue_backend: list[int], cleanup: None, staff: Client, kube: Kube, uid: str
) -> None:
    slug = f"refused-{uid}"
    workspace = make_workspace(
        slug, gpu_flavor(uid), 8, cohort=Cohort.objects.create(name=f"c-{uid}")
    )
    run_published(kueue_backend)
    before = get(kube, "ClusterQueue", f"tau-{slug}")
    # A script past the model's checks (save() without full_clean()): lend more than the
    # nominal quota. Kueue's webhook refuses the ClusterQueue.
    gpu = WorkspaceQuota.objects.for_workspace(workspace).get(resource=GPU)
    gpu.lending_limit = Decimal(9)
    gpu.save()
    run_published(kueue_backend)

    refused = latest(slug)
    assert refused.state == "failed"
    assert refused.last_error.startswith(
        f'ClusterQueue tau-{slug}: admission webhook "vclusterqueue.kb.io" denied the request'
    )
    assert "must be less than or equal to the nominalQuota" in refused.last_error
    after = get(kube, "ClusterQueue", f"tau-{slug}")
    assert resource_version(after) == resource_version(before)

    # The admin shows it, in Kueue's words, on the workspace's page and in the list.
    page = staff.get(reverse("admin:workspaces_workspace_change", args=[workspace.pk]))
    html = page.content.decode()
    assert "must be less than or equal to the nominalQuota" in html
    assert "Sync with Kueue now" in html
    listing = staff.get(reverse("admin:workspaces_workspace_changelist")).content.decode()
    assert "Not in step" in listing

    # Fixed, and synced with the admin's "Sync now" (audited).
    WorkspaceQuota.objects.for_workspace(workspace).filter(pk=gpu.pk).update(lending_limit=2)
    response = staff.post(
        reverse("admin:workspaces_workspace_changelist"),
        {"action": "sync_now", "_selected_action": [str(workspace.pk)]},
    )
    assert response.status_code == 302
    assert (
        AuditEvent.objects.unscoped()
        .filter(action="kueue.sync_requested", workspace_slug=slug)
        .exists()
    )
    run_published(kueue_backend)
    assert latest(slug).state == "synced"
    assert (
        "In step since"
        in staff.get(
            reverse("admin:workspaces_workspace_change", args=[workspace.pk])
        ).content.decode()
    )


# -- a worker killed mid-sync ---------------------------------------------------------------------


def database_url() -> str:
    settings = connection.settings_dict
    if connection.vendor != "postgresql":
        pytest.fail("this test shares its database with a subprocess: run it on PostgreSQL")
    user = quote(str(settings["USER"]), safe="")
    password = quote(str(settings["PASSWORD"]), safe="")
    return (
        f"postgres://{user}:{password}@{settings['HOST'] or '127.0.0.1'}:{settings['PORT'] or 5432}"
        f"/{settings['NAME']}"
    )


WORKER = """
import sys, time
from pathlib import Path
import kube.api
applied = kube.api.KubeClient.apply
def apply(self, body, **kwargs):
    stored = applied(self, body, **kwargs)
    if body["kind"] == "ClusterQueue" and not kwargs.get("dry_run"):
        Path({marker!r}).write_text("applied")
        time.sleep(600)  # killed here: after claiming and the first write, before the outcome
    return stored
kube.api.KubeClient.apply = apply
from executors.kubernetes.tasks import sync_kueue
sync_kueue({sync_id})
"""


@cluster
def test_a_worker_killed_mid_sync_is_completed_by_the_next_reconcile(
    kueue_backend: list[int],
    cleanup: None,
    kube_cluster: KubeCluster,
    kube: Kube,
    uid: str,
    tmp_path: Path,
) -> None:
    slug = f"killed-{uid}"
    make_workspace(slug, gpu_flavor(uid), 8)
    kueue_sync.run_sync(KueueSync.latest("cluster").pk)  # type: ignore[union-attr]
    sync = latest(slug)
    marker = tmp_path / "applied"
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "TAU_BACKEND": "kubernetes",
        "TAU_KUBECONFIG": str(kube_cluster.kubeconfig),
        "TAU_VAR_DIR": str(tmp_path / "var"),
    }
    worker = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "manage.py"),
            "shell",
            "-c",
            WORKER.format(marker=str(marker), sync_id=sync.pk),
        ],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(
            "the worker to claim the sync and apply the ClusterQueue",
            lambda: marker.exists() or None,
            timeout=120,
            describe=lambda: f"worker exit code {worker.poll()}",
        )
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
    assert worker.returncode == -signal.SIGKILL

    claimed = latest(slug)
    assert (claimed.pk, claimed.state, claimed.attempts) == (sync.pk, "pending", 1)
    assert claimed.claimed_at is not None
    assert get(kube, "ClusterQueue", f"tau-{slug}") is not None  # half done:
    assert get(kube, "LocalQueue", slug, f"tau-{slug}") is None  # no queue yet

    # While the claim holds, the reconciler leaves it to its worker.
    assert reconcile_kueue_syncs() == 0
    # The killed worker renews its claim no more: it lapses after the lease (portal.outbox),
    # and the next reconcile completes the sync.
    lapsed = timezone.now() - timedelta(seconds=outbox.lease_seconds() + 1)
    an_hour_ago = timezone.now() - timedelta(hours=1)
    KueueSync.objects.filter(pk=sync.pk).update(claimed_at=lapsed, created_at=an_hour_ago)
    assert reconcile_kueue_syncs() == 1
    done = KueueSync.objects.get(pk=sync.pk)
    assert (done.state, done.attempts, done.claimed_at) == ("synced", 2, None)
    assert list(KueueSync.objects.filter(scope="workspace", workspace_slug=slug)) == [done]
    selector = f"{WORKSPACE_LABEL}={slug}"
    assert len(kube.list(KUEUE, "ClusterQueue", label_selector=selector)) == 1
    assert len(kube.list(KUEUE, "LocalQueue", label_selector=selector)) == 1
    assert len(kube.list("v1", "Namespace", label_selector=selector)) == 1


# -- archiving -----------------------------------------------------------------------------------


@cluster
def test_an_archived_workspace_keeps_its_queues_until_no_run_is_live(
    kueue_backend: list[int], cleanup: None, kube: Kube, uid: str
) -> None:
    slug = f"archive-{uid}"
    workspace = make_workspace(slug, gpu_flavor(uid), 8)
    run_published(kueue_backend)
    job = kube.create(
        batch_job(
            f"last-{uid}", workspace.namespace, workspace.local_queue, 1,
            pod_annotations=KEEP_RUNNING,
        )
    )  # fmt: skip
    wait_until("the job admitted", admitted(kube, job), timeout=KUEUE_TIMEOUT)
    wait_until(
        "Kueue's queue status to count it",
        lambda: (get(kube, "ClusterQueue", f"tau-{slug}") or {}).get("status", {}).get(
            "reservingWorkloads"
        ) or None,
        timeout=KUEUE_TIMEOUT,
    )  # fmt: skip

    workspace.active = False
    workspace.save()
    run_published(kueue_backend)
    waiting = latest(slug)
    assert waiting.state == "waiting"
    assert waiting.detail.startswith("Waiting for 1 live run before the queues are removed.")
    assert get(kube, "ClusterQueue", f"tau-{slug}") is not None

    # The run core's own count (registered by a higher app) is asked too.
    def three_live_runs(archived: Workspace) -> int:
        return 3 if archived.slug == slug else 0

    kueue_cluster.register_live_work_check(three_live_runs)
    try:
        KueueSync.objects.filter(pk=waiting.pk).update(next_try_at=waiting.created_at)
        assert sync_kueue(waiting.pk)
        assert latest(slug).detail.startswith("Waiting for 3 live runs")
    finally:
        kueue_cluster.unregister_live_work_check(three_live_runs)

    # The run ends: the next try removes the queues, and keeps the namespace.
    kube.delete("batch/v1", "Job", job["metadata"]["name"], workspace.namespace)

    def queues_removed() -> KueueSync | None:
        reconcile_kueue_syncs()
        row = latest(slug)
        return row if row.state == "synced" else None

    done = wait_until("the queues removed", queues_removed, timeout=KUEUE_TIMEOUT, interval=1)
    assert "Removed: LocalQueue" in done.detail
    # Deleted; Kueue's finalizer lets the ClusterQueue go once its last reservation is
    # released, which a loaded machine takes a moment to do.
    wait_until(
        "the ClusterQueue gone",
        lambda: True if get(kube, "ClusterQueue", f"tau-{slug}") is None else None,
        timeout=KUEUE_TIMEOUT,
    )
    assert get(kube, "LocalQueue", slug, workspace.namespace) is None
    assert get(kube, "Namespace", workspace.namespace) is not None
    assert (
        AuditEvent.objects.unscoped().filter(action="kueue.removed", workspace_slug=slug).count()
        == 2
    )


# -- without a cluster: the triggers ------------------------------------------------------------


@pytest.mark.django_db
def test_on_the_local_backend_nothing_is_written(settings: Any, uid: str) -> None:
    settings.TAU_BACKEND = "local"
    flavor = ResourceFlavor.objects.create(name=f"f-{uid}")
    make_workspace(f"local-{uid}", flavor, 1)
    assert not KueueSync.objects.exists()
    assert kueue_sync.check_drift() == 0
    assert kueue_sync.reconcile() == 0


@pytest.mark.django_db
def test_every_change_kueue_follows_writes_one_sync_row_in_its_transaction(
    settings: Any, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any
) -> None:
    settings.TAU_BACKEND = "kubernetes"
    published: list[int] = []
    monkeypatch.setattr(kueue_sync, "publish", published.append)
    flavor = ResourceFlavor.objects.create(name="h100")
    cohort = Cohort.objects.create(name="lab")
    with django_capture_on_commit_callbacks(execute=True) as callbacks, transaction.atomic():
        workspace = make_workspace("team", flavor, 8, cohort=cohort)
    # A workspace and three quota rows in one transaction: one row, published once.
    rows = KueueSync.objects.filter(scope="workspace", workspace_slug="team")
    assert rows.count() == 1
    assert len(callbacks) == 1
    assert published == [rows.get().pk]

    # A claimed row is not reused: its worker may have read the rows before this change.
    KueueSync.objects.filter(pk=rows.get().pk).update(claimed_at=timezone.now())
    quota = WorkspaceQuota.objects.for_workspace(workspace).get(resource=GPU)
    quota.nominal = Decimal(16)
    quota.save()
    assert rows.count() == 2
    # A renamed flavor changes every ClusterQueue that names it; a cohort too.
    KueueSync.objects.update(state="synced", claimed_at=None)
    flavor.name = "h100-sxm"
    flavor.save()
    reasons = set(KueueSync.objects.filter(state="pending").values_list("scope", "reason"))
    assert reasons == {
        ("cluster", "resource flavor changed"),
        ("workspace", "resource flavor renamed"),
    }
    # Deleting the workspace asks for the sync that removes its objects.
    KueueSync.objects.update(state="synced")
    workspace.delete()
    assert set(
        KueueSync.objects.filter(state="pending").values_list("workspace_slug", "reason")
    ) == {("team", "workspace deleted")}


@pytest.mark.django_db
def test_sync_now_on_the_change_page_is_audited_and_shown_on_kubernetes_only(
    world: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    staff_client = world.client_for("platform_admin")
    page = reverse("admin:workspaces_workspace_change", args=[world.alpha.pk])
    settings.TAU_BACKEND = "local"
    html = staff_client.get(page).content.decode()
    assert "Sync with Kueue now" not in html
    assert "Kueue sync" not in html

    settings.TAU_BACKEND = "kubernetes"
    published: list[int] = []
    monkeypatch.setattr(kueue_sync, "publish", published.append)
    html = staff_client.get(page).content.decode()
    # The button's form is its own, outside the workspace's form (which saves unchanged).
    assert "action" not in rendered_form(html)
    assert "Not synced yet." in html
    response = staff_client.post(
        reverse("admin:workspaces_workspace_changelist"),
        {"action": "sync_now", "_selected_action": [str(world.alpha.pk)], "_from_change_page": "1"},
    )
    assert (response.status_code, response["Location"]) == (302, page)
    event = AuditEvent.objects.unscoped().get(action="kueue.sync_requested")
    assert (event.workspace_slug, event.actor_username, event.source) == (
        "alpha",
        "platform",
        "admin",
    )
    pending = KueueSync.objects.filter(state="pending").values_list("scope", "workspace_slug")
    assert set(pending) == {("workspace", "alpha"), ("cluster", "")}
    assert "Syncing…" in staff_client.get(page).content.decode()


# -- on the real cluster: the pages show what Kueue has reserved ----------------------------------


@cluster
def test_quota_in_use_on_the_pages_is_what_kueue_reserved(
    kueue_backend: list[int], cleanup: None, kube: Kube, uid: str, django_user_model: Any
) -> None:
    flavor = gpu_flavor(uid)
    workspace = make_workspace(f"use-{uid}", flavor, gpus=8)
    run_published(kueue_backend)
    line = {(u.flavor, u.resource): u for u in usage_lines(workspace)}[(flavor.name, GPU)]
    assert (line.used, line.nominal) == (Decimal(0), Decimal(8))

    job = kube.create(
        batch_job(
            f"held-{uid}",
            workspace.namespace,
            workspace.local_queue,
            gpus=6,
            pod_annotations=KEEP_RUNNING,
        )
    )
    wait_until("the job admitted", admitted(kube, job), timeout=KUEUE_TIMEOUT)

    def reserved() -> Decimal | None:
        lines = {(u.flavor, u.resource): u for u in usage_lines(workspace)}
        used = lines[(flavor.name, GPU)].used
        return used if used else None

    assert wait_until("Kueue's reservation shown", reserved, timeout=KUEUE_TIMEOUT) == Decimal(6)

    member = django_user_model.objects.create_user(username=f"m-{uid}", password=None)
    Membership.objects.create(workspace=workspace, user=member, role=Role.VIEWER)
    client = Client()
    client.force_login(member)
    home = client.get(f"/w/{workspace.slug}/").content.decode()
    row = re.search(rf"{re.escape(GPU)}</td><td class=\"num\">([^<]+)</td>", home)
    assert row is not None, home[:3000]
    assert row.group(1) == "6"
    queue = client.get(f"/w/{workspace.slug}/queue/").content.decode()
    assert "6 of 8" in queue, queue[:3000]


@cluster
def test_lowering_a_quota_below_use_evicts_nothing_and_the_pages_say_so(
    kueue_backend: list[int], cleanup: None, kube: Kube, uid: str, django_user_model: Any
) -> None:
    flavor = gpu_flavor(uid)
    workspace = make_workspace(f"lower-{uid}", flavor, gpus=8)
    run_published(kueue_backend)
    job = kube.create(
        batch_job(
            f"big-{uid}", workspace.namespace, workspace.local_queue, gpus=8,
            pod_annotations=KEEP_RUNNING,
        )
    )  # fmt: skip
    wait_until("the job admitted", admitted(kube, job), timeout=KUEUE_TIMEOUT)

    quota = WorkspaceQuota.objects.for_workspace(workspace).get(resource=GPU)
    quota.nominal = Decimal(4)
    quota.save()
    run_published(kueue_backend)
    assert latest(workspace.slug).state == "synced"
    assert gpu_quota(get(kube, "ClusterQueue", f"tau-{workspace.slug}") or {}) == "4"

    # Kueue keeps the admitted workload: it is not evicted (give it a few seconds to try).
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        workload = workload_of(kube, job)
        assert is_true(workload, "Admitted"), conditions(workload)
        assert not is_true(workload, "Evicted"), conditions(workload)
        time.sleep(0.5)

    member = django_user_model.objects.create_user(username=f"l-{uid}", password=None)
    Membership.objects.create(workspace=workspace, user=member, role=Role.VIEWER)
    client = Client()
    client.force_login(member)
    queue_page = client.get(f"/w/{workspace.slug}/queue/").content.decode()
    assert "8 of 4" in queue_page
    assert "over the quota by 4" in queue_page
    assert "over quota" in client.get(f"/w/{workspace.slug}/").content.decode()


@cluster
def test_workspaces_made_before_the_switch_are_synced_when_the_watcher_starts(
    kueue_backend: list[int], kube: Kube, settings: Any, uid: str, cleanup: None
) -> None:
    """A workspace made while the portal ran the local backend has no sync and no queues on
    the cluster; when the watcher becomes the active one (``kueue_sync.sync_missing``) it is
    synced then, not at the next drift check a minute later. One whose queues exist, or whose
    sync waits to run, is left alone."""
    settings.TAU_BACKEND = "local"
    old = Workspace.unscoped_objects.create(
        slug=f"old-{uid}", name="Made on the local backend", namespace=f"tau-old-{uid}"
    )
    assert not KueueSync.objects.filter(workspace_slug=old.slug).exists()
    settings.TAU_BACKEND = "kubernetes"

    assert old.slug in kueue_sync.sync_missing(reason="the watcher started")
    assert old.slug not in kueue_sync.sync_missing(reason="again")  # its sync waits to run
    run_published(kueue_backend)
    assert kube.get(KUEUE, "ClusterQueue", f"tau-old-{uid}") is not None
    assert kube.get(KUEUE, "LocalQueue", old.local_queue, old.namespace) is not None
    assert old.slug not in kueue_sync.sync_missing(reason="once more")  # on the cluster now
