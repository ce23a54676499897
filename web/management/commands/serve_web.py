"""Serve the portal over HTTP the way ``make run`` does: uvicorn, one process, built for slow
clients (``web.http_server``, ``web.asgi``).

    manage.py serve_web [--host 127.0.0.1] [--port 8000]

``manage.py runportal`` starts it with the Celery processes and the local agent; it runs in
the foreground until SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import os
from typing import Any

from django.core.management.base import BaseCommand

from web import http_server


class Command(BaseCommand):
    help = "Serve the portal over HTTP (uvicorn; foreground, Ctrl-C stops it)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--host", default="127.0.0.1")

    def handle(self, *args: Any, **options: Any) -> None:
        http_server.serve(options["host"], options["port"])
