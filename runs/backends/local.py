"""The embedded backend: runs execute as processes on this machine, supervised by the local
agent (``manage.py run_agent``), which admits queued runs within the machine's resources."""

from __future__ import annotations

from runs.models import Run, RunState
from runs.services import lock_run, transition


class LocalBackend:
    name = "local"

    def submit(self, run: Run) -> None:
        locked = lock_run(run.pk)
        if locked.state == RunState.PENDING:
            transition(locked, RunState.QUEUED, reason="Waiting for the local agent to admit it.")

    def cancel(self, run: Run) -> None:
        # The agent stops the process group of any run in state "cancelling"; a run that was
        # not executing has already been moved to "cancelled" by the cancel itself.
        return None
