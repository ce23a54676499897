"""Every change to a run goes through here: submit, transition, cancel, resume, retry.

``transition`` is the only code that writes ``Run.state``. It locks the row, checks the
transition table, and appends a hash-chained :class:`RunEvent` in the same transaction.
Backends are reached only through :class:`Delivery` rows (an outbox): a change that needs the
backend writes one together with the change, a Celery task delivers it, and the reconciler
delivers whatever a lost task or a down broker left behind. Backend calls are idempotent, so a
delivery made twice has the effect of one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import stat
import string
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, transaction
from django.utils import timezone

from runs import selectors, wording
from runs.agent.prepare import AttemptLayout, runs_root
from runs.models import (
    TERMINAL_STATES,
    TRANSITIONS,
    Backend,
    Checkpoint,
    Delivery,
    FailureClass,
    Run,
    RunAttempt,
    RunEvent,
    RunState,
)

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from runs.models import CodeBundle
    from tau.spec import Spec
    from workspaces.models import Workspace

logger = logging.getLogger(__name__)

GENESIS_HASH = "0" * 64
_SUFFIX_ALPHABET = string.ascii_lowercase + string.digits
NAME_SUFFIX_LENGTH = 6


class IllegalTransition(RuntimeError):
    """A state change the transition table does not allow: a bug, never user input."""


class RunActionRefused(ValueError):
    """A request that makes no sense for the run's state (cancel a finished run, say)."""


def _event_hash(prev_hash: str, content: dict[str, Any]) -> str:
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), cls=DjangoJSONEncoder)
    return hashlib.sha256(f"{prev_hash}\n{canonical}".encode()).hexdigest()


def _event_content(event: RunEvent) -> dict[str, Any]:
    return {
        "run": event.run_id,
        "seq": event.seq,
        "time": event.time.isoformat(),
        "kind": event.kind,
        "old_state": event.old_state,
        "new_state": event.new_state,
        "message": event.message,
        "data": event.data,
    }


def append_event(
    run: Run,
    kind: str,
    *,
    message: str = "",
    data: dict[str, Any] | None = None,
    old_state: str = "",
    new_state: str = "",
    first: bool = False,
) -> RunEvent:
    """Add an event to the run's chain. The caller holds the run's row lock (or has just
    created the run, which then has no events yet)."""
    last = (
        None
        if first
        else RunEvent.objects.for_workspace(run.workspace_id)
        .filter(run=run)
        .order_by("-seq")
        .first()
    )
    event = RunEvent(
        run=run,
        seq=(last.seq + 1) if last else 1,
        time=timezone.now(),
        kind=kind,
        old_state=old_state,
        new_state=new_state,
        message=message,
        data=json.loads(json.dumps(data or {}, cls=DjangoJSONEncoder)),
        prev_hash=last.hash if last else GENESIS_HASH,
    )
    event.hash = _event_hash(event.prev_hash, _event_content(event))
    event.save()
    return event


def verify_event_chain(run: Run) -> bool:
    """Whether the run's events form an unbroken chain from the first one."""
    prev = GENESIS_HASH
    expected_seq = 1
    for event in RunEvent.objects.for_workspace(run.workspace_id).filter(run=run).order_by("seq"):
        if event.seq != expected_seq or event.prev_hash != prev:
            return False
        if event.hash != _event_hash(prev, _event_content(event)):
            return False
        prev = event.hash
        expected_seq += 1
    return True


def lock_run(run_id: int) -> Run:
    """The run, locked for update until the surrounding transaction ends."""
    return Run.objects.unscoped().select_for_update().select_related("workspace").get(pk=run_id)


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
    kind: str = "state",
) -> Run:
    """Move the run to ``new_state`` (row-locked, checked, recorded). Returns the fresh run."""
    locked = lock_run(run.pk)
    old_state = RunState(locked.state)
    if new_state not in TRANSITIONS[old_state]:
        raise IllegalTransition(f"run {locked.name}: {old_state} → {new_state} is not allowed")
    now = timezone.now()
    locked.state = new_state
    locked.state_reason = reason
    if new_state != RunState.QUEUED:
        locked.queue_position = None
    stamp = _TIMESTAMP_FOR_STATE.get(new_state)
    if stamp:
        setattr(locked, stamp, now)
    if new_state in TERMINAL_STATES:
        locked.finished_at = now
    elif old_state in TERMINAL_STATES:
        locked.finished_at = None  # resumed
    locked.save()
    append_event(
        locked,
        kind,
        message=message or reason,
        data=data,
        old_state=old_state,
        new_state=new_state,
    )
    return locked


# --- Names ------------------------------------------------------------------------------------


def new_run_name(spec_name: str) -> str:
    """``<spec name>-<6 random characters>``: unique in practice, checked by a constraint,
    and short enough for Kubernetes object names (the spec name is bounded to fit)."""
    suffix = "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(NAME_SUFFIX_LENGTH))
    return f"{spec_name}-{suffix}"


# --- Submission -----------------------------------------------------------------------------


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


def create_run(*, workspace: Workspace, user: User, submission: Submission) -> Run:
    """Write the run and its delivery in one transaction; deliver after commit.

    If the broker is unreachable the run still exists, pending, and the reconciler delivers
    it when it can: nothing a user submitted is lost.
    """
    with transaction.atomic():
        run = Run(
            workspace=workspace,
            spec_name=submission.spec.name,
            spec=submission.spec.to_dict(),
            spec_hash=_spec_hash(submission.spec),
            spec_source=submission.source,
            bundle=submission.bundle,
            submitted_by=user,
            submitted_by_username=user.get_username(),
            backend=submission.backend,
            priority=submission.priority,
            priority_value=submission.priority_value,
            state=RunState.PENDING,
            state_reason="Accepted; handing it to the scheduler.",
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
        append_event(
            run,
            "submitted",
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
            },
            first=True,
        )
        delivery = Delivery.objects.create(run=run, action=Delivery.Action.SUBMIT)
        transaction.on_commit(lambda: enqueue_delivery(delivery.pk))
    return run


def _spec_hash(spec: Spec) -> str:
    from tau.spec import spec_hash

    return spec_hash(spec)


def enqueue_delivery(delivery_id: int) -> None:
    """Ask a worker to deliver now. Failing is fine: the reconciler will deliver it."""
    from runs.tasks import deliver

    try:
        deliver.apply_async(args=(delivery_id,), retry=False)
    except Exception as exc:  # the broker is down: the outbox row is the durable record
        logger.warning("could not enqueue delivery %s (%s); the reconciler will", delivery_id, exc)


# --- Delivery ---------------------------------------------------------------------------------

DELIVERY_RETRY_SECONDS = 10


def deliver(delivery_id: int, *, backend_for: Callable[[Run], Any] | None = None) -> bool:
    """Hand one outbox row to the run's backend, at most once. True if this call did it."""
    from runs.backends import backend_for_run

    resolve = backend_for or backend_for_run
    with transaction.atomic():
        delivery = (
            Delivery.objects.unscoped()
            .select_for_update(skip_locked=True)
            .select_related("run", "run__workspace")
            .filter(pk=delivery_id, delivered_at__isnull=True)
            .first()
        )
        if delivery is None:
            return False  # delivered already, or another worker is on it right now
        delivery.tries += 1
        try:
            backend = resolve(delivery.run)
            if delivery.action == Delivery.Action.SUBMIT:
                backend.submit(delivery.run)
            else:
                backend.cancel(delivery.run)
        except Exception as exc:
            logger.exception("delivery %s of run %s failed", delivery.action, delivery.run.name)
            delivery.last_error = f"{type(exc).__name__}: {exc}"[:2000]
            delivery.next_try_at = timezone.now() + timedelta(
                seconds=min(300, DELIVERY_RETRY_SECONDS * delivery.tries)
            )
            delivery.save(update_fields=["tries", "last_error", "next_try_at"])
            return False
        delivery.delivered_at = timezone.now()
        delivery.last_error = ""
        delivery.save(update_fields=["tries", "last_error", "delivered_at"])
    return True


def due_deliveries(*, grace_seconds: int = 5, limit: int = 200) -> list[int]:
    """Undelivered outbox rows whose time has come (older than a short grace period, so a
    task published right after commit gets its chance first)."""
    now = timezone.now()
    return list(
        Delivery.objects.unscoped()
        .filter(
            delivered_at__isnull=True,
            next_try_at__lte=now,
            created_at__lte=now - timedelta(seconds=grace_seconds),
        )
        .order_by("next_try_at")
        .values_list("pk", flat=True)[:limit]
    )


# --- Cancel and resume --------------------------------------------------------------------------


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
    if state in {RunState.PENDING, RunState.PREEMPTED, RunState.EVICTED} or (
        state == RunState.QUEUED and not has_live_attempt(locked)
    ):
        # Nothing is executing: it can stop right away.
        result = transition(
            locked, RunState.CANCELLED, reason=wording.cancelled_reason(who), kind="cancelled"
        )
    else:
        # Who asked is kept with the event, so the reason can still name them once it stops.
        result = transition(
            locked,
            RunState.CANCELLING,
            reason=wording.cancelling_reason(who),
            kind="cancel-requested",
            data={"by": who},
        )
    delivery = Delivery.objects.create(run=locked, action=Delivery.Action.CANCEL)
    transaction.on_commit(lambda: enqueue_delivery(delivery.pk))
    return result


def has_live_attempt(run: Run) -> bool:
    return (
        RunAttempt.objects.for_workspace(run.workspace_id)
        .filter(run=run, state__in=[RunAttempt.State.STARTING, RunAttempt.State.RUNNING])
        .exists()
    )


class CheckpointPathRefused(ValueError):
    """A checkpoint path that is not inside the run's own checkpoint folder; the message
    says why, for the workload that reported it."""


def local_checkpoint_dir(run: Run) -> Path:
    """The run's checkpoint folder on this machine: its attempts' ``TAU_CHECKPOINT_DIR``."""
    # The folder is the run's, shared by all its attempts: any attempt number names it.
    return AttemptLayout.for_attempt(runs_root(), run.pk, 1).checkpoints


def _parts_inside(folders: list[PurePosixPath], path: str) -> tuple[str, ...]:
    """The names leading from the checkpoint folder to ``path``, decided from the text alone
    (nothing is looked at on disk): ``path`` is absolute inside one of ``folders`` (the same
    folder, spelled with and without links resolved), or relative to it. ``..`` is refused
    outright rather than resolved: resolving it needs the disk, and no checkpoint needs it."""
    if not path or "\x00" in path:
        raise CheckpointPathRefused("A checkpoint path must be a non-empty path.")
    if "://" in path:
        raise CheckpointPathRefused(
            "A checkpoint path is a path inside TAU_CHECKPOINT_DIR, not a URL."
        )
    candidate = PurePosixPath(path)
    if ".." in candidate.parts:
        raise CheckpointPathRefused("A checkpoint path may not contain '..'.")
    parts: tuple[str, ...] | None = None
    if not candidate.is_absolute():
        parts = candidate.parts
    else:
        for folder in folders:
            if candidate.parts[: len(folder.parts)] == folder.parts:
                parts = candidate.parts[len(folder.parts) :]
                break
    if parts is None:
        raise CheckpointPathRefused(
            f"A checkpoint must lie inside the run's checkpoint folder ({folders[0]}, "
            "TAU_CHECKPOINT_DIR)."
        )
    if not parts:
        raise CheckpointPathRefused(
            "A checkpoint is a file or folder inside TAU_CHECKPOINT_DIR, not the folder itself."
        )
    return parts


def _local_checkpoint_state(run: Run, parts: tuple[str, ...]) -> bool:
    """Whether the checkpoint ``parts`` names below the run's checkpoint folder exists, looking
    only below the portal's own runs folder and never following a link: a symbolic link on
    the way (the checkpoint folder itself included) could lead anywhere on this machine, so it
    is refused (CheckpointPathRefused), as the agent never records a link as a checkpoint."""
    current = Path(os.path.realpath(runs_root()))
    names = (str(run.pk), local_checkpoint_dir(run).name, *parts)
    for index, name in enumerate(names):
        current = current / name
        try:
            status = os.lstat(current)
        except (FileNotFoundError, NotADirectoryError):
            return False
        if stat.S_ISLNK(status.st_mode):
            raise CheckpointPathRefused(
                "A checkpoint path may not go through a symbolic link "
                f"({'/'.join(names[2 : index + 1]) or 'the checkpoint folder'} is one)."
            )
        if index < len(names) - 1 and not stat.S_ISDIR(status.st_mode):
            return False
    return True


def _local_checkpoint_folders(run: Run) -> list[PurePosixPath]:
    folder = local_checkpoint_dir(run)
    spelled = PurePosixPath(os.path.abspath(folder))
    resolved = PurePosixPath(os.path.realpath(runs_root()), *folder.parts[-2:])
    return [spelled, resolved] if resolved != spelled else [spelled]


def checked_checkpoint_path(*, run: Run, path: str) -> str:
    """The path a workload reported a checkpoint at, as it is kept: always inside the run's
    own checkpoint folder, or CheckpointPathRefused.

    On this machine that folder is ``var/runs/<run id>/checkpoints/``; the path may be given
    absolute or relative to it, and is kept absolute. On a cluster backend the workload's
    ``TAU_CHECKPOINT_DIR`` is the run's checkpoint storage mounted at a fixed path
    (``runs.render.CHECKPOINT_DIR``); a path relative to it or absolute inside it is kept
    absolute there. Anything else (another run's folder, the portal's files, an outside URL)
    is refused: the run page would otherwise offer to resume from it and say whether it
    exists."""
    if run.backend == Backend.LOCAL:
        folders = _local_checkpoint_folders(run)
        parts = _parts_inside(folders, path)
        _local_checkpoint_state(run, parts)  # refuses a path through a link
        return str(PurePosixPath(folders[0], *parts))
    from runs.render import CHECKPOINT_DIR

    folder = PurePosixPath(CHECKPOINT_DIR)
    return str(PurePosixPath(folder, *_parts_inside([folder], path)))


def checkpoint_exists(run: Run, checkpoint: Checkpoint) -> bool:
    """Whether a checkpoint can still be resumed from. On this machine the workload may have
    deleted it (many keep only the newest few); elsewhere the backend checks.

    Only a path inside the run's own checkpoint folder is ever looked at, and never through
    a link: a recorded path outside it (written before paths were checked) is not resumable,
    and whether such a file exists is never asked of the disk."""
    if run.backend != Backend.LOCAL:
        return True
    try:
        parts = _parts_inside(_local_checkpoint_folders(run), checkpoint.path)
        if not PurePosixPath(checkpoint.path).is_absolute():
            return False  # the agent and the API keep absolute paths
        return _local_checkpoint_state(run, parts)
    except CheckpointPathRefused:
        return False


def newest_checkpoint(run: Run) -> Checkpoint | None:
    """The newest complete checkpoint that still exists."""
    candidates = (
        Checkpoint.objects.for_workspace(run.workspace_id)
        .filter(run=run, complete=True)
        .order_by("-step", "-created_at")[:50]
    )
    return next((c for c in candidates if checkpoint_exists(run, c)), None)


@transaction.atomic
def resume_run(*, run: Run, user: User | None, checkpoint: Checkpoint | None = None) -> Run:
    """A new attempt of a finished run, from ``checkpoint`` (default: the newest complete one)."""
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
    locked.retry_reason = "manual_resume"
    locked.cancel_requested_at = None
    locked.not_before = None
    locked.failure_class = ""
    locked.save(
        update_fields=[
            "resume_from",
            "retry_reason",
            "cancel_requested_at",
            "not_before",
            "failure_class",
        ]
    )
    who = user.get_username() if user is not None else "the system"
    where = f" from checkpoint at step {start_from.step}" if start_from else " from the start"
    return transition(
        locked,
        RunState.QUEUED,
        reason=f"Resumed by {who}{where}.",
        kind="resumed",
        data={"checkpoint": start_from.path if start_from else None},
    )


# --- Attempts (used by executors) ---------------------------------------------------------------


@transaction.atomic
def start_attempt(*, run: Run, backend_name: str = "") -> RunAttempt:
    """Record a new attempt as the run is admitted. The run must be queued."""
    locked = lock_run(run.pk)
    number = locked.attempt_count + 1
    attempt = RunAttempt.objects.create(
        run=locked,
        number=number,
        backend_name=backend_name,
        resume_from=locked.resume_from,
        retry_reason=locked.retry_reason,
    )
    locked.attempt_count = number
    locked.save(update_fields=["attempt_count"])
    transition(
        locked, RunState.ADMITTED, reason="Resources reserved; starting.", data={"attempt": number}
    )
    return attempt


@transaction.atomic
def attempt_running(
    *, attempt: RunAttempt, pid: int | None = None, start_ticks: int | None = None
) -> None:
    attempt.state = RunAttempt.State.RUNNING
    attempt.started_at = timezone.now()
    attempt.pid = pid
    attempt.process_start_ticks = start_ticks
    attempt.save(update_fields=["state", "started_at", "pid", "process_start_ticks"])
    run = lock_run(attempt.run_id)
    if run.state == RunState.ADMITTED:
        transition(run, RunState.RUNNING, reason="Running.", data={"attempt": attempt.number})


@dataclass(frozen=True)
class AttemptOutcome:
    succeeded: bool
    exit_code: int | None = None
    failure_class: str = ""
    message: str = ""
    cancelled: bool = False
    # The platform stopped it (the local agent restarted, say), not the workload: it starts
    # again from its newest checkpoint whatever the retry policy says, and uses no retry.
    interrupted: bool = False


def retries_used(run: Run, *, before: RunAttempt) -> int:
    """Automatic retries the run has had since it was last started by a person (submitted or
    resumed): its earlier failed attempts that count (platform interruptions do not)."""
    attempts = RunAttempt.objects.for_workspace(run.workspace_id).filter(
        run=run, number__lt=before.number
    )
    last_start = (
        attempts.filter(retry_reason="manual_resume")
        .order_by("-number")
        .values_list("number", flat=True)
        .first()
        if before.retry_reason != "manual_resume"
        else before.number
    )
    return attempts.filter(
        number__gte=last_start or 1,
        state=RunAttempt.State.FAILED,
        counts_against_retries=True,
    ).count()


@transaction.atomic
def finish_attempt(
    *, attempt: RunAttempt, outcome: AttemptOutcome, now: datetime | None = None
) -> Run:
    """Close an attempt and decide what the run does next: succeed, fail, or retry."""
    from tau.spec import Spec

    now = now or timezone.now()
    run = lock_run(attempt.run_id)
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
    data = {"attempt": attempt.number, "exit_code": outcome.exit_code}
    state = RunState(run.state)
    if state in TERMINAL_STATES:
        return run  # already decided (e.g. cancelled while the process was exiting)
    if outcome.succeeded:
        run.failure_class = ""
        run.save(update_fields=["failure_class"])
        return transition(run, RunState.SUCCEEDED, reason="Finished successfully.", data=data)
    if outcome.cancelled or state == RunState.CANCELLING:
        return transition(
            run,
            RunState.CANCELLED,
            reason=wording.cancelled_reason(selectors.cancel_requested_by(run)),
            data=data,
            kind="cancelled",
        )
    failure = FailureClass(attempt.failure_class)
    run.failure_class = failure
    spec = Spec.from_dict(run.spec)
    if outcome.interrupted:
        run.not_before = None
        run.resume_from = newest_checkpoint(run)
        run.retry_reason = failure.value
        run.save(update_fields=["failure_class", "not_before", "resume_from", "retry_reason"])
        where = f" from step {run.resume_from.step}" if run.resume_from else ""
        return transition(
            run,
            RunState.QUEUED,
            reason=f"Interrupted ({outcome.message}); starting again{where}.",
            data={**data, "failure_class": failure.value, "interrupted": True},
            kind="retry",
        )
    retries_so_far = retries_used(run, before=attempt)
    if spec.resilience.retries(failure.value, retries_so_far=retries_so_far):  # type: ignore[arg-type]
        delay = spec.resilience.backoff.delay(retries_so_far + 1)
        run.not_before = now + timedelta(seconds=delay)
        run.resume_from = newest_checkpoint(run)
        run.retry_reason = failure.value
        run.save(update_fields=["failure_class", "not_before", "resume_from", "retry_reason"])
        where = f" from step {run.resume_from.step}" if run.resume_from else ""
        if state in {RunState.PREEMPTED, RunState.EVICTED}:
            pass
        elif failure in {FailureClass.PREEMPTED, FailureClass.EVICTED}:
            run = transition(run, RunState(failure.value), reason=f"{failure.label}.", data=data)
        return transition(
            run,
            RunState.QUEUED,
            reason=(
                f"Attempt {attempt.number} failed ({failure.label.lower()}); "
                f"retrying{where} in {delay}s."
            ),
            data={**data, "failure_class": failure.value, "retry_in_seconds": delay},
            kind="retry",
        )
    run.save(update_fields=["failure_class"])
    return transition(
        run,
        RunState.FAILED,
        reason=(
            f"Attempt {attempt.number} failed: {failure.label.lower()}. {outcome.message}"
        ).strip(),
        data={**data, "failure_class": failure.value},
    )
