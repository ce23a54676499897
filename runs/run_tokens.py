"""Run tokens: the credential a running attempt reports with (``TAU_RUN_TOKEN``).

A run token belongs to the attempt it was issued for (``RunAttempt.token``): it reaches that
run's report routes and its code bundle, nothing else, and is revoked when the attempt ends.
An attempt holds one token at a time: issuing another (the Kubernetes backend does when the
attempt's Secret has to be made again) revokes the one before. Issuing and revoking go
through here only, so each is audited (``token.create`` with the run and attempt,
``token.revoke``) like any other token. The plaintext is handed to the workload (the local
agent's child process, the attempt's Kubernetes Secret) and never logged.
"""

from __future__ import annotations

import math

from django.conf import settings
from django.db import transaction

from identity.models import ApiToken
from identity.tokens import issue_token, revoke_token
from runs.models import Run, RunAttempt

#: A token of an attempt with no ``run.max_runtime`` lasts this long (and a day more).
DEFAULT_RUNTIME_SECONDS = 7 * 86400


def lifetime_days(max_runtime_seconds: int | None) -> int:
    """Days a run token lasts: the attempt's longest runtime and a day, within the token
    policy's limits."""
    runtime_days = math.ceil((max_runtime_seconds or DEFAULT_RUNTIME_SECONDS) / 86400) + 1
    return max(1, min(int(settings.TAU_TOKEN_MAX_DAYS), runtime_days))


def issue_run_token(
    *, run: Run, attempt: RunAttempt, max_runtime_seconds: int | None
) -> str | None:
    """A token that can only report on ``run``, held by ``attempt``; its plaintext, to hand
    to the workload and nowhere else. None when the run's submitter can no longer act (a
    token never does more than its user may). A token the attempt held before is revoked."""
    user = run.submitted_by
    if user is None or not user.is_active:
        return None
    with transaction.atomic():
        revoke_run_tokens(run_id=run.pk, attempt=attempt)
        issued = issue_token(
            user=user,
            name=f"run {run.name} attempt {attempt.number}",
            kind=ApiToken.Kind.RUN,
            workspace=run.workspace,
            expires_in_days=lifetime_days(max_runtime_seconds),
            details={"run": run.name, "attempt": attempt.number},
        )
        RunAttempt.objects.unscoped().filter(pk=attempt.pk).update(token=issued.token)
        attempt.token = issued.token
    return issued.plaintext


def revoke_run_tokens(*, run_id: int, attempt: RunAttempt | None = None) -> int:
    """Revoke the live tokens of ``attempt``, or of every attempt of the run. How many."""
    held = RunAttempt.objects.unscoped().filter(run_id=run_id, token__isnull=False)
    if attempt is not None:
        held = held.filter(pk=attempt.pk)
    tokens = ApiToken.objects.select_related("user", "workspace").filter(
        pk__in=held.values("token_id"), revoked_at__isnull=True
    )
    revoked = 0
    for token in tokens:
        revoke_token(token=token)
        revoked += 1
    return revoked


def can_issue(run: Run) -> bool:
    """Whether a run token can be issued for ``run``: its submitter can still act."""
    user = run.submitted_by
    return user is not None and user.is_active


def run_id_of(token: ApiToken) -> int | None:
    """The run a run token reports on (None for any other token)."""
    if token.kind != ApiToken.Kind.RUN:
        return None
    return (
        RunAttempt.objects.unscoped().filter(token=token).values_list("run_id", flat=True).first()
    )
