"""How a workload ended, as the wrapper recorded it (``wrapper.py``), read back by the agent.

The agent reads the record when the attempt's process ends (it is more exact than the exit
status of the sandbox around the workload) and, above all, when it starts again after a
crash: an attempt whose workload finished while no agent was watching is closed with its
real result instead of being run again.

The file lives in a folder the workload may be able to write (see ``wrapper.py``), so it is
read like untrusted input: never through a symlink, only a small regular file, every field
checked.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from executors.local.agent.wrapper import truncation_marker

MAX_OUTCOME_BYTES = 64 * 1024


@dataclass(frozen=True)
class RecordedOutcome:
    exit_code: int | None
    signal: int | None
    error: str | None  # the command could not be started
    started_at: float | None
    ended_at: float | None
    stop_signals: tuple[int, ...]  # SIGTERM/SIGINT/SIGHUP that came before the end
    log_dropped: int = 0  # bytes of output over the log cap

    @property
    def after_a_stop(self) -> bool:
        """The workload was being stopped when it ended: not a natural end."""
        return bool(self.stop_signals)

    @property
    def duration(self) -> float | None:
        if self.started_at is None or self.ended_at is None:
            return None
        return max(0.0, self.ended_at - self.started_at)


def outcome_written(path: Path) -> bool:
    """Whether the wrapper has written its record: a plain file at ``path`` itself. A link
    there is not followed (the agent may be root, and a link's target outside the run must
    not even be tested for existence)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def read_outcome(path: Path) -> RecordedOutcome | None:
    """The record at ``path``, or None if there is none (or it is not a valid record)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_OUTCOME_BYTES:
            return None
        data = os.read(descriptor, MAX_OUTCOME_BYTES)
    except OSError:
        return None
    finally:
        os.close(descriptor)
    try:
        record = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict):
        return None
    exit_code = _integer(record.get("exit_code"), 0, 255)
    signal_number = _integer(record.get("signal"), 1, 64)
    if (exit_code is None) == (signal_number is None):
        return None  # exactly one of them
    error = record.get("error")
    stops = record.get("stop_signals")
    return RecordedOutcome(
        exit_code=exit_code,
        signal=signal_number,
        error=error[:500] if isinstance(error, str) and error else None,
        started_at=_number(record.get("started_at")),
        ended_at=_number(record.get("ended_at")),
        stop_signals=tuple(
            number
            for number in (stops if isinstance(stops, list) else [])[:10]
            if _integer(number, 1, 64) is not None
        ),
        log_dropped=_integer(record.get("log_dropped"), 0, 2**62) or 0,
    )


def _integer(value: object, low: int, high: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return None
    return value


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def last_log_line(path: Path, limit: int = 300) -> str:
    """The last line a workload wrote to its log (not the platform's ``[taugrid]`` notes nor
    the log's truncation marker), for the reason of an end: "Its last output: …"."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 4096))
            tail = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    marker = truncation_marker(0).decode().strip().split(" at ")[0]
    for line in reversed(tail.splitlines()):
        line = line.strip()
        if line and not line.startswith("[taugrid]") and not line.startswith(marker):
            return line[:limit]
    return ""
