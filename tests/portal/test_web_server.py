"""The embedded default's web server against slow and greedy clients (issue 30): the real
``manage.py serve_web`` (uvicorn, ``web.http_server``, ``web.asgi``) on raw sockets, with
short deadlines so that waiting for them is quick; and the handler's streaming, in process.

tests/portal/test_make_run.py has the acceptance figure (50 idle connections against the
whole of ``make run``, /healthz within 1 s); these are the bounds each client meets.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from django.http import StreamingHttpResponse

from tests.runs.processes import ROOT, free_port, wait_for

pytestmark = pytest.mark.services

DEADLINE = 2  # TAU_HTTP_HEADER_SECONDS and TAU_HTTP_READ_SECONDS of the server here


class Server:
    def __init__(self, port: int, process: subprocess.Popen[bytes], log: Path) -> None:
        self.port = port
        self.process = process
        self.log = log

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=30)

    def healthz_seconds(self) -> float:
        started = time.monotonic()
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=10) as r:
            assert r.status == 200
        return time.monotonic() - started


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("web-server")
    port = free_port()
    env = {key: os.environ[key] for key in ("PATH", "LANG") if key in os.environ}
    env.update(
        HOME=str(base),
        TAU_VAR_DIR=str(base / "var"),
        TAU_HTTP_HEADER_SECONDS=str(DEADLINE),
        TAU_HTTP_READ_SECONDS=str(DEADLINE),
        PYTHONUNBUFFERED="1",
    )
    log = base / "web.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "serve_web", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    running = Server(port, process, log)

    def healthy() -> bool:
        try:
            return running.healthz_seconds() >= 0
        except OSError:
            return False

    try:
        wait_for(healthy, timeout=60, what="serve_web to answer")
        yield running
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def read_response(client: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of the one response on ``client``, read until the server
    closes the connection (the refusals here all close it)."""
    data = b""
    while chunk := client.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), headers, body


def test_a_body_that_does_not_come_is_a_408_and_others_are_served_meanwhile(
    server: Server,
) -> None:
    """The issue's attack, one socket: a login form declared and never sent. The server
    answers 408 once the read deadline (DEADLINE here; 30 s by default) has passed, and
    /healthz answers at once meanwhile."""
    client = server.connect()
    started = time.monotonic()
    client.sendall(
        b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100000\r\n\r\n"
        b"username=a"
    )
    assert server.healthz_seconds() < 1.0
    status, headers, body = read_response(client)
    waited = time.monotonic() - started
    assert status == 408
    assert headers["connection"] == "close"
    assert b"did not arrive within" in body
    # The deadline is the read deadline plus a second per MiB declared: 2.1 s here.
    assert DEADLINE <= waited < DEADLINE + 10, waited


def test_headers_that_do_not_come_are_a_408(server: Server) -> None:
    # The header deadline runs from the server's accept, which may come before connect()
    # returns here: the clock starts before connecting, so the wait is never undercounted.
    started = time.monotonic()
    client = server.connect()
    client.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    status, _, body = read_response(client)
    assert status == 408
    assert b"headers did not arrive in time" in body
    assert DEADLINE <= time.monotonic() - started < DEADLINE + 10


def test_an_idle_connection_is_closed_after_the_header_deadline(server: Server) -> None:
    """Connecting and saying nothing holds no thread, and not even the socket for long."""
    started = time.monotonic()
    client = server.connect()
    status, _, _ = read_response(client)
    assert status == 408
    assert time.monotonic() - started < DEADLINE + 10


def test_a_body_declared_too_large_is_refused_before_it_is_read(server: Server) -> None:
    """Every route has a limit, not only submissions: a form may be at most Django's
    DATA_UPLOAD_MAX_MEMORY_SIZE. The refusal comes without a byte of the body sent."""
    client = server.connect()
    client.sendall(
        b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\n"
        + f"Content-Length: {10 * 2**20}\r\n\r\n".encode()
    )
    status, headers, body = read_response(client)
    assert status == 413
    assert headers["connection"] == "close"
    assert b"at most 2621440 bytes" in body
    assert b"Nothing was read or changed" in body


def test_the_api_refuses_in_its_own_shape(server: Server) -> None:
    client = server.connect()
    client.sendall(
        b"POST /api/v1/workspaces/demo/runs/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: multipart/form-data; boundary=x\r\n"
        + f"Content-Length: {200 * 2**20}\r\n\r\n".encode()
    )
    status, headers, body = read_response(client)
    assert status == 413
    assert headers["content-type"] == "application/json"
    detail = json.loads(body)["detail"]
    # A submission's own limit (a bundle, a spec and the form), not the forms' one.
    from runs.submission import MAX_SUBMISSION_BYTES

    assert f"at most {MAX_SUBMISSION_BYTES} bytes" in detail


def test_a_chunked_body_is_counted_as_it_comes(server: Server) -> None:
    """Without a Content-Length the limit still holds: the body is refused as soon as it
    passes it, and the rest is never read."""
    client = server.connect()
    client.sendall(
        b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"a" * 2**16
    sent = 0
    try:
        while sent < 64 * 2**20:  # far more than the limit: the server stops it first
            client.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    status, _, body = read_response(client)
    assert status == 413
    assert b"passed 2621440 bytes" in body
    assert sent < 16 * 2**20, sent  # stopped near the limit, not after the whole


def test_fifty_slow_clients_and_the_portal_still_answers(server: Server) -> None:
    """Each slow client costs a coroutine: 50 of them (the acceptance's count), and /healthz
    answers within 1 s while they hang."""
    clients = [server.connect() for _ in range(50)]
    try:
        for client in clients:
            client.sendall(
                b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/x-www-form-urlencoded\r\n"
                b"Content-Length: 100000\r\n\r\n"
            )
        time.sleep(0.5)
        assert max(server.healthz_seconds() for _ in range(3)) < 1.0
    finally:
        for client in clients:
            client.close()


def test_runportal_starts_this_server() -> None:
    from web.management.commands.runportal import Command, web_command

    assert Command()._commands("127.0.0.1", 8123)["web"] == web_command("127.0.0.1", 8123)
    assert web_command("127.0.0.1", 8123)[-5:] == [
        "serve_web",
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
    ]


# --- streaming (in process) -------------------------------------------------------------------


def test_a_streaming_response_is_sent_as_it_is_produced() -> None:
    """Downloads (logs, artifacts, the evidence export) are iterators: each chunk goes out as
    it is made. Django's own ASGI handler collects a synchronous iterator whole, in memory,
    before the first byte: here the second chunk is made only once the first was sent."""
    from web.asgi import PortalASGIHandler

    sent_first = threading.Event()
    order: list[str] = []

    def chunks() -> Iterator[bytes]:
        yield b"first"
        # Django's handler would wait here for ever (list() of the whole), so not for ever.
        order.append("second made" if sent_first.wait(timeout=5) else "second made unsent")
        yield b"second"

    async def send(message: Mapping[str, Any]) -> None:
        if message.get("body") == b"first":
            order.append("first sent")
            sent_first.set()

    response = StreamingHttpResponse(chunks())
    # In a thread of its own: after a browser test, Playwright's sync API keeps an event loop
    # running in this one, where asyncio.run() refuses to start another.
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, PortalASGIHandler().send_response(response, send)).result()
    assert order == ["first sent", "second made"]
