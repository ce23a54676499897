"""The GPU pages and API with a real Prometheus scraping the replayed dcgm-exporter
(tests/telemetry/plugin.py): the numbers on the fleet, a node, a workspace and a run are the
ones the exporter served (asserted, not just present); an XID shows; a workspace never sees
another's pods; a run that barely uses its GPUs is flagged; Prometheus stopped is a notice,
never a 500."""

from __future__ import annotations

import io
import re
import time
from datetime import timedelta
from typing import Any

import pytest
from django.core.cache import cache
from django.test import override_settings
from django.utils import timezone

from gpus import readings as telemetry
from gpus import run_gpus
from gpus.models import FleetSync, GpuNode, NodeSource
from runs import submission
from runs.models import Run, RunAttempt, RunState
from tests.runs.factories import TINY_FILES, TINY_SPEC, cluster_quota, zip_bytes

pytestmark = [pytest.mark.services, pytest.mark.django_db]

HOSTS = ("gpu-h100-1", "gpu-h100-2")


@pytest.fixture
def telemetry_on(settings: Any, prometheus: Any, dcgm_exporter: Any) -> Any:
    """The portal on the Kubernetes backend with the suite's Prometheus; the exporter pinned
    on one frame, so that what it serves stays put while the test compares."""
    settings.TAU_BACKEND = "kubernetes"
    settings.TAU_PROMETHEUS_URL = prometheus.url
    settings.TAU_PROMETHEUS_CACHE_SECONDS = 0
    cache.clear()
    dcgm_exporter.frame = 7
    now = timezone.now()
    FleetSync.objects.create(
        pk=1, source=NodeSource.KUBERNETES, last_attempt_at=now, last_success_at=now
    )
    for host in HOSTS:
        GpuNode.objects.create(
            name=host,
            source=NodeSource.KUBERNETES,
            pool="gpu-h100",
            gpus_total=8,
            gpus_allocatable=8,
            ready=True,
            healthy=True,
        )
    yield dcgm_exporter
    cache.clear()
    # The pods this test mapped go stale before the next test asks who holds GPUs.
    dcgm_exporter.reset(HOSTS)
    prometheus.start()  # (a test may have stopped it)
    prometheus.wait_for('DCGM_FI_DEV_GPU_UTIL{pod!=""}', lambda samples: not samples, timeout=30)


def text_of(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def row_of(html: str, node: str) -> str:
    found = re.search(rf'<tr[^>]*data-node="{node}".*?</tr>', html, re.DOTALL)
    assert found, f"no row for {node}"
    return text_of(found.group(0))


def served(exporter: Any, host: str, field: str) -> list[float]:
    return [float(exporter.served(host, gpu)[field]) for gpu in range(8)]


def test_the_fleet_shows_what_the_exporter_served(
    world: Any, prometheus: Any, telemetry_on: Any
) -> None:
    exporter = telemetry_on
    for gpu in range(8):
        exporter.set_value("gpu-h100-1", gpu, "utilization", 40 + 2 * gpu)  # averages 47
    exporter.set_value("gpu-h100-2", 3, "xid", 79)
    prometheus.wait_until_served()
    prometheus.wait_for("DCGM_FI_DEV_XID_ERRORS > 0", lambda samples: len(samples) == 1, timeout=30)
    assert telemetry.refresh_fleet().ok
    html = world.client_for("platform_admin").get("/gpus/").content.decode()
    first = row_of(html, "gpu-h100-1")
    assert "47 %" in first
    used = sum(served(exporter, "gpu-h100-1", "memory_used_mib"))
    assert f"{used / 1024:.1f} GiB" in first
    assert f"{max(served(exporter, 'gpu-h100-1', 'temperature_c')):.0f} °C" in first
    assert f"{sum(served(exporter, 'gpu-h100-1', 'power_w')):.0f} W" in first
    assert "XID on GPU 3" in row_of(html, "gpu-h100-2")
    assert "XID" not in first

    # The API: each GPU with the exporter's own identity and values.
    nodes = {
        row["name"]: row
        for row in world.api_client_for("platform_admin").get("/api/v1/gpus/nodes/").json()
    }
    gpus = nodes["gpu-h100-2"]["gpus"]
    assert [gpu["index"] for gpu in gpus] == list(range(8))
    for gpu in gpus:
        expected = exporter.served("gpu-h100-2", gpu["index"])
        assert gpu["uuid"] == exporter.uuid("gpu-h100-2", gpu["index"])
        assert gpu["model"] == exporter.model("gpu-h100-2", gpu["index"])
        assert gpu["utilization"] == pytest.approx(expected["utilization"])
        assert gpu["memory_used_mib"] == pytest.approx(expected["memory_used_mib"])
        assert gpu["temperature_c"] == pytest.approx(expected["temperature_c"])
        assert gpu["power_w"] == pytest.approx(expected["power_w"])
    assert gpus[3]["xid"] == 79
    assert nodes["gpu-h100-2"]["telemetry_notice"] == ""


def test_a_node_page_has_each_gpu_and_charts(
    world: Any, prometheus: Any, telemetry_on: Any
) -> None:
    exporter = telemetry_on
    prometheus.wait_until_served()
    client = world.client_for("platform_admin")
    text = text_of(client.get("/gpus/nodes/gpu-h100-1/").content.decode())
    for gpu in (0, 5):
        values = exporter.served("gpu-h100-1", gpu)
        assert f"{values['utilization']:.0f} % {values['memory_used_mib'] / 1024:.1f} GiB" in text
    # An hour's chart has a point every 15 s, on the quarter minute: wait for the first one
    # this session's Prometheus has data for.
    deadline = time.monotonic() + 40
    while True:
        charts = client.get("/gpus/nodes/gpu-h100-1/telemetry/?window=1h").json()
        if (charts["charts"] and charts["charts"][0]["series"]) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert charts["notice"] == ""
    assert [chart["field"] for chart in charts["charts"]] == list(telemetry.NODE_CHART_FIELDS)
    utilization = charts["charts"][0]["series"]
    assert sorted(utilization) == sorted(f"GPU {gpu}" for gpu in range(8))
    assert all(0 <= value <= 100 for points in utilization.values() for _, value in points)


def test_prometheus_stopped_is_a_notice_and_node_data_stays(
    world: Any, prometheus: Any, telemetry_on: Any
) -> None:
    # Series present when Prometheus stops look current for five minutes after it starts
    # again (no staleness marker is written for them): let them go stale first, so that the
    # tests after this one see only what the exporter serves then.
    telemetry_on.set_hosts([])
    prometheus.wait_for("DCGM_FI_DEV_GPU_UTIL", lambda samples: not samples, timeout=30)
    prometheus.stop()
    cache.clear()
    client = world.client_for("platform_admin")
    fleet = client.get("/gpus/")
    assert fleet.status_code == 200
    text = text_of(fleet.content.decode())
    assert "GPU telemetry is unavailable right now" in text
    assert "0 / 8" in row_of(fleet.content.decode(), "gpu-h100-1")  # from Kubernetes
    node = client.get("/gpus/nodes/gpu-h100-1/")
    assert node.status_code == 200
    assert "GPU telemetry is unavailable right now" in text_of(node.content.decode())
    charts = client.get("/gpus/nodes/gpu-h100-1/telemetry/").json()
    assert charts["charts"] == []
    assert "unavailable" in charts["notice"]
    api = world.api_client_for("platform_admin").get("/api/v1/gpus/nodes/")
    assert api.status_code == 200
    assert all(row["gpus"] == [] and row["telemetry_notice"] for row in api.json())


def gpu_run_of(world: Any, workspace: Any, user: str, gpus: int, started_ago: timedelta) -> Run:
    cluster_quota(workspace)
    with override_settings(TAU_BACKEND="kubernetes"):
        run = submission.submit(
            workspace=workspace,
            user=world.users[user],
            spec_source=TINY_SPEC.replace(b"cpus: 1", b"cpus: 1\n  gpus: %d" % gpus),
            bundle=io.BytesIO(zip_bytes(TINY_FILES)),
        )
    at = timezone.now() - started_ago
    RunAttempt.objects.for_workspace(workspace).filter(run=run, number=1).update(
        started_at=at, backend_name=f"Job/{run.name}-a1", node_names=["gpu-h100-1"]
    )
    Run.objects.for_workspace(workspace).filter(pk=run.pk).update(
        state=RunState.RUNNING, started_at=at
    )
    run.refresh_from_db()
    return run


def on_node(node: str, entries: list[dict[str, Any]]) -> None:
    GpuNode.objects.filter(name=node).update(runs=entries)


def test_a_workspace_and_a_run_see_their_own_pods_only(
    world: Any, prometheus: Any, telemetry_on: Any
) -> None:
    exporter = telemetry_on
    mine = gpu_run_of(world, world.alpha, "researcher", 2, timedelta(minutes=2))
    theirs = gpu_run_of(world, world.beta, "outsider", 1, timedelta(minutes=2))
    pod = f"{mine.name}-a1-0-x7k2p"
    # Beta's pod has the same name pattern, in beta's namespace: never alpha's.
    their_pod = f"{mine.name}-a1-0-zzzzz"
    for gpu, value in ((0, 80), (1, 60)):
        exporter.set_value("gpu-h100-1", gpu, "utilization", value)
        exporter.set_value("gpu-h100-1", gpu, "memory_used_mib", 30_000 + gpu * 1_000)
        exporter.assign("gpu-h100-1", gpu, namespace="tau-alpha", pod=pod, container="main")
    exporter.set_value("gpu-h100-2", 0, "utilization", 5)
    exporter.assign("gpu-h100-2", 0, namespace="tau-beta", pod=their_pod, container="main")
    on_node(
        "gpu-h100-1",
        [{"workspace": "alpha", "run": mine.name, "namespace": "tau-alpha", "pod": pod, "gpus": 2}],
    )
    prometheus.wait_for(
        'DCGM_FI_DEV_GPU_UTIL{pod!=""}', lambda samples: len(samples) == 3, timeout=30
    )
    prometheus.wait_until_served()
    time.sleep(2)  # a few scrapes of the pods, for the range queries

    viewer = world.client_for("viewer")
    page = viewer.get("/w/alpha/gpus/").content.decode()
    assert mine.name in page
    assert "70 %" in text_of(page)  # (80 + 60) / 2
    assert f"{61_000 / 1024:.1f} GiB" in text_of(page)  # 30,000 + 31,000 MiB
    assert theirs.name not in page
    assert their_pod not in page
    assert "tau-beta" not in page

    body = (
        world.api_client_for("viewer")
        .get(f"/api/v1/workspaces/alpha/runs/{mine.name}/gpus/")
        .json()
    )
    assert body["notice"] == ""
    assert [(gpu["node"], gpu["index"], gpu["pod"]) for gpu in body["gpus"]] == [
        ("gpu-h100-1", 0, pod),
        ("gpu-h100-1", 1, pod),
    ]
    assert [gpu["utilization"] for gpu in body["gpus"]] == [80, 60]
    efficiency = body["efficiency"]
    assert efficiency["gpus"] == 2
    assert efficiency["average_utilization"] == pytest.approx(70, abs=0.5)
    assert efficiency["peak_utilization"] == 80
    assert efficiency["memory_high_water_mib"] == 31_000
    assert efficiency["idle"]["stretches"] == []
    assert their_pod not in str(body)
    section = text_of(viewer.get(f"/w/alpha/runs/{mine.name}/gpus/").content.decode())
    assert "Average use 70 %" in section
    assert "Peak 80 %" in section
    assert "barely used" not in section
    # Beta's outsider reads neither alpha's page nor its run's GPUs.
    assert world.client_for("outsider").get("/w/alpha/gpus/").status_code == 404
    outsider = world.api_client_for("outsider")
    assert outsider.get(f"/api/v1/workspaces/alpha/runs/{mine.name}/gpus/").status_code == 404


def test_a_run_that_barely_uses_its_gpus_is_flagged(
    world: Any, prometheus: Any, telemetry_on: Any, settings: Any, monkeypatch: Any
) -> None:
    """The threshold shrunk from 15 minutes to 12 seconds (and the step to 1 s, this
    Prometheus scrapes every second): the same path, in a test's time."""
    settings.TAU_GPU_IDLE_MINUTES = 0.2
    monkeypatch.setattr(run_gpus, "MIN_STEP_SECONDS", 1.0)
    exporter = telemetry_on
    run = gpu_run_of(world, world.alpha, "researcher", 1, timedelta(seconds=1))
    pod = f"{run.name}-a1-0-idle0"
    exporter.set_value("gpu-h100-1", 2, "utilization", 3)
    exporter.assign("gpu-h100-1", 2, namespace="tau-alpha", pod=pod, container="main")
    on_node(
        "gpu-h100-1",
        [{"workspace": "alpha", "run": run.name, "namespace": "tau-alpha", "pod": pod, "gpus": 1}],
    )
    deadline = time.monotonic() + 60
    while True:
        report = run_gpus.report(Run.objects.for_workspace(world.alpha).get(pk=run.pk))
        if report.efficiency is not None and report.efficiency.wasteful:
            break
        assert time.monotonic() < deadline, report
        time.sleep(1)
    assert report.efficiency.idle_now
    assert report.efficiency.average_utilization == pytest.approx(3, abs=0.5)
    section = text_of(
        world.client_for("viewer").get(f"/w/alpha/runs/{run.name}/gpus/").content.decode()
    )
    assert "Its GPUs are barely used now." in section
    assert "use stayed under 10 %" in section
