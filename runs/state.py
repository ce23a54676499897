"""A run's state: the one writer of ``Run.state`` and of what is said about it.

``transition`` is the only code that changes ``Run.state``. It locks the row, checks the
transition table (``runs.models.TRANSITIONS``), stamps the times, and appends a hash-chained
event in the same transaction. The other writes here change what a run says while its state
stays (its place in the queue and why it waits), each under the same rule: guarded by the
state it is about, so a run that moved on meanwhile keeps its own words.
"""

from __future__ import annotations

from typing import Any, Literal

from django.db import transaction
from django.dispatch import Signal
from django.utils import timezone

from runs.events import append_event, append_workload_event
from runs.models import (
    TERMINAL_STATES,
    TRANSITIONS,
    EventKind,
    FailureClass,
    Run,
    RunAttempt,
    RunEvent,
    RunState,
)

#: Sent by ``transition`` inside the transaction that moves a run into a terminal state, with
#: ``run`` (locked) and ``event`` (the terminal event). The evidence app, which sits above
#: runs and so cannot be called from here, writes its seal request in the receiver: the
#: request commits with the change that needs it, or neither does.
run_ended = Signal()

#: Sent by ``transition`` inside the transaction of every change of state, with ``run``
#: (locked, already in its new state), ``old_state``, ``new_state`` and ``event`` (the event
#: that records it). The notifications app, above runs, turns the changes people are told of
#: into deliveries in that same transaction; a receiver must only write rows, never call out.
run_changed = Signal()


class IllegalTransition(RuntimeError):
    """A state change the transition table does not allow: a bug, never user input."""


class RunActionRefused(ValueError):
    """A request that makes no sense for the run's state (cancel a finished run, say)."""


def lock_run(run_id: int) -> Run:
    """The run, locked for update until the surrounding transaction ends. Every write to a
    run (its state, its history, its attempts, its metric names) takes this lock first.

    Only the run's row is locked (``OF self``; the workspace is read along, not locked), and
    as an update that keeps its key (``NO KEY UPDATE``): rows that merely point at the run or
    its workspace (a new token, event or run of the same workspace) are never held up by it.
    Locking the joined workspace row too made every transition in a workspace wait for the
    others, and deadlocked with a transaction inserting a row that references the workspace
    (PostgreSQL checks Django's deferred foreign keys at commit, with a share lock)."""
    return (
        Run.objects.unscoped()
        .select_for_update(of=("self",), no_key=True)
        .select_related("workspace")
        .get(pk=run_id)
    )


_TIMESTAMP_FOR_STATE = {
    RunState.QUEUED: "queued_at",
    RunState.ADMITTED: "admitted_at",
    RunState.RUNNING: "started_at",
}


@transaction.atomic
def transition(
    run: Run,
    new_state: RunState,
    *,
    reason: str = "",
    message: str = "",
    data: dict[str, Any] | None = None,
    kind: EventKind = EventKind.STATE,
    failure_class: FailureClass | Literal[""] | None = None,
) -> Run:
    """Move the run to ``new_state`` (row-locked, checked, recorded). Returns the fresh run.

    ``failure_class`` is what the run's failure class becomes with the move (``""``: it has
    none any more, as when it succeeds or is resumed; None: unchanged). This is the one
    place it is written, so it always changes with the state and its event.

    A run that ends while an attempt of it still waits (cancelled before it was admitted,
    failed because no backend could be told) ends that attempt with it: cancelled, or failed
    with the run's failure class and the reason."""
    locked = lock_run(run.pk)
    old_state = RunState(locked.state)
    if new_state not in TRANSITIONS[old_state]:
        raise IllegalTransition(f"run {locked.name}: {old_state} → {new_state} is not allowed")
    now = timezone.now()
    locked.state = new_state
    locked.state_reason = reason
    if failure_class is not None:
        locked.failure_class = failure_class
    if new_state != RunState.QUEUED:
        locked.queue_position = None
    stamp = _TIMESTAMP_FOR_STATE.get(new_state)
    if stamp:
        setattr(locked, stamp, now)
    if new_state in TERMINAL_STATES:
        locked.finished_at = now
        _end_waiting_attempt(locked, new_state, reason=message or reason, now=now)
    elif old_state in TERMINAL_STATES:
        locked.finished_at = None  # resumed
    locked.save()
    event = append_event(
        locked,
        kind,
        message=message or reason,
        data=data,
        old_state=old_state,
        new_state=new_state,
    )
    if new_state in TERMINAL_STATES:
        run_ended.send(sender=Run, run=locked, event=event)
    run_changed.send(sender=Run, run=locked, old_state=old_state, new_state=new_state, event=event)
    return locked


def _end_waiting_attempt(run: Run, new_state: RunState, *, reason: str, now: Any) -> None:
    waiting = RunAttempt.objects.for_workspace(run.workspace_id).filter(
        run=run, state=RunAttempt.State.WAITING
    )
    if new_state == RunState.FAILED:
        waiting.update(
            state=RunAttempt.State.FAILED,
            failure_class=run.failure_class or FailureClass.UNKNOWN,
            failure_message=reason[:4000],
            finished_at=now,
        )
    else:
        waiting.update(state=RunAttempt.State.CANCELLED, finished_at=now)


@transaction.atomic
def record_workload_event(
    run: Run, own_kind: str, *, message: str, data: dict[str, Any] | None = None
) -> RunEvent:
    """An event the running workload reports (``workload.<its kind>``)."""
    locked = lock_run(run.pk)
    return append_workload_event(locked, own_kind, message=message, data=data)


@transaction.atomic
def record_data_staged(
    run: Run, *, attempt: int, files: int, bytes: int, seconds: float
) -> RunEvent:
    """An attempt's ``inputs.datasets`` are staged (the local executor, a cluster's stager)."""
    locked = lock_run(run.pk)
    return append_event(
        locked,
        EventKind.DATA_STAGED,
        message=f"Attempt {attempt} staged its datasets: {files:,} files, {bytes:,} bytes in "
        f"{seconds:.1f} s.",
        data={"attempt": attempt, "files": files, "bytes": bytes, "seconds": round(seconds, 3)},
    )


def note_waiting(*, run_id: int, position: int | None, reason: str) -> bool:
    """Say where a queued run stands and why it waits. Only while it is queued: a run that was
    admitted or cancelled meanwhile keeps its own reason. True if anything was written."""
    return bool(
        Run.objects.unscoped()
        .filter(pk=run_id, state=RunState.QUEUED)
        .update(queue_position=position, state_reason=reason, updated_at=timezone.now())
    )


def note_reason(*, run_id: int, state: RunState, reason: str) -> bool:
    """Say what a run is doing while its state stays (an admitted run installing its
    requirements, say). Only while it is in ``state``. True if anything was written."""
    return bool(
        Run.objects.unscoped()
        .filter(pk=run_id, state=state)
        .update(state_reason=reason, updated_at=timezone.now())
    )
