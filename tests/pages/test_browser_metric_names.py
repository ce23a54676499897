"""Metric names come from the workload: on the run page they are plain text, however they
are written. Plotly reads HTML-like markup in chart titles and trace names, and a
right-to-left override reverses what follows it; neither may act."""

from __future__ import annotations

from typing import Any

import pytest

from runs.models import MetricPoint, RunState
from tests.pages.browser_support import log_in, watch_console
from tests.runs.factories import make_run

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LINK = '<a href="https://evil.example/">click</a>'
REVERSED = "loss\u202edrow"


def test_metric_names_are_shown_as_plain_text(world: Any, live_server: Any, page: Any) -> None:
    run = make_run(world, state=RunState.SUCCEEDED)
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, attempt=1, key=key, step=step, value=float(step))
        for key in (LINK, REVERSED)
        for step in range(5)
    )
    problems = watch_console(page)
    log_in(page.context, live_server.url, world.users["researcher"])
    page.goto(f"{live_server.url}/w/alpha/runs/{run.name}/")
    page.wait_for_function("() => document.querySelectorAll('#metrics .chart').length === 2")
    # Plotly drew no link, and the markup reads as the text it is.
    assert page.locator("#metrics a[href*='evil.example']").count() == 0
    titles = page.eval_on_selector_all(
        "#metrics .gtitle", "nodes => nodes.map(node => node.textContent)"
    )
    assert LINK in titles
    # The override is shown as its code, in the titles and in the picker, and acts nowhere.
    assert "loss[U+202E]drow" in titles
    picker = page.inner_text("#metric-picker")
    assert "loss[U+202E]drow" in picker
    assert "\u202e" not in picker
    assert "\u202e" not in " ".join(titles)
    assert problems == []
