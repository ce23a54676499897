"""An attempt's log: everything the workload writes to stdout and stderr, up to a size cap.

The workload's output comes through a pipe, read by one thread per attempt (the agent's main
loop never blocks on it). Bytes go to the log file as they come, flushed, so the portal can
follow it live. When the file reaches the cap, one marker line says so and the rest is only
counted: a noisy program cannot fill the disk, and it is never blocked on a full pipe.
"""

from __future__ import annotations

import os
import select
import threading
from pathlib import Path
from typing import IO

_CHUNK = 64 * 1024


def truncation_marker(limit: int) -> bytes:
    return f"\n… log truncated at {limit} bytes; further output is dropped …\n".encode()


class LogPump(threading.Thread):
    """Copy a pipe into ``path`` (appending) until end of file or ``stop()``."""

    def __init__(self, pipe_fd: int, path: Path, *, limit: int) -> None:
        super().__init__(name=f"log {path.parent.name}", daemon=True)
        self._fd = pipe_fd
        self._path = path
        self._limit = limit
        self._stop_requested = threading.Event()
        self._lock = threading.Lock()
        self._size = path.stat().st_size if path.exists() else 0
        self._dropped = 0
        self._truncated = self._size >= limit

    @property
    def size(self) -> int:
        """Bytes in the log file."""
        with self._lock:
            return self._size

    @property
    def dropped(self) -> int:
        """Bytes of output not written because of the cap."""
        with self._lock:
            return self._dropped

    def stop(self, timeout: float) -> None:
        """Wait up to ``timeout`` for end of file (all writers gone), then stop reading."""
        self.join(timeout)
        if self.is_alive():
            # A process outside the group (it left with setsid) still holds the pipe open.
            self._stop_requested.set()
            self.join(1.0)

    def run(self) -> None:
        try:
            with open(self._path, "ab", buffering=0) as out:
                while True:
                    ready, _, _ = select.select([self._fd], [], [], 0.2)
                    if not ready:
                        if self._stop_requested.is_set():
                            return
                        continue
                    try:
                        chunk = os.read(self._fd, _CHUNK)
                    except OSError:
                        return
                    if not chunk:
                        return  # end of file: every writer has exited
                    self._write(out, chunk)
        finally:
            os.close(self._fd)

    def _write(self, out: IO[bytes], chunk: bytes) -> None:
        with self._lock:
            if self._truncated:
                self._dropped += len(chunk)
                return
            room = self._limit - self._size
            head, tail = chunk[:room], chunk[room:]
            try:
                if head:
                    out.write(head)
                    self._size += len(head)
                if tail:
                    marker = truncation_marker(self._limit)
                    out.write(marker)
                    self._size += len(marker)
                    self._truncated = True
                    self._dropped += len(tail)
            except OSError:
                # Disk full, say: keep reading, or the workload would block on a full pipe.
                self._dropped += len(chunk)
