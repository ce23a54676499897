"""What the accounting app keeps: which budget warnings were sent, so each is sent once."""

from __future__ import annotations

from typing import ClassVar

from django.db import models
from django.utils import timezone

from portal.tenancy import TenantModel
from workspaces.models import Workspace


class BudgetAlert(TenantModel):
    """A budget passed a share (80% or 100%) of its month: written once, with the notice, in
    one transaction; the unique constraint keeps two checkers from warning twice."""

    tenant_path: ClassVar[str | None] = "budget__workspace"

    budget = models.ForeignKey(
        "workspaces.WorkspaceBudget", on_delete=models.CASCADE, related_name="alerts"
    )
    month = models.CharField(max_length=7, help_text="YYYY-MM, in TAU_ACCOUNTING_TIME_ZONE.")
    threshold_percent = models.PositiveSmallIntegerField()
    used_gpu_hours = models.DecimalField(max_digits=14, decimal_places=3)
    budget_gpu_hours = models.DecimalField(max_digits=12, decimal_places=1)
    sent_at = models.DateTimeField(default=timezone.now)

    class Meta(TenantModel.Meta):
        ordering = ["-sent_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["budget", "month", "threshold_percent"], name="budget_alert_once"
            )
        ]

    def __str__(self) -> str:
        return f"{self.budget}: {self.threshold_percent}% of {self.month}"


class WorkspaceUsage(Workspace):
    """Workspaces as the admin's usage list shows them (a proxy: no table of its own)."""

    class Meta:
        proxy = True
        verbose_name = "usage by workspace"
        verbose_name_plural = "usage by workspace"
