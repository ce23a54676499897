"""The rules for metric points, whichever way they arrive (the API's ``report/metrics/``, the
local agent's metrics file): one definition, applied by ``runs.metric_points.record_metrics``.

Nothing here touches the database; the agent's file reader and the API hand over
:class:`MetricRow` values and the service decides what is kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tau.evidence.canonical import MAX_SAFE_INTEGER
from tau.printable import hidden_character_problem

#: Steps are stored as 64-bit integers, but a run's evidence (canonical JSON, whose numbers
#: are doubles) and every JSON reader hold integers exactly only up to 2^53 - 1: a larger step
#: would come back rounded and make the run's evidence impossible to seal.
MAX_STEP = MAX_SAFE_INTEGER
STEP_RULE = f"a whole number of at most 2^53 - 1 ({MAX_STEP}) in size"
MAX_KEY_LENGTH = 100  # MetricPoint.key
#: Values taken from one row (a line of the metrics file, a row of a report).
MAX_VALUES_PER_ROW = 200
#: Distinct metric names one run may have. Each is a chart on the run page, redrawn while it
#: runs, and a series the metrics route reads; 200 is far more than any real run plots.
MAX_KEYS_PER_RUN = 200


def metric_key_problem(key: str) -> str | None:
    """Why ``key`` cannot be a metric name, or None when it can (printable text: the rule
    every name follows, ``tau.printable``)."""
    if not key:
        return "a metric name cannot be empty"
    if len(key) > MAX_KEY_LENGTH:
        return f"metric names are at most {MAX_KEY_LENGTH} characters"
    return hidden_character_problem(key, "metric names")


def step_problem(step: Any) -> str | None:
    """Why ``step`` cannot be a step, or None when it can."""
    if isinstance(step, bool) or not isinstance(step, int) or abs(step) > MAX_STEP:
        return f"'step' must be {STEP_RULE}"
    return None


@dataclass(frozen=True)
class MetricRow:
    """One row as it arrived: a step and its named values, with where it came from ("row
    3" of a report, "line 12" of the metrics file) for the messages about it."""

    step: Any
    values: list[tuple[str, Any]]
    where: str
