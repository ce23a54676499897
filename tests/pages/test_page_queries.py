"""Every list and detail page answers in a fixed number of SQL queries, however many runs,
attempts, events and checkpoints there are. The pinned numbers are part of the contract."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs import attempts, state
from runs.models import Checkpoint, RunState
from tests.runs.factories import make_run

pytestmark = pytest.mark.django_db

# Session and user come first on every page; the navigation adds one for its workspaces.
PINNED = {
    "runs": 7,  # + access, runs page, its experiments, running pipelines
    # + access, resolve run, attempts, events, checkpoints, artifacts, data (2), the pipeline
    # stage it is (none here: the query is made all the same)
    "run": 12,
    "run-fragment": 11,  # + version, then the same reads as the page (minus the navigation)
    "queue": 9,  # + access, pending, running, admission history, usage (runs, quotas)
    "platform-queue": 8,  # + live runs, usage (runs, quotas), workspaces, endpoints
}


def grow(world: Any, *, runs: int) -> Any:
    """Runs with history: half of them running (an attempt, events), all with a checkpoint."""
    last = None
    for index in range(runs):
        run = state.transition(make_run(world), RunState.QUEUED)
        if index % 2:
            attempts.attempt_running(attempt=attempts.admit_attempt(run=run))
        Checkpoint.objects.create(run=run, attempt=1, step=index, path=f"/c/{run.pk}/{index}")
        last = run
    return last


def count(client: Any, url: str, **headers: str) -> tuple[int, list[str]]:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url, **headers)
    assert response.status_code == 200, response.status_code
    return len(queries), [q["sql"][:120] for q in queries.captured_queries]


@pytest.mark.parametrize("page", sorted(PINNED))
def test_page_query_counts_are_pinned(world: Any, page: str) -> None:
    client = world.client_for("platform_admin" if page == "platform-queue" else "researcher")

    def url(run: Any) -> tuple[str, dict[str, str]]:
        return {
            "runs": ("/w/alpha/runs/", {}),
            "run": (f"/w/alpha/runs/{run.name}/", {}),
            "run-fragment": (f"/w/alpha/runs/{run.name}/", {"HTTP_HX_REQUEST": "true"}),
            "queue": ("/w/alpha/queue/", {}),
            "platform-queue": ("/queue/", {}),
        }[page]

    run = grow(world, runs=2)
    path, headers = url(run)
    few, _ = count(client, path, **headers)
    run = grow(world, runs=8)
    for _ in range(5):
        state.record_workload_event(run, "note", message="more history")
    path, headers = url(run)
    many, sql = count(client, path, **headers)
    assert few == many, sql
    assert many == PINNED[page], sql


@pytest.mark.parametrize(
    "page", ["/w/alpha/runs/", "{run}", "/w/alpha/queue/", "/w/alpha/runs/new/"]
)
def test_pages_that_answer_htmx_with_fragments_say_they_vary_on_it(world: Any, page: str) -> None:
    """A cache (the browser's included) must not give the fragment for the page or the page
    for the fragment: both answers name ``HX-Request`` in ``Vary``."""
    client = world.client_for("researcher")
    run = grow(world, runs=1)
    path = f"/w/alpha/runs/{run.name}/" if page == "{run}" else page
    for headers in ({}, {"HTTP_HX_REQUEST": "true"}):
        response = client.get(path, **headers)
        assert response.status_code == 200
        vary = {part.strip().lower() for part in response.get("Vary", "").split(",")}
        assert "hx-request" in vary, (path, headers, response.get("Vary"))
