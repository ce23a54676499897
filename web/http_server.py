"""``make run``'s web server: uvicorn serving :mod:`web.asgi`, in one process.

Chosen for slow clients (issue 30): uvicorn reads requests on an event loop, so a client
that connects and sends nothing, or declares a body and sends none of it, costs a socket and
a coroutine, never one of a few threads; Django only runs once a request is complete
(``web.asgi``: body limits on every route and a whole-request read deadline). What is left to
the server is the part before the application is called, the headers: uvicorn waits for them
without a limit (its keep-alive timeout starts only after a response), so
:class:`HeaderDeadlineProtocol` gives every request :data:`HEADER_SECONDS` from its first
byte (or from the connection, for the first request) to finish its headers, and answers 408
and closes the connection otherwise. Headers are at most 16 KiB (h11's default).

One process is enough for the embedded default: the event loop never blocks on a client, and
each request runs in a thread of its own. ``manage.py runportal`` restarts it if it dies.

Production (the Helm chart) runs gunicorn behind a buffering proxy instead (docs/install.md;
docs/operations.md).
"""

from __future__ import annotations

import asyncio
import logging

import h11
import uvicorn
from django.conf import settings
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger(__name__)

#: Seconds a request's headers may take to arrive in full.
HEADER_SECONDS = settings.TAU_HTTP_HEADER_SECONDS

_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 45\r\n"
    b"Connection: close\r\n\r\n"
    b"The request's headers did not arrive in time\n"
)


class HeaderDeadlineProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline for each request's headers (module
    docstring)."""

    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        # The first bytes of a next request on a kept-alive connection start its deadline.
        if self._header_timer is None and self.conn.their_state is h11.IDLE:
            self._arm_header_deadline()
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the headers are in: the app's deadline
            self._disarm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        self._disarm_header_deadline()
        self._header_timer = self.loop.call_later(HEADER_SECONDS, self._headers_too_slow)

    def _disarm_header_deadline(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        client = self.client[0] if self.client else "-"
        logger.warning("408: a request's headers did not arrive in time (client %s)", client)
        self.transport.write(_TIMEOUT_RESPONSE)
        self.transport.close()


def config(host: str, port: int) -> uvicorn.Config:
    return uvicorn.Config(
        "web.asgi:application",
        host=host,
        port=port,
        http=HeaderDeadlineProtocol,
        loop="asyncio",
        ws="none",
        lifespan="off",
        interface="asgi3",
        # Believe no X-Forwarded-* header: portal.middleware.TrustedProxyMiddleware decides
        # from TAU_TRUSTED_PROXIES (uvicorn's default trusts 127.0.0.1, where runs connect from).
        proxy_headers=False,
        forwarded_allow_ips="",
        server_header=False,
        # The portal's logging: refusals are one line each (django.request); no access log.
        log_config=None,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=5,
        # Long downloads and log streams are cut after this on Ctrl-C.
        timeout_graceful_shutdown=5,
    )


def serve(host: str, port: int) -> None:
    """Serve until SIGINT or SIGTERM."""
    uvicorn.Server(config(host, port)).run()
