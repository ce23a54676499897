"""A dataset or model version from an S3 bucket (issue 33): ``POST …/versions/`` with
``{"source": "url", "url": "s3://bucket/key"}`` (one object) or ``"s3://bucket/prefix/"``
(every object under the prefix), ``tau data dataset ingest NAME s3://…``.

**Where the portal connects.** ``s3://`` names a bucket and a key, not a host: the portal
reads them from the S3 service its platform team configured, never from one a user names,
so the address rules of ``portal.addresses`` (for URLs whose host a user chose) have nothing
to check here. By default that service is the store's own (``TAU_STORAGE_ENDPOINT_URL``,
``TAU_STORAGE_REGION`` and its keys: a platform team's data bucket beside the store works as
it is); setting any of ``TAU_DATA_SOURCE_ENDPOINT_URL``, ``_REGION`` or the source keys
(``TAU_DATA_SOURCE_ACCESS_KEY_ID_FILE``, ``…_SECRET_ACCESS_KEY_FILE``) reads the sources with
those settings alone: another service, or read-only keys apart from the store's. The bucket
name is checked (S3's own rules: no host, port or user name can be slipped in) and the key is
a plain relative path (no ``..``, ``.``, empty part, backslash or hidden character): some
S3-compatible stores resolve such names as paths.

**Which buckets.** The portal reads with its own credentials, which may reach far more than
any one workspace should (the store holds every workspace's files; a platform's account holds
other teams' buckets). So nothing is readable unless ``TAU_DATA_SOURCE_BUCKETS`` names it: a
bucket, or a ``bucket/prefix/`` area, where ``{workspace}`` stands for the asking workspace's
slug (``lab-data/{workspace}/``: each workspace reads its own area and no other's). The
store's own area (``TAU_STORAGE_URL``'s bucket and prefix, and any prefix that holds it) is
refused whatever the setting says. Both are checked when the version is asked for and again
when the worker reads.

**What is read.** A key without a trailing ``/`` is one object (its file in the version: the
key's last segment, or ``path``); if no such object exists but objects lie under ``key/``, it
is read as that prefix. A key ending in ``/``, or none, is a prefix: every object under it
becomes a file at its key relative to the prefix (under ``path``, when given), a path checked
as an upload's is; zero-byte ``…/`` folder markers are skipped. The listing is read whole
first, so the limits (``TAU_DATA_MAX_FILES``, ``TAU_DATA_MAX_FILE_BYTES``), the manifest's
rules (a path once, no file that is also a folder) and the storage quota refuse it before a
byte is downloaded, naming the key. Objects are then fetched to the portal's disk a few at a
time (at most :data:`DOWNLOADS_IN_FLIGHT`, holding at most :data:`SPOOL_BYTES` ahead of the
store, always at least one), each compared with its listing (``If-Match`` its ETag, its
length) and kept in the store by content as it arrives (``catalog.storage.write_blobs``);
progress is the bytes downloaded of the listing's total. The version is ``ready`` only with
every file stored whole, else ``failed`` naming the key.

**Again, or a dead worker.** A redelivered task (the worker died: Celery's late
acknowledgement) reads everything again; files the store holds already are not sent again.
A version the sweep failed meanwhile (its progress stopped) is not made ready nor failed
twice by a late worker.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from catalog import storage
from catalog.ingest import (
    PROGRESS_SECONDS,
    CatalogError,
    check_and_make_ready,
    check_storage_quota,
    claim,
    create_version,
    fail_on_the_way,
    lock_asset,
)
from catalog.models import Asset, AssetVersion
from tau.manifest import CHUNK_BYTES, Entry, Manifest, ManifestError, check_path

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

logger = logging.getLogger(__name__)

#: S3's rules for a bucket's name (the strict ones: lowercase, no underscore).
BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
#: The longest key S3 allows, in UTF-8 bytes.
MAX_KEY_BYTES = 1024
#: Objects being downloaded at once, ahead of the store.
DOWNLOADS_IN_FLIGHT = 4
#: The most bytes fetched ahead of the store on the portal's disk (a larger object is fetched
#: alone: one at a time always goes).
SPOOL_BYTES = 256 * 2**20
#: A digest that stands for "not read yet": the manifest's rules are checked on the listing.
_UNREAD = "0" * 64


class S3SourceRefused(CatalogError):
    """The ``s3://`` source is not one the portal reads, or reading it failed; the message
    names the bucket or key and says what to do."""


def is_s3(url: object) -> bool:
    """Whether ``url`` is an ``s3://`` source (this module's), not an http(s) URL."""
    return isinstance(url, str) and url[:5].lower() == "s3://"


def named(bucket: str, key: str) -> str:
    return f"s3://{bucket}/{key}"


@dataclass(frozen=True)
class Location:
    """What an ``s3://`` source names: a bucket and a key (``""``: the whole bucket; ending in
    ``/``: a prefix)."""

    bucket: str
    key: str

    @property
    def is_prefix(self) -> bool:
        return self.key == "" or self.key.endswith("/")

    def __str__(self) -> str:
        return named(self.bucket, self.key)


def parse(url: str) -> Location:
    """The bucket and key of ``s3://bucket/key``, checked (module docstring)."""
    if not is_s3(url) or len(url) > 5 + 63 + 1 + MAX_KEY_BYTES:
        raise S3SourceRefused("An S3 source is s3://bucket/key or s3://bucket/prefix/.")
    bucket, _, key = url[5:].partition("/")
    if not BUCKET.fullmatch(bucket) or ".." in bucket:
        raise S3SourceRefused(
            f"{bucket[:70]!r} is not a bucket's name (3 to 63 lowercase letters, digits, '.' "
            "and '-'): s3://bucket/key names a bucket of the S3 service the portal is set up "
            "to read, not a host, port or user."
        )
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise S3SourceRefused(f"A key has at most {MAX_KEY_BYTES:,} bytes.")
    body = key[:-1] if key.endswith("/") else key
    if body:
        try:
            check_path(body)
        except ManifestError as exc:
            raise S3SourceRefused(f"{named(bucket, key)}: the key is refused: {exc}") from None
    return Location(bucket, key)


def check_destination(path: str | None) -> str:
    """Where the files go in the version: ``""`` (the object's name, or the prefix's layout),
    a file's path, or a folder ending in ``/``."""
    if not path:
        return ""
    body = path[:-1] if path.endswith("/") else path
    try:
        check_path(body)
    except ManifestError as exc:
        raise S3SourceRefused(f"path: {exc}") from None
    return path


# --- Which buckets a workspace may read -----------------------------------------------------


@dataclass(frozen=True)
class Area:
    """A bucket, or the keys under a prefix in it (``prefix``: ``""`` or ending in ``/``)."""

    bucket: str
    prefix: str

    def holds(self, location: Location) -> bool:
        return location.bucket == self.bucket and location.key.startswith(self.prefix)

    def overlaps(self, location: Location) -> bool:
        """Whether reading ``location`` (an object, or everything under it) may reach into
        the area: one starts with the other."""
        return location.bucket == self.bucket and (
            location.key.startswith(self.prefix) or self.prefix.startswith(location.key)
        )

    def __str__(self) -> str:
        return named(self.bucket, self.prefix)


def _area(text: str) -> Area | None:
    bucket, _, prefix = text.removeprefix("s3://").partition("/")
    prefix = prefix.strip("/")
    if not BUCKET.fullmatch(bucket) or (prefix and _not_a_path(prefix)):
        return None
    return Area(bucket, f"{prefix}/" if prefix else "")


def _not_a_path(text: str) -> bool:
    try:
        check_path(text)
    except ManifestError:
        return True
    return False


def readable_areas(workspace: Any) -> list[Area]:
    """The areas ``TAU_DATA_SOURCE_BUCKETS`` lets ``workspace`` read (``{workspace}``: its
    slug). An entry that is no bucket or area is left out, and logged."""
    areas = []
    for entry in getattr(settings, "TAU_DATA_SOURCE_BUCKETS", []):
        area = _area(str(entry).strip().replace("{workspace}", str(workspace.slug)))
        if area is None:
            logger.warning("TAU_DATA_SOURCE_BUCKETS: %r is no bucket or bucket/prefix/", entry)
        else:
            areas.append(area)
    return areas


def store_area() -> Area | None:
    """The area of the catalog's own store when it is an S3 bucket (``TAU_STORAGE_URL``):
    every workspace's files are there."""
    url = str(getattr(settings, "TAU_STORAGE_URL", "") or "")
    if not url.startswith("s3:"):
        return None
    parts = urlsplit(url)
    prefix = unquote(parts.path).strip("/")
    return Area(parts.netloc, f"{prefix}/" if prefix else "")


def check_readable(workspace: Any, location: Location) -> None:
    """Refuse a location the workspace may not read (module docstring)."""
    store = store_area()
    if store is not None and store.overlaps(location):
        raise S3SourceRefused(
            f"{location} reaches into the portal's own store ({store}), which keeps every "
            "workspace's files: it is never a source. Name data outside it."
        )
    areas = readable_areas(workspace)
    if not areas:
        raise S3SourceRefused(
            "This portal reads no S3 buckets for versions: the platform team names those a "
            "workspace may read in TAU_DATA_SOURCE_BUCKETS."
        )
    if not any(area.holds(location) for area in areas):
        allowed = ", ".join(str(area) for area in areas)
        raise S3SourceRefused(
            f"{location} is not in what {workspace.slug} may read: {allowed} "
            "(TAU_DATA_SOURCE_BUCKETS)."
        )


def start(
    asset: Asset, url: str, *, path: str | None = None, user: Any = None
) -> tuple[AssetVersion, str]:
    """The asset's next version, ``ingesting`` from ``url``, and where its files go
    (:func:`check_destination`); the caller queues the read (``catalog.tasks``)."""
    location = parse(url)
    destination = check_destination(path)
    check_readable(asset.workspace, location)
    with transaction.atomic():
        lock_asset(asset)
        version = create_version(
            asset,
            source=AssetVersion.Source.URL,
            source_detail=str(location)[:1024],
            created_by=user,
        )
    return version, destination


# --- The S3 service -------------------------------------------------------------------------

#: Error codes S3 and its look-alikes give for credentials or rights they refuse: the store's,
#: and a bucket closed to everyone.
_REFUSED = storage.REFUSED_CODES | {"AllAccessDisabled"}

_clients: dict[tuple[object, ...], S3Client] = {}
_clients_lock = threading.Lock()


class SourceService:
    """The S3 service sources are read from, and how its answers are told."""

    def __init__(self) -> None:
        own = any(
            getattr(settings, name, None)
            for name in (
                "TAU_DATA_SOURCE_ENDPOINT_URL",
                "TAU_DATA_SOURCE_REGION",
                "TAU_DATA_SOURCE_ACCESS_KEY_ID",
            )
        )
        #: The settings it is configured by, for messages.
        self.settings = "TAU_DATA_SOURCE" if own else "TAU_STORAGE"
        options = {
            "endpoint_url": getattr(settings, f"{self.settings}_ENDPOINT_URL", "") or None,
            "region": getattr(settings, f"{self.settings}_REGION", "") or None,
            "access_key_id": getattr(settings, f"{self.settings}_ACCESS_KEY_ID", None),
            "secret_access_key": getattr(settings, f"{self.settings}_SECRET_ACCESS_KEY", None),
        }
        key = tuple(options.values())
        with _clients_lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = storage.s3_client(**options)
        self.client = client
        self.described = f"the S3 service {client.meta.endpoint_url}"

    def head(self, location: Location) -> tuple[int, str] | None:
        """The object's size and ETag; None when there is no such object."""
        try:
            with self.errors(str(location), missing_is_error=False):
                found = self.client.head_object(Bucket=location.bucket, Key=location.key)
        except _Missing:
            return None
        return int(found["ContentLength"]), str(found.get("ETag", ""))

    def listing(self, bucket: str, prefix: str) -> Iterator[tuple[str, int, str]]:
        """Every object under ``prefix``: its key, size and ETag, in key order."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        with self.errors(named(bucket, prefix)):
            for page in pages:
                for item in page.get("Contents", []):
                    yield item["Key"], int(item["Size"]), str(item.get("ETag", ""))

    @contextlib.contextmanager
    def errors(self, what: str, *, missing_is_error: bool = True) -> Iterator[None]:
        """botocore's errors as refusals that name ``what`` and say what to check, never a
        key or secret."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
        from urllib3.exceptions import HTTPError

        try:
            yield
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("404", "NoSuchKey", "NotFound"):
                if not missing_is_error:
                    raise _Missing from None
                raise S3SourceRefused(f"{what}: no such object.") from None
            if code == "NoSuchBucket":
                raise S3SourceRefused(f"{what}: {self.described} has no such bucket.") from None
            if code in ("PreconditionFailed", "412"):
                raise S3SourceRefused(
                    f"{what} changed while it was read; ask for the version again."
                ) from None
            if status == 403 or code in _REFUSED:
                raise S3SourceRefused(
                    f"{what}: {self.described} refused the portal ({code or status}): its keys "
                    f"({self.settings}_ACCESS_KEY_ID_FILE, or the role it runs as) need "
                    "s3:GetObject and s3:ListBucket there."
                ) from None
            said = str(error.get("Message", "")).rstrip(".")
            raise S3SourceRefused(
                f"{what}: {self.described} answered {code or status}: {said}."
            ) from None
        except NoCredentialsError:
            raise S3SourceRefused(
                f"{self.described}: the portal has no credentials for it; the platform team "
                f"sets {self.settings}_ACCESS_KEY_ID_FILE and _SECRET_ACCESS_KEY_FILE, or gives "
                "the portal a role."
            ) from None
        except (BotoCoreError, HTTPError) as exc:
            raise S3SourceRefused(
                f"{what} could not be read from {self.described}: {exc}."
            ) from None


class _Missing(Exception):
    """A HEAD's 404: no such object (maybe a prefix)."""


# --- Reading ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    """One object to read, and its file in the version."""

    key: str
    path: str
    size: int
    etag: str


def _into(destination: str, name: str) -> str:
    if not destination:
        return name
    return f"{destination.rstrip('/')}/{name}"


def list_items(source: SourceService, location: Location, destination: str) -> list[Item]:
    """What ``location`` names, checked before a byte is read (module docstring)."""
    max_files = int(settings.TAU_DATA_MAX_FILES)
    prefix = location.key
    if not location.is_prefix:
        found = source.head(location)
        if found is not None:
            size, etag = found
            last = location.key.rsplit("/", 1)[-1]
            whole = destination and not destination.endswith("/")
            path = destination if whole else _into(destination, last)
            return _checked(location.bucket, [Item(location.key, path, size, etag)])
        prefix = f"{location.key}/"
    items: list[Item] = []
    for key, size, etag in source.listing(location.bucket, prefix):
        relative = key[len(prefix) :]
        if not relative or (relative.endswith("/") and size == 0):
            continue  # a folder's marker, as consoles make them
        try:
            check_path(relative)
        except ManifestError as exc:
            raise S3SourceRefused(
                f"{named(location.bucket, key)} cannot be a file of a version: {exc}"
            ) from None
        if len(items) == max_files:
            raise S3SourceRefused(
                f"{named(location.bucket, prefix)} holds more than {max_files:,} objects, more "
                "than a version may hold (TAU_DATA_MAX_FILES)."
            )
        items.append(Item(key, _into(destination, relative), size, etag))
    if not items:
        if location.is_prefix:
            raise S3SourceRefused(f"{location}: there is no object under it.")
        raise S3SourceRefused(
            f"{location}: no such object, nor any under {named(location.bucket, prefix)}."
        )
    return _checked(location.bucket, items)


def _checked(bucket: str, items: list[Item]) -> list[Item]:
    """``items``, each within the file limit and all as a manifest may hold them."""
    limit = int(settings.TAU_DATA_MAX_FILE_BYTES)
    for item in items:
        if item.size > limit:
            raise S3SourceRefused(
                f"{named(bucket, item.key)} is {item.size:,} bytes, more than the {limit:,} a "
                "file may have here (TAU_DATA_MAX_FILE_BYTES)."
            )
    max_files = int(settings.TAU_DATA_MAX_FILES)
    Manifest.of([Entry(item.path, item.size, _UNREAD) for item in items], max_files=max_files)
    return items


class _Progress:
    """Bytes downloaded so far (counted by the downloading threads), written to the version
    now and then by the reading thread (the pages poll it; the sweep sees it alive)."""

    def __init__(self, version: AssetVersion) -> None:
        self.version = version
        self.done = 0
        self.lock = threading.Lock()
        self.said_at = time.monotonic()

    def add(self, count: int) -> None:
        with self.lock:
            self.done += count

    def say(self, _: int = 0) -> None:
        if time.monotonic() - self.said_at < PROGRESS_SECONDS:
            return
        self.said_at = time.monotonic()
        AssetVersion.objects.for_workspace(self.version.asset.workspace_id).filter(
            pk=self.version.pk
        ).update(bytes_done=self.done, touched_at=timezone.now())


def _download(
    source: SourceService,
    bucket: str,
    item: Item,
    spool: Path,
    counted: Callable[[int], None],
    stop: threading.Event,
) -> Path:
    """The object as listed, in the file ``spool``; refused if it is no longer that."""
    what = named(bucket, item.key)
    arguments: dict[str, Any] = {"Bucket": bucket, "Key": item.key}
    if item.etag:
        arguments["IfMatch"] = item.etag
    with source.errors(what):
        answer = source.client.get_object(**arguments)
    body = answer["Body"]
    size = 0
    try:
        with contextlib.closing(body), spool.open("xb") as sink, source.errors(what):
            if int(answer.get("ContentLength", item.size)) != item.size:
                raise S3SourceRefused(f"{what} changed since it was listed; ask for it again.")
            while chunk := body.read(CHUNK_BYTES):
                if stop.is_set():
                    raise S3SourceRefused(f"{what}: stopped.")
                size += len(chunk)
                if size > item.size:
                    raise S3SourceRefused(f"{what} changed since it was listed; ask for it again.")
                sink.write(chunk)
                counted(len(chunk))
    except OSError as exc:
        raise S3SourceRefused(
            f"{what} could not be written to the portal's disk: {exc.strerror or exc}."
        ) from None
    if size != item.size:
        raise S3SourceRefused(f"{what}: the download broke off at {size:,} of {item.size:,} bytes.")
    return spool


def _fetched(
    source: SourceService, bucket: str, items: list[Item], spool_folder: Path, progress: _Progress
) -> Generator[tuple[Path, str], None, None]:
    """Each item's downloaded file and its path, in order, fetched a few ahead (module
    docstring); the caller removes a file once the store has it."""
    stop = threading.Event()
    pending: deque[Future[Path]] = deque()
    with ThreadPoolExecutor(DOWNLOADS_IN_FLIGHT, thread_name_prefix="s3-get") as pool:
        try:
            started = 0
            ahead = 0  # bytes of the downloads started and not yet handed on
            for position, item in enumerate(items):
                while started < len(items) and (
                    started == position
                    or (
                        started - position < DOWNLOADS_IN_FLIGHT
                        and ahead + items[started].size <= SPOOL_BYTES
                    )
                ):
                    spool = spool_folder / str(started)
                    pending.append(
                        pool.submit(
                            _download, source, bucket, items[started], spool, progress.add, stop
                        )
                    )
                    ahead += items[started].size
                    started += 1
                future = pending.popleft()
                while not wait([future], timeout=PROGRESS_SECONDS).done:
                    progress.say()
                progress.say()
                ahead -= item.size
                yield future.result(), item.path
        finally:
            stop.set()
            for future in pending:
                future.cancel()


def ingest(version: AssetVersion, url: str, destination: str) -> None:
    """Read ``url`` into the ``ingesting`` version: ``ready``, or ``failed`` naming the key."""
    workspace = version.asset.workspace
    spool_folder = Path(settings.VAR_DIR) / "uploads" / "s3" / f"{version.pk}-{uuid.uuid4().hex}"
    try:
        location = parse(url)
        check_readable(workspace, location)
        source = SourceService()
        items = list_items(source, location, check_destination(destination))
        version.bytes_total = sum(item.size for item in items)
        version.bytes_done = 0
        version.save(update_fields=["bytes_total", "bytes_done"])
        check_storage_quota(workspace, version.bytes_total, what=version.ref)
        progress = _Progress(version)
        spool_folder.mkdir(parents=True)
        fetched = _fetched(source, location.bucket, items, spool_folder, progress)
        written = storage.write_blobs(workspace.pk, fetched, progress.say)
        entries = []
        with contextlib.closing(fetched), contextlib.closing(written):
            for position, item in enumerate(items):
                try:
                    size, sha256 = next(written)
                except OSError as exc:
                    said = exc.strerror or str(exc)
                    raise S3SourceRefused(
                        f"{named(location.bucket, item.key)} could not be stored: {said}."
                    ) from None
                (spool_folder / str(position)).unlink(missing_ok=True)
                if size != item.size:
                    raise S3SourceRefused(
                        f"{named(location.bucket, item.key)} changed on the portal's disk "
                        "before it was kept."
                    )
                entries.append(Entry(item.path, size, sha256))
        manifest = Manifest.of(entries, max_files=int(settings.TAU_DATA_MAX_FILES))
        if not claim(version, AssetVersion.State.INGESTING, AssetVersion.State.VERIFYING):
            logger.info("%s: no longer ingesting; its read from %s is dropped", version.ref, url)
            return
        check_and_make_ready(version, manifest)
    except (CatalogError, ManifestError) as exc:
        fail_on_the_way(version, str(exc))
    finally:
        shutil.rmtree(spool_folder, ignore_errors=True)
