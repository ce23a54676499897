"""Where the catalog keeps bytes: each workspace's files once per SHA-256.

``TAU_STORAGE_URL`` names the store, one of two kinds behind one interface (:class:`Store`):

* ``file://<folder>``, the embedded default (``var/storage/``): a workspace's blobs are
  ``<folder>/workspaces/<id>/blobs/<ab>/<sha256>``. A blob is written under a temporary name
  in the same folder and renamed once its digest is known, so a crash leaves no blob whose
  name lies about its content; beside it, ``<sha256>.checked`` remembers the file as it was
  when hashed (:func:`is_checked`: staging trusts a blob unchanged since, and hashes one that
  changed).
* ``s3://<bucket>/<prefix>``, any S3-compatible store (AWS, or another with
  ``TAU_STORAGE_ENDPOINT_URL``): a blob is the object ``<prefix>/workspaces/<id>/blobs/<ab>/
  <sha256>``, put under that key only once its digest is known and the bytes sent are those
  hashed: a file up to :data:`MULTIPART_THRESHOLD_BYTES` is held in memory from the reading
  that hashes it and sent in one PUT (a few at once while an ingest reads the next,
  :func:`write_blobs`); a larger one is read again as it is sent in parts, and an upload whose
  second reading differs is aborted before the object exists. Upload pieces gather on the
  portal's disk as with a folder (``VAR_DIR/uploads/``). There is no ``.checked`` mark in a
  bucket: a run on this machine reads a blob through :func:`local_copy`, a content-addressed
  cache (``VAR_DIR/cache/blobs/``) whose copies are hashed as they are fetched, once, and marked as
  a folder's blobs are; a cached copy that changed since is fetched again.

Either way two versions with a file in common keep it once, and no workspace's store holds
another's bytes (nor tells it, by a blob that is already there, what another has).
``verify`` always reads every byte again (:func:`hash_blob`). Credentials for S3 come from
``TAU_STORAGE_ACCESS_KEY_ID(_FILE)`` and ``TAU_STORAGE_SECRET_ACCESS_KEY(_FILE)``, else from
the AWS SDK's own chain (its environment variables, a web identity such as IRSA, an instance
role); they are never logged nor put in a message.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import math
import os
import re
import shutil
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, cast
from urllib.parse import unquote, urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from tau.manifest import CHUNK_BYTES, ManifestError, hash_file

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef

_SHA256 = re.compile(r"[0-9a-f]{64}")

#: A file up to this size goes to an S3 store in one PUT, from memory (it was read once, to
#: hash it); a larger one in parts, read again from its file as it is sent.
MULTIPART_THRESHOLD_BYTES = 16 * 2**20
#: The size of one part of a multipart upload (grown for a file past 10,000 of them).
PART_BYTES = 8 * 2**20
#: Parts in flight at once (boto3's own default concurrency): memory held is at most this
#: many parts, whatever the file's size.
PARTS_IN_FLIGHT = 10
#: Small files an ingest has in flight to an S3 store at once (each held in memory, at most
#: :data:`MULTIPART_THRESHOLD_BYTES`), while the next is read and hashed.
FILES_IN_FLIGHT = 4
#: S3 allows at most this many parts in one upload.
_MAX_PARTS = 10_000


class StorageError(OSError):
    """The store cannot be reached or refused the portal; the message (``strerror``, without
    a full stop: callers add theirs) says which store and what to check, and never holds a
    secret."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EIO, message)


class Store(Protocol):
    """What the catalog asks of a store; :func:`store` picks one from ``TAU_STORAGE_URL``."""

    def write_blob(
        self,
        workspace_id: int,
        source: Path,
        on_bytes: Callable[[int], None] | None,
        name: str,
    ) -> tuple[int, str]: ...
    def keep_part(self, workspace_id: int, part: Path, sha256: str, size: int) -> None: ...
    def has_blob(self, workspace_id: int, sha256: str, size: int) -> bool: ...
    def open_blob(self, workspace_id: int, sha256: str) -> BinaryIO: ...
    def blob_url(self, workspace_id: int, sha256: str, seconds: int) -> str | None: ...
    def hash_blob(self, workspace_id: int, sha256: str) -> tuple[int, str]: ...
    def local_copy(self, workspace_id: int, sha256: str) -> Path: ...
    def forget_blob(self, workspace_id: int, sha256: str) -> None: ...
    def uploads_root(self, workspace_id: int) -> Path: ...


def _checked_sha256(sha256: str) -> str:
    if not _SHA256.fullmatch(sha256):
        raise ValueError(f"{sha256!r} is not a SHA-256 hex digest")
    return sha256


# --- A folder -------------------------------------------------------------------------------


class FolderStore:
    """``file://<folder>``: blobs are files, renamed into place once hashed."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def workspace_root(self, workspace_id: int) -> Path:
        return self.folder / "workspaces" / str(int(workspace_id))

    def blob_path(self, workspace_id: int, sha256: str) -> Path:
        sha256 = _checked_sha256(sha256)
        return self.workspace_root(workspace_id) / "blobs" / sha256[:2] / sha256

    def uploads_root(self, workspace_id: int) -> Path:
        return self.workspace_root(workspace_id) / "uploads"

    def write_blob(
        self,
        workspace_id: int,
        source: Path,
        on_bytes: Callable[[int], None] | None,
        name: str,
    ) -> tuple[int, str]:
        temporary = self.workspace_root(workspace_id) / "blobs" / "incoming" / uuid.uuid4().hex
        temporary.parent.mkdir(parents=True, exist_ok=True)
        try:
            with temporary.open("xb") as writer:
                size, sha256 = hash_file(source, on_bytes, name=name, sink=writer.write)
                writer.flush()
                os.fsync(writer.fileno())
            self.keep_part(workspace_id, temporary, sha256, size)  # or dropped: kept already
            return size, sha256
        finally:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()

    def keep_part(self, workspace_id: int, part: Path, sha256: str, size: int) -> None:
        final = self.blob_path(workspace_id, sha256)
        final.parent.mkdir(parents=True, exist_ok=True)
        if self.has_blob(workspace_id, sha256, size):
            part.unlink()
        else:
            os.replace(part, final)
            mark_checked(final)

    def has_blob(self, workspace_id: int, sha256: str, size: int) -> bool:
        try:
            return self.blob_path(workspace_id, sha256).stat().st_size == size
        except FileNotFoundError:
            return False

    def open_blob(self, workspace_id: int, sha256: str) -> BinaryIO:
        return self.blob_path(workspace_id, sha256).open("rb")

    def blob_url(self, workspace_id: int, sha256: str, seconds: int) -> str | None:
        del workspace_id, sha256, seconds
        return None  # a folder has no such URL: the portal serves the bytes itself

    def hash_blob(self, workspace_id: int, sha256: str) -> tuple[int, str]:
        path = self.blob_path(workspace_id, sha256)
        if not path.is_file():
            raise FileNotFoundError(path)
        return hash_file(path, name=path.name)

    def local_copy(self, workspace_id: int, sha256: str) -> Path:
        return self.blob_path(workspace_id, sha256)  # the store's own file, checked or not

    def forget_blob(self, workspace_id: int, sha256: str) -> None:
        blob = self.blob_path(workspace_id, sha256)
        blob.unlink(missing_ok=True)
        _mark(blob).unlink(missing_ok=True)


# --- An S3-compatible bucket ----------------------------------------------------------------


class S3Store:
    """``s3://<bucket>/<prefix>``: blobs are objects, put under their final key only once the
    bytes sent are known to be those their name says."""

    def __init__(self, client: S3Client, bucket: str, prefix: str, local: Path) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix
        self.local = local  # this machine's folder: upload pieces and the cache of copies
        self._described = _describe(client, bucket)

    def key(self, workspace_id: int, sha256: str) -> str:
        sha256 = _checked_sha256(sha256)
        parts = (self.prefix, "workspaces", str(int(workspace_id)), "blobs", sha256[:2], sha256)
        return "/".join(part for part in parts if part)

    def uploads_root(self, workspace_id: int) -> Path:
        return self.local / "uploads" / "workspaces" / str(int(workspace_id))

    def cache_path(self, workspace_id: int, sha256: str) -> Path:
        return _cache_path_under(self.local, workspace_id, sha256)

    def write_blob(
        self,
        workspace_id: int,
        source: Path,
        on_bytes: Callable[[int], None] | None,
        name: str,
    ) -> tuple[int, str]:
        written = self.write_blobs(workspace_id, [(source, name)], on_bytes)
        with contextlib.closing(written):
            return next(written)

    def write_blobs(
        self,
        workspace_id: int,
        sources: Iterable[tuple[Path, str]],
        on_bytes: Callable[[int], None] | None,
    ) -> Generator[tuple[int, str], None, None]:
        """Each file of ``sources`` (its path, its name in messages) kept; its size and
        SHA-256, or its error, in the order given. The key is the digest, so a file is read
        before a byte of it is sent: a small one is held in memory from that reading and
        sent by a pool (its HEAD, then its PUT) while the next is read, at most
        :data:`FILES_IN_FLIGHT` at once; a large one is read again and sent in parts before
        the next. ``on_bytes`` is called in this thread."""
        pending: deque[tuple[Future[tuple[int, str]], bool]] = deque()
        with ThreadPoolExecutor(FILES_IN_FLIGHT, thread_name_prefix="s3-put") as pool:
            try:
                for source, name in sources:
                    pending.append(self._start(pool, workspace_id, source, name, on_bytes))
                    while len(pending) > FILES_IN_FLIGHT or pending[0][0].done():
                        yield _reported(*pending.popleft(), on_bytes)
                        if not pending:
                            break
                while pending:
                    yield _reported(*pending.popleft(), on_bytes)
            finally:
                for future, _ in pending:
                    future.cancel()

    def _start(
        self,
        pool: ThreadPoolExecutor,
        workspace_id: int,
        source: Path,
        name: str,
        on_bytes: Callable[[int], None] | None,
    ) -> tuple[Future[tuple[int, str]], bool]:
        """One file under way: (its result to come, whether ``on_bytes`` is still owed)."""
        held = bytearray()

        def hold(chunk: memoryview) -> None:
            if len(held) <= MULTIPART_THRESHOLD_BYTES:
                held.extend(chunk)

        done: Future[tuple[int, str]] = Future()
        try:
            size, sha256 = hash_file(source, name=name, sink=hold)
            if size <= MULTIPART_THRESHOLD_BYTES:
                return pool.submit(self._keep_held, workspace_id, sha256, held), True
            del held[:]
            if not self.has_blob(workspace_id, sha256, size):
                self._put_file(workspace_id, source, sha256, size, name, on_bytes)
                done.set_result((size, sha256))
                return done, False
            done.set_result((size, sha256))
        except Exception as exc:  # the file's own error, raised in its turn
            done.set_exception(exc)
        return done, True

    def _keep_held(self, workspace_id: int, sha256: str, data: bytearray) -> tuple[int, str]:
        if not self.has_blob(workspace_id, sha256, len(data)):
            self._put(workspace_id, sha256, data)
        return len(data), sha256

    def keep_part(self, workspace_id: int, part: Path, sha256: str, size: int) -> None:
        if not self.has_blob(workspace_id, sha256, size):
            if size <= MULTIPART_THRESHOLD_BYTES:
                data = part.read_bytes()
                if (len(data), hashlib.sha256(data).hexdigest()) != (size, sha256):
                    raise ManifestError(f"{part.name} changed before it was kept.")
                self._put(workspace_id, sha256, data)
            else:
                self._put_file(workspace_id, part, sha256, size, part.name, None)
        part.unlink()

    def has_blob(self, workspace_id: int, sha256: str, size: int) -> bool:
        try:
            with self._errors():
                head = self.client.head_object(
                    Bucket=self.bucket, Key=self.key(workspace_id, sha256)
                )
        except FileNotFoundError:
            return False
        return head["ContentLength"] == size

    def open_blob(self, workspace_id: int, sha256: str) -> BinaryIO:
        with self._errors():
            found = self.client.get_object(Bucket=self.bucket, Key=self.key(workspace_id, sha256))
        return cast(BinaryIO, found["Body"])

    def blob_url(self, workspace_id: int, sha256: str, seconds: int) -> str | None:
        with self._errors():
            return self.client.generate_presigned_url(
                "get_object",
                Params={"Bucket": self.bucket, "Key": self.key(workspace_id, sha256)},
                ExpiresIn=int(seconds),
            )

    def hash_blob(self, workspace_id: int, sha256: str) -> tuple[int, str]:
        digest = hashlib.sha256()
        size = 0
        for chunk in self._chunks(workspace_id, sha256):
            digest.update(chunk)
            size += len(chunk)
        return size, digest.hexdigest()

    def local_copy(self, workspace_id: int, sha256: str) -> Path:
        cached = self.cache_path(workspace_id, sha256)
        if is_checked(cached):
            return cached
        cached.parent.mkdir(parents=True, exist_ok=True)
        temporary = cached.with_name(f".{sha256}.{uuid.uuid4().hex}")
        try:
            digest = hashlib.sha256()
            with temporary.open("xb") as writer:
                for chunk in self._chunks(workspace_id, sha256):
                    digest.update(chunk)
                    writer.write(chunk)
                writer.flush()
                os.fsync(writer.fileno())
            if digest.hexdigest() != sha256:
                raise StoredCopyDiffers(digest.hexdigest())
            # Read-only, as a folder's blobs are linked: a run's link shares this inode.
            temporary.chmod(0o444)
            os.replace(temporary, cached)
            mark_checked(cached)
            return cached
        finally:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()

    def forget_blob(self, workspace_id: int, sha256: str) -> None:
        with self._errors():
            self.client.delete_object(Bucket=self.bucket, Key=self.key(workspace_id, sha256))
        cached = self.cache_path(workspace_id, sha256)
        cached.unlink(missing_ok=True)
        _mark(cached).unlink(missing_ok=True)

    # The parts of the work.

    def _put(self, workspace_id: int, sha256: str, data: bytes | bytearray) -> None:
        """Bytes already hashed, in one PUT (at most :data:`MULTIPART_THRESHOLD_BYTES`: one
        request costs less than the three of the smallest multipart upload)."""
        with self._errors():
            self.client.put_object(
                Bucket=self.bucket,
                Key=self.key(workspace_id, sha256),
                Body=cast(bytes, data),  # botocore takes a bytearray as it is: no copy
            )

    @contextlib.contextmanager
    def _multipart(self, key: str, size: int) -> Iterator[_PartSender]:
        """A multipart upload to ``key``: its parts are given to the sender inside the
        block; completed when the block ends, aborted if it raises (nothing is left)."""
        part_bytes = max(PART_BYTES, math.ceil(size / _MAX_PARTS / 2**20) * 2**20)
        with self._errors():
            upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
        completed = False
        try:
            with ThreadPoolExecutor(PARTS_IN_FLIGHT, thread_name_prefix="s3-part") as pool:
                sender = _PartSender(self, key, upload_id, part_bytes, pool)
                yield sender
                parts = sender.finish()
            with self._errors():
                self.client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                )
            completed = True
        finally:
            if not completed:
                with contextlib.suppress(Exception):
                    self.client.abort_multipart_upload(
                        Bucket=self.bucket, Key=key, UploadId=upload_id
                    )

    def _put_file(
        self,
        workspace_id: int,
        source: Path,
        sha256: str,
        size: int,
        name: str,
        on_bytes: Callable[[int], None] | None,
    ) -> None:
        """``source`` sent in parts, read in order in this thread (so ``on_bytes`` is called
        here) and hashed again; completed only if it is still the file hashed before, else
        aborted: no object ever holds bytes other than its name's."""
        with self._multipart(self.key(workspace_id, sha256), size) as sender:
            found = hash_file(source, on_bytes, name=name, sink=sender.add)
            if found != (size, sha256):
                raise ManifestError(
                    f"{name} changed while it was stored (SHA-256 {found[1]} on the second "
                    f"reading, {sha256} on the first)."
                )

    def _chunks(self, workspace_id: int, sha256: str) -> Iterator[bytes]:
        body = self.open_blob(workspace_id, sha256)
        with body, self._errors():
            while chunk := body.read(CHUNK_BYTES):
                yield chunk

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """botocore's errors as what the callers know: a missing object is
        FileNotFoundError, anything else a StorageError that says what to check."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        try:
            yield
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("404", "NoSuchKey", "NotFound"):
                raise FileNotFoundError(errno.ENOENT, "no such blob in the store") from None
            if code == "NoSuchBucket":
                raise StorageError(f"{self._described} has no such bucket") from None
            if status == 403 or code in REFUSED_CODES:
                raise StorageError(
                    f"{self._described} refused the portal's credentials ({code or status}): "
                    "check TAU_STORAGE_ACCESS_KEY_ID_FILE and TAU_STORAGE_SECRET_ACCESS_KEY_FILE "
                    "(or the role the portal runs as) and the bucket's policy"
                ) from None
            said = str(error.get("Message", "")).rstrip(".")
            raise StorageError(f"{self._described} answered {code or status}: {said}") from None
        except NoCredentialsError:
            raise StorageError(
                f"{self._described}: no credentials; set TAU_STORAGE_ACCESS_KEY_ID_FILE and "
                "TAU_STORAGE_SECRET_ACCESS_KEY_FILE, or give the portal a role"
            ) from None
        except BotoCoreError as exc:
            raise StorageError(f"{self._described} cannot be reached: {exc}") from None


#: Error codes S3 and its look-alikes give for credentials they do not accept.
REFUSED_CODES = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
    "Forbidden",
}


class StoredCopyDiffers(StorageError):
    """A blob whose bytes, fetched, are not those its name says (``found``: their SHA-256)."""

    def __init__(self, found: str) -> None:
        super().__init__(f"the stored copy has SHA-256 {found}")
        self.found = found


class _PartSender:
    """The parts of one multipart upload, sent by a pool while the next is read; at most
    :data:`PARTS_IN_FLIGHT` parts wait or travel at once (the reader waits for the oldest).
    Bytes are copied once, into the part that is sent."""

    def __init__(
        self, store: S3Store, key: str, upload_id: str, part_bytes: int, pool: ThreadPoolExecutor
    ) -> None:
        self.store = store
        self.key = key
        self.upload_id = upload_id
        self.part_bytes = part_bytes
        self.pool = pool
        self.part = bytearray(part_bytes)
        self.filled = 0
        self.sent: list[Future[CompletedPartTypeDef]] = []
        self.in_flight: list[Future[CompletedPartTypeDef]] = []

    def add(self, chunk: memoryview) -> None:
        """Bytes read in order, sent a part at a time."""
        while chunk:
            taken = min(len(chunk), self.part_bytes - self.filled)
            self.part[self.filled : self.filled + taken] = chunk[:taken]
            self.filled += taken
            chunk = chunk[taken:]
            if self.filled == self.part_bytes:
                self._send(self.part)
                self.part, self.filled = bytearray(self.part_bytes), 0

    def finish(self) -> list[CompletedPartTypeDef]:
        if self.filled or not self.sent:
            self._send(self.part[: self.filled])
            self.filled = 0
        return [future.result() for future in self.sent]

    def _send(self, data: bytearray) -> None:
        while len(self.in_flight) >= PARTS_IN_FLIGHT:
            self.in_flight.pop(0).result()  # raises the first failure here, in the reader
        number = len(self.sent) + 1
        future = self.pool.submit(self._upload, number, data)
        self.sent.append(future)
        self.in_flight.append(future)

    def _upload(self, number: int, data: bytearray) -> CompletedPartTypeDef:
        with self.store._errors():
            answer = self.store.client.upload_part(
                Bucket=self.store.bucket,
                Key=self.key,
                UploadId=self.upload_id,
                PartNumber=number,
                Body=cast(bytes, data),  # botocore takes a bytearray as it is: no copy
            )
        return {"PartNumber": number, "ETag": answer["ETag"]}


def _reported(
    future: Future[tuple[int, str]], owed: bool, on_bytes: Callable[[int], None] | None
) -> tuple[int, str]:
    size, sha256 = future.result()
    if owed and on_bytes is not None:
        on_bytes(size)
    return size, sha256


def _describe(client: Any, bucket: str) -> str:
    return f"The S3 store {client.meta.endpoint_url} (bucket {bucket})"


def s3_client(
    *,
    endpoint_url: str | None,
    region: str | None,
    access_key_id: str | None,
    secret_access_key: str | None,
) -> S3Client:
    """A client of the S3 API: with the given keys, or the AWS SDK's own chain (environment,
    web identity, instance role) without them; path-style addressing for a store named by
    its endpoint (most S3-compatible stores want it)."""
    import boto3
    from botocore.config import Config

    config = Config(
        signature_version="s3v4",
        retries={"max_attempts": 5, "mode": "standard"},
        max_pool_connections=PARTS_IN_FLIGHT + 2,
        s3={"addressing_style": "path" if endpoint_url else "auto"},
        # Checksums the S3 API demands only: S3-compatible stores differ on the others.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    session = boto3.session.Session()
    return session.client(
        "s3",
        endpoint_url=endpoint_url or None,
        region_name=region or None,
        aws_access_key_id=access_key_id or None,
        aws_secret_access_key=secret_access_key or None,
        config=config,
    )


# --- Which store ----------------------------------------------------------------------------

_stores: dict[tuple[object, ...], Store] = {}
_stores_lock = threading.Lock()


def store() -> Store:
    """The store ``TAU_STORAGE_URL`` names (one client per configuration, shared by threads)."""
    url = str(getattr(settings, "TAU_STORAGE_URL", "") or "")
    if not url or url.startswith("file:"):
        return FolderStore(root())
    parts = urlsplit(url)
    if parts.scheme != "s3":
        raise ImproperlyConfigured(
            f"TAU_STORAGE_URL={parts.scheme}://…: name a folder (file:///path/to/storage) or "
            "an S3 bucket (s3://bucket/prefix)."
        )
    bucket = parts.netloc
    if not bucket:
        raise ImproperlyConfigured("TAU_STORAGE_URL=s3://… must name a bucket: s3://bucket/prefix")
    options = {
        "endpoint_url": getattr(settings, "TAU_STORAGE_ENDPOINT_URL", "") or None,
        "region": getattr(settings, "TAU_STORAGE_REGION", "") or None,
        "access_key_id": getattr(settings, "TAU_STORAGE_ACCESS_KEY_ID", None),
        "secret_access_key": getattr(settings, "TAU_STORAGE_SECRET_ACCESS_KEY", None),
    }
    prefix = unquote(parts.path).strip("/")
    local = Path(settings.VAR_DIR)
    key = (bucket, prefix, local, *options.values())
    with _stores_lock:
        found = _stores.get(key)
        if found is None:
            found = _stores[key] = S3Store(s3_client(**options), bucket, prefix, local)
    return found


def root() -> Path:
    """The store's folder, from ``TAU_STORAGE_URL`` (a ``file://`` store's only)."""
    url = str(getattr(settings, "TAU_STORAGE_URL", "") or "")
    if not url:
        return Path(settings.VAR_DIR) / "storage"
    parts = urlsplit(url)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
        raise ImproperlyConfigured(
            f"TAU_STORAGE_URL={parts.scheme}://…: this store keeps no folder on this machine; "
            "only a file:///path/to/storage store has one."
        )
    return Path(unquote(parts.path))


def _folder_store() -> FolderStore:
    found = store()
    if not isinstance(found, FolderStore):
        raise ImproperlyConfigured(
            "TAU_STORAGE_URL names an S3 bucket: its blobs are no files here (open_blob, "
            "local_copy)."
        )
    return found


# --- What the catalog calls -----------------------------------------------------------------


def workspace_root(workspace_id: int) -> Path:
    """The workspace's folder in a ``file://`` store."""
    return _folder_store().workspace_root(workspace_id)


def blob_path(workspace_id: int, sha256: str) -> Path:
    """The file of a blob in a ``file://`` store (an S3 store has none: :func:`open_blob`)."""
    return _folder_store().blob_path(workspace_id, sha256)


def hash_blob(workspace_id: int, sha256: str) -> tuple[int, str]:
    """The size and SHA-256 of a stored blob, every byte read again (FileNotFoundError: it is
    gone)."""
    return store().hash_blob(workspace_id, sha256)


def write_blob(
    workspace_id: int,
    source: Path,
    on_bytes: Callable[[int], None] | None = None,
    *,
    name: str | None = None,
) -> tuple[int, str]:
    """Copy the regular file ``source`` (``name`` in messages) into the workspace's store,
    hashing as it is read; returns its size and SHA-256. Refuses a file that is not regular
    once opened (a symlink or a FIFO put in its place)."""
    return store().write_blob(workspace_id, source, on_bytes, name or source.name)


def write_blobs(
    workspace_id: int,
    sources: Iterable[tuple[Path, str]],
    on_bytes: Callable[[int], None] | None = None,
) -> Generator[tuple[int, str], None, None]:
    """:func:`write_blob` for each of ``sources`` (a path, its name in messages), lazily, in
    order: each file's size and SHA-256, or its error when its turn comes. An S3 store sends
    small files while it reads the next; a folder copies one after the other. Close it when
    done (``contextlib.closing``): what is still under way is then waited for."""
    found = store()
    if isinstance(found, S3Store):
        yield from found.write_blobs(workspace_id, sources, on_bytes)
    else:
        for source, name in sources:
            yield write_blob(workspace_id, source, on_bytes, name=name)


def open_blob(workspace_id: int, sha256: str) -> BinaryIO:
    """The blob ``sha256`` of the workspace, open for reading, streamed (FileNotFoundError: it
    is gone)."""
    return store().open_blob(workspace_id, sha256)


def blob_url(workspace_id: int, sha256: str, *, seconds: int) -> str | None:
    """A URL from which anyone holding it may read the blob for ``seconds`` (an S3 store's
    presigned GET), or None where the store has no such URL (a folder: the portal serves the
    bytes itself)."""
    return store().blob_url(workspace_id, sha256, seconds)


def has_blob(workspace_id: int, sha256: str, size: int) -> bool:
    """Whether the workspace's store holds the blob ``sha256`` whole (by its size)."""
    return store().has_blob(workspace_id, sha256, size)


def local_copy(workspace_id: int, sha256: str) -> Path:
    """A file on this machine with the blob's bytes, for a run to link: a folder store's own
    file (trust it only if :func:`is_checked`), or an S3 store's copy in the local cache,
    fetched and hashed once and marked checked (FileNotFoundError: it is gone from the
    store; StoredCopyDiffers: its bytes are not those its name says)."""
    return store().local_copy(workspace_id, sha256)


def upload_part(workspace_id: int, version_id: int, file_id: int) -> Path:
    """Where the bytes of one uploaded file gather until it is whole (catalog.uploads), on
    the portal's own disk whatever the store."""
    return store().uploads_root(workspace_id) / str(int(version_id)) / str(int(file_id))


def keep_part(workspace_id: int, part: Path, sha256: str, size: int) -> None:
    """Make the whole, checked upload ``part`` the workspace's blob ``sha256`` (a rename in a
    folder, an upload to a bucket; dropped if the blob is there already)."""
    store().keep_part(workspace_id, part, sha256, size)


def cache_path(workspace_id: int, sha256: str) -> Path:
    """Where this machine's cache of copies keeps the workspace's file ``sha256``
    (``VAR_DIR/cache/blobs/``): an S3 store's files, and those of versions registered in
    place (catalog.in_place), copied there for runs to link."""
    return _cache_path_under(Path(settings.VAR_DIR), workspace_id, sha256)


def _cache_path_under(local: Path, workspace_id: int, sha256: str) -> Path:
    sha256 = _checked_sha256(sha256)
    return local / "cache" / "blobs" / "workspaces" / str(int(workspace_id)) / sha256[:2] / sha256


def _cache_root() -> Path:
    return Path(settings.VAR_DIR) / "cache" / "blobs"


def in_place_marks() -> Path:
    """This machine's notes on files registered in place (``VAR_DIR/cache/in-place/``,
    catalog.in_place): what each was found to be when last read."""
    return Path(settings.VAR_DIR) / "cache" / "in-place"


def trim_cache(older_than_seconds: float, *, now: float | None = None) -> int:
    """Remove the cached copies (``VAR_DIR/cache/blobs/``: an S3 store's files, and copies of
    files registered in place) that no staged run links any more (one link: the cache's own)
    and that were fetched or last staged more than ``older_than_seconds`` ago; how many went.
    A copy in use has a second link (the run's data folder), so it stays however old it is.
    The notes on files registered in place (:func:`in_place_marks`) not used for as long go
    too (such a file is then read again before it is trusted). Only the cache's own folders
    are walked: the files of a version registered in place, in the workspace's folder of
    prefixes, are never touched."""
    root = _cache_root()
    limit = (time.time() if now is None else now) - older_than_seconds
    removed = 0
    for folder, _, names in os.walk(root):
        for name in names:
            if not _SHA256.fullmatch(name):
                continue  # a mark, or a copy still being fetched
            path = Path(folder) / name
            try:
                found = path.stat()
            except FileNotFoundError:
                continue
            if found.st_nlink > 1 or max(found.st_mtime, found.st_ctime) > limit:
                continue
            path.unlink(missing_ok=True)
            _mark(path).unlink(missing_ok=True)
            removed += 1
    for folder, _, names in os.walk(in_place_marks()):
        for name in names:
            path = Path(folder) / name
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_mtime <= limit:
                    path.unlink()
    return removed


def _mark(blob: Path) -> Path:
    return blob.with_name(f"{blob.name}.checked")


def _identity(blob: Path) -> str:
    found = blob.stat()
    return f"{found.st_ino} {found.st_mtime_ns} {found.st_size}\n"


def mark_checked(blob: Path) -> None:
    """Remember that the local file ``blob``'s bytes were hashed and match its name, as the
    file is now (inode, modification time, size): a reader may trust it until it changes."""
    temporary = blob.with_name(f".{blob.name}.{uuid.uuid4().hex}")
    temporary.write_text(_identity(blob))
    os.replace(temporary, _mark(blob))


def is_checked(blob: Path) -> bool:
    """Whether the local file ``blob`` is as it was when last hashed (:func:`mark_checked`):
    any write to it since (a new modification time, size or inode) says no."""
    try:
        return _mark(blob).read_text() == _identity(blob)
    except (FileNotFoundError, NotADirectoryError):
        return False


def forget_blob(workspace_id: int, sha256: str) -> None:
    """The blob gone from the store (and from this machine's cache of copies)."""
    store().forget_blob(workspace_id, sha256)


def drop_uploads(workspace_id: int, version_id: int) -> None:
    """Forget the pieces of a version's uploads (it is ready, failed or gone)."""
    shutil.rmtree(store().uploads_root(workspace_id) / str(int(version_id)), ignore_errors=True)
