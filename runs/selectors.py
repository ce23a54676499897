"""Reads about runs, already scoped to a workspace."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db.models import Avg, Count, F, Max, Min, QuerySet
from django.http import Http404

from runs.models import Run, RunAttempt
from workspaces.models import Workspace

MAX_LOG_CHUNK = 1024 * 1024


def runs_of(workspace: Workspace) -> QuerySet[Run]:
    return Run.objects.for_workspace(workspace)


def resolve_run(workspace: Workspace, name: str) -> Run:
    """A run by its full name, or by its spec name (then the newest run of that spec)."""
    runs = runs_of(workspace).select_related("workspace")
    run = runs.filter(name=name).first()
    if run is None:
        run = runs.filter(spec_name=name).order_by("-created_at", "-id").first()
    if run is None:
        raise Http404(f"No run called {name!r} in {workspace.slug}.")
    return run


def latest_attempt(run: Run) -> RunAttempt | None:
    return (
        RunAttempt.objects.for_workspace(run.workspace_id)
        .filter(run=run)
        .order_by("-number")
        .first()
    )


@dataclass(frozen=True)
class LogChunk:
    attempt: int | None
    text: str
    offset: int
    next_offset: int
    size: int
    complete: bool  # the attempt is over: nothing more will be appended


def read_log(
    run: Run,
    *,
    attempt_number: int | None,
    offset: int | None,
    tail_lines: int | None,
    limit: int = 256 * 1024,
) -> LogChunk:
    """A piece of an attempt's log without reading the whole file: from ``offset`` (follow),
    or the last ``tail_lines`` lines."""
    attempts = RunAttempt.objects.for_workspace(run.workspace_id).filter(run=run)
    attempt = (
        attempts.filter(number=attempt_number).first()
        if attempt_number
        else attempts.order_by("-number").first()
    )
    if attempt is None:
        if attempt_number:
            raise Http404(f"{run.name} has no attempt {attempt_number}.")
        return LogChunk(
            attempt=None, text="", offset=0, next_offset=0, size=0, complete=not run.is_live
        )
    complete = attempt.finished_at is not None
    path = Path(attempt.log_path) if attempt.log_path else None
    if path is None or not path.exists():
        return LogChunk(
            attempt=attempt.number, text="", offset=0, next_offset=0, size=0, complete=complete
        )
    limit = max(1, min(limit, MAX_LOG_CHUNK))
    with open(path, "rb") as handle:
        size = handle.seek(0, 2)
        if offset is None:
            start = _tail_start(handle, size, tail_lines or 200)
        else:
            start = max(0, min(offset, size))
        handle.seek(start)
        data = handle.read(min(limit, size - start))
    at_end = start + len(data) >= size
    # A character still being written (or cut by the limit) waits for the next read; once the
    # attempt is over, whatever is there is shown.
    consumed = len(data) if (complete and at_end) else _complete_prefix(data)
    text = data[:consumed].decode("utf-8", errors="replace")
    return LogChunk(
        attempt=attempt.number,
        text=text,
        offset=start,
        next_offset=start + consumed,
        size=size,
        complete=complete and start + consumed >= size,
    )


def _complete_prefix(data: bytes) -> int:
    """How many leading bytes of ``data`` end on a UTF-8 character boundary: a multi-byte
    character whose last bytes are not there yet is left for the next read. Bytes that are not
    UTF-8 at all are consumed (and shown as replacement characters)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0b1100_0000 == 0b1000_0000:
            continue  # a continuation byte: look further back for the lead byte
        if byte >= 0b1111_0000:
            needed = 4
        elif byte >= 0b1110_0000:
            needed = 3
        elif byte >= 0b1100_0000:
            needed = 2
        else:
            needed = 1
        return len(data) - back if needed > back else len(data)
    return len(data)


def _tail_start(handle: Any, size: int, lines: int) -> int:
    """Byte offset where the last ``lines`` lines begin, reading backwards in blocks."""
    block = 8192
    position = size
    newlines = 0
    # A trailing newline ends the last line; it does not start another.
    handle.seek(max(0, size - 1))
    if size and handle.read(1) == b"\n":
        newlines = -1
    while position > 0:
        read = min(block, position)
        position -= read
        handle.seek(position)
        chunk = handle.read(read)
        for index in range(len(chunk) - 1, -1, -1):
            if chunk[index] == 0x0A:
                newlines += 1
                if newlines == lines:
                    return position + index + 1
    return 0


def metric_keys(run: Run) -> list[str]:
    from runs.models import MetricPoint

    return list(
        MetricPoint.objects.for_workspace(run.workspace_id)
        .filter(run=run)
        .values_list("key", flat=True)
        .distinct()
        .order_by("key")
    )


def metric_series(run: Run, keys: list[str], *, max_points: int) -> dict[str, list[list[float]]]:
    """``{key: [[step, value], ...]}``, at most ``max_points`` per key: long series are
    averaged over equal step ranges in the database, so a million rows never leave it."""
    from runs.models import MetricPoint

    series: dict[str, list[list[float]]] = {}
    points = MetricPoint.objects.for_workspace(run.workspace_id).filter(run=run)
    for key in keys:
        rows = points.filter(key=key)
        stats = rows.aggregate(count=Count("id"), low=Min("step"), high=Max("step"))
        count = stats["count"] or 0
        if count == 0:
            continue
        if count <= max_points:
            values = rows.order_by("step", "time").values_list("step", "value")
            series[key] = [[float(step), float(value)] for step, value in values]
            continue
        first_step = stats["low"] or 0
        span = (stats["high"] or 0) - first_step + 1
        width = max(1, -(-span // max_points))  # ceiling division
        buckets = (
            rows.annotate(bucket=(F("step") - first_step) / width)
            .values("bucket")
            .annotate(step=Max("step"), value=Avg("value"))
            .order_by("bucket")
            .values_list("step", "value")
        )
        series[key] = [[float(step), float(value)] for step, value in buckets]
    return series
