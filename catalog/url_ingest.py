"""A dataset or model version from a URL (issue 33): ``POST …/versions/`` with
``{"source": "url", "url": "https://…/file", "path": "name"}``.

The URL names one file; the version holds it at ``path`` (default: the URL's last segment).
The request is checked at once (http or https, no user name or password in it, a path the
manifest rules allow, and the webhook rules for where the portal may connect:
``portal.addresses``) and the version made ``ingesting``; a Celery task
(``catalog.tasks.ingest_url``) then downloads it. Every connection, the first and each of at
most :data:`MAX_REDIRECTS` redirects, goes to an address checked just before connecting (a
name that resolves to a private address, a metadata service or the portal itself is refused,
also after a redirect, also when the name changed its answer since the request was checked).
The file is streamed to the portal's disk while hashed (constant memory), bounded by
``TAU_DATA_MAX_FILE_BYTES`` and the workspace's storage quota (checked before a byte is read
when the server says the length), then kept in the store like an uploaded file; the version
is ``ready`` only once its one file is stored whole, else ``failed`` saying why. A worker
that dies meanwhile leaves the version ``ingesting`` until the sweep fails it (its progress
stops). The version's ``source_detail`` keeps the URL without its query (which may be a
signature) and fragment.

An ``s3://bucket/key`` or ``s3://bucket/prefix/`` URL names objects of a bucket, not a host:
:func:`start` and :func:`download` hand it to ``catalog.s3_ingest``, which reads it from the
S3 service the platform team configured (the same task, ``catalog.tasks.ingest_url``).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import logging
import os
import ssl
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit, urlunsplit

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from catalog import s3_ingest, storage
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
from portal import addresses
from tau.manifest import CHUNK_BYTES, Entry, Manifest, ManifestError, check_path

logger = logging.getLogger(__name__)

#: Redirects followed (each to a checked address), as a browser would, but no more.
MAX_REDIRECTS = 5
#: Seconds to resolve and connect, and the most a read may wait for the next bytes.
CONNECT_SECONDS = 30.0
READ_SECONDS = 60.0
USER_AGENT = "TauGrid-data-ingest/1"


class UrlRefused(CatalogError):
    """The URL is not one the portal fetches; the message says why."""


def shown(url: str) -> str:
    """``url`` as it may be kept and shown: without user info, query and fragment."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def file_name(url: str, path: str | None) -> str:
    """The file's path in the version: ``path``, else the URL's last segment."""
    name = path if path else urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1]
    if not name:
        raise UrlRefused(
            "The URL ends in no file name; say where the file goes in the version with `path`."
        )
    try:
        check_path(name)
    except ManifestError as exc:
        raise UrlRefused(str(exc)) from None
    return name


def check(url: str) -> None:
    """Refuse a URL the portal will not fetch (the webhook rules), before anything is made."""
    if not isinstance(url, str) or len(url) > 4096:
        raise UrlRefused("A URL of at most 4,096 characters, https://…")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise UrlRefused(f"This is not a valid URL ({exc}).") from None
    if parts.scheme not in ("http", "https"):
        raise UrlRefused(
            "A URL must start with https:// (or http://), or name a bucket's objects "
            "(s3://bucket/key, s3://bucket/prefix/); to bring files from elsewhere, ingest them "
            "from a folder (`tau data dataset ingest NAME FOLDER`)."
        )
    if parts.username or parts.password:
        raise UrlRefused(
            "A URL may not hold a user name or password (it would be kept with the version); "
            "use a presigned URL, whose signature is never kept."
        )
    try:
        addresses.check_url(url)
    except addresses.RefusedAddress as exc:
        raise UrlRefused(
            str(exc).replace("A webhook URL", "A URL").replace("a webhook", "a download")
        ) from None


def start(
    asset: Asset, url: str, *, path: str | None = None, user: Any = None
) -> tuple[AssetVersion, str]:
    """The asset's next version, ``ingesting`` from ``url``, and the file's path in it (for
    ``s3://``: where its files go, ``catalog.s3_ingest``); the caller queues the download
    (``catalog.tasks.start_url_ingest``)."""
    if s3_ingest.is_s3(url):
        return s3_ingest.start(asset, url, path=path, user=user)
    name = file_name(url, path)
    check(url)
    with transaction.atomic():
        lock_asset(asset)
        version = create_version(
            asset,
            source=AssetVersion.Source.URL,
            source_detail=shown(url)[:1024],
            created_by=user,
        )
    return version, name


class _CheckedHTTPConnection(http.client.HTTPConnection):
    def connect(self) -> None:
        sock = addresses.connect(self.host, self.port, deadline=time.monotonic() + CONNECT_SECONDS)
        sock.settimeout(READ_SECONDS)
        self.sock = sock


class _CheckedHTTPSConnection(http.client.HTTPSConnection):
    def connect(self) -> None:
        sock = addresses.connect(self.host, self.port, deadline=time.monotonic() + CONNECT_SECONDS)
        sock.settimeout(READ_SECONDS)
        context: ssl.SSLContext = self._context  # type: ignore[attr-defined]
        self.sock = context.wrap_socket(sock, server_hostname=self.host)


def _open(url: str) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """A 200 answer to GET ``url``, redirects followed to checked addresses only."""
    for _ in range(MAX_REDIRECTS + 1):
        try:
            parts = addresses.split_url(url)
        except addresses.RefusedAddress as exc:
            raise UrlRefused(str(exc).replace("A webhook URL", "A URL")) from None
        host = parts.hostname
        assert host is not None
        port = addresses.default_port(parts)
        connection: http.client.HTTPConnection
        if parts.scheme == "https":
            connection = _CheckedHTTPSConnection(
                host, port, timeout=READ_SECONDS, context=ssl.create_default_context()
            )
        else:
            connection = _CheckedHTTPConnection(host, port, timeout=READ_SECONDS)
        target = parts.path or "/"
        if parts.query:
            target = f"{target}?{parts.query}"
        try:
            connection.request("GET", target, headers={"User-Agent": USER_AGENT})
            response = connection.getresponse()
        except addresses.RefusedAddress as exc:
            connection.close()
            raise UrlRefused(f"{shown(url)}: {exc}") from None
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            raise UrlRefused(f"{shown(url)} could not be read ({exc}).") from None
        if response.status in (301, 302, 303, 307, 308):
            location = response.getheader("Location") or ""
            connection.close()
            if not location:
                raise UrlRefused(f"{shown(url)} redirected nowhere (no Location).")
            url = urljoin(url, location)
            continue
        if response.status != 200:
            status = f"{response.status} {response.reason}".strip()
            connection.close()
            raise UrlRefused(f"{shown(url)} answered {status}; nothing was kept.")
        return connection, response
    raise UrlRefused(f"More than {MAX_REDIRECTS} redirects; give the file's final URL.")


def _say_progress(version: AssetVersion, done: int) -> None:
    """Bytes downloaded so far, for the pages (and the sweep: it is alive)."""
    AssetVersion.objects.for_workspace(version.asset.workspace_id).filter(pk=version.pk).update(
        bytes_done=done, touched_at=timezone.now()
    )


def download(version: AssetVersion, url: str, name: str) -> None:
    """Fetch ``url`` into the version as ``name``; ``ready``, or ``failed`` saying why."""
    if s3_ingest.is_s3(url):
        s3_ingest.ingest(version, url, name)
        return
    workspace = version.asset.workspace
    limit = int(settings.TAU_DATA_MAX_FILE_BYTES)
    spool = Path(settings.VAR_DIR) / "uploads" / "url" / f"{version.pk}-{uuid.uuid4().hex}"
    spool.parent.mkdir(parents=True, exist_ok=True)
    try:
        connection, response = _open(url)
        try:
            length = response.getheader("Content-Length")
            expected = int(length) if length and length.isdecimal() else None
            if expected is not None:
                if expected > limit:
                    raise UrlRefused(
                        f"{name} is {expected:,} bytes, more than the {limit:,} a file may "
                        "have here (TAU_DATA_MAX_FILE_BYTES)."
                    )
                check_storage_quota(workspace, expected, what=version.ref)
                version.bytes_total = expected
                version.save(update_fields=["bytes_total"])
            sha256 = hashlib.sha256()
            size = 0
            said_at = time.monotonic()
            with spool.open("xb") as sink:
                while chunk := response.read(CHUNK_BYTES):
                    size += len(chunk)
                    if size > limit:
                        raise UrlRefused(
                            f"{name} is more than the {limit:,} bytes a file may have here "
                            "(TAU_DATA_MAX_FILE_BYTES)."
                        )
                    sha256.update(chunk)
                    sink.write(chunk)
                    if time.monotonic() - said_at >= PROGRESS_SECONDS:
                        said_at = time.monotonic()
                        _say_progress(version, size)
                sink.flush()
                os.fsync(sink.fileno())
        except (OSError, http.client.HTTPException) as exc:
            raise UrlRefused(f"{shown(url)}: the download broke off ({exc}).") from None
        finally:
            connection.close()
        if expected is not None and size != expected:
            raise UrlRefused(f"{shown(url)} sent {size:,} of the {expected:,} bytes it announced.")
        if expected is None:
            check_storage_quota(workspace, size, what=version.ref)
        kept_size, kept_sha256 = storage.write_blob(workspace.pk, spool, name=name)
        if (kept_size, kept_sha256) != (size, sha256.hexdigest()):
            raise UrlRefused(f"{name} changed on the portal's disk before it was kept.")
        manifest = Manifest.of([Entry(name, size, kept_sha256)])
        if not claim(version, AssetVersion.State.INGESTING, AssetVersion.State.VERIFYING):
            return  # the sweep failed it meanwhile (taken for dead): its word stands
        check_and_make_ready(version, manifest)
    except (CatalogError, ManifestError) as exc:
        fail_on_the_way(version, str(exc))
    finally:
        with contextlib.suppress(FileNotFoundError):
            spool.unlink()
