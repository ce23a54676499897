"""The GPU pages from the database side: the fleet as the last sync wrote it, grouped by pool
with the unhealthy nodes first, a node's conditions and runs, cordon's confirmation, a
workspace's GPUs and a run's GPU section — at a fixed number of queries, for staff only where
they show the whole fleet, and plain words when there is no GPU or no telemetry.

Telemetry from a real Prometheus is in tests/gpus/test_telemetry_pages.py."""

from __future__ import annotations

import io
import json
import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from gpus import workspace_gpus
from gpus.models import FleetSync, GpuNode, NodeSource
from runs import submission
from runs.models import RunAttempt, RunState
from tests.runs.factories import TINY_FILES, TINY_SPEC, cluster_quota, make_run, zip_bytes

pytestmark = pytest.mark.django_db

XID_SENTENCE = "XIDErrors since 12:03 UTC: XID 79 — GPU has fallen off the bus"


def node(name: str, **fields: Any) -> GpuNode:
    values: dict[str, Any] = {
        "source": NodeSource.KUBERNETES,
        "pool": "gpu-h100",
        "gpu_model": "NVIDIA-H100-80GB-HBM3",
        "gpus_total": 8,
        "gpus_allocatable": 8,
        "gpus_in_use": 0,
        "ready": True,
        "healthy": True,
        "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
                "last_transition_time": "2026-12-01T09:00:00Z",
                "gpu": False,
                "problem": False,
            }
        ],
    }
    values.update(fields)
    return GpuNode.objects.create(name=name, **values)


def synced(source: str = NodeSource.KUBERNETES, error: str = "") -> FleetSync:
    now = timezone.now()
    return FleetSync.objects.create(
        pk=1, source=source, last_attempt_at=now, last_success_at=now, last_error=error
    )


def broken_node(name: str = "gpu-h100-2") -> GpuNode:
    return node(
        name,
        healthy=False,
        problems=[XID_SENTENCE],
        unhealthy_since=timezone.now() - timedelta(minutes=5),
        conditions=[
            {
                "type": "XIDErrors",
                "status": "True",
                "reason": "XIDErrorsDetected",
                "message": "XID 79 on GPU 3 (PCI 0000:3b:00.0)",
                "last_transition_time": "2026-12-01T12:03:07Z",
                "gpu": True,
                "problem": True,
            }
        ],
    )


@pytest.fixture
def cluster(settings: Any) -> None:
    """The portal on the Kubernetes backend (its fleet: the cluster's GPU nodes)."""
    settings.TAU_BACKEND = "kubernetes"


def text_of(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_the_fleet_by_pool_with_the_unhealthy_first(world: Any, cluster: None) -> None:
    synced()
    node(
        "gpu-h100-1",
        gpus_in_use=4,
        runs=[
            {
                "workspace": "alpha",
                "run": "train-1",
                "namespace": "tau-alpha",
                "pod": "p",
                "gpus": 4,
            }
        ],
    )
    broken_node()
    node("gpu-a100-1", pool="gpu-a100", gpus_total=4, gpus_allocatable=3, gpus_in_use=1)
    response = world.client_for("platform_admin").get("/gpus/")
    assert response.status_code == 200
    html = response.content.decode()
    text = text_of(html)
    assert "3 nodes · 5 of 19 allocatable GPUs in use (20 in all) · 1 unhealthy" in text
    # Pools by name, each with its totals; the unhealthy node in a list of its own first.
    assert (
        html.index("Unhealthy nodes")
        < html.index('<h2 id="pool-1">gpu-a100')
        < html.index('<h2 id="pool-2">gpu-h100')
    )
    assert "2 nodes · 4 of 16 GPUs in use · 1 unhealthy" in text
    assert XID_SENTENCE in text
    # Rows: in use / allocatable (capacity when lower), taints, the run with a link.
    assert "1 / 3 (4)" in text
    assert "nvidia.com/<wbr>gpu<wbr>=present<wbr>:NoSchedule" in html
    assert 'href="/w/alpha/runs/train-1/"' in html
    assert 'class="node-unhealthy" data-node="gpu-h100-2"' in html
    # No Prometheus configured: said once, no numbers made up.
    assert "GPU telemetry is not configured: set TAU_PROMETHEUS_URL" in text
    assert "%" not in text.split("Unhealthy nodes")[1].split("Runs")[0].replace("(", "")


def test_the_fleet_page_costs_the_same_queries_for_one_node_or_many(
    world: Any, cluster: None
) -> None:
    synced()
    client = world.client_for("platform_admin")
    node("gpu-node-0")
    with CaptureQueriesContext(connection) as few:
        assert client.get("/gpus/").status_code == 200
    for index in range(1, 60):
        node(f"gpu-node-{index}", pool=f"pool-{index % 4}", healthy=index % 7 != 0)
    with CaptureQueriesContext(connection) as many:
        response = client.get("/gpus/")
    assert response.content.decode().count("data-node=") == 60
    assert len(few) == len(many), [query["sql"] for query in many.captured_queries]
    assert len(many) <= 6, [query["sql"] for query in many.captured_queries]


def test_polling_answers_304_until_something_changes(world: Any, cluster: None) -> None:
    synced()
    changed = node("gpu-h100-1")
    client = world.client_for("platform_admin")
    first = client.get("/gpus/", HTTP_HX_REQUEST="true")
    assert first.status_code == 200
    assert 'id="fleet-live"' in first.content.decode()
    assert "<html" not in first.content.decode()  # the fragment only
    again = client.get("/gpus/", HTTP_HX_REQUEST="true", HTTP_IF_NONE_MATCH=first["ETag"])
    assert again.status_code == 304
    GpuNode.objects.filter(pk=changed.pk).update(gpus_in_use=3, updated_at=timezone.now())
    after = client.get("/gpus/", HTTP_HX_REQUEST="true", HTTP_IF_NONE_MATCH=first["ETag"])
    assert after.status_code == 200
    assert "3 / 8" in text_of(after.content.decode())


def test_kubernetes_unreachable_shows_the_last_known_fleet_with_why(
    world: Any, cluster: None
) -> None:
    sync = synced(error="cannot reach the Kubernetes API at https://10.0.0.1:6443: timed out")
    FleetSync.objects.filter(pk=sync.pk).update(
        last_success_at=timezone.now() - timedelta(minutes=3)
    )
    node("gpu-h100-1", gpus_in_use=2)
    text = text_of(world.client_for("platform_admin").get("/gpus/").content.decode())
    assert "The fleet could not be read since" in text
    assert "what follows is what was last seen" in text
    assert "Cannot reach the Kubernetes API at https://10.0.0.1:6443: timed out" in text
    assert "2 / 8" in text


def test_a_machine_without_gpus_says_so_plainly(world: Any) -> None:
    synced(
        NodeSource.LOCAL,
        error="no NVIDIA driver on this machine (NVML: NVML Shared Library Not Found)",
    )
    text = text_of(world.client_for("platform_admin").get("/gpus/").content.decode())
    assert "This machine has no NVIDIA GPU" in text
    assert "NVML Shared Library Not Found" in text
    assert "chart" not in text.lower()


def test_the_fleet_is_for_platform_staff_only(world: Any, cluster: None) -> None:
    synced()
    node("gpu-h100-1")
    for who in ("workspace_admin", "researcher", "viewer", "outsider"):
        assert world.client_for(who).get("/gpus/").status_code == 403
        assert world.client_for(who).get("/gpus/nodes/gpu-h100-1/").status_code == 403
    assert world.client_for("anonymous").get("/gpus/").status_code == 302


def test_a_node_page_shows_its_conditions_runs_and_actions(world: Any, cluster: None) -> None:
    synced()
    broken = broken_node()
    GpuNode.objects.filter(pk=broken.pk).update(
        runs=[
            {
                "workspace": "alpha",
                "run": "train-2",
                "namespace": "tau-alpha",
                "pod": "train-2-a1-0",
                "gpus": 8,
            }
        ],
        gpus_in_use=8,
    )
    client = world.client_for("platform_admin")
    response = client.get("/gpus/nodes/gpu-h100-2/")
    assert response.status_code == 200
    text = text_of(response.content.decode())
    assert "Unhealthy" in text
    assert XID_SENTENCE in text
    # The condition with its reason, message and time, as people read them.
    assert "XIDErrors GPU True 2026-12-01 12:03:07 UTC XIDErrorsDetected : XID 79 on GPU 3" in text
    assert "train-2 alpha · 8 GPUs · pod train-2-a1-0" in text
    assert "Cordon…" in text
    assert client.get("/gpus/nodes/no-such-node/").status_code == 404
    # The confirmation lists the runs that keep running there.
    confirm = text_of(client.get("/gpus/nodes/gpu-h100-2/cordon/").content.decode())
    assert "Cordon gpu-h100-2 ?" in confirm
    assert "train-2 alpha · 8 GPUs" in confirm
    assert "They are not stopped." in confirm


def test_a_local_node_cannot_be_cordoned(world: Any) -> None:
    synced(NodeSource.LOCAL)
    node("laptop", source=NodeSource.LOCAL, taints=[])
    client = world.client_for("platform_admin")
    assert "Cordon…" not in client.get("/gpus/nodes/laptop/").content.decode()
    response = client.post("/gpus/nodes/laptop/cordon/", {"reason": "try"}, follow=True)
    assert "laptop was not cordoned" in text_of(response.content.decode())
    assert not GpuNode.objects.get(name="laptop").cordoned


def test_the_node_telemetry_without_prometheus_says_how_to_get_it(
    world: Any, cluster: None
) -> None:
    synced()
    node("gpu-h100-1")
    body = world.client_for("platform_admin").get("/gpus/nodes/gpu-h100-1/telemetry/").json()
    assert body["charts"] == []
    assert "TAU_PROMETHEUS_URL" in body["notice"]


def gpu_run(world: Any, gpus: int = 2, *, who: str = "researcher") -> Any:
    spec = TINY_SPEC.replace(b"cpus: 1", b"cpus: 1\n  gpus: %d" % gpus)
    cluster_quota(world.alpha)
    with override_settings(TAU_BACKEND="kubernetes"):
        return make_run(world, spec=spec, who=who)


def started(run: Any, *, at: Any, until: Any = None, state: RunState = RunState.RUNNING) -> Any:
    RunAttempt.objects.for_workspace(run.workspace_id).filter(run=run, number=1).update(
        started_at=at, finished_at=until, backend_name=f"Job/{run.name}-a1"
    )
    type(run).objects.for_workspace(run.workspace_id).filter(pk=run.pk).update(
        state=state, started_at=at, finished_at=until
    )
    run.refresh_from_db()
    return run


def test_a_workspace_sees_its_own_gpus_against_its_quota(world: Any) -> None:
    now = timezone.now()
    holding = started(gpu_run(world, 4), at=now - timedelta(minutes=30))
    started(
        gpu_run(world, 2),
        at=now - timedelta(hours=2),
        until=now - timedelta(hours=1),
        state=RunState.SUCCEEDED,
    )
    # Another workspace's run holding GPUs: never on alpha's page.
    cluster_quota(world.beta)
    with override_settings(TAU_BACKEND="kubernetes"):
        theirs = submission.submit(
            workspace=world.beta,
            user=world.users["outsider"],
            spec_source=TINY_SPEC.replace(b"cpus: 1", b"cpus: 1\n  gpus: 4"),
            bundle=io.BytesIO(zip_bytes(TINY_FILES)),
        )
    started(theirs, at=now - timedelta(minutes=20))
    client = world.client_for("viewer")
    response = client.get("/w/alpha/gpus/")
    assert response.status_code == 200
    text = text_of(response.content.decode())
    assert "4 GPUs held by 1 run now, of a quota of 8." in text
    assert holding.name in text
    assert theirs.name not in text
    assert world.client_for("outsider").get("/w/alpha/gpus/").status_code == 404
    usage = client.get("/w/alpha/gpus/usage/?window=6h").json()
    assert usage["quota"] == 8.0
    assert len(usage["times"]) == workspace_gpus.BUCKETS
    by_run = {entry["run"]: entry["gpus"] for entry in usage["runs"]}
    assert set(by_run) == {holding.name, *(set(by_run) - {holding.name})}
    # The last half hour: the running run holds 4 GPUs in each full step.
    assert by_run[holding.name][-2] == pytest.approx(4.0)
    # GPU-hours over the window: 4 GPUs for half an hour, 2 for an hour.
    step = usage["step_seconds"]
    held = sum(sum(values) for values in by_run.values()) * step / 3600
    assert held == pytest.approx(4 * 0.5 + 2 * 1.0, abs=0.05)
    assert theirs.name not in json.dumps(usage)


def test_the_usage_chart_keeps_a_dozen_runs_and_sums_the_rest(world: Any) -> None:
    now = timezone.now()
    for index in range(15):
        started(gpu_run(world, 1), at=now - timedelta(minutes=10 + index))
    usage = world.client_for("viewer").get("/w/alpha/gpus/usage/?window=1h").json()
    assert len(usage["runs"]) == workspace_gpus.CHART_RUNS + 1
    assert usage["runs"][-1]["run"] == "3 other runs"


def test_the_run_page_loads_its_gpu_section_separately(world: Any) -> None:
    run = gpu_run(world, 2)
    client = world.client_for("viewer")
    page = client.get(f"/w/alpha/runs/{run.name}/").content.decode()
    assert f'data-poll-url="/w/alpha/runs/{run.name}/gpus/"' in page
    section = client.get(f"/w/alpha/runs/{run.name}/gpus/")
    assert section.status_code == 200
    assert "Its GPUs show here once the run has started." in text_of(section.content.decode())
    cpu_only = make_run(world)
    assert "run-gpus" not in client.get(f"/w/alpha/runs/{cpu_only.name}/").content.decode()
    api = world.api_client_for("viewer").get(f"/api/v1/workspaces/alpha/runs/{run.name}/gpus/")
    assert api.status_code == 200
    body = api.json()
    assert (body["run"], body["requested_gpus"], body["gpus"]) == (run.name, 2, [])
    assert body["efficiency"]["gpus"] == 0
    assert body["efficiency"]["average_utilization"] is None
    assert "once the run has started" in body["notice"]


def test_the_api_lists_the_fleet_for_staff(world: Any, cluster: None) -> None:
    synced()
    broken_node()
    response = world.api_client_for("platform_admin").get("/api/v1/gpus/nodes/")
    assert response.status_code == 200
    (row,) = response.json()
    assert {key: row[key] for key in ("name", "pool", "gpus_total", "gpus_allocatable")} == {
        "name": "gpu-h100-2",
        "pool": "gpu-h100",
        "gpus_total": 8,
        "gpus_allocatable": 8,
    }
    assert (row["healthy"], row["cordoned"], row["gpus_in_use"]) == (False, False, 0)
    assert row["conditions"][0]["type"] == "XIDErrors"
    assert row["conditions"][0]["message"].startswith("XID 79")
    assert row["gpus"] == []
    assert "TAU_PROMETHEUS_URL" in row["telemetry_notice"]
    assert json.dumps(row)  # plain JSON
    assert world.api_client_for("researcher").get("/api/v1/gpus/nodes/").status_code == 403


def test_a_workspaces_gpu_page_costs_the_same_queries_for_one_run_or_many(world: Any) -> None:
    now = timezone.now()
    client = world.client_for("viewer")
    started(gpu_run(world, 1), at=now - timedelta(minutes=5))
    with CaptureQueriesContext(connection) as few:
        assert client.get("/w/alpha/gpus/").status_code == 200
        assert client.get("/w/alpha/gpus/usage/").status_code == 200
    for minutes in range(6, 16):
        started(gpu_run(world, 1), at=now - timedelta(minutes=minutes))
    with CaptureQueriesContext(connection) as many:
        page = client.get("/w/alpha/gpus/")
        assert client.get("/w/alpha/gpus/usage/").status_code == 200
    assert "11 GPUs held by 11 runs now" in text_of(page.content.decode())
    assert len(few) == len(many), [query["sql"] for query in many.captured_queries]
