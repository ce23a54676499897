"""What people do to runs: submit one, cancel it, resume it.

Each is one transaction that records the change (the run, its state, its history) together
with what the backend must be told (a :class:`Delivery`, through ``runs.delivery``), so a
down broker or a lost task never loses it: the reconciler delivers it later.
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from runs import wording
from runs.attempts import hand_over, has_live_attempt
from runs.checkpoints import checkpoint_exists, newest_checkpoint
from runs.delivery import write_delivery
from runs.events import append_event
from runs.models import (
    TERMINAL_STATES,
    WAITING_STATES,
    Checkpoint,
    CodeBundle,
    Delivery,
    EventKind,
    Run,
    RunAttempt,
    RunState,
)
from runs.state import RunActionRefused, lock_run, transition
from tau.spec import Spec, spec_hash

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from workspaces.models import Workspace

_SUFFIX_ALPHABET = string.ascii_lowercase + string.digits
NAME_SUFFIX_LENGTH = 6


def new_run_name(spec_name: str) -> str:
    """``<spec name>-<6 random characters>``: unique in practice, checked by a constraint,
    and short enough for Kubernetes object names (the spec name is bounded to fit)."""
    suffix = "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(NAME_SUFFIX_LENGTH))
    return f"{spec_name}-{suffix}"


@dataclass(frozen=True)
class Submission:
    spec: Spec
    source: str
    bundle: CodeBundle | None
    priority: str
    priority_value: int
    backend: str
    #: The project zip's single top-level folder, when the bundle kept is its contents.
    unwrapped_folder: str | None = None
    #: What it may cost in GPU-hours and the budgets it draws on (``runs.policy.Cost``).
    cost: dict[str, Any] | None = None
    #: What other apps record with the run (``runs.submission.Extension``): each called with
    #: the new run inside its transaction, answering data for the ``submitted`` event.
    extensions: tuple[Callable[[Run], dict[str, Any]], ...] = ()


def create_run(*, workspace: Workspace, user: User, submission: Submission) -> Run:
    """Write the run, its first attempt and the delivery that hands it to the backend in one
    transaction; deliver after commit.

    If the broker is unreachable the run still exists, pending, and the reconciler delivers
    it when it can: nothing a user submitted is lost.
    """
    with transaction.atomic():
        run = Run(
            workspace=workspace,
            spec_name=submission.spec.name,
            spec=submission.spec.to_dict(),
            spec_hash=spec_hash(submission.spec),
            spec_source=submission.source,
            experiment_project=submission.spec.experiment.project or "",
            experiment_name=submission.spec.experiment.name or "",
            experiment_group=submission.spec.experiment.group or "",
            bundle=submission.bundle,
            submitted_by=user,
            submitted_by_username=user.get_username(),
            backend=submission.backend,
            priority=submission.priority,
            priority_value=submission.priority_value,
            state=RunState.PENDING,
            state_reason="Accepted; handing it to the scheduler.",
            attempt_count=1,
        )
        # 36^6 suffixes: a clash is rare, and the unique constraint, not a prior read, decides.
        for attempt in range(5):
            run.name = new_run_name(submission.spec.name)
            try:
                with transaction.atomic():
                    run.save(force_insert=True)
                break
            except IntegrityError:
                if attempt == 4:
                    raise
        recorded: dict[str, Any] = {}
        for record in submission.extensions:
            recorded.update(record(run))
        append_event(
            run,
            EventKind.SUBMITTED,
            new_state=RunState.PENDING,
            message=f"Submitted by {user.get_username()}"
            + (
                f"; the files inside the zip's folder {submission.unwrapped_folder}/ are the "
                "project"
                if submission.unwrapped_folder
                else ""
            ),
            data={
                "spec_hash": run.spec_hash,
                "bundle": submission.bundle.sha256 if submission.bundle else None,
                **(
                    {"unwrapped_folder": submission.unwrapped_folder}
                    if submission.unwrapped_folder
                    else {}
                ),
                **({"cost": submission.cost} if submission.cost else {}),
                **recorded,
            },
            first=True,
        )
        run.submitted_cost = submission.cost
        # The first attempt, written with the run (attempt_count is 1 already).
        first = RunAttempt.objects.create(run=run, number=1)
        write_delivery(run=run, action=Delivery.Action.SUBMIT, attempt=first)
    return run


@transaction.atomic
def cancel_run(*, run: Run, user: User | None) -> Run:
    """Stop a run in whatever state it is. Durable like submission: recorded now, carried out
    by the backend through the outbox."""
    locked = lock_run(run.pk)
    who = user.get_username() if user is not None else "the system"
    state = RunState(locked.state)
    if state in TERMINAL_STATES:
        raise RunActionRefused(f"{locked.name} has already {state.label.lower()}.")
    if state == RunState.CANCELLING:
        return locked
    locked.cancel_requested_at = timezone.now()
    locked.save(update_fields=["cancel_requested_at"])
    if state in WAITING_STATES and not has_live_attempt(locked):
        # Nothing is executing: it can stop right away.
        result = transition(
            locked,
            RunState.CANCELLED,
            reason=wording.cancelled_reason(who),
            kind=EventKind.CANCELLED,
            data={"by": who},
        )
    else:
        # Who asked is kept with the event, so the reason can still name them once it stops.
        result = transition(
            locked,
            RunState.CANCELLING,
            reason=wording.cancelling_reason(who),
            kind=EventKind.CANCEL_REQUESTED,
            data={"by": who},
        )
    write_delivery(run=locked, action=Delivery.Action.CANCEL)
    return result


@transaction.atomic
def resume_run(*, run: Run, user: User | None, checkpoint: Checkpoint | None = None) -> Run:
    """A new attempt of a finished run, from ``checkpoint`` (default: the newest complete one),
    handed to the backend like a submission."""
    locked = lock_run(run.pk)
    if RunState(locked.state) not in TERMINAL_STATES:
        raise RunActionRefused(
            f"{locked.name} is {locked.get_state_display().lower()}; "
            "only a finished run can be resumed."
        )
    if checkpoint is not None and checkpoint.run_id != locked.pk:
        raise RunActionRefused("That checkpoint belongs to another run.")
    if checkpoint is not None and not checkpoint_exists(locked, checkpoint):
        raise RunActionRefused(
            f"The checkpoint at step {checkpoint.step} no longer exists (the workload removed "
            "it); resume from a newer one."
        )
    start_from = checkpoint or newest_checkpoint(locked)
    locked.resume_from = start_from
    locked.retry_reason = wording.MANUAL_RESUME
    locked.cancel_requested_at = None
    locked.not_before = None
    locked.save(update_fields=["resume_from", "retry_reason", "cancel_requested_at", "not_before"])
    who = user.get_username() if user is not None else "the system"
    where = f" from checkpoint at step {start_from.step}" if start_from else " from the start"
    resumed = transition(
        locked,
        RunState.QUEUED,
        reason=f"Resumed by {who}{where}.",
        kind=EventKind.RESUMED,
        data={"checkpoint": start_from.path if start_from else None},
        failure_class="",
    )
    hand_over(run=resumed, resume_from=start_from, retry_reason=wording.MANUAL_RESUME)
    return resumed
