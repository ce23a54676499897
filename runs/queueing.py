"""Where queued runs stand, for pages and the API: each backend is asked about its own.

A queued run's position is either stored on it (the local agent orders its queue itself and
writes ``queue_position``) or kept by the backend and read when a page shows it (Kueue's
visibility API on Kubernetes). :func:`read_positions` asks each backend that has a queued run
among those shown, once, and :func:`apply_positions` puts what was read on the runs, in
memory only.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from runs.backends import BackendUnavailable, QueuedRun, QueueReading
from runs.backends.registry import backend_named
from runs.models import Run, RunState
from workspaces.models import Workspace


def _value(run: QueuedRun, name: str) -> Any:
    return run[name] if isinstance(run, Mapping) else getattr(run, name)


def read_positions(workspace: Workspace, runs: Iterable[QueuedRun]) -> QueueReading:
    """Where each queued run among ``runs`` stands: one question per backend that keeps its
    own order and has a queued run among them, none when no run is queued."""
    by_backend: defaultdict[str, list[QueuedRun]] = defaultdict(list)
    for run in runs:
        if _value(run, "state") == RunState.QUEUED:
            by_backend[str(_value(run, "backend"))].append(run)
    reading = QueueReading()
    for name, queued in sorted(by_backend.items()):
        try:
            backend = backend_named(name)
        except BackendUnavailable:
            continue  # its runs keep the positions stored on them
        reading.merge(backend.queue_positions(workspace, queued))
    return reading


def apply_positions(runs: Iterable[Run], reading: QueueReading) -> None:
    """Show the positions read on the runs they are about (in memory only; nothing saved)."""
    for run in runs:
        if run.pk in reading.covered:
            run.queue_position = reading.position(run.pk)


def apply_to_rows(rows: Iterable[dict[str, Any]], reading: QueueReading) -> None:
    """The same for rows of values (the API's list), by their ``id`` and ``queue_position``."""
    for row in rows:
        if row["id"] in reading.covered:
            row["queue_position"] = reading.position(row["id"])
