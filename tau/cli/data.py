"""``tau data``: a workspace's datasets and models (issue 33; docs/cli.md).

``tau data dataset ingest NAME FOLDER`` reads the folder once (SHA-256 of every file, kept in
``$XDG_CACHE_HOME/taugrid/ingest/`` so a scan cut short goes on where it stopped), declares
the files to the portal, then sends what the portal does not hold yet in pieces. Killed at
any point, the same command goes on: the portal answers the unfinished version and how many
bytes of each file it has, and nothing already sent is sent again. The version is ``ready``
only once the portal has every byte and has checked it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO
from urllib.parse import quote

import click
import httpx
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table

from tau.cli.client import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Api, CliError, problem_text
from tau.cli.common import err, json_option, out, print_json, state_of, workspace_option
from tau.manifest import (
    CHUNK_BYTES,
    MAX_FILES,
    Entry,
    Known,
    Manifest,
    ManifestError,
    StreamedManifest,
    count_files,
    read_listed,
    walk_files,
)
from tau.manifest import verify as verify_folder

#: Bytes sent per request (the portal accepts up to TAU_DATA_UPLOAD_PIECE_BYTES, 64 MiB).
PIECE_BYTES = 8 * 2**20
#: How often the scan's cache of file digests is written while a folder is read.
CACHE_SECONDS = 2.0
#: How often the progress bar's words (files so far) change while a folder is read.
SAY_SECONDS = 0.2
#: How long the portal may take to answer a declaration (a million files: about a minute).
DECLARATION_SECONDS = 1800.0
#: The media type of a streamed declaration (catalog.uploads).
STREAMED = "application/x-ndjson"
#: Files the portal lists per page of those it still lacks.
MISSING_PAGE = 1000


def asset_path(workspace: str, kind: str, name: str | None = None) -> str:
    path = f"/api/v1/workspaces/{quote(workspace, safe='')}/{kind}s/"
    return path if name is None else f"{path}{quote(name, safe='')}/"


def version_path(workspace: str, kind: str, name: str, version: str) -> str:
    return f"{asset_path(workspace, kind, name)}versions/{quote(version, safe='')}/"


def split_ref(text: str) -> tuple[str, str | None]:
    """``wiki@3`` → ``("wiki", "3")``; ``wiki`` → ``("wiki", None)``."""
    name, _, version = text.partition("@")
    if not name:
        raise CliError(f"{text!r}: name a dataset or model, as NAME or NAME@VERSION.", EXIT_USAGE)
    return name, version or None


def _bar(quiet: bool) -> Progress:
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=err,
        disable=quiet or not err.is_terminal,
        transient=True,
    )


def _size(count: int) -> str:
    value = float(count)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{count:,} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count:,} bytes"


# --- reading a folder ------------------------------------------------------------------------


def _cache_file(folder: Path) -> Path:
    """Where the digests of the files of ``folder`` are kept between scans: JSON lines,
    ``[path, size, mtime_ns, sha256]``, sorted by path."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    key = hashlib.sha256(str(folder.resolve()).encode("utf-8", "surrogateescape")).hexdigest()
    return Path(base) / "taugrid" / "ingest" / f"{key[:32]}.jsonl"


def _cached(path: Path) -> Generator[tuple[str, Known]]:
    """The digests kept in ``path``, in its order (nothing, or the lines before a damaged
    one: the cache is only a speed-up)."""
    try:
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                name, size, mtime_ns, sha256 = json.loads(line)
                yield str(name), Known(int(size), int(mtime_ns), str(sha256))
    except (OSError, ValueError, TypeError):
        return


class _KnownInOrder:
    """An earlier scan's digests, read alongside a walk of the folder: both go in path
    order, so the cache of a folder of a million files is read, never held."""

    def __init__(self, path: Path) -> None:
        self.rows = _cached(path)
        self.row = next(self.rows, None)

    def get(self, path: str) -> Known | None:
        while self.row is not None and self.row[0] < path:
            self.row = next(self.rows, None)
        if self.row is not None and self.row[0] == path:
            return self.row[1]
        return None

    def close(self) -> None:
        self.rows.close()


def _fold_cache(folder: Path) -> None:
    """The digests a scan cut short wrote (``.part``) merged into the cache, newest first:
    the next scan reuses both."""
    cache, part = _cache_file(folder), _cache_file(folder).with_suffix(".part")
    if not part.exists():
        return
    try:
        merged = cache.with_suffix(".merging")
        with merged.open("w", encoding="utf-8") as out_file:
            older, newer = _cached(cache), _cached(part)
            old, new = next(older, None), next(newer, None)
            while old is not None or new is not None:
                if new is None or (old is not None and old[0] < new[0]):
                    row, old = old, next(older, None)
                else:
                    if old is not None and old[0] == new[0]:
                        old = next(older, None)
                    row, new = new, next(newer, None)
                assert row is not None
                out_file.write(_cache_line(row[0], row[1]))
        merged.replace(cache)
        part.unlink()
    except OSError:
        pass  # only a speed-up for the next scan


def _cache_line(path: str, known: Known) -> str:
    return json.dumps([path, known.size, known.mtime_ns, known.sha256], ensure_ascii=False) + "\n"


@dataclass
class FolderDeclaration:
    """A folder's files, declared as the portal takes a streamed declaration: the line per
    file (sorted by path) in ``lines``, a temporary file; the count, bytes and digest."""

    lines: BinaryIO
    files_count: int
    total_bytes: int
    digest: str

    def body(self) -> tuple[int, Iterator[bytes]]:
        """The request's length and its bytes: the first line, then the files'."""
        first = json.dumps({"source": "upload", "files_count": self.files_count}).encode()
        length = len(first) + 1 + os.fstat(self.lines.fileno()).st_size

        def chunks() -> Iterator[bytes]:
            yield first + b"\n"
            self.lines.seek(0)
            while chunk := self.lines.read(CHUNK_BYTES):
                yield chunk

        return length, chunks()


def read_folder(folder: Path, lines: BinaryIO, *, quiet: bool) -> FolderDeclaration:
    """The folder's declaration, written to ``lines``: listed once (the count and the bytes;
    the limit on files checked before any file is read), then read in path order, each
    file's SHA-256 reused from an earlier scan while its size and modification time are the
    same. Nothing grows with the number of files but the temporary file, and the cache's
    next version, written as the digests come (so that a scan cut short goes on)."""
    name = folder.name or str(folder)
    _fold_cache(folder)
    cache = _cache_file(folder)
    part = cache.with_suffix(".part")
    with _bar(quiet) as bar:
        task = bar.add_task(f"Listing {name}", total=None)
        said = _Said()
        files_count = total = 0
        try:
            for size in count_files(folder):
                files_count += 1
                total += size
                if files_count > MAX_FILES:
                    raise ManifestError(
                        f"{folder} holds more than {MAX_FILES:,} files, the most allowed."
                    )
                if said.due():
                    bar.update(task, description=f"Listing {name}: {files_count:,} files")
        except ManifestError as exc:
            raise CliError(f"{folder}: {exc}", EXIT_USAGE) from None
        bar.update(task, description=f"Reading {name}", total=total, completed=0)
        streamed = StreamedManifest()
        done = 0

        def tell(count: int) -> None:
            nonlocal done
            done += count
            if said.due():
                bar.update(
                    task,
                    completed=done,
                    description=f"Reading {name}: {streamed.files_count:,} of "
                    f"{files_count:,} files",
                )

        known = _KnownInOrder(cache)
        kept = _CacheWriter(part)
        try:
            for item in walk_files(folder):
                earlier = known.get(item.path)
                if earlier is not None and (earlier.size, earlier.mtime_ns) == (
                    item.size,
                    item.mtime_ns,
                ):
                    entry = Entry(item.path, item.size, earlier.sha256)
                    tell(item.size)
                else:
                    entry = read_listed(item, tell)
                lines.write(streamed.add(entry) + b"\n")
                kept.add(entry, item.mtime_ns)
        except ManifestError as exc:
            kept.close()
            _fold_cache(folder)  # what was read is not read again
            raise CliError(f"{folder}: {exc}", EXIT_USAGE) from None
        except BaseException:
            kept.close()
            _fold_cache(folder)
            raise
        finally:
            known.close()
        if kept.close():
            part.replace(cache)  # exactly the folder as it is now
    lines.flush()
    return FolderDeclaration(lines, streamed.files_count, streamed.total_bytes, streamed.digest)


class _Said:
    """Whether it is time to say how far a long task got (a million small files: not a
    million redraws of the bar)."""

    def __init__(self) -> None:
        self.at = time.monotonic()

    def due(self) -> bool:
        now = time.monotonic()
        if now - self.at < SAY_SECONDS:
            return False
        self.at = now
        return True


class _CacheWriter:
    """The digests of a scan, written to the cache's ``.part`` as they are found, flushed
    every CACHE_SECONDS (a scan killed loses at most those); none if it cannot be written."""

    def __init__(self, part: Path) -> None:
        self.written_at = time.monotonic()
        try:
            part.parent.mkdir(parents=True, exist_ok=True)
            self.file: IO[str] | None = part.open("w", encoding="utf-8")
        except OSError:
            self.file = None  # no cache: every scan reads every file

    def add(self, entry: Entry, mtime_ns: int) -> None:
        if self.file is None:
            return
        try:
            self.file.write(_cache_line(entry.path, Known(entry.size, mtime_ns, entry.sha256)))
            if time.monotonic() - self.written_at >= CACHE_SECONDS:
                self.written_at = time.monotonic()
                self.file.flush()
        except OSError:
            self.close()

    def close(self) -> bool:
        """Whether the cache was written whole."""
        if self.file is None:
            return False
        try:
            self.file.close()
        except OSError:
            return False
        finally:
            self.file = None
        return True


# --- sending an upload ---------------------------------------------------------------------


def _missing_files(api: Api, path: str) -> Iterator[dict[str, Any]]:
    """The files the portal still lacks, a page at a time: each page is asked from the
    first, since those sent drop out (an offset would skip files); a file sent whole that
    the portal still lacks is not sent again and again."""
    sent: set[str] = set()
    while True:
        rows = api.get(f"{path}files/", missing="true", limit=MISSING_PAGE).get("results", [])
        if not rows:
            return
        again = [row["path"] for row in rows if row["path"] in sent]
        if again:
            raise CliError(
                f"{again[0]} was sent whole, but the portal still lacks it; run the same "
                "command again."
            )
        sent = {row["path"] for row in rows}
        yield from rows


def _declare(
    api: Api, url: str, declaration: FolderDeclaration, *, timeout: float
) -> dict[str, Any]:
    """The version the portal makes of (or finds for) ``declaration``, streamed."""
    length, chunks = declaration.body()
    try:
        response = api.http.post(
            url,
            content=chunks,
            headers={"Content-Type": STREAMED, "Content-Length": str(length)},
            timeout=httpx.Timeout(timeout, connect=10.0),
        )
    except httpx.TimeoutException:
        raise CliError(
            f"the portal took more than {timeout:.0f} s to answer the declaration of "
            f"{declaration.files_count:,} files; run the same command again: it finds the "
            "version if the portal made it."
        ) from None
    except httpx.HTTPError as exc:
        raise CliError(f"declaring the files failed ({exc}); run the same command again.") from None
    if response.status_code == 413:
        raise CliError(
            f"the declaration of {declaration.files_count:,} files ({_size(length)}) was "
            f"refused as too large: {problem_text(_json(response)) or response.reason_phrase}. "
            "A proxy in front of the portal must take a body this large (docs/data.md).",
            EXIT_USAGE,
        )
    if response.status_code == 415:
        raise CliError(
            f"{api.url} does not take a streamed declaration ({STREAMED}): it is older than "
            "this tau. Upgrade the portal, or use the tau it serves."
        )
    api.check(response)
    started: dict[str, Any] = api.json_of(response)
    return started


def _send_file(
    api: Api,
    url: str,
    source: Path,
    entry: dict[str, Any],
    *,
    piece_bytes: int,
    on_bytes: Any,
) -> None:
    """Send ``source`` from where the portal's copy ends, piece by piece."""
    size = int(entry["size"])
    start = int(entry["received"])
    on_bytes(start)
    with source.open("rb") as file:
        while True:
            file.seek(start)
            piece = file.read(min(piece_bytes, size - start))
            headers = {"Content-Type": "application/octet-stream"}
            if size:
                headers["Content-Range"] = f"bytes {start}-{start + len(piece) - 1}/{size}"
            if size and not piece:
                raise CliError(
                    f"{entry['path']} is shorter than when it was read; run the command again."
                )
            try:
                response = api.http.put(url, content=piece, headers=headers)
            except httpx.HTTPError as exc:
                raise CliError(
                    f"sending {entry['path']} failed ({exc}); run the same command again to go "
                    "on from where it stopped."
                ) from None
            if response.status_code == 409 and "received" in _json(response):
                start = int(_json(response)["received"])  # another sender got further
                continue
            if response.status_code == 400 and _json(response).get("received") == 0:
                raise CliError(
                    f"{entry['path']} changed since it was read: {problem_text(_json(response))} "
                    "Run the command again once nothing writes to the folder."
                )
            api.check(response)
            answer = _json(response)
            on_bytes(int(answer["received"]) - start)
            start = int(answer["received"])
            if answer.get("stored") or start >= size:
                return


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def ingest(
    api: Api,
    workspace: str,
    kind: str,
    name: str,
    folder: Path,
    *,
    description: str,
    piece_bytes: int,
    quiet: bool,
) -> dict[str, Any]:
    """Declare the folder's files as the next version of ``name`` (made if new), send what
    the portal lacks, and answer the version as the portal has it at the end."""
    if not folder.is_dir():
        raise CliError(f"{folder} is not a folder.", EXIT_USAGE)
    with tempfile.TemporaryFile(prefix="tau-declaration-") as lines:
        declaration = read_folder(folder, lines, quiet=quiet)
        if not declaration.files_count:
            raise CliError(f"{folder} holds no file to keep.", EXIT_USAGE)
        created = not _exists(api, asset_path(workspace, kind, name))
        if created:
            api.request(
                "POST",
                asset_path(workspace, kind),
                json={"name": name, "description": description},
            )
            if not quiet:
                out.print(f"Made the {kind} {name} in {workspace}.", markup=False)
        started = _declare(
            api,
            f"{asset_path(workspace, kind, name)}versions/",
            declaration,
            timeout=DECLARATION_SECONDS,
        )
    ref = f"{name}@{started['number']}"
    path = version_path(workspace, kind, name, str(started["number"]))
    progress = started["progress"]
    if not quiet:
        if started.get("state") == "ingesting" and progress["bytes_done"] and not created:
            out.print(
                f"Going on with {ref}: {_size(progress['bytes_done'])} of "
                f"{_size(progress['bytes_total'])} are in the portal already.",
                markup=False,
            )
        elif started.get("state") == "ingesting":
            out.print(
                f"Sending {ref}: {declaration.files_count:,} files, "
                f"{_size(declaration.total_bytes)}.",
                markup=False,
            )
    if started["state"] == "ingesting":
        with _bar(quiet) as bar:
            task = bar.add_task(f"Sending {ref}", total=progress["bytes_total"])
            bar.update(task, completed=progress["bytes_done"])
            for entry in _missing_files(api, path):
                _send_file(
                    api,
                    f"{path}files/{quote(entry['path'], safe='/')}",
                    folder / entry["path"],
                    entry,
                    piece_bytes=piece_bytes,
                    on_bytes=lambda count: bar.advance(task, count),
                )
    final: dict[str, Any] = api.get(path)
    return final


#: How often ``ingest`` of a URL asks how the portal's download is going.
URL_POLL_SECONDS = 1.0


def ingest_url(
    api: Api,
    workspace: str,
    kind: str,
    name: str,
    url: str,
    *,
    path: str | None,
    description: str,
    quiet: bool,
    wait: bool = True,
) -> dict[str, Any]:
    """Have the portal download ``url`` as the next version of ``name`` (made if new); with
    ``wait``, follow its progress until it is ready or failed."""
    body: dict[str, Any] = {"source": "url", "url": url}
    if path:
        body["path"] = path
    return _made_by_the_portal(
        api, workspace, kind, name, body, "downloading", description, quiet=quiet, wait=wait
    )


def register_prefix(
    api: Api,
    workspace: str,
    kind: str,
    name: str,
    prefix: str,
    *,
    description: str,
    quiet: bool,
    wait: bool = True,
) -> dict[str, Any]:
    """Have the portal read the workspace's ``prefix`` as the next version of ``name``."""
    body = {"source": "prefix", "prefix": prefix}
    return _made_by_the_portal(
        api, workspace, kind, name, body, "reading", description, quiet=quiet, wait=wait
    )


def _made_by_the_portal(
    api: Api,
    workspace: str,
    kind: str,
    name: str,
    body: dict[str, Any],
    doing: str,
    description: str,
    *,
    quiet: bool,
    wait: bool,
) -> dict[str, Any]:
    """A version the portal makes itself from ``body``'s source (the asset made if new),
    followed with a progress bar until ready or failed when ``wait``."""
    if not _exists(api, asset_path(workspace, kind, name)):
        api.request(
            "POST", asset_path(workspace, kind), json={"name": name, "description": description}
        )
        if not quiet:
            out.print(f"Made the {kind} {name} in {workspace}.", markup=False)
    started = api.json_of(
        api.request("POST", f"{asset_path(workspace, kind, name)}versions/", json=body)
    )
    ref = f"{name}@{started['number']}"
    where = version_path(workspace, kind, name, str(started["number"]))
    found: dict[str, Any] = started
    if not quiet:
        out.print(f"The portal is {doing} {ref}.", markup=False)
    if not wait:
        return found
    with _bar(quiet) as bar:
        task = bar.add_task(f"{doing.capitalize()} {ref}", total=None)
        while found["state"] in ("ingesting", "verifying"):
            time.sleep(URL_POLL_SECONDS)
            found = api.get(where)
            progress = found["progress"]
            bar.update(
                task, completed=progress["bytes_done"], total=progress["bytes_total"] or None
            )
    return found


def _exists(api: Api, path: str) -> bool:
    response = api.http.get(path)
    if response.status_code == 404:
        return False
    api.check(response)
    return True


def _said_version(version: dict[str, Any]) -> str:
    state = version["state"]
    line = f"{version['ref']}: {state}, {version['files_count']:,} files, {_size(version['bytes'])}"
    if state in ("ingesting", "verifying"):
        progress = version["progress"]
        line = (
            f"{version['ref']}: {state}, {_size(progress['bytes_done'])} of "
            f"{_size(progress['bytes_total'])}"
        )
    if version.get("manifest_digest"):
        line += f"\n  manifest {version['manifest_digest']}"
    if version.get("aliases"):
        line += f"\n  aliases: {', '.join(version['aliases'])}"
    if version.get("in_place"):
        line += f"\n  in place at the prefix {version.get('prefix') or '.'} (checked on each read)"
    if version.get("derived_from"):
        line += f"\n  made from: {', '.join(version['derived_from'])}"
    if version.get("produced_by"):
        line += f"\n  made by the run {version['produced_by']}"
    if version.get("error"):
        line += f"\n  {version['error']}"
    return line


# --- downloading a version --------------------------------------------------------------


def pull(api: Api, url: str, target: Path, manifest: Manifest, *, quiet: bool) -> None:
    """The version's tar from ``url``, unpacked into ``target`` through a folder beside it;
    every member must be a file of ``manifest`` with its size and SHA-256."""
    expected = {entry.path: entry for entry in manifest.files}
    target = target.absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent))
    try:
        with api.http.stream("GET", url, headers={"Accept": "application/x-tar"}) as response:
            if response.status_code >= 400:
                response.read()
                api.check(response)
            with (
                _bar(quiet) as bar,
                tarfile.open(fileobj=ChunkStream(response.iter_bytes()), mode="r|") as archive,
            ):
                task = bar.add_task(f"Downloading {target.name}", total=manifest.total_bytes)
                seen: set[str] = set()
                for member in archive:
                    entry = expected.get(member.name)
                    if entry is None or not member.isfile() or member.name in seen:
                        raise CliError(
                            f"the download holds {member.name!r}, not a file of the version."
                        )
                    seen.add(member.name)
                    _write_member(archive, member, partial / entry.path, entry, bar, task)
                if seen != set(expected):
                    missing = sorted(set(expected) - seen)[0]
                    raise CliError(f"the download ended without {missing}; try again.")
        if target.exists():
            shutil.rmtree(target)
        partial.rename(target)
    except httpx.HTTPError as error:
        raise CliError(f"the download from {api.url} failed: {error}; try again.") from None
    except tarfile.TarError as error:
        raise CliError(f"the download is not a whole tar ({error}); try again.") from None
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _write_member(
    archive: tarfile.TarFile,
    member: tarfile.TarInfo,
    destination: Path,
    entry: Entry,
    bar: Progress,
    task: Any,
) -> None:
    source = archive.extractfile(member)
    if source is None:
        raise CliError(f"{member.name} is not a file in the download.")
    destination.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    with destination.open("xb") as file:
        while chunk := source.read(1024 * 1024):
            digest.update(chunk)
            file.write(chunk)
            size += len(chunk)
            bar.advance(task, len(chunk))
    if (size, digest.hexdigest()) != (entry.size, entry.sha256):
        raise CliError(
            f"{entry.path} arrived changed (its SHA-256 is not the manifest's); try again."
        )


class ChunkStream(io.RawIOBase):
    """A file object over an iterator of byte chunks: a response for tarfile's stream, or a
    request body made as it is read (the benchmark's and the tests' million-file
    declarations)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.left = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.left:
            try:
                self.left = next(self.chunks)
            except StopIteration:
                return 0
        count = min(len(buffer), len(self.left))
        buffer[:count] = self.left[:count]
        self.left = self.left[count:]
        return count


# --- commands -------------------------------------------------------------------------------


def _alias(
    ctx: click.Context,
    kind: str,
    action: str,
    name: str,
    alias: str,
    version: str | None,
    workspace: str | None,
    as_json: bool,
) -> int:
    """``action`` ``get``, ``set`` (to ``version``) or ``delete`` the alias of ``name``."""
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    api = state.api()
    path = f"{asset_path(ws, kind, name)}aliases/{quote(alias, safe='')}/"
    if action == "delete":
        api.delete(path)
        result: dict[str, Any] = {"alias": alias, "deleted": True}
        said = f"Removed {name}@{alias}."
    elif action == "get":
        found = api.get(version_path(ws, kind, name, alias))
        result = {"alias": alias, "version": found["number"]}
        said = f"{name}@{alias} is {found['ref']}."
    else:
        result = api.json_of(api.request("PUT", path, json={"version": version}))
        said = f"{name}@{alias} is now {name}@{result['version']}."
    if as_json:
        print_json(result)
    else:
        out.print(said, markup=False)
    return EXIT_OK


@click.group("data")
def data_group() -> None:
    """Datasets and models of a workspace: versions, aliases, uploads (docs/cli.md)."""


def _kind_group(kind: str) -> click.Group:
    @click.group(
        kind, help=f"A workspace's {kind}s: each a name with numbered, immutable versions."
    )
    def group() -> None:
        pass

    @group.command("list")
    @workspace_option
    @json_option
    @click.pass_context
    def list_command(ctx: click.Context, workspace: str | None, as_json: bool) -> int:
        """Every one of the workspace, with its newest ready version and aliases."""
        state = state_of(ctx)
        ws = state.workspace_for(workspace)
        rows = state.api().get(asset_path(ws, kind))
        if as_json:
            print_json(rows)
            return EXIT_OK
        if not rows:
            out.print(f"No {kind} in {ws} yet: `tau data {kind} ingest NAME FOLDER`.", markup=False)
            return EXIT_OK
        table = Table(title=f"{kind.capitalize()}s of {ws}", title_justify="left")
        for column in ("NAME", "LATEST", "VERSIONS", "ALIASES"):
            table.add_column(column)
        for row in rows:
            aliases = ", ".join(f"{alias}→{number}" for alias, number in row["aliases"].items())
            latest = "-" if row["latest"] is None else str(row["latest"])
            table.add_row(row["name"], latest, str(row["versions_count"]), aliases)
        out.print(table)
        return EXIT_OK

    @group.command("show")
    @click.argument("ref", metavar="NAME[@VERSION]")
    @workspace_option
    @json_option
    @click.pass_context
    def show_command(ctx: click.Context, ref: str, workspace: str | None, as_json: bool) -> int:
        """One version (NAME@3, NAME@train; NAME alone: every version)."""
        state = state_of(ctx)
        ws = state.workspace_for(workspace)
        name, version = split_ref(ref)
        api = state.api()
        if version is None:
            rows = api.get(f"{asset_path(ws, kind, name)}versions/")
            if as_json:
                print_json(rows)
            elif not rows:
                out.print(f"{name} has no version yet.", markup=False)
            for row in [] if as_json else rows:
                out.print(_said_version(row), markup=False)
            return EXIT_OK
        found = api.get(version_path(ws, kind, name, version))
        if as_json:
            print_json(found)
        else:
            out.print(_said_version(found), markup=False)
        return EXIT_OK

    @group.command("ingest")
    @click.argument("name")
    @click.argument("source", metavar="FOLDER|URL")
    @click.option("--description", default="", help=f"Said of the {kind} if it is new.")
    @click.option(
        "--path",
        "file_path",
        default=None,
        metavar="PATH",
        help="A URL's file: where it goes in the version (default: the URL's last segment); "
        "an s3:// prefix: the folder its objects go under.",
    )
    @click.option("--no-wait", is_flag=True, help="A URL: answer once the download is queued.")
    @click.option(
        "--piece-size",
        "piece_bytes",
        type=click.IntRange(min=65536, max=64 * 2**20),
        default=PIECE_BYTES,
        show_default=True,
        metavar="BYTES",
        help="Bytes sent per request.",
    )
    @workspace_option
    @json_option
    @click.pass_context
    def ingest_command(
        ctx: click.Context,
        name: str,
        source: str,
        description: str,
        file_path: str | None,
        no_wait: bool,
        piece_bytes: int,
        workspace: str | None,
        as_json: bool,
    ) -> int:
        """Upload FOLDER, or have the portal download URL, as the next version of NAME
        (made if new).

        A folder: every file is read once for its SHA-256, declared, then sent in pieces;
        files the workspace holds already are not sent. Interrupted, the same command goes on
        where it stopped. A URL (http or https) names one file, which the portal fetches
        itself; s3://bucket/key is one object and s3://bucket/prefix/ every object under it,
        read by the portal from the S3 service it is set up for, in the buckets the platform
        team lets workspaces read. Exit 0 once the version is ready; 1 if the portal found it
        failed."""
        state = state_of(ctx)
        ws = state.workspace_for(workspace)
        if source.startswith(("https://", "http://", "s3://")):
            version = ingest_url(
                state.api(),
                ws,
                kind,
                name,
                source,
                path=file_path,
                description=description,
                quiet=as_json,
                wait=not no_wait,
            )
            if no_wait and version["state"] == "ingesting":
                if as_json:
                    print_json(version)
                else:
                    out.print(_said_version(version), markup=False)
                return EXIT_OK
        else:
            folder = Path(source)
            if not folder.is_dir():
                raise CliError(
                    f"{source} is neither a folder nor an http(s) or s3:// URL.", EXIT_USAGE
                )
            if file_path is not None or no_wait:
                raise CliError("--path and --no-wait are for a URL.", EXIT_USAGE)
            version = ingest(
                state.api(),
                ws,
                kind,
                name,
                folder,
                description=description,
                piece_bytes=piece_bytes,
                quiet=as_json,
            )
        if as_json:
            print_json(version)
        else:
            out.print(_said_version(version), markup=False)
        return EXIT_OK if version["state"] == "ready" else EXIT_FAILED

    @group.command("register")
    @click.argument("name")
    @click.argument("prefix")
    @click.option("--description", default="", help=f"Said of the {kind} if it is new.")
    @click.option("--no-wait", is_flag=True, help="Answer once the portal has it queued.")
    @workspace_option
    @json_option
    @click.pass_context
    def register_command(
        ctx: click.Context,
        name: str,
        prefix: str,
        description: str,
        no_wait: bool,
        workspace: str | None,
        as_json: bool,
    ) -> int:
        """Register PREFIX, a folder of the workspace's own on the portal (its data volume,
        mounted by the platform team), as the next version of NAME (made if new).

        The portal reads and checks every file under it and keeps them; '.' is all of the
        workspace's folder. Exit 0 once ready; 1 if the portal found it failed."""
        state = state_of(ctx)
        ws = state.workspace_for(workspace)
        version = register_prefix(
            state.api(),
            ws,
            kind,
            name,
            "" if prefix == "." else prefix,
            description=description,
            quiet=as_json,
            wait=not no_wait,
        )
        if as_json:
            print_json(version)
        else:
            out.print(_said_version(version), markup=False)
        if version["state"] in ("ingesting", "verifying"):
            return EXIT_OK
        return EXIT_OK if version["state"] == "ready" else EXIT_FAILED

    @group.command("status")
    @click.argument("ref", metavar="NAME@VERSION")
    @workspace_option
    @json_option
    @click.pass_context
    def status_command(ctx: click.Context, ref: str, workspace: str | None, as_json: bool) -> int:
        """A version's state and progress (exit 0 ready, 1 failed, 5 still on its way)."""
        state = state_of(ctx)
        ws = state.workspace_for(workspace)
        name, version = split_ref(ref)
        found = state.api().get(version_path(ws, kind, name, version or "latest"))
        if as_json:
            print_json(found)
        else:
            out.print(_said_version(found), markup=False)
        return {"ready": EXIT_OK, "failed": EXIT_FAILED}.get(found["state"], 5)

    @group.command("verify")
    @click.argument("ref", metavar="NAME[@VERSION]")
    @click.option(
        "--local",
        "local",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        metavar="FOLDER",
        help="Check this local copy against the version's manifest instead of the portal's store.",
    )
    @workspace_option
    @json_option
    @click.pass_context
    def verify_command(
        ctx: click.Context, ref: str, local: Path | None, workspace: str | None, as_json: bool
    ) -> int:
        """Read every file again and compare it with the version's manifest: the portal's
        store, or a local copy with --local. Exit 0: identical; 1: each difference named."""
        state = state_of(ctx)
        ws = state.workspace_for(workspace)
        name, version = split_ref(ref)
        api = state.api()
        path = version_path(ws, kind, name, version or "latest")
        if local is None:
            answer = api.post(f"{path}verify/")
            problems = list(answer["problems"])
        else:
            files: list[Entry] = []
            for row in api.pages(f"{path}files/", limit=1000):
                files.append(Entry(row["path"], int(row["size"]), row["sha256"]))
            with _bar(as_json) as bar:
                task = bar.add_task(f"Checking {local}", total=None)
                found = verify_folder(
                    local,
                    Manifest.of(files),
                    progress=lambda done, total: bar.update(task, completed=done, total=total),
                )
            problems = [str(problem) for problem in found]
        if as_json:
            print_json({"ok": not problems, "problems": problems})
        elif problems:
            for problem in problems:
                out.print(problem, markup=False)
        else:
            where = str(local) if local is not None else "the portal's store"
            out.print(f"{where} holds exactly {name}@{version or 'latest'}.", markup=False)
        return EXIT_OK if not problems else EXIT_FAILED

    if kind == "dataset":

        @group.command("alias")
        @click.argument("name")
        @click.argument("alias")
        @click.argument("version", required=False)
        @click.option("--delete", is_flag=True, help="Remove the alias.")
        @workspace_option
        @json_option
        @click.pass_context
        def alias_command(
            ctx: click.Context,
            name: str,
            alias: str,
            version: str | None,
            delete: bool,
            workspace: str | None,
            as_json: bool,
        ) -> int:
            """Point ALIAS (train, eval…) at VERSION; without VERSION, say which version it
            names; --delete removes it."""
            action = "delete" if delete else "get" if version is None else "set"
            return _alias(ctx, kind, action, name, alias, version, workspace, as_json)

    else:

        @group.group("alias")
        def alias_group() -> None:
            """Names members give versions (production, candidate…); ``latest`` is kept by
            the portal."""

        @alias_group.command("set")
        @click.argument("name")
        @click.argument("alias")
        @click.argument("version")
        @workspace_option
        @json_option
        @click.pass_context
        def alias_set(
            ctx: click.Context,
            name: str,
            alias: str,
            version: str,
            workspace: str | None,
            as_json: bool,
        ) -> int:
            """Point ALIAS at VERSION (a number or another alias)."""
            return _alias(ctx, kind, "set", name, alias, version, workspace, as_json)

        @alias_group.command("get")
        @click.argument("name")
        @click.argument("alias")
        @workspace_option
        @json_option
        @click.pass_context
        def alias_get(
            ctx: click.Context, name: str, alias: str, workspace: str | None, as_json: bool
        ) -> int:
            """Say which version ALIAS names."""
            return _alias(ctx, kind, "get", name, alias, None, workspace, as_json)

        @alias_group.command("rm")
        @click.argument("name")
        @click.argument("alias")
        @workspace_option
        @json_option
        @click.pass_context
        def alias_rm(
            ctx: click.Context, name: str, alias: str, workspace: str | None, as_json: bool
        ) -> int:
            """Remove ALIAS."""
            return _alias(ctx, kind, "delete", name, alias, None, workspace, as_json)

    if kind == "model":

        @group.command("register")
        @click.argument("name")
        @click.option(
            "--run", "run_name", required=True, metavar="RUN", help="A run that succeeded."
        )
        @click.option(
            "--path",
            required=True,
            metavar="PATH",
            help="The path of the run's kept artifacts that becomes the version (model/).",
        )
        @workspace_option
        @json_option
        @click.pass_context
        def register_command(
            ctx: click.Context,
            name: str,
            run_name: str,
            path: str,
            workspace: str | None,
            as_json: bool,
        ) -> int:
            """Make the artifacts a succeeded run kept under PATH the next version of NAME
            (made if new), with the run's final metrics and the datasets it read."""
            state = state_of(ctx)
            ws = state.workspace_for(workspace)
            api = state.api()
            if not _exists(api, asset_path(ws, kind, name)):
                api.request("POST", asset_path(ws, kind), json={"name": name})
            version = api.post(
                f"{asset_path(ws, kind, name)}versions/",
                {"source": "run", "run": run_name, "path": path},
            )
            if as_json:
                print_json(version)
            else:
                out.print(_said_version(version), markup=False)
            return EXIT_OK

        @group.command("best")
        @click.argument("name")
        @click.option("--metric", required=True, metavar="KEY", help="A metric the runs reported.")
        @click.option("--mode", type=click.Choice(["min", "max"]), default="min", show_default=True)
        @workspace_option
        @json_option
        @click.pass_context
        def best_command(
            ctx: click.Context,
            name: str,
            metric: str,
            mode: str,
            workspace: str | None,
            as_json: bool,
        ) -> int:
            """The ready version whose run ended with the smallest (or largest) METRIC."""
            state = state_of(ctx)
            ws = state.workspace_for(workspace)
            found = state.api().get(f"{asset_path(ws, kind, name)}best/", metric=metric, mode=mode)
            if as_json:
                print_json(found)
            else:
                value = found["metrics"].get(metric)
                out.print(f"{found['ref']}: {metric} {value}", markup=False)
            return EXIT_OK

        @group.command("pull")
        @click.argument("ref", metavar="NAME[@VERSION]")
        @click.option(
            "-o",
            "--output",
            type=click.Path(file_okay=False, path_type=Path),
            metavar="DIR",
            help="Where to put the files (default: NAME-VERSION in the current folder).",
        )
        @click.option("--force", is_flag=True, help="Replace DIR if it exists.")
        @workspace_option
        @json_option
        @click.pass_context
        def pull_command(
            ctx: click.Context,
            ref: str,
            output: Path | None,
            force: bool,
            workspace: str | None,
            as_json: bool,
        ) -> int:
            """Download a version's files into a folder, each checked against its manifest.

            Written beside the folder first and moved into place once every file matched, so
            an interrupted or refused download leaves nothing that looks whole."""
            state = state_of(ctx)
            ws = state.workspace_for(workspace)
            name, version = split_ref(ref)
            api = state.api()
            path = version_path(ws, kind, name, version or "latest")
            found = api.get(path)
            target = output or Path(f"{name}-{found['number']}")
            if target.exists() and not force:
                raise CliError(f"{target} exists; use --force to replace it.", EXIT_USAGE)
            manifest = Manifest.of(
                Entry(row["path"], int(row["size"]), row["sha256"])
                for row in api.pages(f"{path}files/", limit=1000)
            )
            if manifest.digest != found["manifest_digest"]:
                raise CliError(
                    f"the portal's list of files of {found['ref']} does not match its digest."
                )
            pull(api, f"{path}download/", target, manifest, quiet=as_json)
            if as_json:
                print_json(
                    {"ref": found["ref"], "folder": str(target), "files": manifest.files_count}
                )
            else:
                out.print(
                    f"Wrote {found['ref']} to {target}: {manifest.files_count:,} files, "
                    f"{_size(manifest.total_bytes)}, each checked.",
                    markup=False,
                )
            return EXIT_OK

    @group.command("rm")
    @click.argument("ref", metavar="NAME[@VERSION]")
    @click.option("--yes", is_flag=True, help="Do not ask to confirm.")
    @workspace_option
    @json_option
    @click.pass_context
    def rm_command(
        ctx: click.Context, ref: str, yes: bool, workspace: str | None, as_json: bool
    ) -> int:
        """Delete NAME with every version, or one version's files (the workspace admin's
        call). A version a run read or made keeps its manifest, as the run's record."""
        state = state_of(ctx)
        ws = state.workspace_for(workspace)
        name, version = split_ref(ref)
        what = (
            f"the {kind} {name} of {ws} with every version"
            if version is None
            else (f"the files of {name}@{version} in {ws}")
        )
        if not yes:
            if not sys.stdin.isatty():
                raise CliError(
                    f"deleting {ref} needs --yes when not asked at a terminal.", EXIT_USAGE
                )
            click.confirm(f"Delete {what}?", abort=True)
        api = state.api()
        if version is None:
            api.delete(asset_path(ws, kind, name))
            if as_json:
                print_json({"name": name, "deleted": True})
            else:
                out.print(f"Deleted the {kind} {name}.", markup=False)
            return EXIT_OK
        response = api.request("DELETE", version_path(ws, kind, name, version))
        kept = response.status_code == 200
        if as_json:
            print_json(api.json_of(response) if kept else {"ref": ref, "deleted": True})
        elif kept:
            found = api.json_of(response)
            out.print(
                f"Deleted the files of {found['ref']}; its manifest stays, because a run's "
                f"record names it ({found['manifest_digest']}).",
                markup=False,
            )
        else:
            out.print(f"Deleted {name}@{version}.", markup=False)
        return EXIT_OK

    return group


data_group.add_command(_kind_group("dataset"))
data_group.add_command(_kind_group("model"))
