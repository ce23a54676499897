"""The endpoint that ``bench_serving.py`` sends requests to, straight and through the portal:
a real HTTP/1.1 server on 127.0.0.1, in a process of its own, that answers as the Ray Serve
application of ``examples/serve-cpu/app.py`` does. Standard library only.

    python benchmarks/serving_upstream.py     # prints its address, serves until SIGTERM

``POST /`` with ``{"text": "..."}`` answers ``{"positive": 0.93, "label": 1, "words": 4}``:
the example's cleaning and logistic regression, over a small vocabulary of its own (the
benchmark has no trained model). A body that is not such JSON gets the example's 400.

Used in smoke mode (the test suite): a full ``make bench`` measures against Ray Serve itself
(``bench_serving.ray_serve_upstream``), whose start would be most of a smoke run.

Each connection is kept alive (HTTP/1.1) and served by a thread of its own, and every answer
leaves in one write with Nagle's algorithm off, as uvicorn (Ray Serve's HTTP proxy) sends it:
a small second write held back until the client's delayed ACK would add 40 ms to requests.
"""

from __future__ import annotations

import json
import math
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

NOT_LETTERS = re.compile(r"[^a-z]+")
MAX_TEXT = 100_000
#: Weights of a few words, as examples/train-on-data would have learnt them.
WEIGHTS = {
    "wonderful": 2.1,
    "moving": 1.3,
    "brilliant": 2.4,
    "great": 1.6,
    "fun": 0.9,
    "weak": -1.5,
    "boring": -2.2,
    "dull": -1.9,
    "awful": -2.6,
    "film": 0.05,
    "ending": -0.1,
}
BIAS = -0.2
REFUSAL = json.dumps({"error": 'send JSON: {"text": "..."}'}).encode()


def sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def classify(text: str) -> dict[str, Any]:
    """examples/serve-cpu/app.py's ``Classifier.predict``."""
    words = NOT_LETTERS.sub(" ", text[:MAX_TEXT].lower()).split()
    found = {word for word in words if word in WEIGHTS}
    positive = sigmoid(BIAS + sum(WEIGHTS[word] for word in found))
    return {"positive": round(positive, 6), "label": int(positive >= 0.5), "words": len(found)}


def answer_to(body: bytes) -> tuple[int, bytes]:
    try:
        request = json.loads(body)
    except ValueError:
        return 400, REFUSAL
    text = request.get("text") if isinstance(request, dict) else None
    if not isinstance(text, str):
        return 400, REFUSAL
    return 200, json.dumps(classify(text)).encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        status, answer = answer_to(self.rfile.read(length))
        head = (
            f"HTTP/1.1 {status} {'OK' if status == 200 else 'Bad Request'}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(answer)}\r\n\r\n"
        )
        self.wfile.write(head.encode() + answer)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A load generator drops its connections when it has sent its requests: no error.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def main() -> None:
    server = Server(("127.0.0.1", 0), Handler)
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
