"""The comparison page in a real browser: chosen from the runs list, it draws both runs'
metric curves over each other (Plotly, within the CSP), and shows the spec and code diffs;
checked with axe-core at both widths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runs.models import MetricPoint
from tests.compare.test_compare import pair
from tests.pages.browser_support import check_page, log_in, watch_console

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_comparing_two_runs_chosen_from_the_list(
    world: Any, live_server: Any, page: Any, settings: Any, tmp_path: Path
) -> None:
    a, b = pair(world)
    for run, scale in ((a, 1.0), (b, 2.0)):
        MetricPoint.objects.bulk_create(
            MetricPoint(run=run, attempt=1, key=key, step=step, value=scale / (step + 1))
            for key in ("loss", "lr")
            for step in range(30)
        )
    MetricPoint.objects.create(run=b, attempt=1, key="only_b", step=1, value=1.0)
    problems = watch_console(page)
    log_in(page.context, live_server.url, world.users["viewer"])

    page.goto(f"{live_server.url}/w/alpha/runs/")
    page.check(f'input[type=checkbox][value="{a.name}"]')
    page.check(f'input[type=checkbox][value="{b.name}"]')
    page.click("text=Compare the two chosen runs")
    page.wait_for_url("**/runs/compare/?run=*")

    # One chart per metric, each with both runs' curves (a metric only B has: one curve).
    page.wait_for_selector('.compare-chart[data-metric="only_b"] .main-svg')
    charts = page.eval_on_selector_all(
        ".compare-chart", "els => els.map(e => [e.dataset.metric, e.dataset.traces])"
    )
    assert charts == [["loss", "2"], ["lr", "2"], ["only_b", "1"]]
    legend = page.eval_on_selector(
        '.compare-chart[data-metric="loss"] .legend', "el => el.textContent"
    )
    assert f"A · {a.name}" in legend
    assert f"B · {b.name}" in legend
    assert page.locator('.compare-chart[data-metric="loss"] .scatterlayer .trace').count() == 2

    # The differences, escaped: a file's <script> is text.
    assert "compute.cpus" in page.inner_text(".spec-differences")
    added = page.inner_text(".code-changes")
    assert "+lr = 0.1  # <script>alert(1)</script>" in added
    assert page.locator(".code-changes script").count() == 0
    assert "Exited with an error" in page.inner_text("#outcome-heading + table")
    check_page(page, "compare")
    assert problems == []

    # From a run page: "Compare with…" fills run A.
    page.goto(f"{live_server.url}/w/alpha/runs/{b.name}/")
    page.click("text=Compare with…")
    assert page.input_value("#compare-a") == b.name
    page.fill("#compare-b", a.name)
    page.click("button:has-text('Compare')")
    page.wait_for_selector('.compare-chart[data-metric="loss"] .main-svg')
    assert problems == []
