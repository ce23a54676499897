"""What a cluster's stager reads (``executors.kubernetes.render.STAGE_SCRIPT``): the listing of
the files of pinned versions as JSON lines, and each file's bytes. A run's datasets
(``GET …/runs/{run}/data/``, ``RunDataViewSet`` here) and an endpoint's model
(``GET …/endpoints/{name}/model/``, ``serving.api.workload``) are listed and served by the
same code, so the stager reads one format.

The listing: a head ``{"files", "bytes", …}`` (what the caller adds: the datasets and their
folders, the model), then one line per file ``{"path", "ref", "file", "size", "sha256",
"url"}`` — ``path`` where it goes under the stager's folder (the version's folder, then the
file's path in the version), ``url`` relative to the listing (``blobs/{sha256}/``: the
portal's bytes, which the stager asks for with its token) or a presigned URL of the store
(which it fetches directly, sending nothing). A file of a version registered in place is the
portal's to serve, checked as it streams: it never gets a presigned URL.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet
from django.http import FileResponse, HttpResponseBase, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse
from rest_framework import exceptions, status
from rest_framework.response import Response

from catalog import in_place, storage
from catalog.models import AssetFile, AssetVersion
from tau.manifest import CHUNK_BYTES
from workspaces.models import Workspace

logger = logging.getLogger(__name__)

#: How long a presigned URL in a staging listing stays valid (a large version takes a while).
STAGING_URL_SECONDS = 6 * 3600

LISTING_LINES = (
    "then one line per file `{path, ref, file, size, sha256, url}`: `url` relative to this "
    "listing (the portal's bytes, with the same token) or a presigned URL of the store."
)

#: The file route's answer, as the schema says it.
BLOB_RESPONSE = OpenApiResponse(
    OpenApiTypes.BINARY,
    description="The file's bytes as the store keeps them, or, for a version registered in "
    "place, read at its prefix and checked against its SHA-256 as they stream (a file that "
    "changed since ends the body short).",
)


@dataclass(frozen=True)
class Staged:
    """One version to stage, and the folder its files go to under the stager's folder
    (``""``: the folder itself)."""

    version: AssetVersion
    folder: str = ""


def listing_response(
    workspace_id: int, staged: Sequence[Staged], head: dict[str, Any]
) -> StreamingHttpResponse:
    """The JSON-lines listing of every file of ``staged``: ``{"files", "bytes"}`` and
    ``head`` first, then a line per file, streamed (a version may hold millions of files)."""
    first = {
        "files": sum(item.version.files_count for item in staged),
        "bytes": sum(item.version.bytes for item in staged),
        **head,
    }

    def lines() -> Iterator[bytes]:
        yield json.dumps(first).encode() + b"\n"
        for item in staged:
            rows = (
                AssetFile.objects.for_workspace(workspace_id)
                .filter(version_id=item.version.pk)
                .order_by("path")
                .values_list("path", "size", "sha256")
            )
            for path, size, sha256 in rows.iterator(chunk_size=2000):
                url = (
                    None
                    if item.version.in_place
                    else storage.blob_url(workspace_id, sha256, seconds=STAGING_URL_SECONDS)
                )
                line = {
                    "path": f"{item.folder}/{path}" if item.folder else path,
                    "ref": item.version.ref,
                    "file": path,
                    "size": size,
                    "sha256": sha256,
                    "url": url or f"blobs/{sha256}/",
                }
                yield json.dumps(line).encode() + b"\n"

    response = StreamingHttpResponse(lines(), content_type="application/x-ndjson")
    response["Cache-Control"] = "no-store"
    return response


def blob_response(
    workspace: Workspace, files: QuerySet[AssetFile], sha256: str, *, not_listed: str
) -> HttpResponseBase:
    """The bytes of the file with ``sha256`` among ``files`` (the files of the versions the
    caller stages, scoped to ``workspace``): the store's copy when one of them keeps one,
    else a file registered in place, checked. ``NotFound`` (``not_listed``) when none has it."""
    row = (
        files.filter(sha256=sha256)
        .order_by("version__in_place", "version_id", "path")
        .values_list(
            "size",
            "path",
            "version__in_place",
            "version__prefix",
            "version__asset__name",
            "version__number",
        )
        .first()
    )
    if row is None:
        raise exceptions.NotFound(not_listed)
    size, path, is_in_place, prefix, name, number = row
    if is_in_place:
        return _in_place_blob(workspace, f"{name}@{number}", prefix, path, size, sha256)
    try:
        reader = storage.open_blob(workspace.pk, sha256)
    except FileNotFoundError:
        raise exceptions.NotFound(
            "The store no longer holds this file: `tau data dataset verify` says which "
            "version lost it."
        ) from None
    # FileResponse closes the reader when the response is done.
    response = FileResponse(reader, content_type="application/octet-stream")
    response["Content-Length"] = str(size)
    response["Cache-Control"] = "no-store"
    return response


def _in_place_blob(
    workspace: Workspace, ref: str, prefix: str, path: str, size: int, sha256: str
) -> HttpResponseBase:
    """A file of a version registered in place, read at its prefix: refused, naming it,
    when it is gone or known to have changed (a file not known to be unchanged is read
    whole first), else streamed and checked again as it goes."""
    where = in_place.location(workspace, prefix)
    said = f"{ref}: {path} (registered in place at {where.said})"
    try:
        folder = where.folder()
    except OSError as exc:
        return Response(
            {"detail": f"{said}: {exc.strerror}; the version cannot be read."},
            status=status.HTTP_409_CONFLICT,
        )
    try:
        reader = in_place.read_checked(workspace.pk, folder, path, size, sha256, hash_first=True)
    except FileNotFoundError:
        raise exceptions.NotFound(f"{said} is missing.") from None
    except OSError as exc:
        return Response(
            {"detail": f"{said}: {exc.strerror}; the version cannot be read."},
            status=status.HTTP_409_CONFLICT,
        )

    def chunks() -> Iterator[bytes]:
        with reader:
            try:
                while chunk := reader.read(CHUNK_BYTES):
                    yield chunk
            except OSError as exc:  # changed while it streamed: the body ends short
                logger.warning("%s: %s; its body was cut short", said, exc.strerror)

    response = StreamingHttpResponse(chunks(), content_type="application/octet-stream")
    response["Content-Length"] = str(size)
    response["Cache-Control"] = "no-store"
    return response
