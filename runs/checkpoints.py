"""A run's checkpoints: the one writer of :class:`Checkpoint` rows, and which of them a run
can still resume from.

Both roads a checkpoint arrives by record it here: the API's ``report/checkpoints/`` (the
workload says where it wrote one) and the local agent (it found one in the run's checkpoint
folder). Either way the path is checked by the run's backend (``checkpoint_path``: inside the
run's own checkpoint folder, never through a link) and kept as the backend gives it back.
Whether a checkpoint still exists is the backend's to say too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from runs.backends import BackendUnavailable
from runs.backends.registry import backend_for_run
from runs.checkpoint_paths import CheckpointPathRefused
from runs.models import Checkpoint, Run


@dataclass(frozen=True)
class CheckpointReport:
    step: int
    path: str
    complete: bool = True
    size: int | None = None
    data: dict[str, Any] = field(default_factory=dict)


def record_checkpoint(*, run: Run, attempt: int, report: CheckpointReport) -> Checkpoint:
    """Keep a checkpoint of ``run`` (its attempt ``attempt``), or CheckpointPathRefused. The
    same path reported again updates what is known about it — never forgetting its size: the
    local collector measures it, and the SDK's report of the same folder, which does not,
    must not erase it."""
    try:
        path = backend_for_run(run).checkpoint_path(run, report.path)
    except BackendUnavailable as exc:
        raise CheckpointPathRefused(str(exc)) from None
    defaults: dict[str, Any] = {
        "attempt": attempt,
        "step": report.step,
        "complete": report.complete,
    }
    if report.size is not None:
        defaults["size"] = report.size
    if report.data:
        defaults["data"] = report.data
    with transaction.atomic():
        checkpoint, _ = Checkpoint.objects.update_or_create(run=run, path=path, defaults=defaults)
    return checkpoint


def checkpoint_exists(run: Run, checkpoint: Checkpoint) -> bool:
    """Whether the run can still resume from ``checkpoint``: the workload may have deleted it
    (many keep only the newest few); its backend looks."""
    try:
        backend = backend_for_run(run)
    except BackendUnavailable:
        return False
    return backend.checkpoint_exists(run, checkpoint)


def newest_checkpoint(run: Run) -> Checkpoint | None:
    """The newest complete checkpoint that still exists."""
    candidates = (
        Checkpoint.objects.for_workspace(run.workspace_id)
        .filter(run=run, complete=True)
        .order_by("-step", "-created_at")[:50]
    )
    return next((c for c in candidates if checkpoint_exists(run, c)), None)
