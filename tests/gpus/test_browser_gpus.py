"""The GPU pages in a real browser, on the real test cluster (its KWOK H100 nodes) with a real
Prometheus scraping the replayed dcgm-exporter: a platform admin sees the fleet live (a node
that turns unhealthy shows without a reload), opens a node (its GPUs and Plotly charts within
the CSP), cordons it through the confirmation (the Node object is unschedulable, the audit
log says who and why) and uncordons it; a researcher sees their workspace's GPUs and a run's
GPU section. Every page checked with axe-core at both widths (screenshots under
var/browser-artifacts/, docs/gpus.md's among them)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.cache import cache
from django.test import override_settings
from django.utils import timezone

import kube as adapter
from gpus import readings as telemetry
from gpus.fleet import sync_fleet
from gpus.models import GpuNode
from kube import KubeClient, new_api_client
from portal.models import AuditEvent
from runs.models import Run, RunAttempt, RunState
from tests.cluster.plugin import KubeCluster, wait_until
from tests.pages.browser_support import check_page, log_in, watch_console
from tests.runs.factories import TINY_SPEC, cluster_quota, make_run

pytestmark = [
    pytest.mark.browser,
    pytest.mark.cluster,
    pytest.mark.services,
    pytest.mark.django_db(transaction=True),
]

NODE = "gpu-h100-2"


@pytest.fixture
def fleet_live(
    kube_cluster: KubeCluster,
    prometheus: Any,
    dcgm_exporter: Any,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[KubeClient]:
    """TauGrid on the test cluster with the suite's Prometheus; the nodes put back after."""
    settings.TAU_BACKEND = "kubernetes"
    settings.TAU_GPU_AUTO_CORDON = False
    settings.TAU_PROMETHEUS_URL = prometheus.url
    settings.TAU_PROMETHEUS_CACHE_SECONDS = 1
    monkeypatch.setenv("TAU_KUBECONFIG", str(kube_cluster.kubeconfig))
    adapter.reset_client()
    cache.clear()
    admin = KubeClient(new_api_client(kube_cluster.kubeconfig))
    before = admin.get("v1", "Node", NODE)
    yield admin
    admin.patch(
        "v1",
        "Node",
        NODE,
        {"status": {"conditions": [{"type": "XIDErrors", "$patch": "delete"}]}},
        patch_type="strategic",
        subresource="status",
    )
    admin.patch(
        "v1",
        "Node",
        NODE,
        {"spec": {"unschedulable": bool(before["spec"].get("unschedulable"))}},
    )
    admin.close()
    adapter.reset_client()
    cache.clear()


def xid_on(admin: KubeClient) -> None:
    """What a node-problem-detector GPU plugin writes when the driver logs XID 79."""
    now = timezone.now().strftime("%Y-%m-%dT%H:%M:%SZ")
    admin.patch(
        "v1",
        "Node",
        NODE,
        {
            "status": {
                "conditions": [
                    {
                        "type": "XIDErrors",
                        "status": "True",
                        "reason": "XIDErrorsDetected",
                        "message": "XID 79 on GPU 3 (PCI 0000:5d:00.0): GPU has fallen off the bus",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ]
            }
        },
        patch_type="strategic",
        subresource="status",
    )


def test_a_platform_admin_follows_the_fleet_and_cordons_a_node(
    world: Any, live_server: Any, page: Any, fleet_live: KubeClient, prometheus: Any
) -> None:
    exporter = prometheus.exporter
    exporter.frame = 3
    exporter.set_value(NODE, 3, "xid", 79)
    prometheus.wait_until_served()
    assert sync_fleet().ok
    assert telemetry.refresh_fleet().ok
    problems = watch_console(page)
    log_in(page.context, live_server.url, world.users["platform_admin"])
    page.goto(f"{live_server.url}/gpus/")
    row = page.locator(f'tr[data-node="{NODE}"]')
    assert "Healthy" in row.inner_text()
    assert "XID on GPU 3" in row.inner_text()
    assert "0 / 8" in row.inner_text()
    page.evaluate("window.__sameDocument = true")

    # NPD reports the XID on the Node; the next sync has it, and the page follows by itself.
    xid_on(fleet_live)

    def synced_unhealthy() -> bool | None:
        sync_fleet()
        return not GpuNode.objects.get(name=NODE).healthy or None

    wait_until("the fleet sync to see the XID", synced_unhealthy, 30)
    page.wait_for_selector(f'tr.node-unhealthy[data-node="{NODE}"]', timeout=30_000)
    assert page.evaluate("window.__sameDocument === true"), "the page reloaded"
    assert "XID 79 — GPU has fallen off the bus" in page.inner_text("#unhealthy-heading + ul")
    check_page(page, "gpu-fleet")

    # The node: its condition, each GPU, and the charts (Plotly within the CSP).
    page.click(f'#unhealthy-heading + ul a:text("{NODE}")')
    page.wait_for_url(f"**/gpus/nodes/{NODE}/")
    assert "XIDErrorsDetected" in page.inner_text(
        'section[aria-labelledby="conditions-heading"] .table-wrap'
    )
    assert page.locator(".gpu-table tbody tr").count() == 8
    page.wait_for_selector('#gpu-charts [data-chart="utilization"] .main-svg', timeout=40_000)
    check_page(page, "gpu-node")

    # Cordon through the confirmation: the Node is unschedulable, and the audit log says why.
    page.click("text=Cordon…")
    page.fill("#reason", "XID 79 on GPU 3; vendor ticket 4711")
    check_page(page, "gpu-node-cordon")
    page.click(f"button:text('Cordon {NODE}')")
    page.wait_for_selector(".message-success")
    assert f"{NODE} is cordoned" in page.inner_text(".messages")
    assert fleet_live.get("v1", "Node", NODE)["spec"].get("unschedulable") is True
    event = AuditEvent.objects.unscoped().filter(action="gpu.node.cordon").get()
    assert event.actor_username == world.users["platform_admin"].username
    assert event.object_repr == NODE
    assert event.after is not None
    assert event.after["reason"] == "XID 79 on GPU 3; vendor ticket 4711"
    assert "Uncordon…" in page.inner_text(".page-actions")
    page.click("text=Uncordon…")
    page.click(f"button:text('Uncordon {NODE}')")
    page.wait_for_selector(".message-success")
    assert not fleet_live.get("v1", "Node", NODE)["spec"].get("unschedulable")
    assert problems == []


def test_a_researcher_sees_their_workspaces_gpus(
    world: Any, live_server: Any, page: Any, prometheus: Any, dcgm_exporter: Any, settings: Any
) -> None:
    settings.TAU_BACKEND = "kubernetes"
    settings.TAU_PROMETHEUS_URL = prometheus.url
    settings.TAU_PROMETHEUS_CACHE_SECONDS = 1
    cache.clear()
    cluster_quota(world.alpha)
    with override_settings(TAU_BACKEND="kubernetes"):
        run = make_run(world, spec=TINY_SPEC.replace(b"cpus: 1", b"cpus: 1\n  gpus: 2"))
    started = timezone.now() - timedelta(minutes=20)
    RunAttempt.objects.for_workspace(world.alpha).filter(run=run).update(
        started_at=started, backend_name=f"Job/{run.name}-a1"
    )
    Run.objects.for_workspace(world.alpha).filter(pk=run.pk).update(
        state=RunState.RUNNING, started_at=started
    )
    pod = f"{run.name}-a1-0-b7x2k"
    dcgm_exporter.frame = 11
    for gpu in (0, 1):
        dcgm_exporter.assign("gpu-h100-1", gpu, namespace="tau-alpha", pod=pod, container="main")
    prometheus.wait_for(
        'DCGM_FI_DEV_GPU_UTIL{pod!=""}', lambda samples: len(samples) == 2, timeout=30
    )
    problems = watch_console(page)
    log_in(page.context, live_server.url, world.users["researcher"])
    page.goto(f"{live_server.url}/w/alpha/gpus/")
    assert run.name in page.inner_text("#held-heading + div")
    page.wait_for_selector("#gpu-usage-chart .main-svg", timeout=30_000)
    assert page.get_attribute("#gpu-usage-chart", "data-runs") == "1"
    check_page(page, "workspace-gpus")

    page.goto(f"{live_server.url}/w/alpha/runs/{run.name}/")
    page.wait_for_selector("#run-gpus dl.facts", timeout=30_000)
    assert "Average use" in page.inner_text("#run-gpus")
    check_page(page, "run-gpus")
    assert problems == []
