"""Liveness and readiness probes for load balancers and orchestrators.

``/healthz`` says the process answers. ``/readyz`` says it can do its work: the database
and the Celery broker are reachable. Failures name the component but not the error text,
which can carry host names; the details go to the log.

Apps add what else ``/readyz`` should say with ``add_readiness_note`` (the kernel knows no
app): e.g. the runs app says, under ``local_executor``, what the running local agent found:
its sandbox (or that it has none: not a failure, the portal works, with that risk) and what
limits each run's memory, processes and disk.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from portal.celery import app as celery_app

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
            # A probe of its own: requests answered at once in threads (make run's server)
            # each removed the one shared name, and all but the first failed (503).
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".readyz-") as probe:
                probe.write(b"ok")
                probe.flush()
        return
    with celery_app.connection_for_read(url) as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, timeout=_TIMEOUT_SECONDS)
        # Creating a channel talks to the server (a PING for Redis), not only opens a socket.
        channel: Any = conn.default_channel
        channel.client.ping()


_CHECKS = {"database": _check_database, "broker": _check_broker}


#: Extra keys of ``/readyz``'s answer: a name and a function giving a value, or None for
#: nothing to say. Notes never make the portal unready.
_NOTES: dict[str, Callable[[], dict[str, Any] | None]] = {}


def add_readiness_note(name: str, note: Callable[[], dict[str, Any] | None]) -> None:
    """Have ``/readyz`` answer ``name: note()`` whenever ``note()`` has something to say."""
    _NOTES[name] = note


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
    for name, note in _NOTES.items():
        try:
            said = note()
        except Exception:
            logger.exception("readiness note %s failed", name)
            continue
        if said is not None:
            body[name] = said
    return JsonResponse(body, status=503 if down else 200)
