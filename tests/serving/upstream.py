"""A real HTTP server on 127.0.0.1 standing in for an endpoint's address (a Ray Serve
application's port): the proxy's tests send it requests through the portal.

``POST /echo``: the body back, with the request's content type and what it was sent
(``X-Seen-*``). ``POST /stream``: five lines, each sent and flushed alone, ``delay`` apart
(chunked). ``POST /teapot``: a 418 of its own. ``POST /slow``: answers after ``slow`` s.
``GET /v1/models``: an OpenAI-compatible listing; any other ``GET`` is ``/echo`` without a
body. ``/set-cookie`` answers as ``/echo`` and sets a cookie (``Set-Cookie: session=…``)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Upstream:
    address: str
    seen: list[dict[str, Any]] = field(default_factory=list)
    delay: float = 0.0
    slow: float = 0.0
    #: When each streamed line was written (monotonic), to compare with when it arrived.
    written: list[float] = field(default_factory=list)


@contextmanager
def upstream_server(*, delay: float = 0.0, slow: float = 0.0) -> Iterator[Upstream]:
    state = Upstream(address="", delay=delay, slow=slow)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            # The portal may give up waiting (a test of its timeout).
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.answer()

        def do_GET(self) -> None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.answer()

        def answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            state.seen.append(
                {
                    "method": self.command,
                    # Which connection it came on (the proxy keeps and reuses them).
                    "peer": self.client_address,
                    "path": self.path,
                    "body": body,
                    "content_type": self.headers.get("Content-Type"),
                    "content_length": self.headers.get("Content-Length"),
                    "authorization": self.headers.get("Authorization"),
                    "cookie": self.headers.get("Cookie"),
                }
            )
            route = self.path.split("?")[0]
            if self.command == "GET" and route == "/v1/models":
                answer = json.dumps({"object": "list", "data": [{"id": "chat"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)
                return
            if route == "/stream":
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for number in range(5):
                    line = f"data: token {number}\n\n".encode()
                    state.written.append(time.monotonic())
                    self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                    self.wfile.flush()
                    time.sleep(state.delay)
                self.wfile.write(b"0\r\n\r\n")
                return
            if route == "/teapot":
                answer = json.dumps({"error": "I am a teapot"}).encode()
                self.send_response(418)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)
                return
            if route == "/slow":
                time.sleep(state.slow)
            self.send_response(200)
            self.send_header("Content-Type", self.headers.get("Content-Type") or "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-Seen-Path", self.path)
            if route == "/set-cookie":
                self.send_header("Set-Cookie", "session=one-callers; Path=/")
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.address = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
