"""Runs with attempts at given times, for accounting tests: submitted for real (so the
spec, flavor and user are what submission makes), then their attempts' admission and end
written as a backend would have recorded them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from runs.models import FailureClass, RunAttempt, RunState
from tests.runs.factories import make_run

GPU_SPEC = b"""schema_version: 1
name: train
run:
  entrypoint: main.py
  workload_kind: job
  max_runtime: 2h
compute:
  gpus: 2
  workers: 2
  cpus: 4
  memory: 16Gi
"""

CPU_SPEC = b"""schema_version: 1
name: prep
run:
  entrypoint: main.py
  workload_kind: job
compute:
  cpus: 2
  memory: 1Gi
"""


def attempt_at(
    run: Any,
    number: int,
    start: datetime,
    end: datetime | None,
    *,
    state: str = RunAttempt.State.SUCCEEDED,
    failure_class: str = "",
    flavors: dict[str, str] | None = None,
) -> RunAttempt:
    """The run's attempt ``number`` admitted at ``start`` and ended at ``end`` (None: still
    running), created if submission did not."""
    attempt, _ = RunAttempt.objects.unscoped().get_or_create(run=run, number=number)
    RunAttempt.objects.unscoped().filter(pk=attempt.pk).update(
        state=state if end is not None else RunAttempt.State.RUNNING,
        failure_class=failure_class,
        admitted_at=start,
        started_at=start,
        finished_at=end,
        flavors=flavors or {},
        created_at=min(start, attempt.created_at),
    )
    attempt.refresh_from_db()
    return attempt


def gpu_run(world: Any, *, who: str = "researcher", spec: bytes = GPU_SPEC) -> Any:
    return make_run(world, who=who, spec=spec, state=RunState.SUCCEEDED)


PREEMPTED: dict[str, Any] = {
    "state": RunAttempt.State.FAILED,
    "failure_class": FailureClass.PREEMPTED,
}
USER_ERROR: dict[str, Any] = {
    "state": RunAttempt.State.FAILED,
    "failure_class": FailureClass.USER_ERROR,
}
