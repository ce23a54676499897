"""The usage pages in a real browser: the chart is drawn within the CSP, the month picker
shows another month, the budget meter is there, and both pages pass axe at both widths."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from tests.accounting.helpers import PREEMPTED, attempt_at, gpu_run
from tests.pages.browser_support import check_page, log_in, watch_console
from workspaces.models import WorkspaceBudget

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_member_reads_a_month_and_a_staff_member_every_workspace(
    world: Any, live_server: Any, page: Any, settings: Any
) -> None:
    settings.TAU_LOCAL_GPUS = 8
    settings.TAU_LOCAL_CPUS = 64
    settings.TAU_LOCAL_MEMORY = "512Gi"
    settings.TAU_ACCOUNTING_TIME_ZONE = "UTC"
    run = gpu_run(world)
    attempt_at(
        run,
        1,
        datetime(2026, 11, 3, 9, tzinfo=UTC),
        datetime(2026, 11, 3, 10, tzinfo=UTC),
        **PREEMPTED,
    )
    attempt_at(run, 2, datetime(2026, 11, 4, 9, tzinfo=UTC), datetime(2026, 11, 4, 12, tzinfo=UTC))
    WorkspaceBudget.objects.create(workspace=world.alpha, gpu_hours=Decimal("10"))

    problems = watch_console(page)
    log_in(page.context, live_server.url, world.users["viewer"])
    page.goto(f"{live_server.url}/w/alpha/usage/?month=2026-11")
    chart = page.locator("#usage-chart")
    chart.locator(".main-svg").first.wait_for()  # Plotly drew it
    assert chart.get_attribute("data-series") == "1"  # one user
    assert page.locator("#usage-totals").inner_text().count("16") >= 1  # 4 GPUs x 4 h
    assert "Past the hard limit" in page.locator(".budgets").inner_text()
    check_page(page, "usage-workspace")

    # The picker shows another month without a button press.
    page.select_option("#usage-month", index=0)  # this month (never November 2026 again)
    page.wait_for_url(lambda url: "month=2026-11" not in url)
    assert page.locator("h1").inner_text().startswith("Usage in ")

    log_in(page.context, live_server.url, world.users["platform_admin"])
    page.goto(f"{live_server.url}/usage/?month=2026-11")
    page.locator("#usage-chart .main-svg").first.wait_for()
    assert page.get_by_role("link", name="Alpha").count() == 1
    check_page(page, "usage-platform")
    assert problems == []


def test_a_new_workspace_s_usage_reads_right(world: Any, live_server: Any, page: Any) -> None:
    """A workspace made this month has one month to show, not a year of zeros; a short CPU
    run's CPU-hours read 0.017, not 0.0."""
    from django.utils import timezone

    from tests.accounting.helpers import CPU_SPEC

    run = gpu_run(world, spec=CPU_SPEC)  # 2 CPUs
    now = timezone.now()
    attempt_at(run, 1, now - timedelta(seconds=30), now)  # 2 CPUs x 30 s = 0.0167 CPU-hours
    log_in(page.context, live_server.url, world.users["viewer"])
    page.goto(f"{live_server.url}/w/alpha/usage/")
    totals = page.locator("#usage-totals").inner_text()
    assert "CPU-hours\n0.017" in totals, totals
    assert "0.0\n" not in totals + "\n", totals
    months = page.locator("#by-month-heading + .table-wrap tbody tr")
    assert months.count() == 1
    assert page.locator("#usage-month option").count() == 1
    assert "0.017" in months.first.inner_text()
    check_page(page, "usage-new-workspace")

    log_in(page.context, live_server.url, world.users["platform_admin"])
    page.goto(f"{live_server.url}/usage/")
    assert page.locator("#by-month-heading + .table-wrap tbody tr").count() == 1
    assert page.locator("#usage-month option").count() == 1
