"""A version's files as one uncompressed tar, streamed (``GET …/versions/{v}/download/``).

Members in manifest order (sorted by path), each a regular file with mode 0644, owner 0 and
the version's ``ready_at`` as its time, so the same version always downloads as the same
bytes; the length is known before the first byte (``Content-Length``). A file that is gone
from the store or no longer its size ends the stream early: the client sees a short body
rather than a tar whose bytes lie. So does a file of a version registered in place whose
bytes changed since (catalog.in_place: the chunk that completes it is withheld).
"""

from __future__ import annotations

import logging
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tau.manifest import CHUNK_BYTES

logger = logging.getLogger(__name__)

BLOCK = 512


@dataclass(frozen=True)
class Member:
    """One file of the tar: its bytes from ``blob``, a function that opens them (e.g.
    ``functools.partial(catalog.storage.open_blob, workspace_id, sha256)``, whatever the
    store, or ``catalog.in_place.read_checked`` for a version registered in place), or a
    local file's path (a folder store's blob)."""

    path: str
    size: int
    blob: Callable[[], BinaryIO] | Path

    def open(self) -> BinaryIO:
        return self.blob.open("rb") if isinstance(self.blob, Path) else self.blob()


def _padding(size: int) -> int:
    return -size % BLOCK


def _header(member: Member, mtime: float) -> bytes:
    info = tarfile.TarInfo(member.path)
    info.size = member.size
    info.mode = 0o644
    info.mtime = int(mtime)
    # PAX: paths of any length and any UTF-8 (a long path adds an extended header).
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8")


def tar_length(members: list[Member], mtime: float) -> int:
    return (
        sum(len(_header(member, mtime)) + member.size + _padding(member.size) for member in members)
        + 2 * BLOCK
    )


def tar_stream(members: list[Member], mtime: float) -> Iterator[bytes]:
    for member in members:
        yield _header(member, mtime)
        sent = 0
        try:
            with member.open() as source:
                while sent < member.size:
                    chunk = source.read(min(CHUNK_BYTES, member.size - sent))
                    if not chunk:
                        logger.warning("download: %s ended after %d bytes", member.path, sent)
                        return  # the store lost bytes: a short body, never a false member
                    sent += len(chunk)
                    yield chunk
        except OSError as exc:  # gone, or (in place) changed since it was registered
            logger.warning("download: %s cut short: %s", member.path, exc.strerror or exc)
            return
        yield b"\0" * _padding(member.size)
    yield b"\0" * (2 * BLOCK)
