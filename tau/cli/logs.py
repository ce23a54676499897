"""Reading a run's log from the portal: piece by piece while it runs (``tau run logs -f``,
``tau run --watch --logs``, ``tau pipeline logs``), or whole."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from typing import Any

from tau.cli.client import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, Api, CliError, run_path
from tau.cli.common import err, print_json

TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
WAITING_STATES = ("pending", "queued", "preempted", "evicted")
#: How often a log (and a run) is asked for while following it.
POLL_SECONDS = 1.0


@dataclass
class LogFollower:
    """Reads an attempt's log piece by piece (the logs route's ``offset``), moving on to the
    next attempt when one starts."""

    api: Api
    path: str
    attempt: int | None = None
    offset: int = 0
    #: Whether the attempt read last has ended and its log was read to the end.
    complete: bool = False
    #: Why the attempt read last has no log (yet), as the portal says it; empty if it has one.
    note: str = ""

    def read(self, *, attempt_count: int) -> str:
        texts = []
        for _ in range(50):  # a burst of output comes in several pieces
            params: dict[str, Any] = {"offset": self.offset}
            if self.attempt is not None:
                params["attempt"] = self.attempt
            chunk = self.api.get(self.path + "logs/", **params)
            self.note = str(chunk.get("note") or "")
            if chunk.get("attempt") is None:
                break
            if self.attempt is None:
                self.attempt = int(chunk["attempt"])
            if chunk.get("text"):
                texts.append(chunk["text"])
            moved = chunk["next_offset"] != self.offset
            self.offset = int(chunk["next_offset"])
            self.complete = bool(chunk.get("complete")) and self.offset >= int(
                chunk.get("size") or 0
            )
            if moved and self.offset < int(chunk.get("size") or 0):
                continue
            if chunk.get("complete") and self.attempt < attempt_count:
                self.attempt += 1
                self.offset = 0
                texts.append(f"--- attempt {self.attempt} ---\n")
                continue
            break
        return "".join(texts)


def print_run_log(
    api: Api, ws: str, name: str, *, follow: bool, attempt: int | None, as_json: bool
) -> int:
    """Print a run's log (``NAME`` may be a spec name: its newest run); with ``follow``,
    until the run ends, then exit with its outcome."""
    path = run_path(ws, name)
    if follow:
        follower = LogFollower(api, path, attempt=attempt)
        said = ""
        try:
            while True:
                run = api.get(path)
                name = str(run["name"])  # NAME may be a spec name
                count = int(run.get("attempt_count") or 0)
                text = follower.read(attempt_count=attempt or count)
                if text:
                    if as_json:
                        sys.stdout.write(json.dumps({"text": text}) + "\n")
                    else:
                        sys.stdout.write(text)
                    sys.stdout.flush()
                if follower.note and follower.note != said:
                    # Why there is no log yet (a pod that cannot start), once, as it changes.
                    err.print(f"{name}: no log yet: {follower.note}", markup=False)
                said = follower.note
                if run["state"] in TERMINAL_STATES and not text:
                    # How it ended, on standard error: a cancelled run is exit 1 too.
                    err.print(_end_line(run), markup=False)
                    return EXIT_OK if run["state"] == "succeeded" else EXIT_FAILED
                if attempt is not None and follower.complete and not text:
                    err.print(
                        f"attempt {attempt} of {name} has ended; the run is {run['state']}.",
                        markup=False,
                    )
                    return EXIT_OK  # the attempt asked for has ended; the run goes on
                if not text:
                    time.sleep(POLL_SECONDS)
        except KeyboardInterrupt:
            raise CliError(f"stopped following; {name} goes on.", EXIT_INTERRUPTED) from None
    if as_json:
        print_json(api.get(path + "logs/", attempt=attempt, offset=0))
        return EXIT_OK
    params: dict[str, Any] = {"format": "text"}
    if attempt is not None:
        params["attempt"] = attempt
    written = 0
    try:
        with api.http.stream(
            "GET", path + "logs/", params=params, headers={"Accept": "text/plain"}
        ) as response:
            if response.status_code >= 400:
                response.read()
                api.check(response)
            for chunk in response.iter_bytes():
                sys.stdout.buffer.write(chunk)
                written += len(chunk)
    except CliError:
        raise
    except Exception as error:
        raise CliError(f"reading the log failed: {error}") from None
    sys.stdout.flush()
    if not written:
        err.print(_why_no_log(api, path, attempt), markup=False)
    return EXIT_OK


def _end_line(run: dict[str, Any]) -> str:
    """How a run stands, in one line: ``NAME cancelled — Cancelled by rob.``"""
    reason = run.get("state_reason")
    return f"{run['name']} {run['state']}" + (f" — {reason}" if reason else ".")


def _why_no_log(api: Api, path: str, attempt: int | None) -> str:
    """Why ``tau run logs`` printed nothing, in the portal's words where it has some (a pod
    that never started, a log that is gone), else from the run's state."""
    chunk = api.get(path + "logs/", attempt=attempt, offset=0)
    run = api.get(path)
    name = run["name"]
    number = chunk.get("attempt")
    if chunk.get("note"):
        which = f"attempt {number} of {name}" if number else name
        return f"{which} has no log: {chunk['note']}"
    if number is None or run["state"] in (*WAITING_STATES, "admitted"):
        reason = f" ({run['state_reason']})" if run.get("state_reason") else ""
        return (
            f"{name} has no log yet: it is {run['state']}{reason}; "
            f"`tau run logs {name} -f` waits for it."
        )
    if not chunk.get("complete"):
        return (
            f"attempt {number} of {name} has written nothing yet; "
            f"`tau run logs {name} -f` follows it."
        )
    return f"attempt {number} of {name} wrote nothing to its log."
