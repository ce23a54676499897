"""What the runs app adds to ``/readyz``: whether the local agent runs runs without a sandbox
(the agent reports what it found in ``VAR_DIR/local-executor.json``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings

from runs.agent import processes, sandbox


def local_executor_warning() -> dict[str, Any] | None:
    """What the running local agent said about its sandbox, when it has none."""
    if settings.TAU_BACKEND != "local" or not settings.TAU_LOCAL_EXECUTOR:
        return None
    status = sandbox.read_status(Path(settings.VAR_DIR) / sandbox.STATUS_FILE)
    if not status or status.get("sandbox"):
        return None
    pid, ticks = status.get("pid"), status.get("start_ticks")
    if not isinstance(pid, int) or not processes.is_same_process(
        pid, ticks if isinstance(ticks, int) else None
    ):
        return None  # left by an agent that is gone
    every = bool(status.get("unsandboxed_allowed"))
    return {
        "sandbox": "none",
        "reason": str(status.get("reason", "")),
        "runs": (
            "every workspace's, unsandboxed (TAU_LOCAL_EXECUTOR_UNSANDBOXED=true)"
            if every
            else "one workspace's only"
        ),
    }
