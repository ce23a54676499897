"""Reads about runs, already scoped to a workspace."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from django.db import connection
from django.db.models import BigIntegerField, Count, ExpressionWrapper, F, Q, QuerySet, Window
from django.db.models.functions import RowNumber
from django.http import Http404

from runs.agent.collect import MAX_KEYS_PER_RUN
from runs.models import Run, RunAttempt, RunEvent
from workspaces.models import Workspace

MAX_LOG_CHUNK = 1024 * 1024


def runs_of(workspace: Workspace) -> QuerySet[Run]:
    return Run.objects.for_workspace(workspace)


def resolve_run(workspace: Workspace, name: str) -> Run:
    """A run by its full name, or by its spec name (then the newest run of that spec)."""
    if "\x00" in name:  # no run has one, and the database refuses to compare with it
        raise Http404(f"No run called {name!r} in {workspace.slug}.")
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


def cancel_requested_by(run: Run) -> str | None:
    """Who asked for the run's newest cancel that is still being carried out (kept with the
    ``cancel-requested`` event), or None when nobody is named."""
    data = (
        RunEvent.objects.for_workspace(run.workspace_id)
        .filter(run=run, kind="cancel-requested")
        .order_by("-seq")
        .values_list("data", flat=True)
        .first()
    )
    by = data.get("by") if isinstance(data, dict) else None
    return str(by) if by else None


def _attempt_of(run: Run, attempt_number: int | None) -> RunAttempt | None:
    """The numbered attempt (404 when there is none), or the newest one (None before any)."""
    attempts = RunAttempt.objects.for_workspace(run.workspace_id).filter(run=run)
    if attempt_number:
        attempt = attempts.filter(number=attempt_number).first()
        if attempt is None:
            raise Http404(f"{run.name} has no attempt {attempt_number}.")
        return attempt
    return attempts.order_by("-number").first()


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
    attempt = _attempt_of(run, attempt_number)
    if attempt is None:
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


LOG_STREAM_BLOCK = 64 * 1024


@dataclass(frozen=True)
class WholeLog:
    """An attempt's whole log as it is now, to be streamed: iterating yields ``size`` bytes
    in blocks, however large the file is; ``close()`` (which Django calls when the response
    is done, read or not) closes the file."""

    attempt: int | None
    size: int
    handle: BinaryIO | None

    def __iter__(self) -> Iterator[bytes]:
        return self.blocks()

    def blocks(self) -> Iterator[bytes]:
        if self.handle is None:
            return
        try:
            left = self.size
            while left > 0:
                block = self.handle.read(min(LOG_STREAM_BLOCK, left))
                if not block:
                    break
                left -= len(block)
                yield block
        finally:
            self.handle.close()

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()


def open_whole_log(run: Run, *, attempt_number: int | None) -> WholeLog:
    """The log of the numbered attempt (default: the newest), opened for streaming. A live
    attempt's log ends where it was when opened, before any character still being written."""
    attempt = _attempt_of(run, attempt_number)
    if attempt is None:
        return WholeLog(attempt=None, size=0, handle=None)
    path = Path(attempt.log_path) if attempt.log_path else None
    try:
        handle = open(path, "rb") if path is not None else None  # noqa: SIM115 (streamed)
    except FileNotFoundError:
        handle = None
    if handle is None:
        return WholeLog(attempt=attempt.number, size=0, handle=None)
    size = handle.seek(0, 2)
    if attempt.finished_at is None and size:
        handle.seek(max(0, size - 4))
        last = handle.read()
        size -= len(last) - _complete_prefix(last)
    handle.seek(0)
    return WholeLog(attempt=attempt.number, size=size, handle=handle)


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


def metric_keys(run: Run, *, limit: int = MAX_KEYS_PER_RUN) -> list[str]:
    """The run's metric names in order, at most ``limit`` of them.

    A loose index scan: each name is found by one seek in the ``metric_series`` index (the
    first name after the previous one), so the time grows with the number of names returned,
    not with the number of points written (``DISTINCT`` would read every point). Written
    before names were capped, a run can have more than ``limit``; the first are returned."""
    from runs.models import MetricPoint

    quote = connection.ops.quote_name
    table, run_id, key = quote(MetricPoint._meta.db_table), quote("run_id"), quote("key")
    # Table and column names come from the model, quoted; the values are parameters.
    sql = f"""
        WITH RECURSIVE names (name, number) AS (
            SELECT (SELECT {key} FROM {table} WHERE {run_id} = %s ORDER BY {key} LIMIT 1), 1
            UNION ALL
            SELECT (
                SELECT point.{key} FROM {table} point
                WHERE point.{run_id} = %s AND point.{key} > names.name
                ORDER BY point.{key} LIMIT 1
            ), names.number + 1
            FROM names WHERE names.name IS NOT NULL AND names.number < %s
        )
        SELECT name FROM names WHERE name IS NOT NULL ORDER BY number
    """  # noqa: S608
    if limit < 1:
        return []
    with connection.cursor() as cursor:
        cursor.execute(sql, [run.pk, run.pk, limit])
        return [name for (name,) in cursor.fetchall()]


def metric_series(run: Run, keys: list[str], *, max_points: int) -> dict[str, list[list[float]]]:
    """``{key: [[step, value], ...]}`` in step order, never more than ``max_points`` per key.

    A series that fits is returned whole. A longer one keeps its last point (and, with room
    for two, its first), and the steps between are cut into equal step ranges of which each
    gives its lowest and its highest point: spikes and dips stay visible, where averages
    would hide them. One point of an odd budget is left unused. The work happens in the
    database, so a million rows never leave it: one query counts every series (from the
    ``metric_series`` index alone), one reads all the series that fit, and only a series
    longer than ``max_points`` costs queries of its own.
    """
    from runs.models import MetricPoint

    if max_points < 1:
        raise ValueError("max_points must be at least 1")
    series: dict[str, list[list[float]]] = {}
    if not keys:
        return series
    points = MetricPoint.objects.for_workspace(run.workspace_id).filter(run=run)
    counts = dict(
        points.filter(key__in=keys)
        .values("key")
        .annotate(count=Count("*"))
        .values_list("key", "count")
        .order_by()
    )
    whole = [key for key in keys if 0 < counts.get(key, 0) <= max_points]
    if whole:
        whole_rows = (
            points.filter(key__in=whole)
            .order_by("key", "step", "time", "id")
            .values_list("key", "step", "value")
        )
        for key, step, value in whole_rows:
            series.setdefault(key, []).append([float(step), float(value)])
    for key in keys:
        if counts.get(key, 0) <= max_points:
            continue
        rows = points.filter(key=key)
        # Where several rows share a step (a resumed attempt reports it again), the one
        # written last is the series' end.
        newest_first = rows.order_by("-step", "-time", "-id").values_list("id", "step", "value")
        last_id, last_step, last_value = newest_first[0]
        if max_points == 1:
            series[key] = [[float(last_step), float(last_value)]]
            continue
        oldest_first = rows.order_by("step", "time", "id").values_list("id", "step", "value")
        first_id, first_step, first_value = oldest_first[0]
        middle = _extremes_by_step_range(
            rows.exclude(id__in=[first_id, last_id]),
            first_step=first_step,
            last_step=last_step,
            ranges=(max_points - 2) // 2,
        )
        series[key] = [
            [float(first_step), float(first_value)],
            *middle,
            [float(last_step), float(last_value)],
        ]
    return {key: series[key] for key in keys if key in series}


def _extremes_by_step_range(
    rows: QuerySet[Any], *, first_step: int, last_step: int, ranges: int
) -> list[list[float]]:
    """The lowest and the highest point of each of ``ranges`` equal step ranges between
    ``first_step`` and ``last_step``: at most ``2 * ranges`` points, in step order."""
    if ranges < 1:
        return []
    span = last_step - first_step + 1
    width = max(1, -(-span // ranges))  # ceiling division: at most ``ranges`` buckets
    bucket = ExpressionWrapper((F("step") - first_step) / width, output_field=BigIntegerField())
    extremes = (
        rows.annotate(
            low=Window(
                RowNumber(), partition_by=[bucket], order_by=[F("value").asc(), F("id").asc()]
            ),
            high=Window(
                RowNumber(), partition_by=[bucket], order_by=[F("value").desc(), F("id").asc()]
            ),
        )
        .filter(Q(low=1) | Q(high=1))
        .order_by("step", "time", "id")
        .values_list("step", "value")
    )
    return [[float(step), float(value)] for step, value in extremes]
