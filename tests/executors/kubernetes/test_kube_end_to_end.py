"""The Kubernetes path end to end, with every part real: a researcher's token submits
examples/cpu-quickstart over HTTP to gunicorn; the Celery worker syncs the workspace to Kueue
and delivers the run (Secret + Job) to the test cluster's kube-apiserver; Kueue admits it,
kube-scheduler binds its pod to a fake KWOK node, which runs and completes it; the watcher
(``manage.py run_kube_watcher``, its own process) follows it to ``succeeded``; the log is read
through ``pods/log``.

The other tests here follow several runs through the same processes: over quota (Kueue's
positions and reason, admission when the first finishes), preemption by a higher priority and
the preempted run's resume from the checkpoint it reported, and cancel in every state. How long
a run lasts on the fake nodes is set by the environment variable ``TAUGRID_TEST_DURATION`` in
its tau.yaml (``runtime.env``; see deploy/cluster/kwok/stages.yaml)."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
import uuid
import zipfile
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import kube as adapter
from catalog.ingest import asset_named, ingest_folder
from catalog.models import AssetVersion
from executors.kubernetes import render
from identity import tokens
from runs.models import Run, RunAttempt
from tests.cluster.plugin import Kube, KubeCluster, wait_until
from tests.runs.processes import (
    BIN,
    ROOT,
    Portal,
    get_json,
    multipart_form,
    portal_processes,
    post_json,
    submit_example,
)
from workspaces.models import (
    KueueSync,
    Membership,
    PriorityClass,
    ResourceFlavor,
    Role,
    Workspace,
    WorkspaceQuota,
)

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

KWOK_API = "kwok.x-k8s.io/v1alpha1"
KUEUE = "kueue.x-k8s.io/v1beta2"
LOG_LINES = ["step 25 loss=0.61", "step 50 loss=0.44", "done: step 1500"]


@pytest.fixture
def uid() -> str:
    return uuid.uuid4().hex[:6]


@pytest.fixture
def portal(
    tmp_path: Path, settings: Any, kube_cluster: KubeCluster, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Portal]:
    """The portal's processes on the Kubernetes backend, and this test process configured
    the same way (its saves write the Kueue sync rows the worker applies)."""
    settings.TAU_BACKEND = "kubernetes"
    monkeypatch.setenv("TAU_KUBECONFIG", str(kube_cluster.kubeconfig))
    adapter.reset_client()
    env = {
        "TAU_BACKEND": "kubernetes",
        "TAU_KUBECONFIG": str(kube_cluster.kubeconfig),
        "TAU_KUBE_WATCHER_LEASE_NAMESPACE": f"tau-e2e-{uuid.uuid4().hex[:6]}",
    }
    yield from portal_processes(tmp_path, settings.CELERY_BROKER_URL, extra_env=env)
    adapter.reset_client()


@pytest.fixture
def cleanup(kube_cluster: KubeCluster, uid: str) -> Iterator[None]:
    yield
    client = adapter.KubeClient(adapter.new_api_client(kube_cluster.kubeconfig))
    try:
        for api_version, kind in (
            ("v1", "Namespace"),
            (KUEUE, "ClusterQueue"),
            (KUEUE, "ResourceFlavor"),
            (KWOK_API, "ClusterLogs"),
            (KUEUE, "WorkloadPriorityClass"),
            ("v1", "PersistentVolume"),
        ):
            for obj in client.list(api_version, kind):
                if uid in obj["metadata"]["name"]:
                    client.delete(api_version, kind, obj["metadata"]["name"], missing_ok=True)
    finally:
        client.close()


def test_the_cpu_example_runs_as_a_kueue_admitted_job_on_a_fake_node(
    portal: Portal,
    cleanup: None,
    kube: Kube,
    uid: str,
    tmp_path: Path,
    django_user_model: Any,
) -> None:
    portal.start()
    portal._spawn("watcher", [str(BIN / "python"), str(ROOT / "manage.py"), "run_kube_watcher"])

    # The platform team's part, as in the admin: a flavor for the CPU nodes and a workspace.
    flavor = ResourceFlavor.objects.create(name=f"cpu-{uid}")
    workspace = Workspace.unscoped_objects.create(slug=f"e2e-{uid}", name="End to end")
    for resource, amount in (("cpu", Decimal(4)), ("memory", Decimal(8 * 2**30))):
        WorkspaceQuota.objects.create(
            workspace=workspace, flavor=flavor, resource=resource, nominal=amount
        )
    researcher = django_user_model.objects.create_user(username=f"rita-{uid}")
    Membership.objects.create(workspace=workspace, user=researcher, role=Role.RESEARCHER)

    def synced() -> bool | None:
        row = KueueSync.latest(KueueSync.Scope.WORKSPACE, workspace.slug)
        return True if row is not None and row.state == "synced" else None

    wait_until("the worker to sync the workspace to Kueue", synced, timeout=60)

    # What the fake nodes print for the pods of this namespace (KWOK's kubelet API).
    log_file = tmp_path / "pod.log"
    log_file.write_text(
        "".join(f"2026-12-01T12:00:0{i}.0Z stdout F {line}\n" for i, line in enumerate(LOG_LINES))
    )
    kube.create(
        {
            "apiVersion": KWOK_API,
            "kind": "ClusterLogs",
            "metadata": {"name": f"e2e-logs-{uid}"},
            "spec": {
                "selector": {"matchNamespaces": [workspace.namespace]},
                "logs": [{"logsFile": str(log_file)}],
            },
        }
    )

    token = tokens.issue_token(user=researcher, name="e2e").plaintext
    started = time.monotonic()
    created = submit_example(portal.url, token, workspace=workspace.slug)
    url = f"{portal.url}{created['url']}"
    seen = [created["state"]]
    while time.monotonic() - started < 120 and seen[-1] not in {"succeeded", "failed"}:
        state = get_json(url, token)["state"]
        if state != seen[-1]:
            seen.append(state)
        time.sleep(0.2)
    assert seen[-1] == "succeeded", (seen, portal.log("watcher")[-3000:])

    # Every state it passed through, in order, from its own history.
    history = [
        event["new_state"] for event in get_json_list(f"{url}events/", token) if event["new_state"]
    ]
    assert history == ["pending", "queued", "admitted", "running", "succeeded"], history

    run = Run.objects.unscoped().get(name=created["name"])
    (attempt,) = RunAttempt.objects.unscoped().filter(run=run)
    assert attempt.cluster_queue == f"tau-{workspace.slug}"
    assert attempt.flavors
    assert all(node.startswith("cpu-") for node in attempt.node_names), attempt.node_names
    assert attempt.exit_code == 0

    logs = get_json(f"{url}logs/", token)
    assert logs["text"] == "".join(f"{line}\n" for line in LOG_LINES)

    # The watcher kept the log when the attempt ended: once Kubernetes has deleted the pods
    # (here: the Job deleted, as its TTL would), the log is still there, and the run stays
    # succeeded (what happens to a finished run's objects is not a failure).
    def kept() -> str | None:
        attempt.refresh_from_db()
        return attempt.log_path or None

    kept_at = Path(
        wait_until(
            "the log kept by the watcher",
            kept,
            timeout=30,
            describe=lambda: portal.log("watcher"),
        )
    )
    assert kept_at.read_text() == logs["text"]
    kind, _, job_name = attempt.backend_name.partition("/")
    assert kind == "Job"
    client = adapter.KubeClient(adapter.new_api_client(kube.cluster.kubeconfig))
    try:
        client.delete("batch/v1", "Job", job_name, workspace.namespace, propagation="Background")
        wait_until(
            "the pods gone",
            lambda: (
                True
                if not client.list(
                    "v1", "Pod", workspace.namespace, label_selector=f"job-name={job_name}"
                )
                else None
            ),
            timeout=60,
        )
    finally:
        client.close()
    assert get_json(f"{url}logs/", token)["text"] == logs["text"]
    time.sleep(2)  # the watcher has seen the deletion
    assert get_json(url, token)["state"] == "succeeded"


def get_json_list(url: str, token: str) -> list[dict[str, Any]]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return list(json.loads(response.read()))


# -- several runs through the same processes -----------------------------------------------------

EXAMPLE = (ROOT / "examples" / "cpu-quickstart" / "tau.yaml").read_text()
IMAGE_LINE = "  image: python:3.12-slim"


def example_spec(*, lasts: str | None = None, extra: str = "") -> str:
    """The CPU example's tau.yaml; ``lasts``: how long its pod runs on the fake nodes."""
    assert IMAGE_LINE in EXAMPLE
    text = EXAMPLE
    if lasts:
        text = text.replace(
            IMAGE_LINE, f'{IMAGE_LINE}\n  env: {{TAUGRID_TEST_DURATION: "{lasts}"}}'
        )
    return text + extra


class Team:
    """A workspace set up as a platform team would in the admin (a CPU flavor, a quota of
    ``cpus``), synced to Kueue by the worker, and a researcher with a token, submitting over
    HTTP to the portal's processes, the watcher among them."""

    def __init__(self, portal: Portal, uid: str, user_model: Any, **workspace: Any) -> None:
        self.portal = portal
        self.flavor = ResourceFlavor.objects.create(name=f"cpu-{uid}")
        cpus = workspace.pop("cpus", 1)
        self.workspace = Workspace.unscoped_objects.create(
            slug=f"e2e-{uid}", name="End to end", **workspace
        )
        for resource, amount in (("cpu", Decimal(cpus)), ("memory", Decimal(8 * 2**30))):
            WorkspaceQuota.objects.create(
                workspace=self.workspace, flavor=self.flavor, resource=resource, nominal=amount
            )
        researcher = user_model.objects.create_user(username=f"rita-{uid}")
        Membership.objects.create(workspace=self.workspace, user=researcher, role=Role.RESEARCHER)
        self.token = tokens.issue_token(user=researcher, name="e2e").plaintext
        self.base = f"{portal.url}/api/v1/workspaces/{self.workspace.slug}/runs/"

        def synced() -> bool | None:
            row = KueueSync.latest(KueueSync.Scope.WORKSPACE, self.workspace.slug)
            return True if row is not None and row.state == "synced" else None

        wait_until("the worker to sync the workspace to Kueue", synced, timeout=60)

    def submit(self, spec: str) -> str:
        return str(
            submit_example(self.portal.url, self.token, self.workspace.slug, spec=spec)["name"]
        )

    def get(self, name: str) -> dict[str, Any]:
        return get_json(f"{self.base}{name}/", self.token)

    def history(self, name: str) -> list[str]:
        events = get_json_list(f"{self.base}{name}/events/", self.token)
        return [event["new_state"] for event in events if event["new_state"]]

    def wait(self, name: str, *states: str, timeout: float = 60) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            run = self.get(name)
            return run if run["state"] in states else None

        return dict(
            wait_until(
                f"{name} to be {' or '.join(states)}",
                reached,
                timeout=timeout,
                describe=lambda: f"{self.get(name)}\n{self.portal.log('watcher')[-2000:]}",
            )
        )

    def attempt(self, name: str, number: int) -> RunAttempt:
        return RunAttempt.objects.unscoped().get(run__name=name, number=number)


@pytest.fixture
def team(portal: Portal, cleanup: None, uid: str, django_user_model: Any) -> Callable[..., Team]:
    portal.start()
    portal._spawn("watcher", [str(BIN / "python"), str(ROOT / "manage.py"), "run_kube_watcher"])
    return lambda **workspace: Team(portal, uid, django_user_model, **workspace)


def all_gone(
    kube: Kube, namespace: str, *objects: tuple[str, str, str]
) -> Callable[[], bool | None]:
    return lambda: all(kube.get(*key, namespace) is None for key in objects) or None


def kube_time(value: str) -> float:
    return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%SZ"))


def test_over_quota_runs_wait_in_kueue_s_order_and_start_as_the_first_finishes(
    team: Callable[..., Team], kube: Kube
) -> None:
    place = team(cpus=1)  # room for one run of the example (1 CPU) at a time
    first = place.submit(example_spec(lasts="15s"))
    place.wait(first, "running")
    second, third = place.submit(example_spec()), place.submit(example_spec())

    # Both wait, with Kueue's positions (its visibility API: its own order, which for
    # workloads created in the same second need not be the submission order) and its reason
    # in plain words.
    # (The reason's numbers follow the ClusterQueue's status, refreshed once it settled.)
    waiting = f"Waiting for 1 CPU on flavor {place.flavor.name}: the workspace uses 1 of its 1."

    def positions() -> dict[str, int] | None:
        runs = {name: place.get(name) for name in (second, third)}
        if all(
            run["state"] == "queued" and run["queue_position"] and run["state_reason"] == waiting
            for run in runs.values()
        ):
            return {name: run["queue_position"] for name, run in runs.items()}
        return None

    shown = wait_until(
        "both queued with positions and Kueue's reason",
        positions,
        timeout=30,
        describe=lambda: str([place.get(name) for name in (second, third)]),
    )
    assert sorted(shown.values()) == [1, 2], shown
    assert place.get(first)["state"] == "running"

    for name in (first, second, third):
        place.wait(name, "succeeded", timeout=90)
        assert place.history(name)[-4:] == ["queued", "admitted", "running", "succeeded"], name

    # Kueue admitted each only when the one before had finished (Kubernetes' own times).
    namespace = place.workspace.namespace
    workloads = {
        owner["name"]: workload
        for workload in kube.list(KUEUE, "Workload", namespace)
        for owner in workload["metadata"].get("ownerReferences", [])
    }

    def job_of(name: str) -> str:
        return place.attempt(name, 1).backend_name.partition("/")[2]

    next_one, last_one = sorted(shown, key=shown.__getitem__)
    for before, after in ((first, next_one), (next_one, last_one)):
        finished = kube.get("batch/v1", "Job", job_of(before), namespace)
        assert finished is not None
        reserved = {
            c["type"]: c["lastTransitionTime"]
            for c in workloads[job_of(after)]["status"]["conditions"]
        }["QuotaReserved"]
        assert kube_time(reserved) >= kube_time(finished["status"]["completionTime"]), (
            before,
            after,
        )


def test_a_preempted_run_comes_back_from_the_checkpoint_it_reported(
    team: Callable[..., Team], kube: Kube, uid: str
) -> None:
    low_class, high_class = (
        PriorityClass.objects.create(name=f"{name}-{uid}", value=value)
        for name, value in (("low", 10), ("high", 1000))
    )
    claim = f"data-{uid}"
    place = team(
        cpus=1,
        storage_claim=claim,
        allowed_priorities=[low_class.name, high_class.name],
        default_priority=low_class.name,
    )
    namespace = place.workspace.namespace
    bind_claim(kube, uid, namespace, claim)
    retries = "resilience:\n  max_retries: 2\n  backoff: {initial: 1s, max: 1s}\n"
    low = place.submit(example_spec(lasts="10m", extra=retries))
    place.wait(low, "running")

    # The workload reports a checkpoint with the token TauGrid gave its attempt (the Secret).
    secret = kube.get("v1", "Secret", render.run_token_secret_name(low, 1), namespace)
    assert secret is not None
    run_token = base64.b64decode(secret["data"][render.RUN_TOKEN_KEY]).decode()
    post_json(
        f"{place.base}{low}/report/checkpoints/",
        run_token,
        {"step": 400, "path": "/tau/checkpoints/step-400"},
    )

    high = place.submit(example_spec(extra=f"queue:\n  priority: {high_class.name}\n"))
    place.wait(high, "succeeded", timeout=90)
    # Kueue preempted the low run for it; TauGrid queued it again as attempt 2, which Kueue
    # admitted once the high run had finished, resuming from the reported checkpoint.
    place.wait(low, "running", timeout=60)
    run = place.get(low)
    assert run["attempt_count"] == 2, run
    assert place.history(low) == [
        "pending",
        "queued",
        "admitted",
        "running",
        "preempted",
        "queued",
        "admitted",
        "running",
    ]
    first, second = place.attempt(low, 1), place.attempt(low, 2)
    assert first.failure_class == "preempted"
    assert "Kueue preempted it to make room for higher-priority work" in first.failure_message
    job = kube.get("batch/v1", "Job", second.backend_name.partition("/")[2], namespace)
    assert second.backend_name == f"Job/{low}-a2"
    assert job is not None
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TAU_RESUME_FROM"] == "/tau/checkpoints/step-400"
    assert (env["TAU_ATTEMPT"], env["TAU_RETRY_REASON"]) == ("2", "preempted")
    mounts = {m["mountPath"]: m.get("subPath") for m in container["volumeMounts"]}
    assert mounts["/tau/checkpoints"] == f"runs/{low}/checkpoints"
    assert kube.get("batch/v1", "Job", first.backend_name.partition("/")[2], namespace) is None

    # Cancelled while running: the pods stop, the run ends cancelled once they are gone.
    post_json(f"{place.base}{low}/cancel/", place.token)
    assert place.wait(low, "cancelled")["state"] == "cancelled"
    wait_until(
        "attempt 2's Job gone",
        lambda: (
            kube.get("batch/v1", "Job", second.backend_name.partition("/")[2], namespace) is None
            or None
        ),
        timeout=60,
    )


def test_cancel_ends_a_queued_and_an_admitted_run_and_removes_their_objects(
    team: Callable[..., Team], kube: Kube, uid: str
) -> None:
    # The workspace names a storage claim that does not exist: Kueue admits a run, but its pod
    # cannot be scheduled, and the run page says why.
    place = team(cpus=1, storage_claim=f"missing-{uid}")
    admitted = place.submit(example_spec())
    place.wait(admitted, "admitted")
    queued = place.submit(example_spec())
    wait_until(
        "Kueue's reason on the queued run",
        lambda: place.get(queued)["state_reason"].startswith("Waiting for 1 CPU") or None,
        timeout=30,
        describe=lambda: str(place.get(queued)),
    )

    def scheduling_reason() -> str | None:
        reason = str(place.get(admitted)["state_reason"])
        return reason if f"missing-{uid}" in reason else None

    wait_until(
        "the scheduler's reason on the admitted run",
        scheduling_reason,
        timeout=60,
        describe=lambda: f"{place.get(admitted)}\n{place.portal.log('watcher')[-3000:]}",
    )
    assert place.get(admitted)["state"] == "admitted"

    namespace = place.workspace.namespace
    for name in (queued, admitted):
        post_json(f"{place.base}{name}/cancel/", place.token)
    for name in (queued, admitted):
        assert place.wait(name, "cancelled")["state"] == "cancelled"
        job = place.attempt(name, 1).backend_name.partition("/")[2]
        secret = render.run_token_secret_name(name, 1)
        wait_until(
            f"{name}'s Job and Secret gone",
            all_gone(kube, namespace, ("batch/v1", "Job", job), ("v1", "Secret", secret)),
            timeout=60,
        )
    assert place.history(queued) == ["pending", "queued", "cancelled"]
    # Its pod existed (unplaced): cancelling until Kubernetes has removed it.
    assert place.history(admitted) == ["pending", "queued", "admitted", "cancelling", "cancelled"]


def test_a_run_cancelled_while_running_is_sealed_at_once_saying_why_it_has_no_log(
    team: Callable[..., Team], uid: str
) -> None:
    """Issue 30: the evidence of a run cancelled while it ran on the test cluster waited for
    the log of its attempt ("waiting for the log of attempt 1", a traceback per retry) that
    could not come: the cancel had deleted the pods. The watcher now says there is none, and
    the worker seals at once, saying why."""
    place = team(cpus=1)
    name = place.submit(example_spec(lasts="600s"))
    place.wait(name, "running", timeout=90)
    post_json(f"{place.base}{name}/cancel/", place.token)
    place.wait(name, "cancelled", timeout=90)
    cancelled = time.monotonic()

    def sealed() -> bytes | None:
        request = urllib.request.Request(
            f"{place.base}{name}/evidence/", headers={"Authorization": f"Bearer {place.token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as error:
            if error.code == 409:
                return None
            raise

    export = wait_until(
        "the evidence sealed",
        sealed,
        timeout=90,
        describe=lambda: (
            f"{place.portal.log('worker')[-2000:]}\n{place.portal.log('watcher')[-2000:]}"
        ),
    )
    took = time.monotonic() - cancelled
    print(f"sealed {took:.1f} s after the run was cancelled")
    assert took < 60, took  # not the 5 minutes sealing waited for a log before
    with tarfile.open(fileobj=io.BytesIO(export)) as tar:
        extracted = tar.extractfile("manifest.json")
        assert extracted is not None
        (attempt,) = json.loads(extracted.read())["attempts"]
    print(f"attempt 1: log {attempt['log']!r}, log_note {attempt['log_note']!r}")
    # Either the watcher kept what the pod wrote, or the record says why there is no log.
    assert attempt["log"] is not None or attempt["log_note"], attempt
    assert "LogNotKeptYet" not in place.portal.log("worker")  # no traceback per retry


# -- datasets ------------------------------------------------------------------------------------


def bind_claim(kube: Kube, uid: str, namespace: str, claim: str) -> None:
    """A ReadWriteMany claim bound to a volume (nothing is mounted on a fake node; the
    binding is what the scheduler waits for)."""
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"e2e-{uid}"},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "hostPath": {"path": f"/tmp/taugrid-e2e-{uid}"},
                "claimRef": {"namespace": namespace, "name": claim},
            },
        }
    )
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
    )
    wait_until(
        "the claim bound",
        lambda: (
            (kube.get("v1", "PersistentVolumeClaim", claim, namespace) or {})
            .get("status", {})
            .get("phase")
            == "Bound"
            or None
        ),
        timeout=30,
    )


def test_a_run_reading_a_dataset_has_it_staged_and_checked_before_its_program(
    s3_store: Any,  # first: it makes the var folder the portal's processes share
    portal: Portal,
    cleanup: None,
    kube: Kube,
    uid: str,
    tmp_path: Path,
    django_user_model: Any,
) -> None:
    """A run pinned to a dataset version kept in S3 (the suite's SeaweedFS): its Job's pod
    stages the version before the program (an init container after the bundle fetcher, the
    volume sized from the manifest, read-only at TAU_DATA_DIR). The fake nodes run no
    container, so the test runs the stager exactly as the Job object the API server keeps says
    (command, arguments, the run token from the attempt's Secret) against the portal's own
    processes: the listing's presigned URLs take it to the S3 server itself. It stages and
    checks every file, and the run's history, which its evidence seals, says what it staged.

    Its ``outputs.dataset`` is written to TAU_OUTPUT_DIR on the workspace's storage claim,
    which the portal mounts at TAU_DATA_PREFIX_DIR/<workspace>/ (here the test writes there
    what the pod would have); when the attempt succeeds the watcher makes it the next version,
    derived from what the run read and produced by it."""
    service = s3_store.service
    prefixes = tmp_path / "prefixes"
    portal.env.update(
        {
            "TAU_DATA_PREFIX_DIR": str(prefixes),
            "TAU_API_URL": portal.url,
            "TAU_STORAGE_URL": s3_store.url,
            "TAU_STORAGE_ENDPOINT_URL": service.endpoint,
            "TAU_STORAGE_REGION": "us-east-1",
            "TAU_STORAGE_ACCESS_KEY_ID": service.access_key,
            "TAU_STORAGE_SECRET_ACCESS_KEY": service.secret_key,
        }
    )
    portal.start()
    portal._spawn("watcher", [str(BIN / "python"), str(ROOT / "manage.py"), "run_kube_watcher"])
    claim = f"data-{uid}"
    place = Team(portal, uid, django_user_model, cpus=2, storage_claim=claim)
    bind_claim(kube, uid, place.workspace.namespace, claim)
    (prefixes / place.workspace.slug).mkdir(parents=True)
    raw = tmp_path / "raw"
    (raw / "shards").mkdir(parents=True)
    (raw / "shards" / "0.jsonl").write_text('{"text": "a review"}\n' * 50)
    (raw / "README.md").write_text("reviews, raw\n")
    version = ingest_folder(
        asset_named(place.workspace, "dataset", "reviews"), raw, source="upload"
    )

    spec = example_spec(
        lasts="20s", extra="inputs:\n  datasets:\n    - {name: reviews, path: raw}\n"
    ).replace("\noutputs:\n", "\noutputs:\n  dataset: {name: reviews-tokenized, path: tokenized}\n")
    name = place.submit(spec)
    place.wait(name, "running", timeout=90)
    attempt = place.attempt(name, 1)
    kind, _, job_name = attempt.backend_name.partition("/")
    assert kind == "Job"
    job = kube.get("batch/v1", "Job", job_name, place.workspace.namespace)
    assert job is not None
    pod = job["spec"]["template"]["spec"]
    fetcher, stager = pod["initContainers"]
    assert (fetcher["name"], stager["name"]) == ("tau-fetch-bundle", "tau-stage-data")
    volume = next(v for v in pod["volumes"] if v["name"] == "tau-datasets")
    assert volume["emptyDir"]["sizeLimit"] == str(
        render.staged_volume_bytes(version.files_count, version.bytes)
    )
    main = pod["containers"][0]
    assert {"name": "tau-datasets", "mountPath": "/tau/data", "readOnly": True} in main[
        "volumeMounts"
    ]
    assert {"name": "TAU_DATA_DIR", "value": "/tau/data"} in main["env"]

    # What the kubelet would run: the object's command, its token from the attempt's Secret.
    secret = kube.get(
        "v1", "Secret", render.run_token_secret_name(name, 1), place.workspace.namespace
    )
    assert secret is not None
    token = base64.b64decode(secret["data"]["token"]).decode()
    python3, *arguments = stager["command"]
    assert python3 == "python3"
    volume_dir = tmp_path / "volume"
    volume_dir.mkdir()
    arguments = [str(volume_dir) if word == "/tau/data" else word for word in arguments]
    staged = subprocess.run(
        [str(BIN / "python"), *arguments],
        env={"TAU_RUN_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert staged.returncode == 0, staged.stderr + portal.log("web")[-2000:]
    assert (volume_dir / "raw" / "shards" / "0.jsonl").read_text() == (
        raw / "shards" / "0.jsonl"
    ).read_text()
    assert (volume_dir / "raw" / "README.md").stat().st_mode & 0o222 == 0

    # What the program writes to TAU_OUTPUT_DIR/tokenized, on the claim the portal mounts.
    written = prefixes / place.workspace.slug / "runs" / name / "outputs" / "attempt-1"
    (written / "tokenized").mkdir(parents=True)
    (written / "tokenized" / "part-0.jsonl").write_text('{"ids": [1, 2, 3]}\n' * 20)

    done = place.wait(name, "succeeded", timeout=90)
    assert done["state"] == "succeeded"
    events = get_json_list(f"{place.base}{name}/events/", place.token)
    (said,) = [event for event in events if event["kind"] == "data-staged"]
    assert (said["data"]["attempt"], said["data"]["files"], said["data"]["bytes"]) == (
        1,
        2,
        version.bytes,
    )
    submitted = next(event for event in events if event["kind"] == "submitted")
    assert submitted["data"]["datasets"][0]["manifest_digest"] == version.manifest_digest
    (kept,) = [event for event in events if event["kind"] == "outputs-kept"]
    assert [item["ref"] for item in kept["data"]["versions"]] == ["reviews-tokenized@1"]
    tokenized = AssetVersion.objects.for_workspace(place.workspace).get(
        asset__name="reviews-tokenized"
    )
    assert (tokenized.state, tokenized.files_count) == ("ready", 1)
    assert tokenized.produced_by_id == Run.objects.unscoped().get(name=name).pk
    assert list(tokenized.derived_from.all()) == [version]


PIPELINE = """\
schema_version: 1
name: on-the-cluster
stages:
  prepare: {config: prepare/tau.yaml}
  train: {config: train/tau.yaml, needs: [prepare]}
  report: {config: report/tau.yaml, needs: [prepare]}
"""


def test_a_pipeline_runs_its_stages_as_kueue_admitted_jobs(team: Callable[..., Team]) -> None:
    """The same pipeline.yaml as on this machine (tests/pipelines): each stage an ordinary run
    of the workspace, delivered as a Job, admitted by Kueue and run on a fake node, the next
    stages started by the worker when the watcher has seen the first succeed; the two after
    it side by side (the quota has room for both)."""
    place = team(cpus=2)
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.writestr("pipeline.yaml", PIPELINE)
        for stage in ("prepare", "train", "report"):
            spec = example_spec(lasts="3s").replace("name: cpu-quickstart", f"name: {stage}")
            bundle.writestr(f"{stage}/tau.yaml", spec)
            bundle.write(ROOT / "examples" / "cpu-quickstart" / "train.py", f"{stage}/train.py")
    body, content_type = multipart_form([("bundle", "pipeline.zip", archive.getvalue())])
    request = urllib.request.Request(
        f"{place.portal.url}/api/v1/workspaces/{place.workspace.slug}/pipelines/",
        data=body,
        headers={"Authorization": f"Bearer {place.token}", "Content-Type": content_type},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        created = json.loads(response.read())
    url = f"{place.portal.url}{created['url']}"

    def ended() -> dict[str, Any] | None:
        pipeline = get_json(url, place.token)
        return pipeline if pipeline["state"] != "running" else None

    pipeline = wait_until(
        "the pipeline to end",
        ended,
        timeout=150,
        describe=lambda: f"{get_json(url, place.token)}\n{place.portal.log('watcher')[-2000:]}",
    )
    assert pipeline["state"] == "succeeded", pipeline
    stages = {stage["name"]: stage for stage in pipeline["stages"]}
    for name in ("prepare", "train", "report"):
        run = stages[name]["run"]
        assert stages[name]["state"] == "succeeded", stages[name]
        assert place.history(run)[-4:] == ["queued", "admitted", "running", "succeeded"], name
        attempt = place.attempt(run, 1)
        assert attempt.cluster_queue == f"tau-{place.workspace.slug}"
        assert all(node.startswith("cpu-") for node in attempt.node_names)
    # Both after prepare were admitted before either finished: side by side, within quota.
    attempts = [place.attempt(stages[name]["run"], 1) for name in ("train", "report")]
    admitted = [attempt.admitted_at for attempt in attempts if attempt.admitted_at]
    finished = [attempt.finished_at for attempt in attempts if attempt.finished_at]
    assert len(admitted) == len(finished) == 2, attempts
    assert max(admitted) < min(finished), (admitted, finished)
