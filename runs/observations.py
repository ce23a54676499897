"""What a backend saw of one attempt of a run, and the one decision table that brings the run
up to it: :func:`apply_observation`. The Kubernetes watcher calls it with what the cluster's
objects say (``executors.kubernetes.status.observe``); the local executor calls it with how an
attempt it supervised ended (``executors.local.agent.supervisor``). Neither backend moves a
run or an attempt by a rule of its own: they report, the core decides.

The table, under the run's lock, in one transaction
===================================================

=====================================  ===============================================
the attempt and the run                what is done
=====================================  ===============================================
not the run's current attempt, or      nothing, but its leftovers are removed
  already finished, or the run ended     (``delete_object``); an attempt still live
                                         that ended has its row closed with what was
                                         seen, the run left as it is
nothing of it exists yet               nothing
the run is still pending               nothing yet: the backend records "queued" once
                                         it has handed the attempt over (``retry``)
queued                                 the reason it waits, while it waits
admitted / running                     admitted, then running, if not recorded yet;
                                         where it was placed (queue, flavors, nodes)
ended, after it was admitted           caught up as above, then finished: the run
                                         succeeds, fails or is retried
                                         (``runs.attempts.finish_attempt``)
ended before it was ever admitted      the run fails (nothing started to retry)
the run is cancelling                  finished when it ended by itself, else
                                         cancelled once nothing of it still runs
=====================================  ===============================================

Every step is guarded by what the database already holds, so the same observation applied
twice changes nothing the second time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from django.db import transaction
from django.utils import timezone

from runs import selectors, wording
from runs.attempts import (
    AttemptOutcome,
    admit_attempt,
    attempt_running,
    close_attempt,
    finish_attempt,
    note_admission,
    note_nodes,
)
from runs.models import TERMINAL_STATES, EventKind, FailureClass, Run, RunAttempt, RunState
from runs.state import lock_run, note_reason, transition


class ObservedState:
    """What a backend sees of an attempt, in run-state words. ``NOTHING``: nothing of the
    attempt exists yet (the backend has not started or created it): nothing to do."""

    NOTHING: Final = "nothing"
    QUEUED: Final = RunState.QUEUED.value
    ADMITTED: Final = RunState.ADMITTED.value
    RUNNING: Final = RunState.RUNNING.value
    SUCCEEDED: Final = RunState.SUCCEEDED.value
    FAILED: Final = RunState.FAILED.value
    PREEMPTED: Final = RunState.PREEMPTED.value
    EVICTED: Final = RunState.EVICTED.value

    #: The attempt is over: it is finished.
    ENDED: Final = frozenset({SUCCEEDED, FAILED, PREEMPTED, EVICTED})


FINISHED_ATTEMPT_STATES: Final = frozenset(
    {RunAttempt.State.SUCCEEDED, RunAttempt.State.FAILED, RunAttempt.State.CANCELLED}
)
LIVE_ATTEMPT_STATES: Final = frozenset({RunAttempt.State.STARTING, RunAttempt.State.RUNNING})


@dataclass(frozen=True)
class Observation:
    """One look at one attempt, as its backend read it."""

    state: str  # an ObservedState value
    reason: str = ""
    failure_class: FailureClass | None = None
    exit_code: int | None = None
    #: Where it was admitted: the cluster queue, the resource flavors, the nodes.
    cluster_queue: str = ""
    flavors: Mapping[str, str] = field(default_factory=dict)
    node_names: tuple[str, ...] = ()
    #: Its program started (a container or a process ran): an admitted attempt that ended
    #: had been running.
    ran: bool = False
    #: It was admitted at some point (so an attempt TauGrid still sees waiting was admitted).
    admitted: bool = False
    #: What the backend made for it is still there and not finished by itself (a Job
    #: suspended by Kueue after a preemption, or stuck on an image): once the attempt is over
    #: it must be removed, or it could be admitted again.
    object_active: bool = False
    #: What the backend made for it is gone or being removed (a cancel's stop, or someone
    #: else's deletion).
    deleted: bool = False
    #: The platform stopped it (the local executor restarted, say), not the workload: it
    #: starts again from its newest checkpoint and uses no retry.
    interrupted: bool = False
    #: A failure that the backend may still explain better (a GPU's XID reported late): not
    #: to be applied before this time.
    settles_at: datetime | None = None
    #: When it was admitted and when it ended, as the backend's own records say: what the
    #: attempt used is counted between them (runs.accounting), not from when anyone looked.
    admitted_at: datetime | None = None
    ended_at: datetime | None = None

    @property
    def ended(self) -> bool:
        return self.state in ObservedState.ENDED

    @property
    def succeeded(self) -> bool:
        return self.state == ObservedState.SUCCEEDED


@dataclass
class Applied:
    """What :func:`apply_observation` did (for the log and the tests), and what is left."""

    actions: list[str] = field(default_factory=list)
    #: The run is not ready for it yet (still pending): reconcile again soon.
    retry: bool = False
    #: The attempt is over but its Job or RayJob still holds (or may regain) quota.
    delete_object: bool = False
    #: The attempt ended: its run token is revoked.
    ended_attempt: int | None = None


def apply_observation(
    *,
    run_id: int,
    attempt_number: int,
    observation: Observation,
    processes_remain: bool = False,
    object_remains: bool = False,
) -> Applied:
    """Bring the run up to what its backend saw of its attempt ``attempt_number`` (the table
    above), in one transaction under the run's lock. ``processes_remain``: something of the
    attempt still runs (its pods, its processes); ``object_remains``: what the backend made
    for it (a Job, a RayJob) still exists. Whatever the database already shows is not done
    again."""
    applied = Applied()
    with transaction.atomic():
        run = lock_run(run_id)
        attempt = (
            RunAttempt.objects.unscoped()
            .filter(run_id=run_id, number=attempt_number)
            .select_related("run")
            .first()
        )
        if attempt is None:
            return applied
        state = RunState(run.state)
        if (
            attempt.number != run.attempt_count
            or attempt.state in FINISHED_ATTEMPT_STATES
            or state in TERMINAL_STATES
        ):
            # An attempt TauGrid is done with: only its leftovers matter. One still live
            # whose run was ended by someone else (a stop that could not be delivered), or
            # that is not the run's current one, has its row closed once it ends, so that
            # it holds no resources on paper; the run is left as it is.
            if observation.ended and attempt.state in LIVE_ATTEMPT_STATES:
                _finish(attempt, observation, applied, decide=False)
            applied.delete_object = observation.object_active and object_remains
            return applied
        if observation.state == ObservedState.NOTHING:
            return applied
        if state == RunState.PENDING:
            # The backend writes "queued" once it has created the objects; not yet.
            applied.retry = True
            return applied
        if state == RunState.CANCELLING:
            _apply_cancelling(run, attempt, observation, processes_remain, object_remains, applied)
        else:
            _apply(run, attempt, observation, applied)
    return applied


def _apply(run: Run, attempt: RunAttempt, observation: Observation, applied: Applied) -> None:
    kind = observation.state
    if kind == ObservedState.QUEUED:
        waiting = attempt.state == RunAttempt.State.WAITING and run.state == RunState.QUEUED
        if waiting and observation.reason:
            _note(run, RunState.QUEUED, observation.reason, applied)
        return
    if kind == ObservedState.ADMITTED:
        _catch_up(run, attempt, observation, applied, running=False)
        if observation.reason:
            _note(run, RunState.ADMITTED, observation.reason, applied)
        return
    if kind == ObservedState.RUNNING:
        _catch_up(run, attempt, observation, applied, running=True)
        return
    # The attempt is over.
    if observation.admitted or observation.ran or attempt.state != RunAttempt.State.WAITING:
        _catch_up(run, attempt, observation, applied, running=observation.ran)
        _finish(attempt, observation, applied)
        return
    # It ended before Kueue ever admitted it (its objects were deleted while it waited):
    # there is no started attempt to retry; the run fails with the attempt.
    failure = FailureClass(observation.failure_class or FailureClass.UNKNOWN)
    transition(
        run,
        RunState.FAILED,
        reason=f"Attempt {attempt.number} failed before it started: {observation.reason}",
        data={"attempt": attempt.number, "failure_class": failure.value},
        failure_class=failure,
    )
    applied.actions.append(f"failed:{failure.value}")
    applied.ended_attempt = attempt.number
    applied.delete_object = observation.object_active


def _apply_cancelling(
    run: Run,
    attempt: RunAttempt,
    observation: Observation,
    processes_remain: bool,
    object_remains: bool,
    applied: Applied,
) -> None:
    """A cancel in progress: it ends cancelled once nothing of the attempt runs any more,
    unless the attempt reached its own end first (succeeded stays succeeded)."""
    live = attempt.state in LIVE_ATTEMPT_STATES
    if observation.ended and not observation.deleted and live:
        _catch_up(run, attempt, observation, applied, running=observation.ran)
        _finish(attempt, observation, applied)  # finish_attempt: cancelled unless succeeded
        return
    if processes_remain or (object_remains and not observation.deleted):
        return  # still stopping
    if live:
        attempt.refresh_from_db()
        finish_attempt(
            attempt=attempt,
            outcome=AttemptOutcome(
                succeeded=False, cancelled=True, exit_code=observation.exit_code, message=""
            ),
        )
    else:
        transition(
            run,
            RunState.CANCELLED,
            reason=wording.cancelled_reason(selectors.cancel_requested_by(run)),
            kind=EventKind.CANCELLED,
        )
    applied.actions.append("cancelled")
    applied.ended_attempt = attempt.number


def _catch_up(
    run: Run,
    attempt: RunAttempt,
    observation: Observation,
    applied: Applied,
    *,
    running: bool,
) -> None:
    """Admitted (and running), as the backend says, if not recorded yet; and where it was
    placed (for Kubernetes: where Kueue and the scheduler put it)."""
    if attempt.state == RunAttempt.State.WAITING:
        if run.state != RunState.QUEUED:
            return
        started = admit_attempt(run=run, admitted_at=observation.admitted_at)
        attempt.state = started.state
        applied.actions.append("admitted")
    if running and attempt.state == RunAttempt.State.STARTING:
        attempt_running(attempt=attempt)
        applied.actions.append("running")
    if observation.cluster_queue and note_admission(
        attempt_id=attempt.pk,
        cluster_queue=observation.cluster_queue,
        flavors=dict(observation.flavors),
    ):
        applied.actions.append("placed")
    if observation.node_names and note_nodes(
        attempt_id=attempt.pk, node_names=list(observation.node_names)
    ):
        applied.actions.append("nodes")


def _finish(
    attempt: RunAttempt, observation: Observation, applied: Applied, *, decide: bool = True
) -> None:
    """The attempt ended: recorded, and (``decide``) the run succeeds, fails or is retried;
    without ``decide`` only the attempt's row (its run was ended by someone else)."""
    failure = observation.failure_class
    # finish_attempt saves the whole row: what note_admission and note_nodes wrote (and the
    # run token) must be in it.
    attempt.refresh_from_db()
    # It used its resources until its backend saw it end (Kueue its Workload finish), not
    # until someone looked (a late XID's hold can be 30 s later); never before it was
    # admitted.
    ended_at = observation.ended_at
    if ended_at is not None and attempt.admitted_at is not None:
        ended_at = max(ended_at, attempt.admitted_at)
    now = timezone.now()
    ended_at = ended_at if ended_at is not None and ended_at < now else now
    outcome = AttemptOutcome(
        succeeded=observation.succeeded,
        exit_code=observation.exit_code,
        failure_class="" if failure is None else str(failure.value),
        message="" if observation.succeeded else observation.reason,
        interrupted=observation.interrupted,
    )
    if decide:
        finish_attempt(attempt=attempt, now=ended_at, outcome=outcome)
    else:
        close_attempt(attempt, outcome, ended_at)
    applied.actions.append(
        "succeeded" if observation.succeeded else f"ended:{failure or 'unknown'}"
    )
    applied.ended_attempt = attempt.number
    applied.delete_object = observation.object_active


def _note(run: Run, state: RunState, reason: str, applied: Applied) -> None:
    run.refresh_from_db(fields=["state", "state_reason"])
    if run.state_reason != reason and note_reason(run_id=run.pk, state=state, reason=reason):
        run.state_reason = reason
        applied.actions.append("reason")
