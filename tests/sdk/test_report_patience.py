"""A sweep driver's last word on its trials (``tau.sdk.report_trials(..., patience=…)``):
a busy portal's 429s (the limit every process of a run shares) are waited out for as long as
the patience allows, where the ordinary report gives up after four tries. Against a loopback
stand-in that answers 429 a set number of times (the real portal's answers to the same
reports: the ray-tune example's test)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tau import sdk


@pytest.fixture
def busy_portal(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    state: dict[str, Any] = {"refusals": 0, "bodies": []}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            if state["refusals"] > 0:
                state["refusals"] -= 1
                self.send_response(429)
                self.send_header("Retry-After", "0")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")
                return
            state["bodies"].append(json.loads(body))
            answer = b'{"recorded": 1}'
            self.send_response(202)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    for name, value in {
        "TAU_API_URL": f"http://127.0.0.1:{server.server_port}",
        "TAU_RUN_TOKEN": "tau_run_stand-in",
        "TAU_WORKSPACE": "alpha",
        "TAU_RUN_NAME": "sweep-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sdk, "FIRST_RETRY_SECONDS", 0.01)
    monkeypatch.setattr(sdk, "MAX_RETRY_SECONDS", 0.05)
    sdk._reset()
    yield state
    sdk._reset()
    server.shutdown()
    server.server_close()


TRIALS = [{"trial": 1, "config": {"lr": 0.1}, "state": "succeeded", "exit_code": 0}]


def test_an_ordinary_report_gives_up_after_four_tries(
    busy_portal: dict[str, Any], capfd: pytest.CaptureFixture[str]
) -> None:
    busy_portal["refusals"] = 6
    assert sdk.report_trials(TRIALS) is False
    assert busy_portal["bodies"] == []
    assert busy_portal["refusals"] == 2  # four tries, four refusals
    assert "report_trials: the portal cannot be reached" in capfd.readouterr().err


def test_the_last_report_waits_out_a_busy_portal(busy_portal: dict[str, Any]) -> None:
    busy_portal["refusals"] = 6
    assert sdk.report_trials(TRIALS, patience=30) is True
    assert busy_portal["bodies"] == [{"trials": TRIALS}]
    assert busy_portal["refusals"] == 0
