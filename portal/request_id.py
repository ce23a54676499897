"""The id of the request being served, for log lines; importable before Django is set up."""

from __future__ import annotations

import logging
from contextvars import ContextVar

current_request_id: ContextVar[str] = ContextVar("current_request_id", default="-")


class RequestIdLogFilter(logging.Filter):
    """Adds ``request_id`` to every log record ("-" outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = current_request_id.get()
        return True
