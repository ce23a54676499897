"""The Kubernetes path end to end, with every part real: a researcher's token submits
examples/cpu-quickstart over HTTP to gunicorn; the Celery worker syncs the workspace to Kueue
and delivers the run (Secret + Job) to the test cluster's kube-apiserver; Kueue admits it,
kube-scheduler binds its pod to a fake KWOK node, which runs and completes it; the watcher
(``manage.py run_kube_watcher``, its own process) follows it to ``succeeded``; the log is read
through ``pods/log``."""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import kube as adapter
from identity import tokens
from runs.models import Run, RunAttempt
from tests.cluster.plugin import Kube, KubeCluster, wait_until
from tests.runs.processes import BIN, ROOT, Portal, get_json, portal_processes, submit_example
from workspaces import kueue_sync
from workspaces.models import (
    KueueSync,
    Membership,
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
        row = kueue_sync.latest_sync(KueueSync.Scope.WORKSPACE, workspace.slug)
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
