"""The id of the request being served, and the log filters that put requests into log lines
in a form people can read; importable before Django is set up (the logging configuration
names these filters)."""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any

current_request_id: ContextVar[str] = ContextVar("current_request_id", default="-")


class RequestIdLogFilter(logging.Filter):
    """Adds ``request_id`` to every log record ("-" outside a request).

    Django logs a 4xx response after the middleware has returned, when the context variable
    is reset; the request travels with such records, and its id is the one to show.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = getattr(getattr(record, "request", None), "request_id", None)
        record.request_id = request_id if isinstance(request_id, str) else current_request_id.get()
        return True


class ClientErrorLogFilter(logging.Filter):
    """A refused or missing request (4xx) is one line: method, path, status, reason, user.

    Django attaches the exception to a 403 from ``PermissionDenied`` (and to a 400 from a
    suspicious request), so every refusal printed a traceback, although nothing went wrong on
    the server. The traceback is dropped here and the exception's message kept; 5xx records
    are left alone and keep theirs.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        request = getattr(record, "request", None)
        if not isinstance(status, int) or not 400 <= status < 500 or request is None:
            return True
        path = _escaped(str(getattr(request, "path", "")))
        reason = record.getMessage()
        # Django's messages end in ": <path>" ("Forbidden (Permission denied): /admin/").
        reason = reason.removesuffix(f": {path}")
        exception = record.exc_info[1] if record.exc_info else None
        if exception is not None and str(exception) and str(exception) not in reason:
            reason = f"{reason}: {exception}"
        record.msg = "%s %s %s %s user=%s"
        record.args = (
            _one_line(str(getattr(request, "method", "-"))),
            path,
            status,
            _one_line(reason),
            _username(request),
        )
        record.exc_info = None
        record.exc_text = None
        record.stack_info = None
        return True


def _escaped(path: str) -> str:
    """A path as Django writes it in its own messages: one line, whatever the client sent."""
    return path.encode("unicode_escape").decode("ascii")


# Control characters (line breaks above all) would let one record look like several.
_CONTROL_CHARACTERS = dict.fromkeys((*range(32), 127), " ")


def _one_line(text: str) -> str:
    return text.translate(_CONTROL_CHARACTERS)


def _username(request: Any) -> str:
    try:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return "anonymous"
        return _one_line(str(user.get_username()))
    except Exception:  # a log line must never fail the request it describes
        return "unknown"
