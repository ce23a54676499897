"""The export file of a record: a deterministic tar (``tau.evidence.archive``), streamed.

Its length is known before the first byte (each member's size is in the sealed manifest,
and a header's length follows from its name and size), so the response carries a
``Content-Length`` and a client can tell a cut-off download from a whole one. Nothing but one
chunk of one member is in memory at a time, whatever the size of a log.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

from evidence.manifest import Coverage, export_members
from evidence.models import EvidenceRecord
from tau.evidence import archive


def _tar_length(members: list[archive.Member], mtime: int) -> int:
    """The bytes ``tar_stream`` writes for ``members``. Each header comes from the writer
    itself (its first chunk, taken before the member is opened), so the two cannot disagree
    about pax headers for long names."""
    total = 0
    for member in members:
        # The writer yields a member's header before it opens the member: this one never is.
        probe = archive.Member(member.name, member.size, io.BytesIO)
        header = next(archive.tar_stream([probe], mtime=mtime))
        total += len(header) + member.size + (-member.size % archive.BLOCK)
    total += 2 * archive.BLOCK
    return total + (-total % archive.RECORD)


class FileGone(Exception):
    """A file the record holds is no longer where TauGrid keeps it (the message names it)."""


def export_stream(record: EvidenceRecord) -> tuple[int, Iterator[bytes]]:
    """The length of ``record``'s export file and its chunks. Every member is opened once
    before the first byte (``FileGone`` when one cannot be): once the response has started,
    a missing file could only cut it short."""
    coverage = Coverage(attempt_count=record.attempt_count, event_count=record.event_count)
    name = "the bundle"
    try:
        members = list(
            export_members(record.run, coverage, bytes(record.manifest), bytes(record.signature))
        )
        for member in members:
            name = member.name
            member.open().close()
    except OSError as error:
        raise FileGone(f"{name} is no longer kept ({error.strerror})") from None
    mtime = int(record.sealed_at.timestamp())
    return _tar_length(members, mtime), archive.tar_stream(members, mtime=mtime)
