"""Versions whose files a client sends over the API, resumable (issue 33).

The client first declares the whole manifest — every file's path, size and SHA-256 — and the
version is made ``ingesting`` with a row per file. Files the workspace's store already holds
whole (the same bytes in another version) count as sent. Then the client sends each remaining
file, in pieces of at most ``TAU_DATA_UPLOAD_PIECE_BYTES``, each starting where the last ended
(:func:`receive`); the store keeps the pieces of a file until it is whole, then checks its
SHA-256 against the declaration and keeps it as the workspace's blob. When the last file is
kept, the version is checked and made ``ready`` (:func:`finish_if_whole`).

A declaration comes in one of two forms. A small one may be one JSON body
(:func:`start_upload`, up to ``DECLARATION_BYTES``: about 400,000 files). Any, up to
``TAU_DATA_MAX_FILES``, may be streamed as JSON lines (:func:`start_streamed_upload`): a first
line with the declaration's own fields, then a line per file, sorted by path. The streamed
form is read and checked a line at a time, never whole: each file is checked as the manifest
checks it (:class:`tau.manifest.StreamedManifest`, which also takes the manifest's digest as
the lines come, the same digest the JSON form gives the same files), counted against the
first line's ``files_count`` (so a million and one files are refused at the count, before any
is recorded), and written to a spool file on disk. Only once the whole body has been read and
found good does the database see it (:func:`_declare`): in one transaction that holds the
asset, the rows are inserted a batch at a time from the spool, the files held already are
marked sent, and the storage quota is checked with them counted — a refusal anywhere, or a
client that stops sending, leaves nothing, and a slow client holds no transaction open.

Interrupted anywhere — the client killed, the connection lost, the portal restarted — nothing
is ``ready`` that is not whole, and nothing sent is sent again: declaring the same manifest, in
either form, finds the same ``ingesting`` version (by the manifest's digest, known before the
transaction starts, so finding it inserts nothing), and each file says how many bytes it holds
(``received``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Sum
from django.db.models.functions import Collate
from django.utils import timezone

from catalog import storage
from catalog.ingest import (
    PROGRESS_SECONDS,
    CatalogError,
    check_storage_quota,
    create_version,
    fail,
    lock_asset,
    mark_ready,
    storage_used,
)
from catalog.models import Asset, AssetFile, AssetVersion
from tau.manifest import (
    CHUNK_BYTES,
    MAX_FILES,
    Entry,
    Manifest,
    ManifestError,
    StreamedManifest,
    entry_from_dict,
    hash_file,
)

#: The largest declaration of an upload's files as one JSON body (about 400,000 files of
#: paths of usual lengths): it is parsed whole, in memory. Larger ones are streamed.
DECLARATION_BYTES = 64 * 2**20
#: The media type of a streamed declaration: JSON lines.
STREAMED_DECLARATION = "application/x-ndjson"
#: The longest line of a streamed declaration: a path of 1,024 characters, each written as
#: JSON may write it (``\uXXXX\uXXXX`` for one outside the Basic Multilingual Plane), with
#: its size and SHA-256.
DECLARATION_LINE_BYTES = 16 * 1024
#: What a streamed declaration may take per file, on average: a path of up to about 900
#: bytes. With ``TAU_DATA_MAX_FILES``, its whole body's limit (:func:`declaration_limit`).
DECLARATION_BYTES_PER_FILE = 1024
#: Files recorded per INSERT.
INSERT_BATCH = 5000
#: How many store lookups (an S3 HEAD each) go at once while held files are found.
LOOKUPS_AT_ONCE = 8


def declaration_limit() -> int:
    """The largest body a declaration may send: a streamed one of ``TAU_DATA_MAX_FILES``
    files (``DECLARATION_BYTES_PER_FILE`` each on average, and the first line). A JSON body
    has its own, smaller limit, ``DECLARATION_BYTES``."""
    files = int(settings.TAU_DATA_MAX_FILES)
    return max(DECLARATION_BYTES, (files + 1) * DECLARATION_BYTES_PER_FILE)


class NotDeclared(CatalogError):
    """A file the version's declaration does not hold."""


class NotReceiving(CatalogError):
    """The version takes no more bytes (ready, failed, or not an upload)."""


class OutOfOrder(CatalogError):
    """A piece that does not start where the file's bytes so far end."""

    def __init__(self, message: str, received: int) -> None:
        super().__init__(message)
        self.received = received


class TooLarge(CatalogError):
    """A piece larger than one request may carry."""


@dataclass(frozen=True)
class Received:
    """What one piece did: the file's row after it, and whether the bytes did not match the
    declared SHA-256 (the file was dropped, to be sent again from its first byte)."""

    file: AssetFile
    mismatch: str = ""


def start_upload(asset: Asset, files: Any, *, user: Any = None) -> tuple[AssetVersion, bool]:
    """The ``ingesting`` version for the declared ``files`` (``[{path, size, sha256}]``): a new
    one, or the one an interrupted upload of the same files left (``created`` False)."""
    try:
        manifest = Manifest.from_dict(
            {"format": 1, "files": files}, max_files=settings.TAU_DATA_MAX_FILES
        )
    except ManifestError as exc:
        raise CatalogError(str(exc)) from exc
    if not manifest.files:
        raise CatalogError("An upload declares at least one file.")
    for entry in manifest.files:
        _check_size(entry, int(settings.TAU_DATA_MAX_FILE_BYTES))
    return _declare(
        asset,
        digest=manifest.digest,
        files_count=manifest.files_count,
        total_bytes=manifest.total_bytes,
        entries=manifest.files,
        user=user,
    )


def read_declaration_header(stream: IO[bytes]) -> dict[str, Any]:
    """The first line of a streamed declaration: a JSON object (its fields are checked by
    :func:`start_streamed_upload`)."""
    line = stream.readline(DECLARATION_LINE_BYTES + 1)
    if len(line) > DECLARATION_LINE_BYTES:
        raise CatalogError(f"Line 1 is longer than {DECLARATION_LINE_BYTES:,} bytes.")
    try:
        header = json.loads(line)
    except ValueError:
        header = None
    if not isinstance(header, dict):
        raise CatalogError(
            'Line 1 is a JSON object, {"source": "upload", "files_count": N}, then a line per file.'
        )
    return header


def declaration_lines(stream: IO[bytes]) -> Iterator[bytes]:
    """The lines after the first of a streamed declaration, read one at a time; blank lines
    are skipped."""
    number = 1
    while line := stream.readline(DECLARATION_LINE_BYTES + 1):
        number += 1
        if len(line) > DECLARATION_LINE_BYTES and not line.endswith(b"\n"):
            raise CatalogError(f"Line {number:,} is longer than {DECLARATION_LINE_BYTES:,} bytes.")
        if line.strip():
            yield line


def start_streamed_upload(
    asset: Asset, header: Mapping[str, Any], lines: Iterable[bytes], *, user: Any = None
) -> tuple[AssetVersion, bool]:
    """As :func:`start_upload`, for a declaration streamed as JSON lines: ``header`` is its
    first line (``{"source": "upload", "files_count": N}``), ``lines`` the rest, one file
    each (``{"path", "size", "sha256"}``), sorted by path. Read once, a line at a time; held
    on disk, not in memory, until it has all been checked (the module's docstring)."""
    if header.get("source") != "upload":
        raise CatalogError("Line 1's source is \"upload\": only an upload's files are streamed.")
    unknown = set(header) - {"source", "files_count"}
    if unknown:
        raise CatalogError(
            f"Line 1 holds {', '.join(sorted(map(repr, unknown)))}: it has only 'source' and "
            "'files_count'."
        )
    most = int(settings.TAU_DATA_MAX_FILES)
    declared = header.get("files_count")
    if type(declared) is not int or declared < 1:
        raise CatalogError("Line 1's files_count is the number of files that follow, 1 or more.")
    if declared > most:
        raise CatalogError(
            f"{declared:,} files: a version holds at most {most:,} (TAU_DATA_MAX_FILES)."
        )
    streamed = StreamedManifest(max_files=most)
    largest = int(settings.TAU_DATA_MAX_FILE_BYTES)
    # The spool holds each checked file as ``<sha256> <size> <path>``: a path holds no line
    # break (check_path), and this reads back faster than JSON.
    with tempfile.TemporaryFile("w+", encoding="utf-8", prefix="tau-declaration-") as spool:
        for number, line in enumerate(lines, start=2):
            if streamed.files_count == declared:
                raise CatalogError(
                    f"Line {number:,}: more files than the {declared:,} line 1 declares."
                )
            try:
                item = json.loads(line.decode())
            except ValueError:  # and UnicodeDecodeError
                raise CatalogError(f"Line {number:,}: not JSON in UTF-8.") from None
            try:
                entry = entry_from_dict(item)
                streamed.add(entry)
                _check_size(entry, largest)
            except (ManifestError, CatalogError) as exc:
                raise CatalogError(f"Line {number:,}: {exc}") from exc
            spool.write(f"{entry.sha256} {entry.size} {entry.path}\n")
        if streamed.files_count != declared:
            raise CatalogError(
                f"Line 1 declares {declared:,} files; {streamed.files_count:,} followed. Send "
                "them all."
            )
        spool.seek(0)
        return _declare(
            asset,
            digest=streamed.digest,
            files_count=streamed.files_count,
            total_bytes=streamed.total_bytes,
            entries=(_spooled(line) for line in spool),
            user=user,
        )


def _spooled(line: str) -> Entry:
    sha256, size, path = line[:-1].split(" ", 2)
    return Entry(path, int(size), sha256)


def _check_size(entry: Entry, limit: int) -> None:
    if entry.size > limit:
        raise CatalogError(
            f"{entry.path} is {entry.size:,} bytes; one file may be at most {limit:,} "
            "(TAU_DATA_MAX_FILE_BYTES)."
        )


def _declare(
    asset: Asset,
    *,
    digest: str,
    files_count: int,
    total_bytes: int,
    entries: Iterable[Entry],
    user: Any,
) -> tuple[AssetVersion, bool]:
    """The version for a checked declaration: the unfinished upload of the same manifest, or
    a new one with its files recorded from ``entries`` (read once, a batch at a time), those
    the store holds marked sent, within the storage quota — or nothing (CatalogError)."""
    workspace = asset.workspace
    with transaction.atomic():
        lock_asset(asset)
        waiting = (
            AssetVersion.objects.for_workspace(workspace.pk)
            .filter(
                asset=asset,
                state=AssetVersion.State.INGESTING,
                source=AssetVersion.Source.UPLOAD,
                declared_digest=digest,
            )
            .first()
        )
        if waiting is not None:
            return waiting, False
        counted = workspace.storage_quota_bytes is not None
        used = storage_used(workspace.pk) if counted else 0
        version = create_version(
            asset,
            source=AssetVersion.Source.UPLOAD,
            source_detail=f"{files_count:,} files uploaded",
            created_by=user,
            declared_digest=digest,
            bytes_total=total_bytes,
            bytes_done=0,
        )
        _insert_files(version, entries)
        version.bytes_done = _mark_held(version)
        version.save(update_fields=["bytes_done"])
        if counted:
            # Counted with this version's files in: what they add is what the quota's own
            # measure grows by (each SHA-256 once, whatever else holds it).
            adding = storage_used(workspace.pk) - used
            check_storage_quota(workspace, adding, what="This upload", used=used)
    finish_if_whole(version)
    return version, True


def _insert_files(version: AssetVersion, entries: Iterable[Entry]) -> None:
    """The version's rows, one per entry, none sent yet. On PostgreSQL with ``COPY``: a
    million rows in seconds, where the ORM's INSERTs (a model instance a row, its values
    prepared one by one) take minutes; elsewhere (SQLite, ``make run``'s default) in batches."""
    if connection.vendor == "postgresql":
        quote = connection.ops.quote_name
        fields = ("version", "path", "size", "sha256", "stored", "received")
        columns = [getattr(AssetFile._meta.get_field(name), "column", name) for name in fields]
        named = ", ".join(quote(str(column)) for column in columns)
        table = quote(AssetFile._meta.db_table)
        with (
            connection.cursor() as cursor,
            cursor.copy(f"COPY {table} ({named}) FROM STDIN") as copy,
        ):
            for entry in entries:
                copy.write_row((version.pk, entry.path, entry.size, entry.sha256, False, 0))
        return
    rows = (
        AssetFile(
            version=version,
            path=entry.path,
            size=entry.size,
            sha256=entry.sha256,
            stored=False,
            received=0,
        )
        for entry in entries
    )
    while batch := list(itertools.islice(rows, INSERT_BATCH)):
        AssetFile.objects.bulk_create(batch)


def _mark_held(version: AssetVersion) -> int:
    """Mark sent the files of the new ``version`` whose bytes the workspace's store holds
    whole already; the bytes they make up.

    Only a SHA-256 that another file of the workspace lists as stored can be in the store:
    those are marked in one statement, however many files, then each is looked up in the
    store (several at a time), and the few the store lacks after all are unmarked. The
    statement joins the version's rows, just inserted and not yet in the planner's
    statistics, to the workspace's: PostgreSQL, taking them for a handful, would compare
    every pair (a nested loop, minutes for 50,000 files), so it is told to hash them."""
    workspace_id = version.asset.workspace_id
    files = AssetFile.objects.for_workspace(workspace_id)
    mine = files.filter(version=version)
    stored_elsewhere = files.filter(stored=True).exclude(version=version).values("sha256")
    with _no_nested_loops():
        mine.filter(sha256__in=stored_elsewhere).update(stored=True, received=F("size"))
    candidates = mine.filter(stored=True).order_by().values_list("sha256", "size").distinct()

    with tempfile.TemporaryFile("w+", prefix="tau-lacking-") as spool:
        found = iter(candidates.iterator(chunk_size=INSERT_BATCH))
        with ThreadPoolExecutor(LOOKUPS_AT_ONCE) as pool:
            while batch := list(itertools.islice(found, INSERT_BATCH)):
                held = _in_store(pool, workspace_id, batch)
                spool.writelines(
                    f"{sha256}\n"
                    for (sha256, _), whole in zip(batch, held, strict=True)
                    if not whole
                )
        spool.seek(0)
        shas = (line.strip() for line in spool)
        while some := list(itertools.islice(shas, INSERT_BATCH)):
            mine.filter(sha256__in=some).update(stored=False, received=0)
    return int(mine.filter(stored=True).aggregate(total=Sum("size"))["total"] or 0)


@contextlib.contextmanager
def _no_nested_loops() -> Iterator[None]:
    """PostgreSQL plans the statements inside with hash or merge joins (this transaction
    only); other databases as they like.

    Without JIT compilation too: a nested loop the plan still needs (the tiny join of a
    version to its asset) is not removed but costed 10^10 higher, which puts the statement far
    above ``jit_above_cost``; PostgreSQL then compiled it with LLVM, inlined and optimised, on
    every declaration: half a second, where the statement itself takes milliseconds."""
    if connection.vendor != "postgresql":
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('enable_nestloop'), current_setting('jit')")
        was = cursor.fetchone()
        cursor.execute(
            "SELECT set_config('enable_nestloop', 'off', true), set_config('jit', 'off', true)"
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT set_config('enable_nestloop', %s, true), set_config('jit', %s, true)",
                list(was),
            )


def receive(
    version: AssetVersion,
    path: str,
    body: BinaryIO,
    *,
    length: int,
    start: int = 0,
    total: int | None = None,
) -> Received:
    """Write ``length`` bytes read from ``body`` into the declared file ``path`` from byte
    ``start`` (``total``: the file's whole size, as the client knows it)."""
    if (
        version.source != AssetVersion.Source.UPLOAD
        or version.state != AssetVersion.State.INGESTING
    ):
        raise NotReceiving(
            f"{version.ref} is {version.state}: it takes no more files. Declare the files "
            "again to start a new version."
        )
    workspace_id = version.asset.workspace_id
    files = AssetFile.objects.for_workspace(workspace_id).filter(version=version)
    if not files.filter(path=path).exists():
        raise NotDeclared(f"{version.ref} declared no file {path!r}.")
    if length > settings.TAU_DATA_UPLOAD_PIECE_BYTES:
        raise TooLarge(
            f"A piece of {length:,} bytes: send at most {settings.TAU_DATA_UPLOAD_PIECE_BYTES:,} "
            "per request (TAU_DATA_UPLOAD_PIECE_BYTES)."
        )
    with transaction.atomic():
        row = files.select_for_update().get(path=path)
        if total is not None and total != row.size:
            raise CatalogError(f"{path} was declared as {row.size:,} bytes, not {total:,}.")
        if row.stored:
            return Received(row)
        part = storage.upload_part(workspace_id, version.pk, row.pk)
        if row.received < row.size or row.size == 0:
            if start != row.received:
                raise OutOfOrder(
                    f"{path}: the portal holds its first {row.received:,} bytes; send the "
                    f"piece that starts there, not at {start:,}.",
                    row.received,
                )
            if start + length > row.size:
                raise CatalogError(
                    f"{path}: a piece of {length:,} bytes from {start:,} ends past its "
                    f"declared size, {row.size:,} bytes."
                )
            written = _write_piece(part, body, start, length)
            row.received = start + written
            row.save(update_fields=["received"])
            AssetVersion.objects.for_workspace(workspace_id).filter(pk=version.pk).update(
                bytes_done=F("bytes_done") + written, touched_at=timezone.now()
            )
        # Else every byte is here and the file was not kept yet (a request that stopped
        # between the two steps): this one keeps it, whatever it sent.
    if row.received != row.size:
        return Received(row)
    # Whole: hashed and kept outside the row's lock (an S3 store's PUT of the whole file
    # takes a while); only then marked stored, in a second short step.
    return _keep(version, row, part)


def _keep(version: AssetVersion, row: AssetFile, part: Path) -> Received:
    """The whole part checked against its declared SHA-256 and kept in the store (then the
    version finished if it was the last), or dropped, saying so."""
    workspace_id = version.asset.workspace_id
    files = AssetFile.objects.for_workspace(workspace_id).filter(pk=row.pk)
    try:
        size, sha256 = hash_file(part, name=row.path)
    except FileNotFoundError:
        # Another request kept (or dropped) it meanwhile: answer what it left.
        row.refresh_from_db()
        return Received(row)
    if (size, sha256) == (row.size, row.sha256):
        storage.keep_part(workspace_id, part, sha256, size)
        files.filter(stored=False).update(stored=True)
        row.stored = True
        finish_if_whole(version)
        return Received(row)
    part.unlink(missing_ok=True)
    with transaction.atomic():
        if files.filter(stored=False, received=row.size).update(received=0):
            AssetVersion.objects.for_workspace(workspace_id).filter(pk=version.pk).update(
                bytes_done=F("bytes_done") - row.size, touched_at=timezone.now()
            )
    row.received = 0
    return Received(
        row,
        f"{row.path}: the bytes sent do not match its declared SHA-256 ({sha256} instead of "
        f"{row.sha256}); nothing of it is kept. Send it again from its first byte.",
    )


def _write_piece(part: Path, body: BinaryIO, start: int, length: int) -> int:
    """Bytes from ``body`` written into ``part`` from ``start`` (what was there past it, from
    a piece cut short before it was counted, dropped first); how many arrived."""
    part.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(part, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    written = 0
    with os.fdopen(descriptor, "wb") as file:
        file.truncate(start)
        file.seek(start)
        while written < length:
            chunk = body.read(min(CHUNK_BYTES, length - written))
            if not chunk:
                break
            file.write(chunk)
            written += len(chunk)
        file.flush()
        os.fsync(file.fileno())
    return written


def finish_if_whole(version: AssetVersion) -> None:
    """Once every declared file is kept: ``verifying``, each checked in the store, ``ready``
    (or ``failed`` naming the file). Called after every kept file; one caller does it.

    Whether every file is kept is asked of the version's counters first: until every byte
    has arrived (``bytes_done``), some file is not whole, and the rows need not be looked
    through — a million kept files would otherwise each scan the version's rows. The check
    reads the rows in path order, a batch at a time, taking the manifest's digest as they
    come (what the declaration promised) and looking each file up in the store, several at
    a time; it says it is alive (``touched_at``) as it goes, so that the sweep does not take
    a long one for dead."""
    workspace_id = version.asset.workspace_id
    files = AssetFile.objects.for_workspace(workspace_id).filter(version=version)
    with transaction.atomic():
        locked = (
            AssetVersion.objects.for_workspace(workspace_id).select_for_update().get(pk=version.pk)
        )
        if (
            locked.state != AssetVersion.State.INGESTING
            or locked.bytes_done < locked.bytes_total
            or files.filter(stored=False).exists()
        ):
            return
        locked.state = AssetVersion.State.VERIFYING
        locked.touched_at = timezone.now()
        locked.save(update_fields=["state", "touched_at"])
    version.state = AssetVersion.State.VERIFYING
    try:
        kept = _kept_manifest(version, files)
        if kept.digest != version.declared_digest:
            raise ManifestError("the files kept are not the files declared; upload them again.")
        mark_ready(
            version,
            digest=kept.digest,
            files_count=kept.files_count,
            total_bytes=kept.total_bytes,
        )
    except ManifestError as exc:
        fail(version, str(exc))
    storage.drop_uploads(workspace_id, version.pk)


def _kept_manifest(version: AssetVersion, files: Any) -> StreamedManifest:
    """The manifest of the version's rows, each file's blob found whole in the store
    (ManifestError naming the first, by path, that is not)."""
    workspace_id = version.asset.workspace_id
    # By code point, as the digest wants: PostgreSQL's own collation may sort otherwise;
    # SQLite's compares the UTF-8 bytes, which is the same order.
    by_path = Collate("path", "C") if connection.vendor == "postgresql" else "path"
    rows = iter(
        files.order_by(by_path)
        .values_list("path", "size", "sha256")
        .iterator(chunk_size=INSERT_BATCH)
    )
    kept = StreamedManifest(max_files=max(int(settings.TAU_DATA_MAX_FILES), MAX_FILES))
    said_at = time.monotonic()
    with ThreadPoolExecutor(LOOKUPS_AT_ONCE) as pool:
        while batch := [Entry(*row) for row in itertools.islice(rows, INSERT_BATCH)]:
            held = _in_store(pool, workspace_id, [(e.sha256, e.size) for e in batch])
            for entry, whole in zip(batch, held, strict=True):
                if not whole:
                    raise ManifestError(f"{entry.path}: its stored copy is missing or incomplete.")
                kept.add(entry)
            if time.monotonic() - said_at >= PROGRESS_SECONDS:
                said_at = time.monotonic()
                AssetVersion.objects.for_workspace(workspace_id).filter(pk=version.pk).update(
                    touched_at=timezone.now()
                )
    return kept


def _in_store(
    pool: ThreadPoolExecutor, workspace_id: int, blobs: list[tuple[str, int]]
) -> list[bool]:
    """Whether the store holds each ``(sha256, size)`` whole, asked in slices on ``pool``."""
    share = -(-len(blobs) // LOOKUPS_AT_ONCE) or 1

    def look(some: list[tuple[str, int]]) -> list[bool]:
        return [storage.has_blob(workspace_id, sha256, size) for sha256, size in some]

    slices = [blobs[first : first + share] for first in range(0, len(blobs), share)]
    return [whole for found in pool.map(look, slices) for whole in found]
