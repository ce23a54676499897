"""What a running workload writes that the portal keeps: metric rows and checkpoints.

**Metrics.** The workload appends JSON lines to ``$TAU_OUTPUT_DIR/<outputs.metrics_file>``:
``{"step": 10, "loss": 0.31, "accuracy": 0.9}``. Each line with an integer ``step``
becomes one point per numeric value (booleans, strings, NaN and infinities are skipped).
Only complete lines (ending in a newline) are read, from the byte offset reached so far, so a
half-written line is read once it is finished; when the workload has exited, a last line
without a newline counts too. A line that is not a JSON object with an integer ``step`` is
counted and skipped, never fatal. What a line holds is kept by ``runs.metric_points`` under the
rules every metric follows (``runs.metric_rules``: printable names, at most so many per
line and per run); a line of which it skips something counts as a bad line too.

**Checkpoints.** Entries directly in ``$TAU_CHECKPOINT_DIR`` whose name ends in the step
number, optionally followed by extensions: ``step-700``, ``checkpoint-700``, ``700``,
``model-700.pt``, ``ckpt_700.tar.gz``.

* A folder is a checkpoint once it contains a file named ``COMPLETE`` (write the folder
  under a temporary name, then rename it, or write ``COMPLETE`` last).
* A file is a checkpoint once it exists under its final name: write it under a name that
  starts with ``.`` or ends in ``.tmp``/``.partial`` and rename it when it is whole.

Each checkpoint is recorded once (unique by path); the newest complete one (highest step)
is what a retry resumes from.

The agent may run as root, and these folders are the workload's: nothing here follows a
symbolic link. The checkpoint folder and each checkpoint in it are opened with
``O_NOFOLLOW`` and looked at through their descriptors (``COMPLETE`` must be a plain file in
the checkpoint folder itself, sizes are summed with ``lstat``), so a link to a host path
reveals nothing about that path — not even whether it exists.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runs.metric_rules import MetricRow, step_problem

MAX_READ_BYTES = 1024 * 1024  # per collection pass; the rest waits for the next pass
COMPLETE_MARKER = "COMPLETE"
_STEP_NAME = re.compile(r"^(?:.*?[^0-9])?(?P<step>\d{1,18})(?:\.[A-Za-z][A-Za-z0-9]*)*$")
_IGNORED_SUFFIXES = (".tmp", ".partial", ".incomplete", ".lock")
_MAX_WALK_ENTRIES = 100_000


@dataclass
class MetricsBatch:
    rows: list[MetricRow]  # one per metrics line, with its numeric values
    offset: int  # where the next read starts
    bad_lines: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def points(self) -> list[tuple[str, int, float]]:
        """(key, step, value) of every value read, in line order."""
        return [(key, row.step, value) for row in self.rows for key, value in row.values]


@dataclass
class MetricsReader:
    """Reads new complete lines of one attempt's metrics file."""

    path: Path
    offset: int = 0
    line_number: int = 0  # lines read so far in this process (for messages only)
    bad_lines: int = 0
    first_problem: str = ""
    #: The folder the workload writes (its output folder): the file is opened inside it
    #: without following any symbolic link, and only when it is a regular file. The agent
    #: may run as root: a link to a host file, or a FIFO that would block the read, is the
    #: workload's problem, reported as such, never the agent's.
    root: Path | None = None

    def read(self, *, final: bool = False) -> MetricsBatch:
        batch = MetricsBatch(rows=[], offset=self.offset)
        try:
            descriptor = open_regular_file(self.path, self.root)
        except FileNotFoundError:
            return batch
        except OSError as exc:
            self._problem(batch, f"could not read the metrics file: {exc.strerror or exc}")
            return batch
        with os.fdopen(descriptor, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size < self.offset:
                # The file was replaced or truncated by the workload: start over.
                self._problem(batch, "the metrics file shrank; reading it again from the start")
                self.offset = batch.offset = 0
            if size == self.offset:
                return batch
            try:
                handle.seek(self.offset)
                data = handle.read(MAX_READ_BYTES)
            except OSError as exc:
                self._problem(batch, f"could not read the metrics file: {exc}")
                return batch
        end = data.rfind(b"\n")
        if end >= 0:
            complete, consumed = data[:end], end + 1
        elif len(data) >= MAX_READ_BYTES:
            complete, consumed = data, len(data)  # one enormous line: count it as bad
            self.line_number += 1
            self._bad(batch, "longer than 1 MiB")
            complete = b""
        elif final:
            complete, consumed = data, len(data)
        else:
            return batch  # a line still being written
        for raw in complete.split(b"\n") if complete else []:
            self.line_number += 1
            self._parse(raw, batch)
        self.offset += consumed
        batch.offset = self.offset
        return batch

    def _parse(self, raw: bytes, batch: MetricsBatch) -> None:
        text = raw.strip()
        if not text:
            return
        try:
            row: Any = json.loads(text)
        except (ValueError, UnicodeDecodeError):
            self._bad(batch, "not JSON")
            return
        if not isinstance(row, dict):
            self._bad(batch, "not a JSON object")
            return
        step = row.get("step")
        if "step" not in row:
            self._bad(batch, 'no integer "step"')
            return
        if (why := step_problem(step)) is not None:
            self._bad(batch, why)
            return
        values: list[tuple[str, Any]] = []
        for key, value in row.items():
            # Other fields (a phase name, a flag) may share the line: only numbers are metrics.
            if key == "step" or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            try:
                number = float(value)
            except OverflowError:  # an integer beyond any float
                continue
            if math.isfinite(number):
                values.append((key, number))
        batch.rows.append(MetricRow(step=step, values=values, where=f"line {self.line_number}"))

    def skipped(self, rows: int, first_problem: str | None) -> None:
        """Lines that were read but not wholly kept (``runs.metric_points`` skipped a name or a
        value of each): counted as bad lines, the first reason kept for the run's history."""
        self.bad_lines += rows
        if first_problem and not self.first_problem:
            self.first_problem = first_problem

    def _bad(self, batch: MetricsBatch, why: str) -> None:
        self.bad_lines += 1
        batch.bad_lines += 1
        self._problem(batch, f"line {self.line_number}: {why}")

    def _problem(self, batch: MetricsBatch, message: str) -> None:
        batch.problems.append(message)
        if not self.first_problem:
            self.first_problem = message


@dataclass(frozen=True)
class FoundCheckpoint:
    path: str
    step: int
    size: int
    kind: str  # "directory" or "file"


def checkpoint_step(name: str) -> int | None:
    """The step a checkpoint's name says, or None if the name is not a checkpoint's."""
    if name.startswith(".") or name.endswith(_IGNORED_SUFFIXES):
        return None
    match = _STEP_NAME.match(name)
    # A step too large for the run's evidence to hold (``metric_rules``) is not a step.
    return int(match["step"]) if match and step_problem(int(match["step"])) is None else None


_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class CheckpointScanner:
    """Finds complete checkpoints in one directory that are not recorded yet."""

    directory: Path
    known: set[str] = field(default_factory=set)

    def scan(self) -> list[FoundCheckpoint]:
        found: list[FoundCheckpoint] = []
        try:
            folder = os.open(self.directory, _FOLDER)
        except OSError:
            return found  # not there (yet), or not a folder of its own
        try:
            names = os.listdir(folder)
            for name in names:
                path = os.path.join(self.directory, name)
                step = checkpoint_step(name)
                if step is None or path in self.known:
                    continue
                try:
                    info = os.stat(name, dir_fd=folder, follow_symlinks=False)
                    if stat.S_ISDIR(info.st_mode):
                        size = _complete_folder_size(folder, name)
                        if size is not None:
                            found.append(FoundCheckpoint(path, step, size, "directory"))
                    elif stat.S_ISREG(info.st_mode):
                        found.append(FoundCheckpoint(path, step, info.st_size, "file"))
                except OSError:
                    continue  # removed (or replaced) while we looked
        except OSError:
            return found
        finally:
            os.close(folder)
        return found


def _complete_folder_size(parent: int, name: str) -> int | None:
    """The size of the checkpoint folder ``name`` (in the folder open as ``parent``) once it
    holds a plain file ``COMPLETE``; None before. Raises OSError when it is not a folder."""
    folder = os.open(name, _FOLDER, dir_fd=parent)
    try:
        try:
            marker = os.stat(COMPLETE_MARKER, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(marker.st_mode):
            return None
        return _tree_size(folder)
    finally:
        os.close(folder)


def open_regular_file(path: Path, root: Path | None) -> int:
    """A read-only descriptor of ``path``, a regular file. With ``root``, ``path`` must lie
    below it and is opened one component at a time from ``root`` with ``O_NOFOLLOW``: no
    symbolic link on the way is followed. Raises FileNotFoundError when it is not there
    (yet), another OSError when it is there but not a plain file inside ``root``."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    if root is None:
        descriptor = os.open(path, flags)
    else:
        try:
            parts = path.relative_to(root).parts
        except ValueError:
            raise OSError(errno.EPERM, "it is not inside the output folder") from None
        if not parts or ".." in parts:
            raise OSError(errno.EPERM, "it is not inside the output folder")
        folder = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            for part in parts[:-1]:
                inner = os.open(
                    part,
                    os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                    dir_fd=folder,
                )
                os.close(folder)
                folder = inner
            descriptor = os.open(parts[-1], flags, dir_fd=folder)
        except NotADirectoryError:
            raise OSError(errno.ENOTDIR, "a folder on its path is a link or a file") from None
        finally:
            os.close(folder)
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise OSError(errno.EINVAL, "it is not a regular file")
    return descriptor


def read_bounded(path: Path, root: Path, *, limit: int) -> bytes | None:
    """At most ``limit + 1`` bytes of the regular file ``path`` below ``root`` (opened as
    ``open_regular_file`` does); None when it is not there or not a plain file."""
    try:
        descriptor = open_regular_file(path, root)
    except OSError:
        return None
    with os.fdopen(descriptor, "rb") as handle:
        try:
            return handle.read(limit + 1)
        except OSError:
            return None


def _tree_size(folder: int) -> int:
    """The bytes of the regular files below the folder open as ``folder``; walked through
    descriptors, never through a link."""
    total = 0
    seen = 0
    for _path, _folders, files, folder_fd in os.fwalk(".", dir_fd=folder, follow_symlinks=False):
        for name in files:
            seen += 1
            if seen > _MAX_WALK_ENTRIES:
                return total
            try:
                info = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):  # a link counts as nothing
                total += info.st_size
    return total
