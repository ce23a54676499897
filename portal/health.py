"""Liveness and readiness probes for load balancers and orchestrators.

``/healthz`` says the process answers. ``/readyz`` says it can do its work: the database
and the Celery broker are reachable. Failures name the component but not the error text,
which can carry host names; the details go to the log.

When the running local agent found no sandbox for local runs (no bubblewrap here), ``/readyz``
says so in ``local_executor`` (not a failure: the portal works, with that risk); the agent
reports what it found in ``VAR_DIR/local-executor.json``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from portal.celery import app as celery_app
from runs.agent import processes, sandbox

logger = logging.getLogger(__name__)
_TIMEOUT_SECONDS = 2


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def _check_database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def _check_broker() -> None:
    url: str = settings.CELERY_BROKER_URL
    if url.startswith("filesystem://"):
        options = settings.CELERY_BROKER_TRANSPORT_OPTIONS
        for key in ("data_folder_in", "processed_folder"):
            folder = Path(str(options[key]))
            if not folder.is_dir():
                raise OSError(f"broker folder {folder} is missing")
            probe = folder / ".readyz"
            probe.write_text("ok", encoding="utf-8")
            probe.unlink()
        return
    with celery_app.connection_for_read(url) as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, timeout=_TIMEOUT_SECONDS)
        # Creating a channel talks to the server (a PING for Redis), not only opens a socket.
        channel: Any = conn.default_channel
        channel.client.ping()


_CHECKS = {"database": _check_database, "broker": _check_broker}


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


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    checks: dict[str, str] = {}
    for name, check in _CHECKS.items():
        try:
            check()
        except Exception:
            logger.exception("readiness check %s failed", name)
            checks[name] = "down"
        else:
            checks[name] = "ok"
    down = sorted(name for name, state in checks.items() if state != "ok")
    body: dict[str, Any] = {"status": "unavailable", "down": down} if down else {"status": "ok"}
    body["checks"] = checks
    warning = local_executor_warning()
    if warning is not None:
        body["local_executor"] = warning
    return JsonResponse(body, status=503 if down else 200)
