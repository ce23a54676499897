"""Accounting: the GPU-, CPU- and memory-hours each attempt used, attributed to workspace,
user and flavor; usage pages, charts, CSV and the usage API; the GPU-hour budgets' warnings.

The numbers come from the attempts themselves (``runs.accounting``: from admission to the
end, preempted and failed attempts included), so they need no separate meter that could
drift from what the run pages say. Budgets are a workspace setting (``workspaces``) applied
at submission by ``runs.policy``; this app watches them during the month.
"""

from django.apps import AppConfig


class AccountingConfig(AppConfig):
    name = "accounting"
    verbose_name = "Accounting"
