"""A run's metric points: the one writer of :class:`MetricPoint` rows.

Both roads a metric arrives by record it here, under the same rules (``runs.metric_rules``):
the API's ``report/metrics/`` (all or nothing: a report with any problem is refused whole,
so the workload learns at once) and the local agent's metrics file (line by line: what breaks
a rule is skipped and counted, the rest of the line is kept, and the run's history says so
once its attempt ends). A run has at most ``MAX_KEYS_PER_RUN`` metric names, decided under
the run's row lock, so two writers cannot both take the last free places.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from runs.events import append_event
from runs.metric_rules import (
    MAX_KEYS_PER_RUN,
    MAX_VALUES_PER_ROW,
    MetricRow,
    metric_key_problem,
    step_problem,
)
from runs.models import EventKind, MetricPoint, Run
from runs.selectors import metric_keys
from runs.state import lock_run

#: Problems kept per call (the count of rows with problems is exact).
MAX_PROBLEMS = 50


class MetricsRefused(ValueError):
    """A report that breaks the rules; nothing of it was recorded."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class MetricsRecorded:
    recorded: int
    #: What was skipped and why (lenient recording only), at most MAX_PROBLEMS of them.
    problems: list[str]
    #: Rows of which something was skipped.
    rows_skipped: int


def _finite(value: Any) -> float | None:
    """A value as a float, or None when it is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        return None
    return number if math.isfinite(number) else None


def record_metrics(
    *, run: Run, attempt: int, rows: Sequence[MetricRow], all_or_nothing: bool
) -> MetricsRecorded:
    """Keep the points of ``rows`` for attempt ``attempt`` of ``run``.

    ``all_or_nothing`` (the API): any problem refuses the whole report (MetricsRefused), and
    a value that is not a finite number is a problem. Otherwise (the metrics file) what
    breaks a rule is skipped and said, and values that are not numbers are simply not
    metrics (a line may carry other fields)."""
    problems: list[str] = []
    skipped_rows: set[int] = set()
    points: list[tuple[int, str, int, float]] = []  # (row index, key, step, value)

    def problem(index: int, text: str) -> None:
        skipped_rows.add(index)
        problems.append(text)

    for index, row in enumerate(rows):
        if (why := step_problem(row.step)) is not None:
            problem(index, f"{row.where}: {why}")
            continue
        values = row.values
        if len(values) > MAX_VALUES_PER_ROW:
            if all_or_nothing:
                problem(index, f"{row.where}: a row holds at most {MAX_VALUES_PER_ROW} values")
                continue
            problem(
                index,
                f"{row.where}: a row holds at most {MAX_VALUES_PER_ROW} values; the rest "
                "were skipped",
            )
            values = values[:MAX_VALUES_PER_ROW]
        for key, value in values:
            if (why := metric_key_problem(key)) is not None:
                problem(
                    index,
                    f"{row.where}: {key!r}: {why}"
                    if all_or_nothing
                    else f"{row.where}: metric name {key!r} skipped: {why}",
                )
                continue
            number = _finite(value)
            if number is None:
                if all_or_nothing:
                    problem(index, f"{row.where}: {key!r} must be a finite number")
                continue
            points.append((index, key, row.step, number))
    if all_or_nothing and problems:
        raise MetricsRefused(problems[:MAX_PROBLEMS])
    with transaction.atomic():
        names = {key for _, key, _, _ in points}
        known = set(metric_keys(run))
        if names - known:
            # New names: decided under the run's lock, so two writers cannot both take the
            # last free places.
            lock_run(run.pk)
            known = set(metric_keys(run))
        new = [key for key in dict.fromkeys(key for _, key, _, _ in points) if key not in known]
        room = max(0, MAX_KEYS_PER_RUN - len(known))
        if len(new) > room:
            if all_or_nothing:
                refused = sorted(new)
                shown = ", ".join(repr(name) for name in refused[:5])
                more = f" and {len(refused) - 5} more" if len(refused) > 5 else ""
                raise MetricsRefused(
                    [
                        f"a run has at most {MAX_KEYS_PER_RUN} metric names; this one has "
                        f"{len(known)}, so the new names {shown}{more} are refused (values of "
                        "its existing names are still taken)"
                    ]
                )
            # First come, first served: the names seen first take the free places.
            over = set(new[room:])
            said: set[str] = set()
            for index, key, _, _ in points:
                if key not in over:
                    continue
                skipped_rows.add(index)
                if key not in said:  # said once per name
                    said.add(key)
                    problems.append(
                        f"{rows[index].where}: metric name {key!r} skipped: a run has at most "
                        f"{MAX_KEYS_PER_RUN} metric names"
                    )
            allowed = known | set(new[:room])
            points = [point for point in points if point[1] in allowed]
        MetricPoint.objects.bulk_create(
            [
                MetricPoint(run=run, attempt=attempt, key=key, step=step, value=value)
                for _, key, step, value in points
            ],
            batch_size=1000,
        )
    return MetricsRecorded(
        recorded=len(points), problems=problems[:MAX_PROBLEMS], rows_skipped=len(skipped_rows)
    )


@transaction.atomic
def note_skipped_lines(*, run: Run, attempt: int, lines: int, first_problem: str) -> None:
    """Say in the run's history that lines of an attempt's metrics file were not (wholly)
    kept, and why the first one was not."""
    locked = lock_run(run.pk)
    append_event(
        locked,
        EventKind.METRICS_SKIPPED,
        message=f"{lines} line(s) of the metrics file could not be read; the first: "
        f"{first_problem}.",
        data={"attempt": attempt, "lines": lines},
    )
