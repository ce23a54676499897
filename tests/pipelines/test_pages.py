"""The pipeline pages (issue 35): the list (its queries pinned), one pipeline's graph and
stages with what each read, reported and made, its live fragment (304 when nothing changed),
the buttons of those who may use them, the run page's link to its pipeline, and the
workspace home's recent pipelines. The browser's view: tests/pages/test_browser_pipeline_page.py."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from pipelines import orchestration
from pipelines.layout import BOX_HEIGHT, BOX_WIDTH, COLUMN_GAP, ROW_GAP, layout
from pipelines.models import Pipeline
from runs.models import RunState
from tau.pipeline import load_pipeline
from tests.pipelines.factories import PIPELINE, make_pipeline
from tests.pipelines.test_orchestration import end, report, run_of

pytestmark = pytest.mark.django_db

LIST = "/w/alpha/pipelines/"


def page(pipeline: Pipeline) -> str:
    return f"/w/alpha/pipelines/{pipeline.name}/"


def get(client: Any, url: str, **headers: str) -> str:
    response = client.get(url, **headers)
    assert response.status_code == 200, response.status_code
    return str(response.content.decode())


def test_the_layout_puts_each_stage_right_of_what_it_needs() -> None:
    pipeline_file, _ = load_pipeline(PIPELINE)
    assert pipeline_file is not None
    graph = layout(pipeline_file)
    column = {box.stage: box.column for box in graph.boxes}
    assert column == {"prepare": 0, "train": 1, "report": 1, "evaluate": 2, "publish": 3}
    train, side = graph.box("train"), graph.box("report")
    assert train.x == side.x == graph.box("prepare").x + BOX_WIDTH + COLUMN_GAP
    assert side.y == train.y + BOX_HEIGHT + ROW_GAP  # one under the other
    # Every edge runs from the right side of what is needed to the left side of the stage.
    for edge in graph.edges:
        source, target = graph.box(edge.source), graph.box(edge.target)
        start, end_point = edge.path.split(" ")[0], edge.path.split(" ")[-1]
        assert start == f"M{source.x + BOX_WIDTH},{source.y + BOX_HEIGHT // 2}"
        assert end_point == f"{target.x},{target.y + BOX_HEIGHT // 2}"
    assert len(graph.edges) == 4
    assert graph.width == graph.box("publish").x + BOX_WIDTH + 8
    assert graph.height == side.y + BOX_HEIGHT + 8


def test_the_page_draws_the_graph_and_lists_each_stage(world: Any) -> None:
    pipeline = make_pipeline(world)
    end(pipeline, "prepare")
    end(pipeline, "train")
    evaluate = run_of(pipeline, "evaluate")
    report(evaluate, "accuracy", 0.42)
    end(pipeline, "evaluate")
    html = get(world.client_for("viewer"), page(pipeline))
    assert html.count('class="stage-box"') == 5
    assert 'data-stage="evaluate" data-state="succeeded"' in html
    assert f'href="/w/alpha/runs/{evaluate.name}/"' in html
    # The edge into the gated stage says what it read, and the stage's row why it waits.
    assert 'class="edge-label">accuracy=0.42 ✗' in html
    assert "not started: evaluate.metrics.accuracy &gt;= 0.8 was false (0.42)" in html
    assert "0.42: not passed" in html
    # The stage's own metrics, kept when it ended.
    assert '<span class="mono">accuracy</span> 0.42' in html
    # Still running (report): the page polls; the history says what happened.
    assert f'data-poll-url="{page(pipeline)}"' in html
    assert "Stage ended" in html
    # A viewer sees no buttons.
    assert "/cancel/" not in html


def test_the_live_fragment_answers_304_until_something_changes(world: Any) -> None:
    pipeline = make_pipeline(world)
    client = world.client_for("researcher")
    first = client.get(page(pipeline), HTTP_HX_REQUEST="true")
    assert first.status_code == 200
    assert 'id="pipeline-live"' in first.content.decode()
    assert "<html" not in first.content.decode()
    etag = first["ETag"]
    again = client.get(page(pipeline), HTTP_HX_REQUEST="true", HTTP_IF_NONE_MATCH=etag)
    assert again.status_code == 304
    end(pipeline, "prepare")
    changed = client.get(page(pipeline), HTTP_HX_REQUEST="true", HTTP_IF_NONE_MATCH=etag)
    assert changed.status_code == 200
    assert 'data-stage="train" data-state="running"' in changed.content.decode()


def test_an_ended_pipeline_stops_polling_and_offers_resume_to_its_submitter(world: Any) -> None:
    pipeline = make_pipeline(world)
    end(pipeline, "prepare", RunState.FAILED)
    html = get(world.client_for("researcher"), page(pipeline))
    assert "data-poll-url" not in html.split('id="pipeline-live"')[1].split(">")[0]
    assert "stage prepare failed" in html
    assert f'action="/w/alpha/pipelines/{pipeline.name}/resume/"' in html
    response = world.client_for("researcher").post(f"{page(pipeline)}resume/")
    assert response.status_code == 302
    pipeline.refresh_from_db()
    assert pipeline.state == "running"
    assert run_of(pipeline, "prepare").attempt_count == 2
    # Refused (it runs): said as a message, nothing changes.
    follow = world.client_for("researcher").post(f"{page(pipeline)}resume/", follow=True)
    assert "still running" in follow.content.decode()


def test_cancel_from_the_page(world: Any) -> None:
    pipeline = make_pipeline(world)
    viewer = world.client_for("viewer").post(f"{page(pipeline)}cancel/")
    assert viewer.status_code == 403
    response = world.client_for("workspace_admin").post(f"{page(pipeline)}cancel/", follow=True)
    assert f"{pipeline.name} is cancelled." in response.content.decode()
    pipeline.refresh_from_db()
    assert pipeline.state == "cancelled"


def test_another_workspaces_pipeline_is_not_there(world: Any) -> None:
    pipeline = make_pipeline(world)
    assert world.client_for("outsider").get(page(pipeline)).status_code == 404
    assert world.client_for("researcher").get(f"{LIST}nothing/").status_code == 404


#: Session, user, access, the count of pipelines, the page of them (with their stages done
#: and in all), the navigation's workspaces; the live rows the same less the navigation.
PINNED_LIST = 6
#: Session, user, access, the pipeline, its stages (with runs and endpoints), what their runs
#: made, its events, the navigation's workspaces.
PINNED_PAGE = 8


def test_the_pages_queries_are_pinned(world: Any) -> None:
    client = world.client_for("researcher")
    first = make_pipeline(world)
    with CaptureQueriesContext(connection) as one:
        get(client, LIST)
    with CaptureQueriesContext(connection) as one_fragment:
        get(client, LIST, HTTP_HX_REQUEST="true")
    with CaptureQueriesContext(connection) as one_page:
        get(client, page(first))
    for _ in range(4):
        more = make_pipeline(world)
        end(more, "prepare")
        orchestration.advance(more.pk)
    end(first, "prepare")
    end(first, "train")
    with CaptureQueriesContext(connection) as many:
        html = get(client, LIST)
    with CaptureQueriesContext(connection) as many_fragment:
        get(client, LIST, HTTP_HX_REQUEST="true")
    with CaptureQueriesContext(connection) as many_page:
        get(client, page(first))
    assert html.count('class="stack-lead pipeline-name"') == 5
    sql = [q["sql"][:80] for q in many.captured_queries]
    assert len(one) == len(many) == PINNED_LIST, sql
    assert len(one_fragment) == len(many_fragment) == PINNED_LIST - 1
    page_sql = [q["sql"][:80] for q in many_page.captured_queries]
    assert len(one_page) == len(many_page) == PINNED_PAGE, page_sql


def test_the_run_page_links_its_pipeline_and_the_runs_list_and_home_list_them(world: Any) -> None:
    pipeline = make_pipeline(world)
    client = world.client_for("researcher")
    run_page = get(client, f"/w/alpha/runs/{run_of(pipeline, 'prepare').name}/")
    assert f'href="/w/alpha/pipelines/{pipeline.name}/#stage-prepare"' in run_page
    runs = get(client, "/w/alpha/runs/")
    assert "Pipelines running:" in runs
    assert f'href="/w/alpha/pipelines/{pipeline.name}/"' in runs
    home = get(client, "/w/alpha/")
    assert f'href="/w/alpha/pipelines/{pipeline.name}/"' in home
    assert "0/5 stages" in home
