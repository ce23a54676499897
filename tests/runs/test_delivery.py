"""Durable submission against the real parts: a Redis that goes away, a real Celery worker
and beat, gunicorn serving the API. Nothing submitted is lost, nothing is delivered twice."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from kombu import Connection

from identity import tokens
from runs import lifecycle
from runs.events import verify_event_chain
from runs.models import Delivery, Run, RunEvent, RunState
from runs.tasks import deliver
from tests.runs.factories import TINY_FILES, TINY_SPEC, zip_bytes
from tests.runs.processes import Portal, PrivateRedis, portal_processes, wait_for

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def portal(tmp_path: Path, redis: PrivateRedis) -> Iterator[Portal]:
    yield from portal_processes(tmp_path, redis.url)


def queued_events(run: Run) -> int:
    return RunEvent.objects.unscoped().filter(run=run, new_state=RunState.QUEUED).count()


def test_submitted_while_the_broker_is_down_is_delivered_once_it_is_back(
    world: Any, redis: PrivateRedis, portal: Portal
) -> None:
    portal.start()
    token = tokens.issue_token(user=world.users["researcher"], name="e2e").plaintext
    redis.stop()
    started = time.monotonic()
    response = requests.post(
        f"{portal.url}/api/v1/workspaces/alpha/runs/",
        headers={"Authorization": f"Bearer {token}"},
        files={"spec": ("tau.yaml", TINY_SPEC), "bundle": ("project.zip", zip_bytes(TINY_FILES))},
        timeout=60,
    )
    assert response.status_code == 201, response.text
    assert time.monotonic() - started < 30, "a down broker must not hang submission"
    run = Run.objects.unscoped().get(name=response.json()["name"])
    time.sleep(3)
    run.refresh_from_db()
    assert run.state == RunState.PENDING  # nothing could carry it yet, and nothing was lost
    redis.start()
    wait_for(
        lambda: Run.objects.unscoped().get(pk=run.pk).state == RunState.QUEUED,
        timeout=90,
        what=f"delivery after the broker came back (worker log:\n{portal.log('worker')[-2000:]})",
    )
    time.sleep(3)  # give any duplicate a chance to show itself
    deliveries = list(Delivery.objects.unscoped().filter(run=run))
    assert len(deliveries) == 1
    assert deliveries[0].delivered_at is not None
    assert queued_events(run) == 1
    assert verify_event_chain(run)


def test_the_same_delivery_twice_has_one_effect(
    world: Any, redis: PrivateRedis, portal: Portal
) -> None:
    portal.start(web=False, beat=False)
    run = lifecycle.create_run(
        workspace=world.alpha,
        user=world.users["researcher"],
        submission=_submission(world),
    )
    delivery = Delivery.objects.unscoped().get(run=run)
    with Connection(redis.url) as connection:
        for _ in range(3):  # a duplicated task, as a redelivery after a worker crash would make
            deliver.apply_async(args=(delivery.pk,), connection=connection)  # type: ignore[call-arg]
    wait_for(
        lambda: Run.objects.unscoped().get(pk=run.pk).state == RunState.QUEUED,
        timeout=60,
        what="delivery by the worker",
    )
    time.sleep(3)
    delivery.refresh_from_db()
    assert delivery.tries == 1
    assert queued_events(run) == 1


def _submission(world: Any) -> lifecycle.Submission:
    from runs.submission import check_spec

    placement = check_spec(TINY_SPEC, workspace=world.alpha)
    return lifecycle.Submission(
        spec=placement.spec,
        source=TINY_SPEC.decode(),
        bundle=None,
        priority=placement.priority,
        priority_value=placement.priority_value,
        backend="local",
    )
