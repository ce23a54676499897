"""The pipeline pages in a real browser: the graph drawn with a box per stage, which updates
itself when a stage's run ends (no reload), becomes a list at 390 px, cancel through its
button (after the confirmation), no CSP violation, and both pages read well (axe-core) at
both widths."""

from __future__ import annotations

from typing import Any

import pytest

from pipelines import orchestration
from pipelines.models import Pipeline
from runs.models import RunState
from tests.notifications.helpers import finish
from tests.pages.browser_support import check_page, log_in, watch_console
from tests.pipelines.factories import make_pipeline
from tests.pipelines.test_orchestration import end, run_of

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_graph_follows_the_pipeline_and_cancel_stops_it(
    world: Any, live_server: Any, page: Any
) -> None:
    pipeline = make_pipeline(world)
    end(pipeline, "prepare")
    end(pipeline, "report", RunState.FAILED)
    problems = watch_console(page)
    log_in(page.context, live_server.url, world.users["researcher"])
    page.goto(f"{live_server.url}/w/alpha/pipelines/{pipeline.name}/")

    boxes = page.locator("svg.pipeline-graph a.stage-box")
    assert boxes.count() == 5
    assert page.get_attribute("a.stage-box[data-stage=prepare]", "href") == (
        f"/w/alpha/runs/{run_of(pipeline, 'prepare').name}/"
    )
    assert "Failed" in page.text_content("#stage-report")
    assert "not started: train" not in page.text_content("#stage-evaluate")
    check_page(page, "pipeline")
    # At 390 px the graph gives way to the list of stages.
    page.set_viewport_size({"width": 390, "height": 900})
    assert not page.is_visible("svg.pipeline-graph")
    assert page.is_visible("#stage-train")
    page.set_viewport_size({"width": 1280, "height": 900})

    # train's run ends while the page is open: its box and row say so without a reload.
    finish(run_of(pipeline, "train"))
    orchestration.advance(pipeline.pk)
    page.wait_for_selector("a.stage-box[data-stage=train][data-state=succeeded]", timeout=15000)
    page.wait_for_selector("a.stage-box[data-stage=evaluate][data-state=running]", timeout=15000)

    asked: list[str] = []

    def confirm(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.accept()

    page.on("dialog", confirm)
    page.click("form[action$='/cancel/'] button[type=submit]")
    # evaluate's run had not reached a backend: it is cancelled at once, and so the pipeline.
    page.wait_for_selector(f"text={pipeline.name} is cancelled.")
    assert asked
    assert "no new one starts" in asked[0]
    assert Pipeline.objects.unscoped().get(pk=pipeline.pk).state == "cancelled"
    assert page.is_visible("form[action$='/resume/'] button")

    page.goto(f"{live_server.url}/w/alpha/pipelines/")
    assert pipeline.name in page.text_content("#pipeline-rows")
    assert "2/5" in page.text_content("#pipeline-rows")  # prepare and train done
    check_page(page, "pipelines")
    assert problems == []
