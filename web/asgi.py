"""The portal as an ASGI application: what ``make run``'s web server (``manage.py serve_web``,
uvicorn) serves, and what stands between a client and Django there.

Why ASGI for the embedded default: a sync server such as gunicorn's sync or threaded workers
gives every connection a thread from a small pool while it reads the request, so a dozen
clients that declare a body and never send it (anyone on the machine, a run in its sandbox)
hold every thread and the portal stops answering (issue 30). Here an incomplete request costs
a coroutine waiting on a socket; Django runs only once the whole request is in, each request
in a thread of its own, as Django's ASGI handler does.

What the wrapper (:class:`RequestGuard`) adds around Django, before any of it runs:

* **Body limits on every route.** A request declaring more than its route accepts
  (:func:`body_limit`: a submission, the live check, an artifact upload, and everything else
  Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE``) gets a 413 before a byte of the body is read; a
  chunked body (no ``Content-Length``) is counted as it arrives and refused as soon as it
  passes the limit. Django itself would read the whole body first under ASGI, so the
  Content-Length checks of the middleware (``runs.submission.SubmissionSizeMiddleware``,
  ``portal.body_limits.JSONBodySizeMiddleware``) would come too late here.
* **A whole-request read deadline.** Once the headers are in, the body must be complete within
  :data:`READ_SECONDS` plus one second per MiB it declares (or, undeclared, its route may
  take): a client that stops sending gets a 408 and its connection closed, so idle clients
  cannot pile up. The headers have their own deadline in the server
  (``web.http_server``).

A refusal is one line in the log (method, path, status, why), like a refusal by Django, and
its connection is closed: the rest of an unread body is never read.

:class:`PortalASGIHandler` is Django's handler with one change: a streaming response with a
synchronous iterator (file downloads, log downloads, the evidence export, CSV exports) is sent
chunk by chunk as it is produced, each chunk made in the request's thread. Django's own
handler collects such an iterator whole, in memory, before sending the first byte.

What gunicorn was told with ``--forwarded-allow-ips ""`` still holds: the server believes no
``X-Forwarded-*`` header (uvicorn's proxy headers are off), the peer is ``REMOTE_ADDR``, and
``portal.middleware.TrustedProxyMiddleware`` alone decides from ``TAU_TRUSTED_PROXIES``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any

import django
from asgiref.sync import sync_to_async

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django.setup(set_prefix=False)

# Only once Django is set up: these import models.
from django.conf import settings  # noqa: E402
from django.core.handlers.asgi import ASGIHandler  # noqa: E402
from django.http import HttpResponseBase  # noqa: E402
from django.urls import Resolver404, resolve  # noqa: E402

from portal.body_limits import own_body_limit  # noqa: E402
from runs import submission  # noqa: E402

logger = logging.getLogger(__name__)

Scope = dict[str, Any]
Message = Mapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Seconds a request's body may take after its headers, plus one per MiB (BYTES_PER_SECOND).
READ_SECONDS = settings.TAU_HTTP_READ_SECONDS
#: The slowest upload accepted past READ_SECONDS: 1 MiB/s.
BYTES_PER_SECOND = 2**20


def body_limit(view_name: str | None, method: str = "POST") -> int:
    """The most a request to this route may send: the submission routes' own limits (the
    same table their middleware refuses from), an artifact's (a run's whole allowance, the
    file is the body), a limit the route's view sets itself (``portal.body_limits.own_body_limit``:
    the catalog's uploads), and Django's limit for forms and JSON everywhere else."""
    if view_name is None:
        return int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    own = own_body_limit(view_name, method)
    if own is not None:
        return own
    if view_name == "api:run-report-artifacts":
        return int(settings.TAU_ARTIFACT_MAX_BYTES_PER_RUN)
    # runs.submission's table: one source for the limit the page and the API promise.
    return submission.SIZED_ROUTES.get(view_name, int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE))


def _view_name(path: str) -> str | None:
    try:
        return resolve(path).view_name
    except Resolver404:
        return None


def read_deadline(expected_bytes: int) -> float:
    """Seconds from the end of the headers by which a body of this size must be in."""
    return READ_SECONDS + expected_bytes / BYTES_PER_SECOND


class Refusal(Exception):
    """A request refused before Django saw it: the status and the reason, in words."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _declared_length(scope: Scope) -> int | None:
    """The body's ``Content-Length`` (None when chunked or absent); uvicorn's parser (h11)
    has already refused a malformed or repeated one."""
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            return int(value)
    return None


class RequestGuard:
    """Body limits and a read deadline in front of an ASGI application (module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)  # Django has nothing to start or stop
            return
        if scope["type"] != "http":
            return await self.app(scope, receive, send)  # Django refuses it
        view_name = _view_name(scope["path"])
        limit = body_limit(view_name, scope["method"])
        declared = _declared_length(scope)
        if declared is not None and declared > limit:
            await _refuse(
                scope,
                send,
                Refusal(
                    413,
                    f"The request declares {declared} bytes; this address accepts at most "
                    f"{limit} bytes. Nothing was read or changed.",
                ),
            )
            return
        seconds = read_deadline(declared if declared is not None else limit)
        started = False

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, _guarded(receive, limit=limit, seconds=seconds), tracked_send)
        except Refusal as refusal:
            if started:  # cannot happen: Django reads the whole body before it answers
                raise
            await _refuse(scope, send, refusal)


def _guarded(receive: Receive, *, limit: int, seconds: float) -> Receive:
    """``receive`` with the body counted against ``limit`` and due within ``seconds``; once
    the body is complete, messages (the client's disconnect) pass as they come."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    received = 0
    complete = False

    async def guarded_receive() -> Message:
        nonlocal received, complete
        if complete:
            return await receive()
        try:
            async with asyncio.timeout_at(deadline):
                message = await receive()
        except TimeoutError:
            raise Refusal(
                408,
                f"The request's body did not arrive within {seconds:.0f} seconds "
                f"({received} bytes came). Nothing was changed.",
            ) from None
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise Refusal(
                    413,
                    f"The request's body passed {limit} bytes, the most this address "
                    "accepts. Nothing was changed.",
                )
            complete = not message.get("more_body", False)
        return message

    return guarded_receive


async def _refuse(scope: Scope, send: Send, refusal: Refusal) -> None:
    """Answer the refusal (JSON on the API, as its other refusals; text elsewhere) and close
    the connection, so that nothing more of the body is read."""
    path = str(scope.get("path", ""))
    if path.startswith("/api/"):
        body = json.dumps({"detail": refusal.reason}).encode()
        content_type = b"application/json"
    else:
        body = (refusal.reason + "\n").encode()
        content_type = b"text/plain; charset=utf-8"
    client = scope.get("client") or ("-", 0)
    logger.warning(
        "%s %s %s %s (client %s)",
        scope.get("method", "-"),
        path.encode("unicode_escape").decode("ascii"),
        refusal.status,
        refusal.reason,
        client[0],
    )
    await send(
        {
            "type": "http.response.start",
            "status": refusal.status,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                (b"cache-control", b"no-store"),
                (b"x-content-type-options", b"nosniff"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class PortalASGIHandler(ASGIHandler):
    """Django's ASGI handler, streaming synchronous iterators as they produce (module
    docstring)."""

    async def send_response(self, response: HttpResponseBase, send: Send) -> None:
        if response.streaming and not getattr(response, "is_async", False):
            produced = response.streaming_content  # type: ignore[attr-defined]
            response.streaming_content = _produced_in_thread(produced)  # type: ignore[attr-defined]
        await super().send_response(response, send)


async def _produced_in_thread(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """Each chunk made in the request's own thread (thread-sensitive, as the view ran: a
    generator reading the database uses the view's connection), one at a time."""

    def next_chunk() -> bytes | None:
        return next(chunks, None)

    in_thread = sync_to_async(next_chunk, thread_sensitive=True)
    while (chunk := await in_thread()) is not None:
        yield chunk


application = RequestGuard(PortalASGIHandler())
