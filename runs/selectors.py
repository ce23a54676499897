"""Reads about runs, already scoped to a workspace. What only a backend can say (an
attempt's log) is asked of the run's backend."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.models import BigIntegerField, Count, ExpressionWrapper, F, Q, QuerySet, Window
from django.db.models.functions import RowNumber
from django.http import Http404

from runs.backends import BackendUnavailable
from runs.backends.registry import backend_for_run
from runs.logs import LogChunk, WholeLog
from runs.metric_rules import MAX_KEYS_PER_RUN
from runs.models import LIVE_STATES, EventKind, MetricPoint, Run, RunAttempt, RunEvent
from workspaces.models import Workspace

#: Runs filtered by their experiment labels (the runs page and the API): parameter → column.
EXPERIMENT_FILTERS = {
    "project": "experiment_project",
    "experiment": "experiment_name",
    "group": "experiment_group",
}


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


def cancel_requested_by(run: Run) -> str | None:
    """Who asked for the run's newest cancel that is still being carried out (kept with the
    ``cancel-requested`` event), or None when nobody is named."""
    data = (
        RunEvent.objects.for_workspace(run.workspace_id)
        .filter(run=run, kind=EventKind.CANCEL_REQUESTED)
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


def read_log(
    run: Run,
    *,
    attempt_number: int | None,
    offset: int | None,
    tail_lines: int | None,
    pod: str | None = None,
) -> LogChunk:
    """A piece of an attempt's log (the newest attempt's by default), from its backend: from
    ``offset`` (follow), or the last ``tail_lines`` lines; of ``pod``, where the attempt
    runs as several."""
    attempt = _attempt_of(run, attempt_number)
    if attempt is None:
        return LogChunk(
            attempt=None, text="", offset=0, next_offset=0, size=0, complete=not run.is_live
        )
    try:
        backend = backend_for_run(run)
    except BackendUnavailable:
        return LogChunk(
            attempt=attempt.number,
            text="",
            offset=0,
            next_offset=0,
            size=0,
            complete=attempt.finished_at is not None,
        )
    return backend.read_log(run, attempt, offset=offset, tail_lines=tail_lines, pod=pod)


def open_whole_log(run: Run, *, attempt_number: int | None, pod: str | None = None) -> WholeLog:
    """The log of the numbered attempt (default: the newest), opened for streaming by its
    backend. A live attempt's log ends where it was when opened."""
    attempt = _attempt_of(run, attempt_number)
    if attempt is None:
        return WholeLog(attempt=None, size=0, handle=None)
    try:
        backend = backend_for_run(run)
    except BackendUnavailable:
        return WholeLog(attempt=attempt.number, size=0, handle=None)
    return backend.open_log(run, attempt, pod=pod)


def metric_keys(run: Run, *, limit: int = MAX_KEYS_PER_RUN) -> list[str]:
    """The run's metric names in order, at most ``limit`` of them.

    A loose index scan: each name is found by one seek in the ``metric_series`` index (the
    first name after the previous one), so the time grows with the number of names returned,
    not with the number of points written (``DISTINCT`` would read every point). Written
    before names were capped, a run can have more than ``limit``; the first are returned."""
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


def live_run_count(workspace: Workspace) -> int:
    """How many of the workspace's runs are not finished (waiting or running)."""
    return Run.objects.for_workspace(workspace).filter(state__in=LIVE_STATES).count()
