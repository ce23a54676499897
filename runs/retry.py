"""The retry policy: after a failed attempt, whether the run gets another one, and when.

The spec's ``resilience`` block decides for the workload's own failures: a failure class in
``retry_on`` is retried while the run has retries left (``max_retries``, counted since a
person last started it: its submission or its newest resume), after the ``backoff``. An
attempt the platform cut short (the local agent restarted, say) is not the workload's
failure: it starts again at once, from its newest checkpoint, and uses no retry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from runs.models import FailureClass, Run, RunAttempt
from runs.wording import MANUAL_RESUME
from tau.spec import Spec
from tau.spec.model import FailureClass as SpecFailureClass


@dataclass(frozen=True)
class RetryDecision:
    again: bool  # another attempt follows
    delay_seconds: int = 0  # it may not start before this many seconds have passed


def retries_used(run: Run, *, before: RunAttempt) -> int:
    """Automatic retries the run has had since it was last started by a person (submitted or
    resumed): its earlier failed attempts that count (platform interruptions do not)."""
    attempts = RunAttempt.objects.for_workspace(run.workspace_id).filter(
        run=run, number__lt=before.number
    )
    last_start = (
        attempts.filter(retry_reason=MANUAL_RESUME)
        .order_by("-number")
        .values_list("number", flat=True)
        .first()
        if before.retry_reason != MANUAL_RESUME
        else before.number
    )
    return attempts.filter(
        number__gte=last_start or 1,
        state=RunAttempt.State.FAILED,
        counts_against_retries=True,
    ).count()


def decide(
    spec: Spec, failure: FailureClass, *, retries_so_far: int, interrupted: bool
) -> RetryDecision:
    """What follows a failed attempt of a run of ``spec``."""
    if interrupted:
        return RetryDecision(again=True)
    resilience = spec.resilience
    if not resilience.retries(cast(SpecFailureClass, failure.value), retries_so_far=retries_so_far):
        return RetryDecision(again=False)
    return RetryDecision(again=True, delay_seconds=resilience.backoff.delay(retries_so_far + 1))
