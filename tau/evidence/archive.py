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
    "member_rank",
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


def member_rank(name: str) -> tuple[int, int, str] | None:
    """Where ``name`` stands in the export's fixed order (docs/evidence.md, "The export
    file"): the manifest, its signature, ``spec.json``, ``tau.yaml``, ``bundle.zip``, each
    attempt's log by attempt number, ``metrics.jsonl``, ``events.jsonl``, then the artifacts
    by path (code point order). Members sort by their rank; None for a name the format has
    no place for."""
    fixed = {MANIFEST: 0, SIGNATURE: 1, SPEC: 2, TAU_YAML: 3, BUNDLE: 4, METRICS: 6, EVENTS: 7}
    if name in fixed:
        return (fixed[name], 0, "")
    parts = name.split("/")
    if len(parts) == 3 and parts[0] == "attempts" and parts[2] == "log.txt":
        number = parts[1]
        if number.isascii() and number.isdigit() and number == str(int(number)):
            return (5, int(number), "")
        return None
    if name.startswith("artifacts/") and len(name) > len("artifacts/"):
        return (8, 0, name.removeprefix("artifacts/"))
    return None


class MemberNameError(ValueError):
    """A member name the format does not allow (absolute, ``..``, empty parts, repeated)."""


class MemberSizeError(ValueError):
    """A member whose bytes are more or fewer than the size it was declared with."""


def check_member_name(name: str) -> None:
    """Raise ``MemberNameError`` unless ``name`` is a plain relative path: no leading ``/``,
    no ``.`` or ``..`` or empty parts, no backslash or NUL (which extractors read differently),
    nothing that is not UTF-8 text."""
    parts = name.split("/")
    if (
        not name
        or not _is_utf8(name)
        or name.startswith("/")
        or "\\" in name
        or "\0" in name
        or any(part in ("", ".", "..") for part in parts)
    ):
        raise MemberNameError(f"member name not allowed: {name!r}")


def _is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
    """The tar header of a member: what the writer emits and what the verifier expects, byte
    for byte. A plain ustar header, preceded by a pax header only when the name is longer than
    100 bytes or not ASCII, or the size is 8 GiB or more.

    Written here from POSIX rather than by ``tarfile.TarInfo.tobuf``, whose bytes change
    between Python releases (the device-number fields of regular files, for one): the
    same record must export to the same bytes, and verify, on every Python the client runs on.
    """
    pax: dict[str, str] = {}
    if not name.isascii() or len(name) > _NAME_SIZE:
        pax["path"] = name
    if size >= _SIZE_LIMIT:
        pax["size"] = str(size)
    header = _ustar_block(
        name=name.encode("ascii", "replace")[:_NAME_SIZE],
        mode=0o644,
        size=0 if "size" in pax else size,
        mtime=mtime,
        kind=tarfile.REGTYPE,
    )
    if not pax:
        return header
    records = b"".join(_pax_record(key, value) for key, value in pax.items())
    pax_header = _ustar_block(
        name=b"././@PaxHeader", mode=0, size=len(records), mtime=0, kind=tarfile.XHDTYPE
    )
    return pax_header + records + bytes(-len(records) % BLOCK) + header


_NAME_SIZE = 100
_SIZE_LIMIT = 8**11  # what the 11 octal digits of ustar's size field hold


def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def _ustar_block(*, name: bytes, mode: int, size: int, mtime: int, kind: bytes) -> bytes:
    if not 0 <= mtime < 8**11:
        raise ValueError(f"mtime {mtime} does not fit a ustar header")
    block = b"".join(
        [
            name.ljust(100, b"\0"),
            _octal(mode, 8),
            _octal(0, 8),  # uid
            _octal(0, 8),  # gid
            _octal(size, 12),
            _octal(mtime, 12),
            b" " * 8,  # the checksum, counted as spaces
            kind,
            bytes(100),  # linkname
            b"ustar\x0000",  # magic and version
            bytes(32 + 32 + 8 + 8 + 155),  # uname, gname, devmajor, devminor, prefix
        ]
    ).ljust(BLOCK, b"\0")
    checksum = b"%06o\0 " % sum(block)
    return block[:148] + checksum + block[156:]


def _pax_record(key: str, value: str) -> bytes:
    # "<length> <key>=<value>\n", where the length counts its own digits too.
    body = b" %s=%s\n" % (key.encode("utf-8"), value.encode("utf-8"))
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length = len(str(length)) + len(body)
    return b"%d%s" % (length, body)


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
