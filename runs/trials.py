"""A sweep's trials: what the attempt's sweep runner reports (``tau.sweep`` writes
``trials.json`` in the attempt's output folder) kept as :class:`RunTrial` rows, and the
trials table the run page shows: each trial's values, state and best ``metric``, the best
trial marked.

A trial's metrics are the run's points named ``trial-<number>/<key>`` (the runner renames
the rows a trial writes, the SDK the rows it sends), so its best value is one aggregate over
the points the portal already keeps."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.db.models import Max, Min

from runs.models import MetricPoint, Run, RunTrial
from tau.sweep import trial_key

#: ``trials.json`` is read only up to this size: 256 trials with their values fit well.
MAX_TRIALS_FILE_BYTES = 1024 * 1024
TRIALS_FILE = "trials.json"
_STATES = set(RunTrial.State.values)


def parse_trials_file(data: bytes | None) -> list[dict[str, Any]] | None:
    """The trial records in a runner's ``trials.json`` (its bytes, as the backend read them
    from the workload's folder: the local agent reads it without following links); None
    when it is absent, too big or not what the runner writes (then nothing is changed)."""
    if data is None or len(data) > MAX_TRIALS_FILE_BYTES:
        return None
    try:
        document = json.loads(data)
    except ValueError:
        return None
    trials = document.get("trials") if isinstance(document, dict) else None
    if not isinstance(trials, list):
        return None
    for item in trials:
        if not isinstance(item, dict):
            return None
        number, state, config = item.get("trial"), item.get("state"), item.get("config")
        if not isinstance(number, int) or number < 1 or state not in _STATES:
            return None
        if not isinstance(config, dict):
            return None
    # The runner's records are what the API's trial reports are: read the same way.
    return records_from_reports(trials)


def records_from_reports(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Trial records from checked reports (``{trial, config, state, …}``: the API's, or a
    runner's ``trials.json``); a trial reported twice counts as its last report."""
    by_number: dict[int, dict[str, Any]] = {}
    for report in reports:
        by_number[report["trial"]] = {
            "number": report["trial"],
            "state": report["state"],
            "config": report["config"],
            "exit_code": _exit_code(report.get("exit_code")),
            "started_at": _time(report.get("started_at")),
            "finished_at": _time(report.get("finished_at")),
        }
    return [by_number[number] for number in sorted(by_number)]


def _exit_code(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _time(value: object) -> datetime | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < 2**33:
        return datetime.fromtimestamp(value, tz=UTC)
    return None


#: A trial's states in the order they happen: a report never moves a trial back (one that
#: describes an earlier moment can arrive last: a request the runner gave up on and sent
#: again may still be answered after the next one was).
_ORDER = {"pending": 0, "running": 1, "succeeded": 2, "failed": 2}


def record_trials(*, run: Run, attempt: int, records: list[dict[str, Any]]) -> int:
    """Create or update the attempt's trial rows from the runner's records; how many
    changed. A row is written only when something about it changed, and never back to an
    earlier state; reports of one attempt are taken one at a time (its rows locked)."""
    scoped = RunTrial.objects.for_workspace(run.workspace_id)
    fields = ("state", "config", "exit_code", "started_at", "finished_at")
    created: list[RunTrial] = []
    changed: list[RunTrial] = []
    with transaction.atomic():
        rows = scoped.filter(run=run, attempt=attempt).select_for_update()
        existing = {trial.number: trial for trial in rows}
        for record in records:
            trial = existing.get(record["number"])
            if trial is None:
                created.append(RunTrial(run=run, attempt=attempt, **record))
                continue
            if _ORDER.get(record["state"], 0) < _ORDER.get(trial.state, 0):
                continue
            if any(getattr(trial, name) != record[name] for name in fields):
                for name in fields:
                    setattr(trial, name, record[name])
                changed.append(trial)
        if created:
            scoped.bulk_create(created)
        if changed:
            scoped.bulk_update(changed, fields)
    return len(created) + len(changed)


@dataclass(frozen=True)
class TrialRow:
    number: int
    attempt: int
    config: dict[str, Any]
    state: str
    exit_code: int | None
    best: float | None
    is_best: bool


def trials_table(run: Run, spec: dict[str, Any]) -> tuple[list[str], list[TrialRow]]:
    """(parameter names, one row per trial) of the run's newest attempt that has trials,
    each with its best ``metric`` value; the best of them marked. Two queries."""
    execution = spec.get("execution") or {}
    metric = execution.get("metric") or ""
    mode = execution.get("mode") or "min"
    trials = list(
        RunTrial.objects.for_workspace(run.workspace_id)
        .filter(run=run)
        .order_by("-attempt", "number")
    )
    if not trials:
        return [], []
    attempt = trials[0].attempt
    trials = [trial for trial in trials if trial.attempt == attempt]
    keys = {trial_key(trial.number, metric): trial.number for trial in trials}
    aggregate = Min("value") if mode == "min" else Max("value")
    best_values = dict(
        MetricPoint.objects.for_workspace(run.workspace_id)
        .filter(run=run, attempt=attempt, key__in=list(keys))
        .values("key")
        .annotate(best=aggregate)
        .values_list("key", "best")
    )
    by_number = {keys[key]: value for key, value in best_values.items()}
    # The best trial; on a tie, the lowest number.
    winner = None
    for number in sorted(by_number):
        value = by_number[number]
        if value is None:
            continue
        if winner is None or (
            value < by_number[winner] if mode == "min" else value > by_number[winner]
        ):
            winner = number
    names: list[str] = []
    for trial in trials:
        for name in trial.config:
            if name not in names:
                names.append(name)
    rows = [
        TrialRow(
            number=trial.number,
            attempt=trial.attempt,
            config=trial.config,
            state=trial.state,
            exit_code=trial.exit_code,
            best=by_number.get(trial.number),
            is_best=trial.number == winner,
        )
        for trial in trials
    ]
    return sorted(names), rows
