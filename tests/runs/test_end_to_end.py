"""The whole path on the production-shaped parts: the example submitted over HTTP to
gunicorn, delivered by a real Celery worker through Redis, run by the real local agent, on
PostgreSQL; it succeeds with its log, metric rows and checkpoints recorded."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from identity import tokens
from runs.events import verify_event_chain
from runs.models import Checkpoint, MetricPoint, Run, RunAttempt
from tests.executors.local.agent_harness import Agent, local_quota
from tests.runs.processes import Portal, get_json, portal_processes, submit_example

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def portal(tmp_path: Path, settings: Any) -> Iterator[Portal]:
    yield from portal_processes(tmp_path, settings.CELERY_BROKER_URL)


def test_the_cpu_example_submitted_over_http_succeeds(
    world: Any, portal: Portal, tmp_path: Path
) -> None:
    local_quota(world.alpha)
    # The web process, the worker and the agent share one var/ (bundles, run directories).
    # The example reports its metrics through the SDK to this portal (TAU_API_URL).
    agent = Agent(tmp_path / "var", {"TAU_API_URL": portal.url}).start()
    try:
        portal.start()
        token = tokens.issue_token(user=world.users["researcher"], name="e2e").plaintext
        created = submit_example(portal.url, token, workspace="alpha")
        deadline = time.monotonic() + 180
        state = created["state"]
        while time.monotonic() < deadline and state not in {"succeeded", "failed", "cancelled"}:
            time.sleep(0.5)
            state = get_json(f"{portal.url}{created['url']}", token)["state"]
        assert state == "succeeded", agent.output()
    finally:
        agent.stop()
    run = Run.objects.unscoped().get(name=created["name"])
    (attempt,) = RunAttempt.objects.unscoped().filter(run=run)
    assert Path(attempt.log_path).read_text().count("step") > 10
    assert MetricPoint.objects.unscoped().filter(run=run, key="loss").count() >= 50
    assert Checkpoint.objects.unscoped().filter(run=run, complete=True).exists()
    assert verify_event_chain(run)
    logs = get_json(f"{portal.url}{created['url']}logs/?tail=3", token)
    assert "done: step" in logs["text"]
