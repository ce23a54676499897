"""The export file's names and its writer: a deterministic, uncompressed POSIX tar streamed
in constant memory.

The portal streams a record of any size (a 1 GiB log included) straight into the HTTP
response, so the writer never holds more than one chunk of a member. A tar is cheap to write
that way: a 512-byte header, the bytes as they are, padding. Deterministic means the header
carries nothing of the machine or the moment of export (fixed owner, mode and mtime), so the
same record always exports to the same bytes. A member that turns out longer or shorter than
its header said raises instead of producing a tar that reads wrong.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

__all__ = [
    "BUNDLE",
    "EVENTS",
    "FORMAT",
    "MANIFEST",
    "METRICS",
    "SIGNATURE",
    "SPEC",
    "TAU_YAML",
    "Member",
    "MemberNameError",
    "MemberSizeError",
    "artifact_member",
    "attempt_log",
    "bytes_member",
    "check_member_name",
    "member_header",
    "tar_stream",
]

FORMAT = "taugrid-evidence/1"

MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
SPEC = "spec.json"
TAU_YAML = "tau.yaml"
BUNDLE = "bundle.zip"
METRICS = "metrics.jsonl"
EVENTS = "events.jsonl"

BLOCK = tarfile.BLOCKSIZE
# tarfile (and GNU tar) pad the archive to whole 10 KiB records; doing the same keeps the
# output byte for byte what tarfile itself writes for these members.
RECORD = tarfile.RECORDSIZE


def attempt_log(number: int) -> str:
    """The member holding attempt ``number``'s log."""
    return f"attempts/{number}/log.txt"


def artifact_member(path: str) -> str:
    """The member holding the collected artifact at ``path`` (relative, as the run declared it)."""
    return f"artifacts/{path}"


class MemberNameError(ValueError):
    """A member name the format does not allow (absolute, ``..``, empty parts, repeated)."""


class MemberSizeError(ValueError):
    """A member whose bytes are more or fewer than the size it was declared with."""


def check_member_name(name: str) -> None:
    """Raise ``MemberNameError`` unless ``name`` is a plain relative path: no leading ``/``,
    no ``.`` or ``..`` or empty parts, no backslash or NUL (which extractors read differently)."""
    parts = name.split("/")
    if (
        not name
        or name.startswith("/")
        or "\\" in name
        or "\0" in name
        or any(part in ("", ".", "..") for part in parts)
    ):
        raise MemberNameError(f"member name not allowed: {name!r}")


@dataclass(frozen=True)
class Member:
    """One file of the export: its name, its exact size, and how to open it (a zero-argument
    callable returning a binary file object, opened only when the writer reaches it and
    closed right after)."""

    name: str
    size: int
    open: Callable[[], BinaryIO]


def bytes_member(name: str, data: bytes) -> Member:
    """A member held in memory (the manifest, the signature, the JSON lines)."""
    return Member(name=name, size=len(data), open=lambda: io.BytesIO(data))


def member_header(name: str, size: int, mtime: int) -> bytes:
    """The tar header of a member: what the writer emits and what the verifier expects."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = mtime
    info.mode = 0o644
    info.type = tarfile.REGTYPE
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    # PAX_FORMAT writes a plain ustar header and adds a pax header only when a field does not
    # fit ustar (a name over 100 bytes or not ASCII, a size of 8 GiB or more).
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "strict")


def tar_stream(
    members: Iterable[Member], *, mtime: int, chunk_size: int = 1 << 20
) -> Iterator[bytes]:
    """The tar of ``members``, in the order given, as chunks of at most ``chunk_size`` bytes
    of content (headers and padding are yielded on their own). Every member is a regular
    file, mode 0644, owner 0/0 with empty names, modification time ``mtime``.

    Raises ``MemberNameError`` for a name the format refuses or one given twice, and
    ``MemberSizeError`` when a member's file holds more or fewer bytes than its ``size``.
    """
    if chunk_size <= 0:
        raise ValueError("chunk_size must be positive")
    seen: set[str] = set()
    written = 0
    for member in members:
        check_member_name(member.name)
        if member.name in seen:
            raise MemberNameError(f"member given twice: {member.name!r}")
        seen.add(member.name)
        if member.size < 0:
            raise MemberSizeError(f"{member.name}: negative size {member.size}")
        header = member_header(member.name, member.size, mtime)
        yield header
        written += len(header)
        with member.open() as source:
            remaining = member.size
            while remaining:
                chunk = source.read(min(chunk_size, remaining))
                if not chunk:
                    raise MemberSizeError(
                        f"{member.name}: declared {member.size} bytes, the file ended after "
                        f"{member.size - remaining}"
                    )
                remaining -= len(chunk)
                yield chunk
            if source.read(1):
                raise MemberSizeError(
                    f"{member.name}: the file holds more than {member.size} bytes"
                )
        written += member.size
        padding = -member.size % BLOCK
        if padding:
            yield bytes(padding)
            written += padding
    # The end of the archive: two zero blocks, then zeros up to a whole record.
    written += 2 * BLOCK
    yield bytes(2 * BLOCK + (-written % RECORD))
