"""A node page's charts in a real browser, on the embedded default (this machine as the node,
its readings kept by the refresh task, seeded here): every chart is drawn at the width of its
column, at 1280 px and 390 px. The first one used to be drawn before the others joined its
grid, at the whole grid's width, and then clipped (shared chart code: static/js/charts.js)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.cache import cache
from django.utils import timezone

from gpus import readings as telemetry
from gpus.models import FleetSync, GpuNode, NodeSource
from telemetry.samples import GpuSample
from tests.compare.test_browser_compare import assert_charts_fill_their_places
from tests.pages.browser_support import check_page, log_in, watch_console

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

HOST = "workstation"


@pytest.fixture
def node_with_history(settings: Any) -> Iterator[GpuNode]:
    settings.TAU_BACKEND = "local"
    cache.clear()
    now = timezone.now()
    FleetSync.objects.create(
        pk=1, source=NodeSource.LOCAL, last_attempt_at=now, last_success_at=now
    )
    node = GpuNode.objects.create(
        name=HOST,
        source=NodeSource.LOCAL,
        gpus_total=2,
        gpus_allocatable=2,
        ready=True,
        healthy=True,
    )
    history = [
        (
            (now - timedelta(minutes=59 - minute)).isoformat(),
            [
                GpuSample(
                    host=HOST,
                    index=index,
                    uuid=f"GPU-{index}",
                    model="NVIDIA H100",
                    utilization=float((minute * 7 + index * 30) % 100),
                    memory_used_mib=1024.0 * (minute % 40),
                    temperature_c=40.0 + minute % 30,
                    power_w=100.0 + minute,
                )
                for index in range(2)
            ],
        )
        for minute in range(60)
    ]
    cache.set(telemetry.LOCAL_HISTORY_KEY, history, timeout=None)
    yield node
    cache.clear()


def test_the_node_page_draws_each_chart_at_its_width(
    world: Any, live_server: Any, page: Any, node_with_history: GpuNode
) -> None:
    problems = watch_console(page)
    log_in(page.context, live_server.url, world.users["platform_admin"])
    page.goto(f"{live_server.url}/gpus/nodes/{HOST}/")
    page.wait_for_selector('#gpu-charts [data-chart="power_w"] .main-svg')
    charts = assert_charts_fill_their_places(page, "#gpu-charts .chart")
    assert len(charts) == len(telemetry.NODE_CHART_FIELDS)
    assert charts[0]["place"] < 600  # two columns at 1280 px: the first is not the grid's width
    page.set_viewport_size({"width": 390, "height": 900})
    assert_charts_fill_their_places(page, "#gpu-charts .chart")
    page.set_viewport_size({"width": 1280, "height": 900})
    assert_charts_fill_their_places(page, "#gpu-charts .chart")
    check_page(page, "gpu-node-charts")
    assert problems == []
