"""An endpoint's files on this machine: what the local backend hands the agent, what the
agent records of the processes it started, and what each generation's runner reports.

Layout, under ``VAR_DIR/endpoints/<endpoint id>/`` (:func:`endpoints_root`)::

    handed.json           the instructions delivered (the backend's ``deploy``/``stop``):
                          the newest generation to run, the newest to stop
    serving.json          which generation answers requests, at which port (the agent's)
    generation-<n>/       one per generation, an attempt's layout (``prepare.AttemptLayout``)
        run.log           the runner's stdout and stderr (Ray's, its replicas' included),
                          capped like a run's log (``TAU_RUN_LOG_MAX_BYTES``)
        process.json      the agent's record of the process group: pid, start time, port
        work/             the project zip unpacked (the working directory, on PYTHONPATH)
        data/             the model version, staged read-only: TAU_MODEL_DIR
        output/           the runner's reports: serve-status.jsonl, serve-metrics.json
        tmp/ shm/ status/ sandbox/   as an attempt's (status/outcome.json: the wrapper's)

The backend (web process, Celery worker) writes ``handed.json`` and reads logs and metrics;
the agent writes everything else. The runner's reports live in a folder the endpoint's code
can write, so they are read as untrusted input: never through a link, bounded in size, every
field checked where it is used. Filesystem only; no database here.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from executors.local.agent.collect import open_regular_file, read_bounded
from executors.local.agent.prepare import AttemptLayout

HANDED_FILE = "handed.json"
SERVING_FILE = "serving.json"
PROCESS_FILE = "process.json"
#: The runner's reports (``tau.serving``: STATUS_FILE, METRICS_FILE), in ``output/``.
STATUS_FILE = "serve-status.jsonl"
METRICS_FILE = "serve-metrics.json"
GENERATION_PREFIX = "generation-"
_GENERATION = re.compile(r"generation-([1-9][0-9]{0,8})")
#: The most of a record read (the agent's own files, and the runner's metrics).
RECORD_LIMIT = 64 * 1024
#: The most of the runner's status read in one pass (its lines are a few hundred bytes).
STATUS_READ_LIMIT = 256 * 1024


def endpoints_root() -> Path:
    """Where endpoints live: ``VAR_DIR/endpoints`` (derived when asked, so it follows
    VAR_DIR)."""
    return Path(settings.VAR_DIR) / "endpoints"


@dataclass(frozen=True)
class EndpointFolder:
    """One endpoint's folder (module docstring)."""

    path: Path

    @classmethod
    def of(cls, endpoint_id: int, root: Path | None = None) -> EndpointFolder:
        return cls((root or endpoints_root()) / str(int(endpoint_id)))

    @property
    def handed(self) -> Path:
        return self.path / HANDED_FILE

    @property
    def serving(self) -> Path:
        return self.path / SERVING_FILE

    def generation(self, number: int) -> AttemptLayout:
        """Generation ``number``'s folders, laid out as an attempt's (so the sandbox, the
        wrapper and the limits treat it as they treat an attempt)."""
        return AttemptLayout(
            run_dir=self.path, attempt_dir=self.path / f"{GENERATION_PREFIX}{number}"
        )

    def generations(self) -> list[int]:
        """The generations that have a folder here, oldest first."""
        try:
            names = os.listdir(self.path)
        except OSError:
            return []
        return sorted(
            int(found.group(1)) for name in names if (found := _GENERATION.fullmatch(name))
        )


def process_record(layout: AttemptLayout) -> Path:
    return layout.attempt_dir / PROCESS_FILE


def status_file(layout: AttemptLayout) -> Path:
    return layout.output / STATUS_FILE


def metrics_file(layout: AttemptLayout) -> Path:
    return layout.output / METRICS_FILE


def generation_name(number: int) -> str:
    """How pages and the API name a generation's log (the ``replica`` of ``read_log``)."""
    return f"{GENERATION_PREFIX}{number}"


def generation_of(name: str) -> int | None:
    found = _GENERATION.fullmatch(name)
    return int(found.group(1)) if found else None


# --- records written whole ----------------------------------------------------------------


def write_record(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON atomically (a temporary file renamed into place), readable by
    the portal's user only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    os.replace(temporary, path)


def read_record(path: Path, root: Path | None = None) -> dict[str, Any] | None:
    """The JSON object in ``path`` (below ``root``, never through a link, when given), or
    None when there is none, it is too large, or it is not an object."""
    if root is None:
        root = path.parent
    raw = read_bounded(path, root, limit=RECORD_LIMIT)
    if raw is None or len(raw) > RECORD_LIMIT:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def number(value: Any, *, low: int = 0, high: int = 2**31) -> int | None:
    """An integer field of a record, checked."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return None
    return int(value)


def figure(value: Any) -> float | None:
    """A numeric field of the runner's metrics, checked (finite, not negative)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    found = float(value)
    if found != found or found in (float("inf"), float("-inf")) or found < 0:
        return None
    return found


# --- what the backend hands the agent -----------------------------------------------------


@dataclass(frozen=True)
class Handed:
    """The instructions delivered for an endpoint: run generation ``deploy`` (0: none yet),
    run nothing of generation ``stop`` or older (0: never stopped)."""

    deploy: int = 0
    stop: int = 0


def handed(folder: EndpointFolder) -> Handed:
    data = read_record(folder.handed) or {}
    return Handed(deploy=number(data.get("deploy")) or 0, stop=number(data.get("stop")) or 0)


@contextlib.contextmanager
def _locked(folder: EndpointFolder) -> Iterator[None]:
    folder.path.mkdir(parents=True, exist_ok=True)
    with open(folder.path / f".{HANDED_FILE}.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def hand_over(
    folder: EndpointFolder, *, deploy: int | None = None, stop: int | None = None
) -> Handed:
    """Record an instruction; each number only ever grows, so a delivery made twice, or an
    older generation's delivered after a newer one's, changes nothing."""
    with _locked(folder):
        before = handed(folder)
        after = Handed(deploy=max(before.deploy, deploy or 0), stop=max(before.stop, stop or 0))
        if after != before:
            write_record(folder.handed, {"deploy": after.deploy, "stop": after.stop})
        return after


# --- what the runner reports ----------------------------------------------------------------


def read_status(path: Path, root: Path, offset: int) -> tuple[dict[str, Any] | None, int]:
    """The newest complete status line after byte ``offset`` of the runner's status file
    (None when there is no new one) and the offset after the last complete line. Only the
    file's last ``STATUS_READ_LIMIT`` bytes are ever read; a file that shrank (a restart
    wrote a new one) is read from its start."""
    try:
        descriptor = open_regular_file(path, root)
    except OSError:
        return None, 0
    with os.fdopen(descriptor, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size < offset:
            offset = 0
        start = max(offset, size - STATUS_READ_LIMIT)
        handle.seek(start)
        raw = handle.read(size - start)
    end = raw.rfind(b"\n")
    if end < 0:
        return None, offset
    for line in reversed(raw[:end].split(b"\n")):
        try:
            data = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(data, dict):
            return data, start + end + 1
    return None, start + end + 1
