"""The core's decision table (runs/observations.py), which both backends call with what they
saw of an attempt: the rows the Kubernetes watcher's tests
(tests/executors/kubernetes/test_kube_watcher.py) do not reach, and the ones the local executor
depends on.

* an attempt still live whose run was ended by someone else is closed with what was seen
  when it ends, and the run is left as it was (no event, no new decision);
* an interruption (the platform stopped it, not the workload) starts the run again from its
  newest checkpoint without using a retry, even with ``max_retries: 0``;
* the same end seen twice changes nothing the second time.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from runs import delivery
from runs.models import FailureClass, Run, RunAttempt, RunEvent, RunState
from runs.observations import Observation, ObservedState, apply_observation
from runs.state import lock_run, transition
from tests.runs.factories import TINY_SPEC, make_run

pytestmark = [pytest.mark.django_db(transaction=True)]

NO_RETRIES = TINY_SPEC + b"resilience:\n  max_retries: 0\n"
RUNNING = Observation(state=ObservedState.RUNNING, ran=True, admitted=True)


@pytest.fixture(autouse=True)
def no_broker(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A retry's new delivery is recorded, not sent to a broker."""
    published: list[int] = []
    monkeypatch.setattr(delivery, "publish", published.append)
    return published


def running_run(world: Any, spec: bytes = TINY_SPEC) -> Run:
    """A run whose first attempt runs, brought there through the table as a backend would."""
    run = make_run(world, spec=spec)
    with transaction.atomic():
        transition(lock_run(run.pk), RunState.QUEUED, reason="Handed over.")
    applied = apply_observation(run_id=run.pk, attempt_number=1, observation=RUNNING)
    assert applied.actions == ["admitted", "running"]
    return fresh(run)


def fresh(run: Run) -> Run:
    return Run.objects.unscoped().get(pk=run.pk)


def attempt_of(run: Run, number: int = 1) -> RunAttempt:
    return RunAttempt.objects.unscoped().get(run_id=run.pk, number=number)


def event_count(run: Run) -> int:
    return RunEvent.objects.unscoped().filter(run=run).count()


def test_a_live_attempt_of_a_run_ended_elsewhere_is_closed_and_the_run_left_alone(
    world: Any,
) -> None:
    run = running_run(world)
    with transaction.atomic():
        transition(lock_run(run.pk), RunState.FAILED, reason="Stopped by the platform team.")
    events = event_count(run)
    killed = Observation(
        state=ObservedState.FAILED,
        reason="Killed by signal 9.",
        failure_class=FailureClass.INFRASTRUCTURE,
        exit_code=137,
        ran=True,
        admitted=True,
        object_active=True,
    )
    applied = apply_observation(
        run_id=run.pk, attempt_number=1, observation=killed, object_remains=True
    )
    assert applied.actions == ["ended:infrastructure"]
    assert (applied.ended_attempt, applied.delete_object) == (1, True)
    attempt = attempt_of(run)
    assert attempt.state == RunAttempt.State.FAILED
    assert (attempt.exit_code, attempt.failure_message) == (137, "Killed by signal 9.")
    assert attempt.finished_at is not None
    run = fresh(run)
    assert (run.state, run.state_reason) == (RunState.FAILED, "Stopped by the platform team.")
    assert event_count(run) == events
    # Seen again: the attempt is finished; only its leftovers are named.
    again = apply_observation(
        run_id=run.pk, attempt_number=1, observation=killed, object_remains=True
    )
    assert (again.actions, again.delete_object) == ([], True)


def test_an_interruption_starts_again_without_using_a_retry(
    world: Any, no_broker: list[int]
) -> None:
    run = running_run(world, spec=NO_RETRIES)
    stopped = Observation(
        state=ObservedState.FAILED,
        reason="the agent stopped",
        failure_class=FailureClass.INFRASTRUCTURE,
        ran=True,
        admitted=True,
        interrupted=True,
    )
    applied = apply_observation(run_id=run.pk, attempt_number=1, observation=stopped)
    assert applied.actions == ["ended:infrastructure"]
    run = fresh(run)
    assert (run.state, run.attempt_count) == (RunState.QUEUED, 2)
    assert run.state_reason.startswith("Interrupted (the agent stopped); starting again")
    assert run.not_before is None  # at once, no back-off
    first = attempt_of(run)
    assert (first.state, first.counts_against_retries) == (RunAttempt.State.FAILED, False)
    assert attempt_of(run, 2).state == RunAttempt.State.WAITING


def test_the_same_end_twice_changes_nothing_the_second_time(world: Any) -> None:
    run = running_run(world)
    done = Observation(state=ObservedState.SUCCEEDED, exit_code=0, ran=True, admitted=True)
    assert apply_observation(run_id=run.pk, attempt_number=1, observation=done).actions == [
        "succeeded"
    ]
    events = event_count(run)
    again = apply_observation(run_id=run.pk, attempt_number=1, observation=done)
    assert (again.actions, again.ended_attempt) == ([], None)
    assert (fresh(run).state, event_count(run)) == (RunState.SUCCEEDED, events)
