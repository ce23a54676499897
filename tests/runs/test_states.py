"""The run state machine: the transition table is enforced, every change is an event, and
the events form a hash chain that detects any tampering."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest

from runs import services
from runs.models import TRANSITIONS, Run, RunEvent, RunState
from tests.runs.factories import make_run

pytestmark = pytest.mark.django_db

PAIRS = [(old, new) for old in RunState for new in RunState]


@pytest.mark.parametrize(("old", "new"), PAIRS, ids=[f"{o}->{n}" for o, n in PAIRS])
def test_transition_table(world: Any, old: RunState, new: RunState) -> None:
    run = make_run(world, state=old)
    events_before = RunEvent.objects.for_workspace(world.alpha).filter(run=run).count()
    if new in TRANSITIONS[old]:
        moved = services.transition(run, new, reason="test")
        assert moved.state == new
        assert (
            RunEvent.objects.for_workspace(world.alpha).filter(run=run).count() == events_before + 1
        )
    else:
        with pytest.raises(services.IllegalTransition):
            services.transition(run, new, reason="test")
        run.refresh_from_db()
        assert run.state == old
        assert RunEvent.objects.for_workspace(world.alpha).filter(run=run).count() == events_before


def test_every_state_has_a_row_in_the_table() -> None:
    assert set(TRANSITIONS) == set(RunState)


def test_a_lifecycle_leaves_a_verifiable_chain(world: Any) -> None:
    run = make_run(world)
    for state in (RunState.QUEUED, RunState.ADMITTED, RunState.RUNNING, RunState.SUCCEEDED):
        run = services.transition(run, state, reason=f"to {state}")
    assert run.finished_at is not None
    events = list(RunEvent.objects.for_workspace(world.alpha).filter(run=run).order_by("seq"))
    assert [e.seq for e in events] == [1, 2, 3, 4, 5]
    assert events[0].prev_hash == services.GENESIS_HASH
    assert all(later.prev_hash == earlier.hash for earlier, later in pairwise(events))
    assert services.verify_event_chain(run)


@pytest.mark.parametrize("field", ["message", "new_state", "data"])
def test_tampering_breaks_the_chain(world: Any, field: str) -> None:
    run = make_run(world)
    run = services.transition(run, RunState.QUEUED, reason="queued")
    services.transition(run, RunState.CANCELLED, reason="cancelled")
    first = RunEvent.objects.for_workspace(world.alpha).get(run=run, seq=2)
    value = {"message": "nothing to see", "new_state": "succeeded", "data": {"forged": True}}[field]
    RunEvent.objects.for_workspace(world.alpha).filter(pk=first.pk).update(**{field: value})
    assert not services.verify_event_chain(Run.objects.for_workspace(world.alpha).get(pk=run.pk))


def test_a_deleted_event_breaks_the_chain(world: Any) -> None:
    run = make_run(world)
    run = services.transition(run, RunState.QUEUED, reason="queued")
    services.transition(run, RunState.CANCELLED, reason="cancelled")
    RunEvent.objects.for_workspace(world.alpha).filter(run=run, seq=2).delete()
    assert not services.verify_event_chain(run)


def test_finishing_an_attempt_retries_per_policy(world: Any) -> None:
    spec = b"""schema_version: 1
name: flaky
run:
  entrypoint: main.py
  workload_kind: job
compute:
  cpus: 1
  memory: 256Mi
resilience:
  max_retries: 1
  retry_on: [oom_killed]
  backoff: {initial: 5s, max: 1m}
"""
    run = make_run(world, spec=spec)
    run = services.transition(run, RunState.QUEUED)
    attempt = services.start_attempt(run=run)
    services.attempt_running(attempt=attempt, pid=None)
    run = services.finish_attempt(
        attempt=attempt,
        outcome=services.AttemptOutcome(succeeded=False, exit_code=-9, failure_class="oom_killed"),
    )
    assert run.state == RunState.QUEUED
    assert run.retry_reason == "oom_killed"
    assert run.not_before is not None
    second = services.start_attempt(run=run)
    services.attempt_running(attempt=second)
    run = services.finish_attempt(
        attempt=second,
        outcome=services.AttemptOutcome(succeeded=False, exit_code=-9, failure_class="oom_killed"),
    )
    assert run.state == RunState.FAILED  # one retry only
    assert run.failure_class == "oom_killed"
    third = make_run(world, spec=spec)
    third = services.transition(third, RunState.QUEUED)
    attempt = services.start_attempt(run=third)
    services.attempt_running(attempt=attempt)
    third = services.finish_attempt(
        attempt=attempt,
        outcome=services.AttemptOutcome(succeeded=False, exit_code=1, failure_class="user_error"),
    )
    assert third.state == RunState.FAILED  # user errors are not in retry_on
    assert services.verify_event_chain(third)


def _fail(run: Run, **outcome: Any) -> Run:
    attempt = services.start_attempt(run=run)
    services.attempt_running(attempt=attempt)
    return services.finish_attempt(
        attempt=attempt, outcome=services.AttemptOutcome(succeeded=False, **outcome)
    )


NO_RETRIES = b"""schema_version: 1
name: strict
run:
  entrypoint: main.py
  workload_kind: job
resilience:
  max_retries: 1
  retry_on: [user_error]
"""


def test_platform_interruptions_use_no_retry(world: Any) -> None:
    run = services.transition(make_run(world, spec=NO_RETRIES), RunState.QUEUED)
    # infrastructure is not in retry_on, yet an interruption always comes back, uncounted.
    for _ in range(3):
        run = _fail(
            run, failure_class="infrastructure", message="agent restarted", interrupted=True
        )
        assert run.state == RunState.QUEUED
        assert run.not_before is None
    run = _fail(run, exit_code=1, failure_class="user_error")
    assert run.state == RunState.QUEUED  # the one retry the policy allows
    run = _fail(run, exit_code=1, failure_class="user_error")
    assert run.state == RunState.FAILED
    assert services.verify_event_chain(run)


def test_a_manual_resume_restores_the_retry_budget(world: Any) -> None:
    run = services.transition(make_run(world, spec=NO_RETRIES), RunState.QUEUED)
    run = _fail(run, exit_code=1, failure_class="user_error")
    run = _fail(run, exit_code=1, failure_class="user_error")
    assert run.state == RunState.FAILED
    run = services.resume_run(run=run, user=world.users["researcher"])
    run = _fail(run, exit_code=1, failure_class="user_error")
    assert run.state == RunState.QUEUED  # a retry again, counted from the resume
    run = _fail(run, exit_code=1, failure_class="user_error")
    assert run.state == RunState.FAILED
