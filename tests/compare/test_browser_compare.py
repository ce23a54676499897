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


# Every chart's drawing (Plotly's laid-out width, its SVG) against its place on the page.
CHART_WIDTHS = """sel => Array.from(document.querySelectorAll(sel)).map(div => ({
    place: div.clientWidth,
    laidOut: div._fullLayout ? Math.round(div._fullLayout.width) : null,
    svg: div.querySelector('.main-svg') ? Math.round(div.querySelector('.main-svg')
        .getBoundingClientRect().width) : null,
    xEnd: div._fullLayout ? div._fullLayout.xaxis.range[1] : null,
}))"""
SAME_WIDTH = """sel => { const charts = Array.from(document.querySelectorAll(sel));
    return charts.length > 0 && charts.every(div => div._fullLayout && div.clientWidth > 0
        && Math.abs(div._fullLayout.width - div.clientWidth) <= 1); }"""


def assert_charts_fill_their_places(page: Any, selector: str) -> list[dict[str, Any]]:
    page.wait_for_function(SAME_WIDTH, arg=selector, timeout=10_000)
    charts: list[dict[str, Any]] = page.evaluate(CHART_WIDTHS, selector)
    for chart in charts:
        assert abs(chart["laidOut"] - chart["place"]) <= 1, charts
        assert abs(chart["svg"] - chart["place"]) <= 1, charts
    return charts


def test_every_chart_is_drawn_at_the_width_of_its_place(
    world: Any, live_server: Any, page: Any
) -> None:
    """The first chart was drawn before the others joined its grid, at the whole grid's
    width, then clipped to its column: its title read "los" and its x-axis stopped near step
    700 of 1500. Every chart is as wide as its column, at 1280 px and at 390 px."""
    a, b = pair(world)
    for run in (a, b):
        MetricPoint.objects.bulk_create(
            MetricPoint(run=run, attempt=1, key=key, step=step, value=1 / (step + 1))
            for key in ("loss", "lr", "val_loss")
            for step in range(1500)
        )
    problems = watch_console(page)
    log_in(page.context, live_server.url, world.users["viewer"])
    page.goto(f"{live_server.url}/w/alpha/runs/compare/?a={a.name}&b={b.name}")
    page.wait_for_selector('.compare-chart[data-metric="val_loss"] .main-svg')
    charts = assert_charts_fill_their_places(page, ".compare-chart")
    assert len(charts) == 3
    # Two columns at 1280 px: the first chart is half the grid, and its axis goes to 1499.
    assert charts[0]["place"] < 600
    assert all(chart["xEnd"] >= 1499 for chart in charts), charts
    loss_title = '.compare-chart[data-metric="loss"] .gtitle'
    title = page.eval_on_selector(loss_title, "e => e.textContent")
    assert title == "loss"
    title_box = page.eval_on_selector(
        '.compare-chart[data-metric="loss"] .gtitle',
        "el => { const r = el.getBoundingClientRect(), c = el.closest('.compare-chart')"
        ".getBoundingClientRect(); return [r.left >= c.left, r.right <= c.right]; }",
    )
    assert title_box == [True, True]
    page.set_viewport_size({"width": 390, "height": 900})
    narrow = assert_charts_fill_their_places(page, ".compare-chart")
    assert all(chart["place"] < 390 for chart in narrow)
    page.set_viewport_size({"width": 1280, "height": 900})
    assert_charts_fill_their_places(page, ".compare-chart")
    assert problems == []


def test_the_form_the_durations_and_the_labels_read_right_on_a_phone(
    world: Any, live_server: Any, page: Any
) -> None:
    """Chosen in the runs list (newest first), the older run is A in the form too; a
    duration reads "5 min", not "0:05:00"; at 390 px no label breaks inside a word."""
    a, b = pair(world)
    log_in(page.context, live_server.url, world.users["viewer"])
    page.goto(f"{live_server.url}/w/alpha/runs/")
    page.check(f'input[type=checkbox][value="{b.name}"]')
    page.check(f'input[type=checkbox][value="{a.name}"]')
    page.click("text=Compare the two chosen runs")
    page.wait_for_url("**/runs/compare/?run=*")
    assert page.input_value("#compare-a") == a.name
    assert page.input_value("#compare-b") == b.name
    assert f"A · {a.name}" in page.inner_text("#outcome-heading + table thead")
    durations = page.eval_on_selector_all("td.duration", "els => els.map(e => e.innerText)")
    assert durations == ["5 min", "30 s"]
    # Submitting the form as shown compares the same two runs the same way round.
    page.click("button:has-text('Compare')")
    page.wait_for_url("**/runs/compare/?a=*")
    assert f"A · {a.name}" in page.inner_text("#outcome-heading + table thead")

    page.set_viewport_size({"width": 390, "height": 900})
    # A word drawn on two lines has two boxes: wrap each word of each label and count.
    broken = page.evaluate(
        """() => {
        const broken = [];
        document.querySelectorAll('table.compare th').forEach(th => {
          const words = th.innerText.split(/\\s+/).filter(Boolean);
          th.textContent = '';
          words.forEach((word, i) => {
            const span = document.createElement('span');
            span.textContent = word;
            th.appendChild(span);
            if (i < words.length - 1) th.appendChild(document.createTextNode(' '));
            // A dotted path may wrap at its dots, a run name at its hyphens: not broken.
            const parts = word.split(/[.-]/).length;
            if (span.getClientRects().length > parts) broken.push(word);
          });
        });
        return broken;
    }"""
    )
    assert broken == []
    check_page(page, "compare-phone-labels")
