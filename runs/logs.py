"""An attempt's log as the core hands it out, whichever backend keeps it: a piece of it to
follow (:class:`LogChunk`, by byte offset or as the last lines) and the whole of it to
stream (:class:`WholeLog`).

A backend that keeps a log as a file on this machine (the local executor's ``run.log``)
reads it with :func:`read_log_file` and :func:`open_log_file`; one that gets a log as bytes
(the Kubernetes backend, from ``pods/log``) cuts it with :func:`read_log_bytes` and
:func:`whole_log_bytes`, the same way.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

MAX_LOG_CHUNK = 1024 * 1024
LOG_STREAM_BLOCK = 64 * 1024


@dataclass(frozen=True)
class LogChunk:
    attempt: int | None
    text: str
    offset: int
    next_offset: int
    size: int
    complete: bool  # the attempt is over: nothing more will be appended
    #: Where an attempt runs as several processes (a cluster's pods), which one this is
    #: the log of, and all of them; empty for a backend with one log per attempt.
    pod: str = ""
    pods: tuple[str, ...] = ()
    #: Why there is no log (yet), in words, when the backend can say: a pod that never
    #: started (scheduling, the image), a log that is gone.
    note: str = ""


@dataclass(frozen=True)
class WholeLog:
    """An attempt's whole log as it is now, to be streamed: iterating yields ``size`` bytes
    in blocks, however large the file is; ``close()`` (which Django calls when the response
    is done, read or not) closes the file."""

    attempt: int | None
    size: int
    handle: BinaryIO | None

    def __iter__(self) -> Iterator[bytes]:
        return self.blocks()

    def blocks(self) -> Iterator[bytes]:
        if self.handle is None:
            return
        try:
            left = self.size
            while left > 0:
                block = self.handle.read(min(LOG_STREAM_BLOCK, left))
                if not block:
                    break
                left -= len(block)
                yield block
        finally:
            self.handle.close()

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()


def read_log_file(
    path: Path | None,
    *,
    attempt: int,
    complete: bool,
    offset: int | None,
    tail_lines: int | None,
    limit: int = 256 * 1024,
) -> LogChunk:
    """A piece of a log file without reading the whole file: from ``offset`` (follow), or
    the last ``tail_lines`` lines. ``complete``: the attempt is over."""
    if path is None or not path.exists():
        return LogChunk(
            attempt=attempt, text="", offset=0, next_offset=0, size=0, complete=complete
        )
    with open(path, "rb") as handle:
        return _read_piece(
            handle, attempt=attempt, complete=complete, offset=offset, tail_lines=tail_lines,
            limit=limit,
        )  # fmt: skip


def read_log_bytes(
    data: bytes,
    *,
    attempt: int,
    complete: bool,
    offset: int | None,
    tail_lines: int | None,
    limit: int = 256 * 1024,
) -> LogChunk:
    """A piece of a log held in memory, cut as :func:`read_log_file` cuts a file."""
    return _read_piece(
        io.BytesIO(data), attempt=attempt, complete=complete, offset=offset,
        tail_lines=tail_lines, limit=limit,
    )  # fmt: skip


def _read_piece(
    handle: BinaryIO,
    *,
    attempt: int,
    complete: bool,
    offset: int | None,
    tail_lines: int | None,
    limit: int,
) -> LogChunk:
    limit = max(1, min(limit, MAX_LOG_CHUNK))
    size = handle.seek(0, 2)
    if offset is None:
        start = _tail_start(handle, size, tail_lines or 200)
    else:
        start = max(0, min(offset, size))
    handle.seek(start)
    data = handle.read(min(limit, size - start))
    at_end = start + len(data) >= size
    # A character still being written (or cut by the limit) waits for the next read; once the
    # attempt is over, whatever is there is shown.
    consumed = len(data) if (complete and at_end) else _complete_prefix(data)
    return LogChunk(
        attempt=attempt,
        text=data[:consumed].decode("utf-8", errors="replace"),
        offset=start,
        next_offset=start + consumed,
        size=size,
        complete=complete and start + consumed >= size,
    )


def whole_log_bytes(data: bytes, *, attempt: int, live: bool) -> WholeLog:
    """A log held in memory, to stream; a live attempt's ends before any character still
    being written."""
    if live:
        data = data[: _complete_prefix(data)]
    return WholeLog(attempt=attempt, size=len(data), handle=io.BytesIO(data))


def open_log_file(path: Path | None, *, attempt: int, live: bool) -> WholeLog:
    """A log file opened for streaming. A live attempt's log ends where it was when opened,
    before any character still being written."""
    try:
        handle = open(path, "rb") if path is not None else None  # noqa: SIM115 (streamed)
    except FileNotFoundError:
        handle = None
    if handle is None:
        return WholeLog(attempt=attempt, size=0, handle=None)
    size = handle.seek(0, 2)
    if live and size:
        handle.seek(max(0, size - 4))
        last = handle.read()
        size -= len(last) - _complete_prefix(last)
    handle.seek(0)
    return WholeLog(attempt=attempt, size=size, handle=handle)


def _complete_prefix(data: bytes) -> int:
    """How many leading bytes of ``data`` end on a UTF-8 character boundary: a multi-byte
    character whose last bytes are not there yet is left for the next read. Bytes that are not
    UTF-8 at all are consumed (and shown as replacement characters)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0b1100_0000 == 0b1000_0000:
            continue  # a continuation byte: look further back for the lead byte
        if byte >= 0b1111_0000:
            needed = 4
        elif byte >= 0b1110_0000:
            needed = 3
        elif byte >= 0b1100_0000:
            needed = 2
        else:
            needed = 1
        return len(data) - back if needed > back else len(data)
    return len(data)


def _tail_start(handle: Any, size: int, lines: int) -> int:
    """Byte offset where the last ``lines`` lines begin, reading backwards in blocks."""
    block = 8192
    position = size
    newlines = 0
    # A trailing newline ends the last line; it does not start another.
    handle.seek(max(0, size - 1))
    if size and handle.read(1) == b"\n":
        newlines = -1
    while position > 0:
        read = min(block, position)
        position -= read
        handle.seek(position)
        chunk = handle.read(read)
        for index in range(len(chunk) - 1, -1, -1):
            if chunk[index] == 0x0A:
                newlines += 1
                if newlines == lines:
                    return position + index + 1
    return 0
