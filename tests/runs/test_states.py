"""The run state machine: the transition table is enforced, every change is an event, and
the events form a hash chain that detects any tampering."""

from __future__ import annotations

import ast
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from runs import attempts, lifecycle
from runs.events import verify_event_chain
from runs.models import (
    LIVE_STATES,
    RUNNING_STATES,
    TERMINAL_STATES,
    TRANSITIONS,
    WAITING_STATES,
    Delivery,
    FailureClass,
    Run,
    RunAttempt,
    RunEvent,
    RunState,
)
from runs.state import IllegalTransition, transition
from tau.evidence.chain import GENESIS_HASH
from tests.runs.factories import make_run

pytestmark = pytest.mark.django_db

PAIRS = [(old, new) for old in RunState for new in RunState]


@pytest.mark.parametrize(("old", "new"), PAIRS, ids=[f"{o}->{n}" for o, n in PAIRS])
def test_transition_table(world: Any, old: RunState, new: RunState) -> None:
    run = make_run(world, state=old)
    events_before = RunEvent.objects.for_workspace(world.alpha).filter(run=run).count()
    if new in TRANSITIONS[old]:
        moved = transition(run, new, reason="test")
        assert moved.state == new
        assert (
            RunEvent.objects.for_workspace(world.alpha).filter(run=run).count() == events_before + 1
        )
    else:
        with pytest.raises(IllegalTransition):
            transition(run, new, reason="test")
        run.refresh_from_db()
        assert run.state == old
        assert RunEvent.objects.for_workspace(world.alpha).filter(run=run).count() == events_before


def test_every_state_has_a_row_in_the_table() -> None:
    assert set(TRANSITIONS) == set(RunState)


def test_a_lifecycle_leaves_a_verifiable_chain(world: Any) -> None:
    run = make_run(world)
    for state in (RunState.QUEUED, RunState.ADMITTED, RunState.RUNNING, RunState.SUCCEEDED):
        run = transition(run, state, reason=f"to {state}")
    assert run.finished_at is not None
    events = list(RunEvent.objects.for_workspace(world.alpha).filter(run=run).order_by("seq"))
    assert [e.seq for e in events] == [1, 2, 3, 4, 5]
    assert events[0].prev_hash == GENESIS_HASH
    assert all(later.prev_hash == earlier.hash for earlier, later in pairwise(events))
    assert verify_event_chain(run)


@pytest.mark.parametrize("field", ["message", "new_state", "data"])
def test_tampering_breaks_the_chain(world: Any, field: str) -> None:
    run = make_run(world)
    run = transition(run, RunState.QUEUED, reason="queued")
    transition(run, RunState.CANCELLED, reason="cancelled")
    first = RunEvent.objects.for_workspace(world.alpha).get(run=run, seq=2)
    value = {"message": "nothing to see", "new_state": "succeeded", "data": {"forged": True}}[field]
    RunEvent.objects.for_workspace(world.alpha).filter(pk=first.pk).update(**{field: value})
    assert not verify_event_chain(Run.objects.for_workspace(world.alpha).get(pk=run.pk))


def test_a_deleted_event_breaks_the_chain(world: Any) -> None:
    run = make_run(world)
    run = transition(run, RunState.QUEUED, reason="queued")
    transition(run, RunState.CANCELLED, reason="cancelled")
    RunEvent.objects.for_workspace(world.alpha).filter(run=run, seq=2).delete()
    assert not verify_event_chain(run)


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
    run = transition(run, RunState.QUEUED)
    attempt = attempts.admit_attempt(run=run)
    attempts.attempt_running(attempt=attempt, pid=None)
    run = attempts.finish_attempt(
        attempt=attempt,
        outcome=attempts.AttemptOutcome(succeeded=False, exit_code=-9, failure_class="oom_killed"),
    )
    assert run.state == RunState.QUEUED
    assert run.retry_reason == "oom_killed"
    assert run.not_before is not None
    second = attempts.admit_attempt(run=run)
    attempts.attempt_running(attempt=second)
    run = attempts.finish_attempt(
        attempt=second,
        outcome=attempts.AttemptOutcome(succeeded=False, exit_code=-9, failure_class="oom_killed"),
    )
    assert run.state == RunState.FAILED  # one retry only
    assert run.failure_class == "oom_killed"
    third = make_run(world, spec=spec)
    third = transition(third, RunState.QUEUED)
    attempt = attempts.admit_attempt(run=third)
    attempts.attempt_running(attempt=attempt)
    third = attempts.finish_attempt(
        attempt=attempt,
        outcome=attempts.AttemptOutcome(succeeded=False, exit_code=1, failure_class="user_error"),
    )
    assert third.state == RunState.FAILED  # user errors are not in retry_on
    assert verify_event_chain(third)


def _fail(run: Run, **outcome: Any) -> Run:
    attempt = attempts.admit_attempt(run=run)
    attempts.attempt_running(attempt=attempt)
    return attempts.finish_attempt(
        attempt=attempt, outcome=attempts.AttemptOutcome(succeeded=False, **outcome)
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
    run = transition(make_run(world, spec=NO_RETRIES), RunState.QUEUED)
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
    assert verify_event_chain(run)


def test_a_manual_resume_restores_the_retry_budget(world: Any) -> None:
    run = transition(make_run(world, spec=NO_RETRIES), RunState.QUEUED)
    run = _fail(run, exit_code=1, failure_class="user_error")
    run = _fail(run, exit_code=1, failure_class="user_error")
    assert run.state == RunState.FAILED
    run = lifecycle.resume_run(run=run, user=world.users["researcher"])
    run = _fail(run, exit_code=1, failure_class="user_error")
    assert run.state == RunState.QUEUED  # a retry again, counted from the resume
    run = _fail(run, exit_code=1, failure_class="user_error")
    assert run.state == RunState.FAILED


def test_the_named_sets_of_states_divide_every_state_once() -> None:
    assert set(RunState) == WAITING_STATES | RUNNING_STATES | TERMINAL_STATES
    assert not WAITING_STATES & RUNNING_STATES
    assert not (WAITING_STATES | RUNNING_STATES) & TERMINAL_STATES
    assert LIVE_STATES == WAITING_STATES | RUNNING_STATES
    # Under Kueue a preempted or evicted workload waits to be admitted again.
    assert {RunState.PREEMPTED, RunState.EVICTED} <= WAITING_STATES


@pytest.mark.parametrize("end", [RunState.CANCELLED, RunState.FAILED], ids=str)
def test_a_run_that_ends_ends_its_waiting_attempt(world: Any, end: RunState) -> None:
    run = transition(make_run(world), RunState.QUEUED)
    Run.objects.for_workspace(world.alpha).filter(pk=run.pk).update(
        failure_class=FailureClass.INFRASTRUCTURE
    )
    run = transition(run, end, reason="the backend said no")
    (attempt,) = RunAttempt.objects.for_workspace(world.alpha).filter(run=run)
    assert attempt.finished_at is not None
    if end == RunState.FAILED:
        assert attempt.state == RunAttempt.State.FAILED
        assert attempt.failure_class == FailureClass.INFRASTRUCTURE
        assert attempt.failure_message == "the backend said no"
    else:
        assert attempt.state == RunAttempt.State.CANCELLED


def test_an_interrupted_attempt_keeps_the_runs_place_in_the_queue(world: Any) -> None:
    run = transition(make_run(world, spec=NO_RETRIES), RunState.QUEUED)
    queued_at = run.queued_at
    run = _fail(run, failure_class="infrastructure", message="agent restarted", interrupted=True)
    assert run.state == RunState.QUEUED
    assert run.queued_at == queued_at
    run.refresh_from_db()
    assert run.queued_at == queued_at
    # ... and is handed over again as its next attempt.
    newest = RunAttempt.objects.for_workspace(world.alpha).filter(run=run).latest("number")
    assert (newest.number, newest.state) == (2, RunAttempt.State.WAITING)
    assert Delivery.objects.for_workspace(world.alpha).filter(run=run, attempt=newest).exists()


def test_the_failure_class_moves_with_the_state_it_explains(world: Any) -> None:
    """``transition`` writes the failure class with the state and its event: set when the
    run fails, cleared when it is resumed, unchanged when not given."""
    run = make_run(world, state=RunState.RUNNING)
    failed = transition(
        run, RunState.FAILED, reason="no memory", failure_class=FailureClass.OOM_KILLED
    )
    assert Run.objects.for_workspace(world.alpha).get(pk=run.pk).failure_class == "oom_killed"
    assert failed.failure_class == FailureClass.OOM_KILLED
    queued = transition(failed, RunState.QUEUED, reason="resumed", failure_class="")
    assert Run.objects.for_workspace(world.alpha).get(pk=queued.pk).failure_class == ""
    transition(queued, RunState.CANCELLED, reason="stopped")  # None: left as it is
    assert Run.objects.for_workspace(world.alpha).get(pk=queued.pk).failure_class == ""


def failure_class_writes(path: Path) -> list[str]:
    """Where a file writes a run's failure class other than through ``transition``: an
    assignment to ``<run>.failure_class`` (an attempt's, an exception's and an outcome's are
    their own), ``"failure_class"`` in ``update_fields``, or ``.update(failure_class=...)``
    on anything but waiting attempts."""
    found = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr == "failure_class":
                    owner = ast.unparse(target.value)
                    if "attempt" not in owner and owner != "self":
                        found.append(f"{path}:{node.lineno} sets {owner}.failure_class")
        elif isinstance(node, ast.keyword) and node.arg == "update_fields":
            if "'failure_class'" in ast.unparse(node.value):
                found.append(f"{path}:{node.value.lineno} saves failure_class")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "update"
            and any(keyword.arg == "failure_class" for keyword in node.keywords)
            and ast.unparse(node.func.value) != "waiting"
        ):
            found.append(f"{path}:{node.lineno} updates failure_class")
    return found


def test_only_transition_writes_a_runs_failure_class(tmp_path: Path) -> None:
    """Issue 31: "lock, set the class, save, move to failed" was written out in six places;
    now the class is an argument of the one function that moves a run."""
    root = Path(__file__).resolve().parents[2]
    state = root / "runs" / "state.py"
    product = [
        path
        for package in ("runs", "evidence", "gpus", "accounting", "notifications", "workspaces")
        for path in sorted((root / package).rglob("*.py"))
        if "migrations" not in path.parts and path != state
    ]
    assert [line for path in product for line in failure_class_writes(path)] == []
    # The check finds each shape it looks for.
    sample = tmp_path / "sample.py"
    sample.write_text(
        "locked.failure_class = 'x'\n"
        "run.save(update_fields=['failure_class'])\n"
        "Run.objects.filter(pk=1).update(failure_class='x')\n"
        "attempt.failure_class = 'x'\n",
        encoding="utf-8",
    )
    assert len(failure_class_writes(sample)) == 3
