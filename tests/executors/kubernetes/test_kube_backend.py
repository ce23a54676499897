"""The Kubernetes backend on the real control plane (deploy/cluster: kube-apiserver, Kueue v0.17
with its webhooks and visibility API, the KubeRay operator, kube-scheduler, the garbage
collector, KWOK's fake nodes).

Runs are submitted the way people submit them (``runs.submission.submit``, or HTTP through
the API) and handed to the cluster through the real outbox (``runs.delivery.deliver`` with
the backend the registry gives for ``TAU_BACKEND=kubernetes``); the workspaces are synced to
Kueue by the real sync. What the watcher would do (admit, start, finish an attempt) is done
here through the same run services it calls (``runs.attempts``), and named so where it is.

The one change to what the backend renders: tests that need a pod to keep running put
KWOK's ``taugrid.io/test-duration`` annotation on the pod template (``keep_pods_running``).
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

import kube as adapter
from executors.kubernetes import backend as kube_backend
from executors.kubernetes import kueue_sync, labels, render
from executors.kubernetes import queue as kube_queue
from executors.kubernetes.tasks import sync_kueue
from runs import delivery, submission
from runs.attempts import (
    AttemptOutcome,
    admit_attempt,
    attempt_running,
    finish_attempt,
    note_log_kept,
)
from runs.backends.registry import available_backend_names, backend_named
from runs.delivery import deliver, write_delivery
from runs.lifecycle import cancel_run
from runs.models import Backend, Delivery, FailureClass, Run, RunAttempt, RunState
from tests.cluster.kueue_objects import KUEUE, TEST_DURATION, conditions, workload_of
from tests.cluster.plugin import Kube, KubeCluster, wait_until
from tests.executors.kubernetes.test_cluster_check import PortalIdentity, portal_sa  # noqa: F401 (fixture)
from tests.runs.factories import zip_bytes
from workspaces.models import (
    KueueSync,
    Membership,
    PriorityClass,
    ResourceFlavor,
    Role,
    Workspace,
    WorkspaceQuota,
)

pytestmark = [pytest.mark.django_db(transaction=True)]
cluster = pytest.mark.cluster

JOB = ("batch/v1", "Job")
RAY = ("ray.io/v1", "RayJob")
KWOK_API = "kwok.x-k8s.io/v1alpha1"
H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
#: Kueue's admission and the garbage collector follow in seconds; a loaded machine is slower.
TIMEOUT = 90


def job_spec(name: str, *, cpus: int = 1, workers: int = 1, extra: str = "") -> bytes:
    return (
        f"schema_version: 1\nname: {name}\n"
        "run:\n  entrypoint: train.py\n  workload_kind: job\n"
        f"compute:\n  cpus: {cpus}\n  memory: 1Gi\n  workers: {workers}\n"
        "runtime:\n  image: python:3.12-slim\n" + extra
    ).encode()


RAY_SPEC = b"""schema_version: 1
name: kb-ray
run:
  entrypoint: train.py
  workload_kind: rayjob
compute:
  cpus: 2
  memory: 4Gi
runtime:
  image: rayproject/ray:2.46.0
"""


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture
def uid() -> str:
    return uuid.uuid4().hex[:6]


@dataclass
class Recorded:
    """What would have gone to the broker: delivery ids and Kueue sync ids, in order."""

    deliveries: list[int]
    syncs: list[int]


@pytest.fixture
def cluster_backend(
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    kube_cluster: KubeCluster,
    tmp_path: Path,
    uid: str,
) -> Iterator[Recorded]:
    """``TAU_BACKEND=kubernetes`` against the test cluster. Published deliveries (their ids,
    in order) and Kueue syncs are recorded instead of going to a broker; the test delivers
    them as a worker would. Afterwards every namespace and cluster-wide Kueue object with
    the test's id in its name is deleted (the runs' objects go with their namespaces)."""
    settings.TAU_BACKEND = "kubernetes"
    settings.VAR_DIR = tmp_path
    monkeypatch.setenv("TAU_KUBECONFIG", str(kube_cluster.kubeconfig))
    adapter.reset_client()
    kube_backend.forget_nodes()
    recorded = Recorded(deliveries=[], syncs=[])
    monkeypatch.setattr(delivery, "publish", recorded.deliveries.append)
    monkeypatch.setattr(kueue_sync, "publish", recorded.syncs.append)
    yield recorded
    adapter.reset_client()
    remove_test_objects(kube_cluster, uid)


def remove_test_objects(kube_cluster: KubeCluster, uid: str) -> None:
    """Delete every namespace (with the runs' objects in it), cluster-wide Kueue object and
    KWOK ClusterLogs with ``uid`` in its name, and wait until they are gone: a ClusterQueue
    holding admitted workloads, or a flavor it uses, lingers behind Kueue's finalizers, and
    a later test's cluster-wide Kueue sync would find TauGrid's objects still there."""
    client = adapter.KubeClient(adapter.new_api_client(kube_cluster.kubeconfig))
    kinds = [
        ("v1", "Namespace"),
        (KUEUE, "ClusterQueue"),
        (KUEUE, "ResourceFlavor"),
        (KUEUE, "WorkloadPriorityClass"),
        (KWOK_API, "ClusterLogs"),
    ]

    def left() -> list[tuple[str, str, str]]:
        return [
            (api_version, kind, obj["metadata"]["name"])
            for api_version, kind in kinds
            for obj in client.list(api_version, kind)
            if uid in obj["metadata"]["name"]
        ]

    try:
        for api_version, kind, name in left():
            client.delete(api_version, kind, name, missing_ok=True)
        wait_until(
            "the test's namespaces and Kueue objects to be gone",
            lambda: True if not left() else None,
            timeout=TIMEOUT,
            describe=lambda: str(left()),
        )
    finally:
        client.close()


@dataclass
class Place:
    """A workspace synced to Kueue, with a researcher, and what a test does with them."""

    workspace: Workspace
    user: Any
    flavor: ResourceFlavor
    published: list[int]
    uid: str
    high: str
    low: str

    def submit(self, spec: bytes, files: dict[str, str] | None = None) -> Run:
        bundle = None
        if files is not None:
            bundle = SimpleUploadedFile("project.zip", zip_bytes(files))
        return submission.submit(
            workspace=self.workspace, user=self.user, spec_source=spec, bundle=bundle
        )

    def deliver_all(self, backend: Any = None) -> None:
        while self.published:
            if backend is None:
                deliver(self.published.pop(0))
            else:
                deliver(self.published.pop(0), backend_for=lambda run: backend)

    def api(self) -> APIClient:
        client = APIClient()
        client.force_authenticate(self.user)
        return client

    def browser(self) -> Client:
        client = Client()
        client.force_login(self.user)
        return client

    @property
    def runs_url(self) -> str:
        return f"/api/v1/workspaces/{self.workspace.slug}/runs/"


def make_place(
    cluster_backend: Recorded,
    django_user_model: Any,
    uid: str,
    *,
    prefix: str = "kb",
    cpus: str = "96",
    memory: Decimal = Decimal(2**40),
    storage_claim: str = "",
    flavor: ResourceFlavor | None = None,
) -> Place:
    if flavor is None:
        flavor = ResourceFlavor.objects.create(
            name=f"h100-{uid}",
            gpu_model=H100["nvidia.com/gpu.product"],
            node_labels=dict(H100),
            tolerations=[dict(GPU_TOLERATION)],
        )
    high, low = f"high-{uid}", f"low-{uid}"
    if not PriorityClass.objects.filter(name=high).exists():
        PriorityClass.objects.create(name=high, value=10_000)
        PriorityClass.objects.create(name=low, value=100)
    workspace = Workspace.unscoped_objects.create(
        slug=f"{prefix}-{uid}",
        name=prefix,
        allowed_priorities=[low, high],
        default_priority=low,
        storage_claim=storage_claim,
    )
    amounts = (("nvidia.com/gpu", Decimal(8)), ("cpu", Decimal(cpus)), ("memory", memory))
    for resource, nominal in amounts:
        WorkspaceQuota.objects.create(
            workspace=workspace, flavor=flavor, resource=resource, nominal=nominal
        )
    user = django_user_model.objects.create_user(username=f"researcher-{prefix}-{uid}")
    Membership.objects.create(workspace=workspace, user=user, role=Role.RESEARCHER)
    while cluster_backend.syncs:
        sync_kueue(cluster_backend.syncs.pop(0))
    found = KueueSync.latest(KueueSync.Scope.WORKSPACE, workspace.slug)
    assert found is not None
    assert found.state == "synced", found.last_error
    return Place(workspace, user, flavor, cluster_backend.deliveries, uid, high, low)


@pytest.fixture
def place(cluster_backend: Recorded, django_user_model: Any, uid: str) -> Place:
    return make_place(cluster_backend, django_user_model, uid)


@pytest.fixture
def keep_pods_running(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake nodes complete a Job's pod after 2 s; this keeps it running for 30 minutes
    (KWOK's test annotation on the pod templates, the only change to what is rendered)."""
    original = render.render_workload

    def rendered(spec: Any, target: Any) -> dict[str, Any]:
        workload = original(spec, target)
        templates = (
            [workload["spec"]["template"]]
            if workload["kind"] == "Job"
            else [
                workload["spec"]["rayClusterSpec"]["headGroupSpec"]["template"],
                *[g["template"] for g in workload["spec"]["rayClusterSpec"]["workerGroupSpecs"]],
                workload["spec"]["submitterPodTemplate"],
            ]
        )
        for template in templates:
            template["metadata"].setdefault("annotations", {})[TEST_DURATION] = "30m"
        return workload

    monkeypatch.setattr(render, "render_workload", rendered)


# -- helpers ---------------------------------------------------------------------------------------


def attempt_of(run: Run, number: int | None = None) -> RunAttempt:
    attempts = RunAttempt.objects.unscoped().filter(run=run).order_by("-number")
    return attempts.get(number=number) if number else attempts[0]


def fresh(run: Run) -> Run:
    return Run.objects.unscoped().select_related("workspace").get(pk=run.pk)


def objects_of(
    kube: Kube, run: Run, kind: tuple[str, str], namespace: str | None = None
) -> list[dict[str, Any]]:
    """The run's objects of ``kind`` (in every namespace by default). Selected by the run's
    name as well as its id: ids start again in each test database, while objects of an
    earlier session may still be on their way out of the cluster."""
    selector = f"{labels.RUN_ID}={run.pk},{labels.RUN}={run.name},{labels.MANAGED_BY}=taugrid"
    return kube.list(kind[0], kind[1], namespace, label_selector=selector)


def gone(kube: Kube, kind: tuple[str, str], name: str, namespace: str) -> Callable[[], bool | None]:
    return lambda: True if kube.get(kind[0], kind[1], name, namespace) is None else None


def pods_of_attempt(kube: Kube, run: Run, attempt: int) -> list[dict[str, Any]]:
    return kube.list(
        "v1",
        "Pod",
        run.workspace.namespace,
        label_selector=f"{labels.RUN_ID}={run.pk},{labels.ATTEMPT}={attempt}",
    )


def running_pod(kube: Kube, run: Run, attempt: int) -> Callable[[], dict[str, Any] | None]:
    def probe() -> dict[str, Any] | None:
        for pod in pods_of_attempt(kube, run, attempt):
            if (pod.get("status") or {}).get("phase") == "Running":
                return pod
        return None

    return probe


def admitted(kube: Kube, workload: dict[str, Any]) -> Callable[[], dict[str, Any] | None]:
    def probe() -> dict[str, Any] | None:
        found = workload_of(kube, workload)
        status = conditions(found).get("Admitted", {}).get("status")
        return found if status == "True" else None

    return probe


def secret_token(kube: Kube, run: Run, attempt: int) -> str:
    name = render.run_token_secret_name(run.name, attempt)
    secret = kube.get("v1", "Secret", name, run.workspace.namespace)
    assert secret is not None
    return base64.b64decode(secret["data"][render.RUN_TOKEN_KEY]).decode()


def watcher_starts(run: Run) -> RunAttempt:
    """What the watcher does when Kueue admits the attempt and its pods run (the run
    services it calls)."""
    attempt = admit_attempt(run=run)
    attempt_running(attempt=attempt)
    return attempt


# -- submit: objects, labels, idempotency, admission ---------------------------------------------


@cluster
def test_delivering_a_job_creates_its_secret_and_job_once_and_kueue_runs_it(
    place: Place, kube: Kube, keep_pods_running: None
) -> None:
    assert Backend.KUBERNETES in available_backend_names()
    run = place.submit(
        job_spec("kb-job", extra=f"queue:\n  priority: {place.high}\n"),
        files={"train.py": "print('hi')\n"},
    )
    assert run.backend == Backend.KUBERNETES
    assert run.state == RunState.PENDING
    started = time.monotonic()
    place.deliver_all()
    took = time.monotonic() - started
    print(f"\ndelivery of a Job run (Job + Secret) took {took:.2f}s")

    namespace = place.workspace.namespace
    name = f"{run.name}-a1"
    job = kube.get(*JOB, name, namespace)
    assert job is not None
    assert job["metadata"]["labels"] == {
        labels.MANAGED_BY: "taugrid",
        labels.WORKSPACE: place.workspace.slug,
        labels.RUN: run.name,
        labels.RUN_ID: str(run.pk),
        labels.ATTEMPT: "1",
        labels.SPEC_NAME: "kb-job",
        labels.KUEUE_QUEUE_NAME: place.workspace.local_queue,
        labels.KUEUE_PRIORITY_CLASS: place.high,
    }
    bundle = fresh(run).bundle
    assert bundle is not None
    assert job["metadata"]["annotations"][labels.BUNDLE_SHA256] == bundle.sha256
    secret = kube.get("v1", "Secret", f"{name}-run-token", namespace)
    assert secret is not None
    assert secret["metadata"]["labels"][labels.RUN_ID] == str(run.pk)
    assert secret["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": name,
            "uid": job["metadata"]["uid"],
            "blockOwnerDeletion": True,
        }
    ]
    # The Secret holds the attempt's own token (the only place its plaintext went).
    attempt = attempt_of(run)
    assert attempt.token is not None
    assert attempt.token.revoked_at is None
    run = fresh(run)
    assert run.state == RunState.QUEUED
    assert "Waiting for Kueue" in run.state_reason
    assert attempt.backend_name == f"Job/{name}"

    # Delivered again (a lost acknowledgement, a reconciler): still one set, nothing changed.
    token_before = attempt.token_id
    write_delivery(run=run, action=Delivery.Action.SUBMIT, attempt=attempt)
    place.deliver_all()
    assert [j["metadata"]["uid"] for j in objects_of(kube, run, JOB)] == [job["metadata"]["uid"]]
    again = kube.get("v1", "Secret", f"{name}-run-token", namespace)
    assert again is not None
    assert again["metadata"]["resourceVersion"] == secret["metadata"]["resourceVersion"]
    assert attempt_of(run).token_id == token_before

    # The run's objects exist in its workspace's namespace only.
    for kind in (JOB, ("v1", "Secret")):
        assert {o["metadata"]["namespace"] for o in objects_of(kube, run, kind)} == {namespace}

    # Kueue admits it with the priority class, and its pod runs on a fake H100 node.
    workload = wait_until("the Job admitted", admitted(kube, job), timeout=TIMEOUT)
    assert workload["spec"]["priorityClassRef"]["name"] == place.high
    pod = wait_until("its pod running", running_pod(kube, run, 1), timeout=TIMEOUT)
    assert pod["spec"]["nodeName"].startswith("gpu-h100-")
    assert pod["metadata"]["labels"][labels.COMPONENT] == labels.COMPONENT_WORKER

    # Cancelled while running: the run is cancelling; the delivery deletes the Job in the
    # foreground, so the Job goes only after its pod and Secret.
    watcher_starts(run)
    cancelled = cancel_run(run=run, user=place.user)
    assert cancelled.state == RunState.CANCELLING
    place.deliver_all()
    deleting = kube.get(*JOB, name, namespace)
    assert deleting is None or deleting["metadata"].get("deletionTimestamp")
    wait_until("the Job gone", gone(kube, JOB, name, namespace), timeout=TIMEOUT)
    assert pods_of_attempt(kube, run, 1) == []
    assert kube.get("v1", "Secret", f"{name}-run-token", namespace) is None
    assert fresh(run).state == RunState.CANCELLING  # until the watcher sees it gone:
    finish_attempt(attempt=attempt_of(run), outcome=AttemptOutcome(succeeded=False, cancelled=True))
    assert fresh(run).state == RunState.CANCELLED


@cluster
def test_a_rayjob_run_gets_its_rayjob_and_secret_and_cancel_removes_them(
    place: Place, kube: Kube
) -> None:
    run = place.submit(RAY_SPEC)
    place.deliver_all()
    namespace = place.workspace.namespace
    name = f"{run.name}-a1"
    rayjob = kube.get(*RAY, name, namespace)
    assert rayjob is not None, fresh(run).state_reason
    assert rayjob["metadata"]["labels"][labels.KUEUE_QUEUE_NAME] == place.workspace.local_queue
    assert rayjob["metadata"]["labels"][labels.KUEUE_PRIORITY_CLASS] == place.low  # the default
    assert rayjob["metadata"]["labels"][labels.ATTEMPT] == "1"
    secret = kube.get("v1", "Secret", f"{name}-run-token", namespace)
    assert secret is not None
    assert secret["metadata"]["ownerReferences"][0]["kind"] == "RayJob"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == rayjob["metadata"]["uid"]
    write_delivery(run=run, action=Delivery.Action.SUBMIT, attempt=attempt_of(run))
    place.deliver_all()
    assert len(objects_of(kube, run, RAY)) == 1

    wait_until("the RayJob admitted", admitted(kube, rayjob), timeout=TIMEOUT)
    # KubeRay builds its Ray cluster: the head and worker pods run on fake nodes.
    wait_until(
        "the Ray cluster's pods running",
        lambda: (lambda pods: pods if len(pods) >= 2 else None)(
            [p for p in pods_of_attempt(kube, run, 1) if p["status"].get("phase") == "Running"]
        ),
        timeout=TIMEOUT,
    )
    watcher_starts(fresh(run))
    assert cancel_run(run=fresh(run), user=place.user).state == RunState.CANCELLING
    place.deliver_all()
    wait_until("the RayJob gone", gone(kube, RAY, name, namespace), timeout=TIMEOUT)
    wait_until(
        "its Secret collected",
        gone(kube, ("v1", "Secret"), f"{name}-run-token", namespace),
        timeout=TIMEOUT,
    )
    wait_until(
        "its Ray cluster's pods gone",
        lambda: True if not pods_of_attempt(kube, run, 1) else None,
        timeout=TIMEOUT,
    )


# -- queue position, cancel before admission --------------------------------------------------


@cluster
def test_over_quota_runs_show_kueue_s_positions_one_call_per_queue(
    cluster_backend: Recorded,
    django_user_model: Any,
    uid: str,
    kube: Kube,
    keep_pods_running: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    place = make_place(cluster_backend, django_user_model, uid, prefix="kq", cpus="2")
    first = place.submit(job_spec("kq-first", cpus=2))
    place.deliver_all()
    first_job = kube.get(*JOB, f"{first.name}-a1", place.workspace.namespace)
    assert first_job is not None
    wait_until("the first run admitted", admitted(kube, first_job), timeout=TIMEOUT)
    watcher_starts(fresh(first))  # what the watcher records when its pod runs
    second = place.submit(job_spec("kq-second", cpus=2))
    place.deliver_all()
    # Kueue orders equal priorities by creation time, which has whole seconds.
    time.sleep(1.1)
    third = place.submit(job_spec("kq-third", cpus=2))
    place.deliver_all()

    def listed() -> list[Any] | None:
        path = kube_queue.pending_workloads_path(
            place.workspace.namespace, place.workspace.local_queue
        )
        items = kube.raw_get(path).get("items") or []
        return items if len(items) == 2 else None

    wait_until("Kueue's visibility API to list both", listed, timeout=TIMEOUT)

    calls: list[str] = []
    real_get_path = adapter.KubeClient.get_path

    def counted(self: adapter.KubeClient, path: str, **kwargs: Any) -> dict[str, Any]:
        calls.append(path)
        return real_get_path(self, path, **kwargs)

    monkeypatch.setattr(adapter.KubeClient, "get_path", counted)

    answer = place.api().get(place.runs_url)
    assert answer.status_code == 200
    positions = {row["name"]: row["queue_position"] for row in answer.json()["results"]}
    assert positions == {first.name: None, second.name: 1, third.name: 2}
    assert len(calls) == 1
    assert calls[0].endswith(f"/localqueues/{place.workspace.local_queue}/pendingworkloads")

    calls.clear()
    detail = place.api().get(f"{place.runs_url}{third.name}/")
    assert detail.json()["queue_position"] == 2
    assert len(calls) == 1

    calls.clear()
    browser = place.browser()
    page = browser.get(f"/w/{place.workspace.slug}/queue/").content.decode()
    assert len(calls) == 1
    assert page.index(second.name) < page.index(third.name)
    assert "#1" in page
    assert "#2" in page
    calls.clear()
    run_page = browser.get(f"/w/{place.workspace.slug}/runs/{third.name}/").content.decode()
    assert "position 2 in the queue" in run_page
    assert len(calls) == 1
    calls.clear()
    listing = browser.get(f"/w/{place.workspace.slug}/runs/").content.decode()
    assert len(calls) == 1
    assert "#2" in listing

    # Kueue's visibility API does not answer (the aggregator's 503 while the Kueue manager
    # is down): TauGrid's own order, and the pages say so.
    def unavailable(self: adapter.KubeClient, path: str, **kwargs: Any) -> dict[str, Any]:
        calls.append(path)
        raise adapter.Unavailable(
            "the server is currently unable to handle the request", status=503
        )

    monkeypatch.setattr(adapter.KubeClient, "get_path", unavailable)
    answer = place.api().get(place.runs_url)
    positions = {row["name"]: row["queue_position"] for row in answer.json()["results"]}
    assert positions == {first.name: None, second.name: 1, third.name: 2}
    page = browser.get(f"/w/{place.workspace.slug}/queue/").content.decode()
    assert (
        "Kueue&#x27;s queue could not be read" in page or "Kueue's queue could not be read" in page
    )
    run_page = browser.get(f"/w/{place.workspace.slug}/runs/{third.name}/").content.decode()
    assert "could not be read" in run_page
    assert "position 2 in the queue" in run_page
    monkeypatch.setattr(adapter.KubeClient, "get_path", real_get_path)

    # Cancelled before admission: cancelled at once; the delivery deletes its Job, and the
    # Secret goes with it.
    cancelled = cancel_run(run=fresh(third), user=place.user)
    assert cancelled.state == RunState.CANCELLED
    place.deliver_all()
    namespace = place.workspace.namespace
    wait_until("its Job gone", gone(kube, JOB, f"{third.name}-a1", namespace), timeout=TIMEOUT)
    wait_until(
        "its Secret collected",
        gone(kube, ("v1", "Secret"), f"{third.name}-a1-run-token", namespace),
        timeout=TIMEOUT,
    )
    assert attempt_of(third).state == RunAttempt.State.CANCELLED
    assert attempt_of(third).token.revoked_at is not None  # type: ignore[union-attr]
    answer = place.api().get(place.runs_url)
    positions = {row["name"]: row["queue_position"] for row in answer.json()["results"]}
    assert positions[second.name] == 1


# -- tokens, checkpoints, the second attempt -------------------------------------------------


@cluster
def test_a_second_attempt_gets_new_objects_resuming_from_the_reported_checkpoint(
    cluster_backend: Recorded, django_user_model: Any, uid: str, kube: Kube
) -> None:
    place = make_place(
        cluster_backend, django_user_model, uid, prefix="kr", storage_claim="team-data"
    )
    spec = job_spec(
        "kr-job",
        extra="resilience:\n  max_retries: 2\n  retry_on: [node_failure]\n"
        "  backoff: {initial: 1s, max: 1s}\n",
    )
    run = place.submit(spec)
    other = place.submit(job_spec("kr-other"), files={"train.py": "print(1)\n"})
    place.deliver_all()
    namespace = place.workspace.namespace
    first = kube.get(*JOB, f"{run.name}-a1", namespace)
    assert first is not None
    volumes = {v["name"]: v for v in first["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tau-data"]["persistentVolumeClaim"] == {"claimName": "team-data"}
    mounts = {
        m["mountPath"]: m["subPath"]
        for m in first["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
        if m["name"] == "tau-data"
    }
    assert mounts == {
        "/tau/outputs": f"runs/{run.name}/outputs/attempt-1",
        "/tau/checkpoints": f"runs/{run.name}/checkpoints",
    }

    # The token in the attempt's Secret reports on its run, over HTTP...
    token = secret_token(kube, run, 1)
    workload = APIClient()
    workload.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    base = place.runs_url
    reported = workload.post(
        f"{base}{run.name}/report/checkpoints/",
        {"step": 400, "path": "/tau/checkpoints/step-400"},
        format="json",
    )
    assert reported.status_code == 201, reported.content
    assert (
        workload.post(
            f"{base}{run.name}/report/metrics/", {"rows": [{"step": 1, "loss": 0.5}]}, format="json"
        ).status_code
        == 202
    )
    # ...and reaches no other run: not its reports, not its code, not the runs API.
    assert (
        workload.post(
            f"{base}{other.name}/report/checkpoints/", {"step": 1, "path": "x"}, format="json"
        ).status_code
        == 404
    )
    assert workload.get(f"{base}{other.name}/bundle/").status_code == 404
    assert workload.get(f"{base}{other.name}/").status_code in {403, 404}
    assert workload.get(base).status_code in {403, 404}

    # The watcher sees the first attempt fail on a broken node (the run services it calls):
    # a retry is due, handed over as attempt 2, from the reported checkpoint.
    attempt = watcher_starts(fresh(run))
    finish_attempt(
        attempt=attempt,
        outcome=AttemptOutcome(
            succeeded=False, failure_class=FailureClass.NODE_FAILURE, message="node lost"
        ),
    )
    retried = fresh(run)
    assert retried.state == RunState.QUEUED
    assert retried.attempt_count == 2
    assert attempt_of(run, 2).resume_from is not None
    held = list(place.published)
    place.deliver_all()  # too early: the retry waits out its backoff (1 s) first
    assert kube.get(*JOB, f"{run.name}-a2", namespace) is None
    not_before = retried.not_before
    assert not_before is not None
    wait_until(
        "the retry's backoff over",
        lambda: True if timezone.now() >= not_before else None,
        timeout=10,
    )
    place.published.extend(held)
    place.deliver_all()

    second = kube.get(*JOB, f"{run.name}-a2", namespace)
    assert second is not None
    assert second["metadata"]["labels"][labels.ATTEMPT] == "2"
    env = {
        e["name"]: e.get("value")
        for e in second["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["TAU_RESUME_FROM"] == "/tau/checkpoints/step-400"
    assert env["TAU_ATTEMPT"] == "2"
    assert env["TAU_RETRY_REASON"] == "node_failure"
    new_secret = kube.get("v1", "Secret", f"{run.name}-a2-run-token", namespace)
    assert new_secret is not None
    assert new_secret["metadata"]["ownerReferences"][0]["uid"] == second["metadata"]["uid"]
    assert secret_token(kube, run, 2) != token
    # The first attempt's objects are deleted with it.
    wait_until(
        "attempt 1's Job gone", gone(kube, JOB, f"{run.name}-a1", namespace), timeout=TIMEOUT
    )
    wait_until(
        "attempt 1's Secret collected",
        gone(kube, ("v1", "Secret"), f"{run.name}-a1-run-token", namespace),
        timeout=TIMEOUT,
    )
    assert [o["metadata"]["name"] for o in objects_of(kube, run, JOB)] == [f"{run.name}-a2"]


# -- logs ----------------------------------------------------------------------------------------


@cluster
def test_a_job_pod_s_log_is_read_through_pods_log(
    place: Place, kube: Kube, keep_pods_running: None, tmp_path: Path
) -> None:
    namespace = place.workspace.namespace
    log_file = tmp_path / "train.log"
    lines = ["step 1 loss=0.9", "step 2 loss=0.7", "done ✓"]
    log_file.write_text(
        "".join(
            f"2026-12-01T12:00:0{i}.000000000Z stdout F {line}\n" for i, line in enumerate(lines)
        )
    )
    kube.create(
        {
            "apiVersion": KWOK_API,
            "kind": "ClusterLogs",
            "metadata": {"name": f"kb-logs-{place.uid}"},
            "spec": {
                "selector": {"matchNamespaces": [namespace]},
                "logs": [{"logsFile": str(log_file)}],
            },
        }
    )
    run = place.submit(job_spec("kb-logs"))
    place.deliver_all()
    pod = wait_until("its pod running", running_pod(kube, run, 1), timeout=TIMEOUT)
    watcher_starts(fresh(run))

    api = place.api()
    url = f"{place.runs_url}{run.name}/logs/"

    def log_text() -> dict[str, Any] | None:
        answer = api.get(url).json()
        return answer if answer["text"] else None

    chunk = wait_until("the log through pods/log", log_text, timeout=60)
    assert chunk["text"] == "".join(f"{line}\n" for line in lines)
    assert chunk["pod"] == pod["metadata"]["name"]
    assert chunk["pods"] == [chunk["pod"]]
    assert chunk["attempt"] == 1
    assert chunk["complete"] is False
    assert chunk["note"] == ""
    assert api.get(url, {"tail": 1}).json()["text"] == f"{lines[-1]}\n"
    following = api.get(url, {"offset": chunk["next_offset"]}).json()
    assert following["text"] == ""
    assert following["offset"] == chunk["size"]
    whole = api.get(url, {"format": "text", "pod": chunk["pod"]})
    assert b"".join(whole.streaming_content).decode() == chunk["text"]  # type: ignore[attr-defined]
    assert (
        api.get(url, {"pod": "no-such-pod"}).json()["note"].endswith("no pod called no-such-pod.")
    )


@cluster
def test_each_worker_s_log_is_read_and_kept_when_the_attempt_ends(
    place: Place, kube: Kube, keep_pods_running: None, tmp_path: Path, settings: Any
) -> None:
    settings.VAR_DIR = tmp_path / "var"
    namespace = place.workspace.namespace
    run = place.submit(job_spec("kb-two", workers=2))
    place.deliver_all()

    def both_running() -> list[dict[str, Any]] | None:
        pods = pods_of_attempt(kube, run, 1)
        running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
        return running if len(running) == 2 else None

    pods = wait_until("both workers running", both_running, timeout=TIMEOUT)
    watcher_starts(fresh(run))
    # What each fake kubelet prints for its pod (KWOK's Logs, named like the pod).
    texts = {}
    for pod in pods:
        name = pod["metadata"]["name"]
        rank = pod["metadata"]["annotations"][labels.JOB_COMPLETION_INDEX]
        texts[name] = f"rank {rank} of 2 ready\n"
        log_file = tmp_path / f"{name}.log"
        log_file.write_text(f"2026-12-01T12:00:00.000000000Z stdout F rank {rank} of 2 ready\n")
        kube.create(
            {
                "apiVersion": KWOK_API,
                "kind": "Logs",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"logs": [{"logsFile": str(log_file)}]},
            }
        )
    api = place.api()
    url = f"{place.runs_url}{run.name}/logs/"

    def text_of(pod: str | None = None) -> Callable[[], dict[str, Any] | None]:
        def read() -> dict[str, Any] | None:
            answer = api.get(url, {"pod": pod} if pod else {}).json()
            return answer if answer["text"] else None

        return read

    first = wait_until("worker 0's log", text_of(), timeout=60)
    order = first["pods"]
    assert len(order) == 2
    assert first["pod"] == order[0]
    assert first["text"] == texts[order[0]] == "rank 0 of 2 ready\n"
    second = wait_until("worker 1's log", text_of(order[1]), timeout=60)
    assert (second["pod"], second["text"]) == (order[1], "rank 1 of 2 ready\n")

    # The attempt ends; the watcher keeps every pod's log before Kubernetes deletes them.
    attempt = attempt_of(run)
    finish_attempt(attempt=attempt, outcome=AttemptOutcome(succeeded=True, exit_code=0))
    attempt = attempt_of(run)
    backend = kube_backend.KubernetesBackend()
    kept = backend.archive_log(fresh(run), attempt)
    assert kept is not None
    path, size = kept
    note_log_kept(attempt_id=attempt.pk, path=str(path), size=size)
    backend.client.delete(*JOB, f"{run.name}-a1", namespace, propagation="Background")
    wait_until("the pods gone", lambda: not pods_of_attempt(kube, run, 1) or None, timeout=TIMEOUT)

    for query, text in (({}, texts[order[0]]), ({"pod": order[1]}, texts[order[1]])):
        answer = api.get(url, query).json()
        assert (answer["text"], answer["pods"], answer["complete"]) == (text, order, True), query
        whole = api.get(url, {"format": "text", **query})
        assert b"".join(whole.streaming_content).decode() == text  # type: ignore[attr-defined]
    missing = api.get(url, {"pod": "kb-two-other"}).json()
    assert missing["note"] == "The log of pod kb-two-other was not kept when the attempt ended."


@cluster
def test_a_pod_without_a_log_says_so_live_and_once_kept(
    place: Place, kube: Kube, keep_pods_running: None, tmp_path: Path, settings: Any
) -> None:
    """A fake node keeps no log for a pod nobody gave one (no container runs on the test
    cluster): the API's ``note`` says so in words, instead of "could not be read" with the
    node's error, and still says it once the log was kept at the attempt's end."""
    settings.VAR_DIR = tmp_path / "var"
    run = place.submit(job_spec("kb-nolog"))
    place.deliver_all()
    pod = wait_until("its pod running", running_pod(kube, run, 1), timeout=TIMEOUT)
    watcher_starts(fresh(run))
    name = pod["metadata"]["name"]
    api = place.api()
    url = f"{place.runs_url}{run.name}/logs/"
    answer = api.get(url).json()
    assert (answer["text"], answer["pod"]) == ("", name)
    assert answer["note"] == f"{name} has no log: its node keeps none for it."

    attempt = attempt_of(run)
    finish_attempt(attempt=attempt, outcome=AttemptOutcome(succeeded=True, exit_code=0))
    attempt = attempt_of(run)
    kept = kube_backend.KubernetesBackend().archive_log(fresh(run), attempt)
    assert kept is not None
    assert kept[1] == 0
    note_log_kept(attempt_id=attempt.pk, path=str(kept[0]), size=kept[1])
    answer = api.get(url).json()
    assert (answer["text"], answer["complete"]) == ("", True)
    assert answer["note"] == f"{name} has no log: its node keeps none for it."


@cluster
def test_a_pod_that_never_started_says_why(
    cluster_backend: Recorded, django_user_model: Any, uid: str, kube: Kube
) -> None:
    # A flavor whose nodes do not exist: Kueue admits on quota, the scheduler finds no node.
    nowhere = ResourceFlavor.objects.create(
        name=f"nowhere-{uid}", node_labels={"taugrid.io/node-pool": f"nowhere-{uid}"}
    )
    place = make_place(cluster_backend, django_user_model, uid, prefix="kn", flavor=nowhere)
    run = place.submit(job_spec("kn-job"))
    place.deliver_all()

    def pending_pod() -> dict[str, Any] | None:
        pods = pods_of_attempt(kube, run, 1)
        return pods[0] if pods else None

    wait_until("its pod created", pending_pod, timeout=TIMEOUT)
    api = place.api()
    url = f"{place.runs_url}{run.name}/logs/"

    def explained() -> dict[str, Any] | None:
        answer = api.get(url).json()
        return answer if "not scheduled" in answer["note"] else None

    chunk = wait_until("the reason in the log's note", explained, timeout=TIMEOUT)
    print(f"\nnote of a pod that never started: {chunk['note']}")
    assert chunk["text"] == ""
    assert "node affinity/selector" in chunk["note"] or "didn't match" in chunk["note"]


# -- as the portal's ServiceAccount, with nothing but the shipped ClusterRole --------------------


@cluster
def test_the_backend_works_as_the_serviceaccount_bound_to_the_shipped_role(
    place: Place,
    kube: Kube,
    portal_sa: PortalIdentity,  # noqa: F811 (the fixture imported above)
    keep_pods_running: None,
    tmp_path: Path,
) -> None:
    """Submit (a two-worker Job: Job, token Secret, rendezvous Service), the node check, the
    visibility API, logs and cancel, all through a client impersonating a ServiceAccount bound
    only to a copy of deploy/rbac/clusterrole.yaml."""
    backend = kube_backend.KubernetesBackend(client=portal_sa.client)
    namespace = place.workspace.namespace
    log_file = tmp_path / "worker.log"
    log_file.write_text("2026-12-01T12:00:00.000000000Z stdout F rank ready\n")
    kube.create(
        {
            "apiVersion": KWOK_API,
            "kind": "ClusterLogs",
            "metadata": {"name": f"kb-sa-logs-{place.uid}"},
            "spec": {
                "selector": {"matchNamespaces": [namespace]},
                "logs": [{"logsFile": str(log_file)}],
            },
        }
    )
    spec = job_spec("kb-sa", workers=2)
    kube_backend.forget_nodes()
    from tau.spec import load_spec

    assert backend.submission_problems(load_spec(spec), place.workspace) == []
    run = place.submit(spec)
    place.deliver_all(backend)
    name = f"{run.name}-a1"
    assert kube.get(*JOB, name, namespace) is not None, fresh(run).state_reason
    assert kube.get("v1", "Service", name, namespace) is not None
    assert kube.get("v1", "Secret", f"{name}-run-token", namespace) is not None
    assert fresh(run).state == RunState.QUEUED
    path = kube_queue.pending_workloads_path(namespace, place.workspace.local_queue)
    assert "items" in portal_sa.client.get_path(path)

    wait_until(
        "both workers running",
        lambda: (lambda pods: pods if len(pods) == 2 else None)(
            [p for p in pods_of_attempt(kube, run, 1) if p["status"].get("phase") == "Running"]
        ),
        timeout=TIMEOUT,
    )
    attempt = watcher_starts(fresh(run))
    chunk = wait_until(
        "a worker's log",
        lambda: (lambda c: c if c.text else None)(
            backend.read_log(fresh(run), attempt, offset=None, tail_lines=None)
        ),
        timeout=60,
    )
    assert chunk.text == "rank ready\n"
    assert len(chunk.pods) == 2
    assert chunk.pod == chunk.pods[0]
    assert chunk.pod.startswith(f"{name}-0-")  # the first worker (completion index 0)

    cancel_run(run=fresh(run), user=place.user)
    place.deliver_all(backend)
    wait_until("the Job gone", gone(kube, JOB, name, namespace), timeout=TIMEOUT)
    wait_until(
        "its Service collected", gone(kube, ("v1", "Service"), name, namespace), timeout=TIMEOUT
    )


# -- submission --------------------------------------------------------------------------------


@cluster
def test_submission_refuses_a_worker_no_node_could_hold(
    cluster_backend: Recorded, django_user_model: Any, uid: str
) -> None:
    place = make_place(
        cluster_backend, django_user_model, uid, prefix="kf", cpus="1000", memory=Decimal(2**44)
    )
    with pytest.raises(submission.SubmissionRefused) as refused:
        submission.check_spec(job_spec("kf-big", cpus=200), workspace=place.workspace)
    (problem,) = [p for p in refused.value.problems if p.path == "compute.cpus"]
    assert "the largest node of this cluster" in problem.message
    assert problem.line is not None

    answer = place.api().post(
        place.runs_url,
        {"spec": SimpleUploadedFile("tau.yaml", job_spec("kf-big", cpus=200))},
        format="multipart",
    )
    assert answer.status_code == 400
    assert "compute.cpus" in {p["path"] for p in answer.json()["problems"]}

    # A flavor whose labels no node has: a GPU run on it could never be placed.
    ghost = ResourceFlavor.objects.create(
        name=f"ghost-{uid}", node_labels={"nvidia.com/gpu.product": "NVIDIA-B200"}
    )
    WorkspaceQuota.objects.create(
        workspace=place.workspace, flavor=ghost, resource="nvidia.com/gpu", nominal=Decimal(8)
    )
    spec = job_spec("kf-ghost").replace(
        b"  memory: 1Gi\n", f"  memory: 1Gi\n  gpus: 1\n  gpu_type: {ghost.name}\n".encode()
    )
    with pytest.raises(submission.SubmissionRefused) as refused:
        submission.check_spec(spec, workspace=place.workspace)
    assert any(
        p.path == "compute.gpu_type" and "No node of this cluster has the labels" in p.message
        for p in refused.value.problems
    ), refused.value.problems


@cluster
def test_an_api_submission_on_kubernetes_is_accepted_and_handed_over(
    place: Place, kube: Kube
) -> None:
    answer = place.api().post(
        place.runs_url,
        {
            "spec": SimpleUploadedFile("tau.yaml", job_spec("kb-api")),
            "bundle": SimpleUploadedFile("p.zip", zip_bytes({"train.py": "print(1)\n"})),
        },
        format="multipart",
    )
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert body["backend"] == "kubernetes"
    assert body["state"] == "pending"
    # The workspace keeps no checkpoints between attempts: the answer says so.
    assert any("no storage for checkpoints" in warning for warning in body["warnings"])
    run = Run.objects.unscoped().get(name=body["name"])
    (handover,) = Delivery.objects.unscoped().filter(run=run)
    assert handover.action == Delivery.Action.SUBMIT
    assert handover.delivered_at is None
    assert place.published == [handover.pk]
    place.deliver_all()
    assert kube.get(*JOB, f"{run.name}-a1", place.workspace.namespace) is not None
    assert fresh(run).state == RunState.QUEUED
    assert backend_named("kubernetes").name == "kubernetes"
    # The submit page's preview says it too, before anything is submitted.
    preview = place.browser().post(
        f"/w/{place.workspace.slug}/runs/validate/",
        {"spec_text": job_spec("kb-api").decode()},
        HTTP_HX_REQUEST="true",
    )
    assert preview.status_code == 200
    assert "no storage for checkpoints" in preview.content.decode()


# -- without a cluster: the pieces the tests above rely on ---------------------------------------


def node(
    name: str, *, gpus: int = 0, cpus: str = "32", memory: str = "128Gi", **node_labels: str
) -> kube_backend.NodeCapacity:
    from tau.quantity import parse_quantity

    return kube_backend.NodeCapacity(
        name=name,
        labels=node_labels,
        allocatable={
            "nvidia.com/gpu": Decimal(gpus),
            "cpu": parse_quantity(cpus),
            "memory": parse_quantity(memory),
        },
    )


def spec_of(source: bytes) -> Any:
    from tau.spec import load_spec

    return load_spec(source)


def test_never_fits_names_the_resource_no_node_has_enough_of(world: Any) -> None:
    nodes = [node("gpu-1", gpus=8, cpus="96", memory="1800Gi"), node("cpu-1")]
    fits = spec_of(job_spec("fits", cpus=64))
    assert kube_backend.never_fits(fits, nodes) == []
    too_many_cpus = kube_backend.never_fits(spec_of(job_spec("big", cpus=200)), nodes)
    assert [path for path, _ in too_many_cpus] == ["compute.cpus"]
    assert "the largest node of this cluster (gpu-1) has 96 CPUs" in too_many_cpus[0][1]
    gpus = spec_of(job_spec("gpus").replace(b"  memory: 1Gi\n", b"  memory: 1Gi\n  gpus: 4\n"))
    assert kube_backend.never_fits(gpus, [node("cpu-1"), node("cpu-2")]) == [
        (
            "compute.gpus",
            "Each worker needs 4 GPUs, but no node of this cluster has any GPU; ask for none, "
            "or choose a GPU flavor (compute.gpu_type).",
        )
    ]
    # Each resource fits somewhere, but not all of them on one node.
    split = [node("gpu-1", gpus=8, cpus="8"), node("cpu-1", cpus="96")]
    both = spec_of(
        job_spec("both", cpus=64).replace(b"  memory: 1Gi\n", b"  memory: 1Gi\n  gpus: 1\n")
    )
    assert [path for path, _ in kube_backend.never_fits(both, split)] == ["compute"]
    # No nodes at all (a pool scaled to zero may grow): nothing is said.
    assert kube_backend.never_fits(spec_of(job_spec("big", cpus=200)), []) == []
    # A flavor whose labels no node has.
    typed = spec_of(
        job_spec("typed").replace(
            b"  memory: 1Gi\n", b"  memory: 1Gi\n  gpus: 1\n  gpu_type: h100\n"
        )
    )
    assert [path for path, _ in kube_backend.never_fits(typed, nodes)] == ["compute.gpu_type"]
    labelled = [
        node(
            "gpu-1", gpus=8, cpus="96", **{"nvidia.com/gpu.product": H100["nvidia.com/gpu.product"]}
        )
    ]
    assert kube_backend.never_fits(typed, labelled) == []


class FakeVisibility:
    """The adapter's ``get_path`` for one LocalQueue, counting calls."""

    def __init__(self, items: list[dict[str, Any]] | Exception) -> None:
        self.items = items
        self.calls: list[str] = []

    def get_path(self, path: str, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(path)
        if isinstance(self.items, Exception):
            raise self.items
        return {"items": self.items}


def test_queue_positions_come_from_the_pending_workloads_owners(world: Any) -> None:
    from tests.runs.factories import make_run

    runs = [make_run(world, state=RunState.QUEUED) for _ in range(3)]
    Run.objects.unscoped().filter(pk__in=[r.pk for r in runs]).update(backend=Backend.KUBERNETES)
    runs = [fresh(run) for run in runs]
    items = [
        {
            "metadata": {
                "name": "job-x",
                "ownerReferences": [{"kind": "Job", "name": f"{r.name}-a1"}],
            },
            "positionInLocalQueue": index,
        }
        for index, r in enumerate(reversed(runs))
    ]
    visibility = FakeVisibility(items)
    reading = kube_queue.read_queue(world.alpha, runs, client=visibility)  # type: ignore[arg-type]
    assert visibility.calls == [
        "/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/tau-alpha/localqueues/alpha/pendingworkloads"
    ]
    assert [reading.position(r.pk) for r in runs] == [3, 2, 1]
    assert reading.unavailable == ""
    # Nothing queued on Kubernetes: no call at all.
    assert kube_queue.read_queue(world.alpha, [], client=visibility).positions == {}  # type: ignore[arg-type]
    assert len(visibility.calls) == 1

    down = FakeVisibility(
        adapter.Unavailable("the server is currently unable to handle the request")
    )
    reading = kube_queue.read_queue(world.alpha, runs, client=down)  # type: ignore[arg-type]
    assert [reading.position(r.pk) for r in runs] == [1, 2, 3]  # TauGrid's order: queued first
    assert reading.unavailable.startswith("Kueue's queue could not be read")


def test_checkpoints_are_kept_under_the_pods_checkpoint_folder(world: Any) -> None:
    from runs.checkpoint_paths import CheckpointPathRefused
    from runs.models import Checkpoint
    from tests.runs.factories import make_run

    backend = kube_backend.KubernetesBackend(client=object())  # type: ignore[arg-type]
    run = fresh(make_run(world))
    assert backend.checkpoint_path(run, "/tau/checkpoints/step-10") == "/tau/checkpoints/step-10"
    assert backend.checkpoint_path(run, "step-10/model.pt") == "/tau/checkpoints/step-10/model.pt"
    for outside in ("/tau/outputs/x", "/etc/passwd", "../x", "s3://bucket/x"):
        with pytest.raises(CheckpointPathRefused):
            backend.checkpoint_path(run, outside)
    checkpoint = Checkpoint(run=run, attempt=1, step=10, path="/tau/checkpoints/step-10")
    # Without storage the checkpoints went with the attempt's pods; with it, trusted.
    assert backend.checkpoint_exists(run, checkpoint) is False
    run.workspace.storage_claim = "team-data"
    assert backend.checkpoint_exists(run, checkpoint) is True
    checkpoint.path = "/elsewhere/step-10"
    assert backend.checkpoint_exists(run, checkpoint) is False


def test_the_kubernetes_backend_is_there_only_when_configured(settings: Any) -> None:
    from runs.backends import BackendUnavailable

    settings.TAU_BACKEND = "local"
    assert available_backend_names() == {"local"}
    with pytest.raises(BackendUnavailable):
        backend_named("kubernetes")
    settings.TAU_BACKEND = "kubernetes"
    assert available_backend_names() == {"local", "kubernetes"}
    assert isinstance(backend_named("kubernetes"), kube_backend.KubernetesBackend)


def test_a_storage_claim_must_be_a_kubernetes_name(world: Any) -> None:
    from django.core.exceptions import ValidationError

    world.alpha.storage_claim = "Team Data"
    with pytest.raises(ValidationError) as refused:
        world.alpha.full_clean()
    assert "storage_claim" in refused.value.message_dict
    world.alpha.storage_claim = "team-data.v2"
    world.alpha.full_clean()
    assert kube_backend.data_volume(world.alpha) == {
        "persistentVolumeClaim": {"claimName": "team-data.v2"}
    }
