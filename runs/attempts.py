"""A run's attempts: handed over, admitted, running, finished; and what follows a finished one.

An attempt is created, numbered and waiting, when the run is handed to its backend
(``hand_over``: in the transaction of the submission, the retry or the resume, together with
the ``submit`` delivery that tells the backend), so the backend's objects can carry its
number before anything runs. The backend's supervisor (the local agent, the Kubernetes
watcher) then admits that attempt, records that it runs, and records how it ended
(``finish_attempt``), which decides, with the retry policy (``runs.retry``), whether the run
succeeds, fails or goes back to the queue with a new attempt.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from runs import retry, selectors, wording
from runs.checkpoints import newest_checkpoint
from runs.delivery import write_delivery
from runs.models import (
    TERMINAL_STATES,
    Checkpoint,
    Delivery,
    EventKind,
    FailureClass,
    Run,
    RunAttempt,
    RunState,
)
from runs.state import IllegalTransition, lock_run, transition
from tau.spec import spec_from_dict


class NoWaitingAttempt(IllegalTransition):
    """A queued run without the waiting attempt it was handed over with: a bug."""


@dataclass(frozen=True)
class AttemptOutcome:
    succeeded: bool
    exit_code: int | None = None
    failure_class: str = ""
    message: str = ""
    cancelled: bool = False
    # The platform stopped it (the local agent restarted, say), not the workload: it starts
    # again from its newest checkpoint whatever the retry policy says, uses no retry, and
    # keeps the run's place in the queue.
    interrupted: bool = False


def has_live_attempt(run: Run) -> bool:
    return (
        RunAttempt.objects.for_workspace(run.workspace_id)
        .filter(run=run, state__in=[RunAttempt.State.STARTING, RunAttempt.State.RUNNING])
        .exists()
    )


def hand_over(*, run: Run, resume_from: Checkpoint | None, retry_reason: str) -> RunAttempt:
    """The run's next attempt, waiting, and the delivery that hands it to the backend. The
    caller holds the run's lock (or has just created the run) in its transaction."""
    now = timezone.now()
    # An attempt that still waits is replaced, never left beside the new one.
    RunAttempt.objects.for_workspace(run.workspace_id).filter(
        run=run, state=RunAttempt.State.WAITING
    ).update(state=RunAttempt.State.CANCELLED, finished_at=now)
    number = run.attempt_count + 1
    attempt = RunAttempt.objects.create(
        run=run, number=number, resume_from=resume_from, retry_reason=retry_reason
    )
    run.attempt_count = number
    run.save(update_fields=["attempt_count", "updated_at"])
    write_delivery(run=run, action=Delivery.Action.SUBMIT, attempt=attempt)
    return attempt


@transaction.atomic
def admit_attempt(*, run: Run, admitted_at: datetime | None = None) -> RunAttempt:
    """The backend admitted the run: its waiting attempt starts. The run must be queued.

    ``admitted_at``: when the backend says it reserved the resources (Kueue's admission
    time), if earlier than now: usage counts from then. Never before the attempt existed."""
    locked = lock_run(run.pk)
    attempt = (
        RunAttempt.objects.for_workspace(locked.workspace_id)
        .filter(run=locked, number=locked.attempt_count, state=RunAttempt.State.WAITING)
        .select_related("resume_from")
        .first()
    )
    if attempt is None:
        raise NoWaitingAttempt(f"run {locked.name} has no waiting attempt to admit")
    transition(
        locked,
        RunState.ADMITTED,
        reason="Resources reserved; starting.",
        data={"attempt": attempt.number},
    )
    now = timezone.now()
    attempt.state = RunAttempt.State.STARTING
    attempt.admitted_at = min(max(admitted_at or now, attempt.created_at), now)
    attempt.save(update_fields=["state", "admitted_at"])
    return attempt


@transaction.atomic
def attempt_running(
    *, attempt: RunAttempt, pid: int | None = None, start_ticks: int | None = None
) -> None:
    attempt.state = RunAttempt.State.RUNNING
    attempt.started_at = timezone.now()
    if pid is not None:  # the local executor's process (kept when a later caller has none)
        attempt.pid = pid
        attempt.process_start_ticks = start_ticks
    attempt.save(update_fields=["state", "started_at", "pid", "process_start_ticks"])
    run = lock_run(attempt.run_id)
    if run.state == RunState.ADMITTED:
        transition(run, RunState.RUNNING, reason="Running.", data={"attempt": attempt.number})


def note_placement(*, attempt: RunAttempt, backend_name: str, log_path: str) -> None:
    """Where the backend runs the attempt (a process folder, an object name) and keeps its
    log."""
    attempt.backend_name = backend_name
    attempt.log_path = log_path
    RunAttempt.objects.unscoped().filter(pk=attempt.pk).update(
        backend_name=backend_name, log_path=log_path
    )


def note_admission(*, attempt_id: int, cluster_queue: str, flavors: dict[str, str]) -> bool:
    """What Kueue admitted the attempt to (its ClusterQueue, a flavor per resource). Saying
    the same twice writes nothing; returns whether anything changed."""
    attempt = (
        RunAttempt.objects.unscoped().filter(pk=attempt_id).only("cluster_queue", "flavors").first()
    )
    if attempt is None or (attempt.cluster_queue, attempt.flavors) == (cluster_queue, flavors):
        return False
    RunAttempt.objects.unscoped().filter(pk=attempt_id).update(
        cluster_queue=cluster_queue, flavors=flavors
    )
    return True


def note_nodes(*, attempt_id: int, node_names: list[str]) -> bool:
    """The nodes the attempt's pods were bound to (sorted, each once), added to those seen
    before; returns whether any was new."""
    attempt = RunAttempt.objects.unscoped().filter(pk=attempt_id).only("node_names").first()
    if attempt is None:
        return False
    known = list(attempt.node_names or [])
    merged = sorted(set(known) | set(node_names))
    if merged == sorted(known):
        return False
    RunAttempt.objects.unscoped().filter(pk=attempt_id).update(node_names=merged)
    return True


def note_log_kept(*, attempt_id: int, path: str, size: int) -> None:
    """Where the portal keeps an ended attempt's log (a cluster's pods do not last)."""
    RunAttempt.objects.unscoped().filter(pk=attempt_id).update(log_path=path, log_size=size)


def note_log_missing(*, attempt_id: int, why: str) -> None:
    """Why the portal keeps no log of an ended attempt (its backend looked and found none to
    keep): its evidence is sealed with this instead of waiting for a log."""
    RunAttempt.objects.unscoped().filter(pk=attempt_id, log_path="").update(log_note=why[:500])


def note_progress(
    *, attempt_id: int, log_size: int | None = None, metrics_offset: int | None = None
) -> None:
    """How far the backend has read what a running attempt writes (in the caller's
    transaction, with what was read)."""
    fields: dict[str, int] = {}
    if log_size is not None:
        fields["log_size"] = log_size
    if metrics_offset is not None:
        fields["metrics_offset"] = metrics_offset
    if fields:
        RunAttempt.objects.unscoped().filter(pk=attempt_id).update(**fields)


def _keep_queue_place(run: Run, queued_at: datetime | None) -> None:
    """A run the platform interrupted goes back to where it stood in the queue, not to its
    end: its old ``queued_at`` (the queue's order within a priority) is restored."""
    if run.state != RunState.QUEUED or queued_at is None:
        return
    Run.objects.unscoped().filter(pk=run.pk).update(queued_at=queued_at)
    run.queued_at = queued_at


@transaction.atomic
def requeue_stranded(*, run: Run, reason: str) -> Run:
    """A run the backend holds as admitted or running although nothing of it executes (its
    supervisor restarted before starting it) goes back to the queue, at its old place: with
    the attempt that never started, or else a new one."""
    locked = lock_run(run.pk)
    queued_at = locked.queued_at
    requeued = transition(locked, RunState.QUEUED, reason=reason)
    _keep_queue_place(requeued, queued_at)
    waiting = (
        RunAttempt.objects.for_workspace(requeued.workspace_id)
        .filter(run=requeued, number=requeued.attempt_count, state=RunAttempt.State.WAITING)
        .first()
    )
    if waiting is not None:
        # Its attempt never started: the backend is handed the same one again.
        write_delivery(run=requeued, action=Delivery.Action.SUBMIT, attempt=waiting)
    else:
        hand_over(
            run=requeued, resume_from=requeued.resume_from, retry_reason=requeued.retry_reason
        )
    return requeued


@transaction.atomic
def finish_attempt(
    *, attempt: RunAttempt, outcome: AttemptOutcome, now: datetime | None = None
) -> Run:
    """Close an attempt and decide what the run does next: succeed, fail, or retry."""
    now = now or timezone.now()
    run = lock_run(attempt.run_id)
    close_attempt(attempt, outcome, now)
    data = {"attempt": attempt.number, "exit_code": outcome.exit_code}
    state = RunState(run.state)
    if state in TERMINAL_STATES:
        return run  # already decided (e.g. cancelled while the process was exiting)
    if outcome.succeeded:
        return transition(
            run, RunState.SUCCEEDED, reason="Finished successfully.", data=data, failure_class=""
        )
    if outcome.cancelled or state == RunState.CANCELLING:
        return transition(
            run,
            RunState.CANCELLED,
            reason=wording.cancelled_reason(selectors.cancel_requested_by(run)),
            data=data,
            kind=EventKind.CANCELLED,
        )
    failure = FailureClass(attempt.failure_class)
    spec = spec_from_dict(run.spec)
    decision = retry.decide(
        spec,
        failure,
        retries_so_far=0 if outcome.interrupted else retry.retries_used(run, before=attempt),
        interrupted=outcome.interrupted,
    )
    if not decision.again:
        return transition(
            run,
            RunState.FAILED,
            reason=(
                f"Attempt {attempt.number} failed: {failure.label.lower()}. {outcome.message}"
            ).strip(),
            data={**data, "failure_class": failure.value},
            failure_class=failure,
        )
    # An interruption starts again at once; a retry waits out its backoff.
    run.not_before = (
        None if outcome.interrupted else now + timedelta(seconds=decision.delay_seconds)
    )
    run.resume_from = newest_checkpoint(run)
    run.retry_reason = failure.value
    run.save(update_fields=["not_before", "resume_from", "retry_reason"])
    where = f" from step {run.resume_from.step}" if run.resume_from else ""
    if outcome.interrupted:
        queued_at = run.queued_at
        run = transition(
            run,
            RunState.QUEUED,
            reason=f"Interrupted ({outcome.message}); starting again{where}.",
            data={**data, "failure_class": failure.value, "interrupted": True},
            kind=EventKind.RETRY,
            failure_class=failure,
        )
        _keep_queue_place(run, queued_at)
    else:
        if state not in {RunState.PREEMPTED, RunState.EVICTED} and failure in {
            FailureClass.PREEMPTED,
            FailureClass.EVICTED,
        }:
            run = transition(
                run,
                RunState(failure.value),
                reason=f"{failure.label}.",
                data=data,
                failure_class=failure,
            )
        run = transition(
            run,
            RunState.QUEUED,
            reason=(
                f"Attempt {attempt.number} failed ({failure.label.lower()}); "
                f"retrying{where} in {decision.delay_seconds}s."
            ),
            data={
                **data,
                "failure_class": failure.value,
                "retry_in_seconds": decision.delay_seconds,
            },
            kind=EventKind.RETRY,
            failure_class=failure,
        )
    hand_over(run=run, resume_from=run.resume_from, retry_reason=failure.value)
    return run


def close_attempt(attempt: RunAttempt, outcome: AttemptOutcome, now: datetime) -> None:
    """Record how one attempt ended, on its row only (what the run does next is
    :func:`finish_attempt`'s to decide)."""
    attempt.finished_at = now
    attempt.exit_code = outcome.exit_code
    if outcome.succeeded:
        attempt.state = RunAttempt.State.SUCCEEDED
    elif outcome.cancelled:
        attempt.state = RunAttempt.State.CANCELLED
    else:
        attempt.state = RunAttempt.State.FAILED
        attempt.failure_class = outcome.failure_class or FailureClass.UNKNOWN
        attempt.failure_message = outcome.message[:4000]
        attempt.counts_against_retries = not outcome.interrupted
    attempt.save()
