"""What the local executor adds to ``/readyz``: what the running local agent found — its sandbox,
or that it has none, and what holds each run's memory, processes and disk (the agent reports
it in ``VAR_DIR/local-executor.json``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings

from executors.local.agent import processes, sandbox


def local_executor_note() -> dict[str, Any] | None:
    """The running local agent's sandbox (a warning when it has none) and per-run limits."""
    if settings.TAU_BACKEND != "local" or not settings.TAU_LOCAL_EXECUTOR:
        return None
    status = sandbox.read_status(Path(settings.VAR_DIR) / sandbox.STATUS_FILE)
    if not status:
        return None
    pid, ticks = status.get("pid"), status.get("start_ticks")
    if not isinstance(pid, int) or not processes.is_same_process(
        pid, ticks if isinstance(ticks, int) else None
    ):
        return None  # left by an agent that is gone
    limits = status.get("limits")
    described = (
        {"limits": {str(name): str(how) for name, how in limits.items()}}
        if isinstance(limits, dict)
        else {}
    )
    if status.get("sandbox"):
        return {"sandbox": str(status["sandbox"]), **described}
    every = bool(status.get("unsandboxed_allowed"))
    return {
        "sandbox": "none",
        "reason": str(status.get("reason", "")),
        "runs": (
            "every workspace's, unsandboxed (TAU_LOCAL_EXECUTOR_UNSANDBOXED=true)"
            if every
            else "one workspace's only"
        ),
        **described,
    }
