"""The periodic budget check (``CELERY_BEAT_SCHEDULE["check-gpu-budgets"]``)."""

from __future__ import annotations

from typing import Final

from celery import shared_task
from django.conf import settings

from accounting import budget_alerts

CHECK_TASK: Final = "accounting.tasks.check_budgets"


@shared_task(name=CHECK_TASK, ignore_result=True, expires=float(settings.TAU_BUDGET_CHECK_SECONDS))
def check_budgets() -> int:
    """Warn about the budget thresholds passed since the last check; how many were sent."""
    return len(budget_alerts.check_budgets())
