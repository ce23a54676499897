"""The catalog's API (issue 33): a workspace's datasets and models, their versions and each
version's files, read by the workspace's members; researchers make assets, upload versions
(catalog.uploads), verify them and set aliases; a workspace admin deletes an asset.
``{version}`` is a number, an alias or ``latest``; another workspace's assets do not exist
here (404)."""

from __future__ import annotations

import builtins
import dataclasses
import functools
import io
import logging
import re
from collections.abc import Iterator, Mapping
from typing import IO, Any, ClassVar

from django.db import IntegrityError, transaction
from django.db.models import Count, Max, Q, QuerySet
from django.http import HttpResponseBase, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiRequest, OpenApiResponse, extend_schema
from rest_framework import exceptions, status
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.parsers import BaseParser
from rest_framework.request import Request
from rest_framework.response import Response

from catalog import deletion, in_place, storage, tasks, uploads
from catalog.api import staging
from catalog.api.serializers import (
    AliasSerializer,
    AliasSetSerializer,
    AssetCreateSerializer,
    AssetSerializer,
    FileSerializer,
    FilesPageSerializer,
    PieceSerializer,
    StartedSerializer,
    VerifiedSerializer,
    VersionSerializer,
    VersionStartSerializer,
)
from catalog.download import Member, tar_length, tar_stream
from catalog.ingest import CatalogError, asset_named, delete_asset, find_version, set_alias, verify
from catalog.models import (
    AUTOMATIC_ALIASES,
    Asset,
    AssetAlias,
    AssetFile,
    AssetVersion,
    RunInput,
)
from catalog.runs import register_checkpoint, register_from_run
from identity.models import ApiToken
from identity.tokens import token_of
from portal.api import BoundedJSONParser, FileDownloadNegotiation, refusals
from runs import run_tokens
from runs.models import Run
from workspaces.access import WorkspaceScopedViewSet
from workspaces.models import Role

logger = logging.getLogger(__name__)

#: ``Content-Range: bytes <first>-<last>/<size>`` of a piece of a file.
_CONTENT_RANGE = re.compile(r"bytes (\d{1,19})-(\d{1,19})/(\d{1,19}|\*)")


class DeclarationParser(BaseParser):
    """JSON as the API's parser reads it (portal.api.BoundedJSONParser), but from the stream:
    DRF hands its own JSON parser the body through ``request.body``, which Django refuses past
    ``DATA_UPLOAD_MAX_MEMORY_SIZE``; a declaration has a limit of its own
    (``uploads.DECLARATION_BYTES``: the route's, catalog.apps, is the streamed form's)."""

    media_type = "application/json"

    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        limit = uploads.DECLARATION_BYTES
        request = (parser_context or {}).get("request")
        if int(getattr(request, "META", {}).get("CONTENT_LENGTH") or 0) > limit:
            raise DeclarationTooLarge()  # unread
        body = stream.read(limit + 1)
        if len(body) > limit:
            raise DeclarationTooLarge()
        return BoundedJSONParser().parse(io.BytesIO(body), media_type, parser_context)


class DeclarationTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = (
        f"A declaration sent as one JSON body is at most {uploads.DECLARATION_BYTES // 2**20} "
        f"MiB (about 400,000 files): stream it as JSON lines ({uploads.STREAMED_DECLARATION}; "
        "docs/data.md)."
    )


class StreamedDeclarationParser(BaseParser):
    """A declaration streamed as JSON lines (catalog.uploads): its first line read here, the
    files' lines left in the stream, read one at a time by ``uploads.start_streamed_upload``
    (never ``request.body``, which would hold the whole body in memory)."""

    media_type = uploads.STREAMED_DECLARATION

    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        try:
            header = uploads.read_declaration_header(stream)
        except CatalogError as exc:
            raise exceptions.ParseError(str(exc)) from exc
        return {
            "source": header.get("source"),
            "streamed": StreamedDeclaration(header, uploads.declaration_lines(stream)),
        }


@dataclasses.dataclass(frozen=True)
class StreamedDeclaration:
    header: dict[str, Any]
    lines: Iterator[bytes]


class FilesPagination(LimitOffsetPagination):
    """A version's files by path, ``limit`` (at most 1,000) at a time from ``offset``."""

    default_limit = 200
    max_limit = 1000


def asset_fields(asset: Asset) -> dict[str, Any]:
    return {
        "name": asset.name,
        "kind": asset.kind,
        "description": asset.description,
        "created_at": asset.created_at,
        "versions_count": getattr(asset, "versions_count", 0),
        "latest": getattr(asset, "latest", None),
        "aliases": {alias.name: alias.version.number for alias in asset.aliases.all()},
    }


def version_fields(version: AssetVersion) -> dict[str, Any]:
    return {
        "number": version.number,
        "ref": f"{version.asset.name}@{version.number}",
        "state": version.state,
        "source": version.source,
        "source_detail": version.source_detail,
        "in_place": version.in_place,
        "prefix": version.prefix if version.in_place else None,
        "manifest_digest": version.manifest_digest,
        "files_count": version.files_count,
        "bytes": version.bytes,
        "progress": {"bytes_done": version.bytes_done, "bytes_total": version.bytes_total},
        "error": version.error,
        "derived_from": [
            f"{parent.asset.name}@{parent.number}" for parent in version.derived_from.all()
        ],
        "produced_by": version.produced_by.name if version.produced_by else None,
        "aliases": sorted(alias.name for alias in version.aliases.all()),
        "metrics": version.metrics,
        "created_at": version.created_at,
        "ready_at": version.ready_at,
        "deleted_at": version.deleted_at,
    }


class AssetViewSet(WorkspaceScopedViewSet):
    kind: ClassVar[str]
    base_queryset = Asset.objects.all()

    def get_base_queryset(self) -> QuerySet[Any]:
        return (
            Asset.objects.filter(kind=self.kind)
            .annotate(
                versions_count=Count("versions", distinct=True),
                latest=Max("versions__number", filter=Q(versions__state="ready")),
            )
            .prefetch_related("aliases__version")
            .order_by("name")
        )

    def _asset(self) -> Asset:
        name = self.kwargs["name"]
        asset: Asset | None = (
            None if "\x00" in name else self.get_queryset().filter(name=name).first()
        )
        if asset is None:
            raise exceptions.NotFound(f"This workspace has no {self.kind} named {name!r}.")
        return asset

    def _versions(self, asset: Asset) -> QuerySet[AssetVersion]:
        return (
            AssetVersion.objects.for_workspace(self.workspace)
            .filter(asset=asset)
            .select_related("asset", "produced_by")
            .prefetch_related("derived_from__asset", "aliases")
        )

    def _version(self, asset: Asset) -> AssetVersion:
        ref = self.kwargs["version"]
        found = find_version(self.workspace, asset, ref, self._versions(asset))
        if found is None:
            raise exceptions.NotFound(f"{asset.name} has no version {ref!r}.")
        return found

    @extend_schema(responses={200: AssetSerializer(many=True), **refusals()})
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(AssetSerializer(map(asset_fields, self.get_queryset()), many=True).data)

    @extend_schema(responses={200: AssetSerializer, **refusals()})
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(AssetSerializer(asset_fields(self._asset())).data)

    @extend_schema(responses={200: VersionSerializer(many=True), **refusals()})
    def versions(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        rows = self._versions(self._asset()).order_by("-number")
        return Response(VersionSerializer(map(version_fields, rows), many=True).data)

    @extend_schema(responses={200: VersionSerializer, **refusals()})
    def version(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(VersionSerializer(version_fields(self._version(self._asset()))).data)

    @extend_schema(
        parameters=[
            OpenApiParameter("limit", int, description="Files per page: 1 to 1,000 (200)."),
            OpenApiParameter("offset", int, description="Files to skip, by path."),
        ],
        responses={200: FilesPageSerializer, **refusals()},
    )
    def files(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        version = self._version(self._asset())
        rows = AssetFile.objects.for_workspace(self.workspace).filter(version=version)
        if request.query_params.get("missing") in ("1", "true"):
            rows = rows.filter(stored=False)
        paginator = FilesPagination()
        page = paginator.paginate_queryset(
            rows.order_by("path").values("path", "size", "sha256", "stored", "received"),
            request,
            view=self,
        )
        return paginator.get_paginated_response(FileSerializer(page, many=True).data)

    # --- writes ---------------------------------------------------------------------------

    def get_serializer_class(self) -> type[Any]:
        # What OPTIONS describes (DRF's metadata) for each write.
        return {
            "create": AssetCreateSerializer,
            "start_version": VersionStartSerializer,
            "set_alias": AliasSetSerializer,
        }.get(self.action or "", AssetSerializer)

    def get_object(self) -> Any:
        # OPTIONS asks for the object a PUT would change: the asset named in the URL.
        return self._asset()

    def get_parsers(self) -> builtins.list[BaseParser]:
        request = getattr(self, "request", None)  # None while the schema is generated
        method = (getattr(request, "method", None) or "").lower()
        if getattr(self, "action_map", {}).get(method) == "start_version":
            return [DeclarationParser(), StreamedDeclarationParser()]
        return super().get_parsers()

    def write_role_for(self, request: Request) -> Role:
        # Deleting a dataset or model, or a version's files, is the workspace admin's call.
        if request.method == "DELETE" and "alias" not in self.kwargs:
            return Role.ADMIN
        return self.write_role

    @extend_schema(
        request=AssetCreateSerializer,
        responses={201: AssetSerializer, **refusals(400, 409)},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        body = AssetCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        name = body.validated_data["name"]
        if self.get_queryset().filter(name=name).exists():
            return Response(
                {"detail": f"This workspace has a {self.kind} named {name!r} already."},
                status=status.HTTP_409_CONFLICT,
            )
        try:
            with transaction.atomic():
                asset = asset_named(self.workspace, self.kind, name, user=request.user)
        except CatalogError as exc:
            raise exceptions.ValidationError({"name": [str(exc)]}) from exc
        except IntegrityError:
            return Response(
                {"detail": f"This workspace has a {self.kind} named {name!r} already."},
                status=status.HTTP_409_CONFLICT,
            )
        asset.description = body.validated_data.get("description", "")
        asset.save(update_fields=["description"])
        created = self.get_queryset().get(pk=asset.pk)
        return Response(AssetSerializer(asset_fields(created)).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request=None,
        responses={
            204: None,
            **refusals(
                409,
                words={
                    409: "Also: a run read one of its versions, or an endpoint's record "
                    "names one (the model version it serves)."
                },
            ),
        },
    )
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        try:
            delete_asset(self._asset())
        except CatalogError as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        description="Starts a version. An upload declares its files here, as one JSON body "
        "(`files`, up to 64 MiB) or, for any number up to TAU_DATA_MAX_FILES, streamed as JSON "
        f"lines (`{uploads.STREAMED_DECLARATION}`, with a Content-Length): a first line "
        '`{"source": "upload", "files_count": N}`, then one line per file, '
        '`{"path": …, "size": …, "sha256": …}`, sorted by path (by Unicode code point). '
        "The stream is read a line at a time; a refused line is named by its number, and "
        "nothing is kept of a refused declaration. Either form of the same files gives the "
        "same manifest digest and, while that upload is unfinished, the same version (200).",
        request={
            "application/json": VersionStartSerializer,
            uploads.STREAMED_DECLARATION: OpenApiTypes.BINARY,
        },
        responses={
            200: StartedSerializer,
            201: StartedSerializer,
            **refusals(
                400,
                411,
                413,
                words={
                    400: "Also: a declared file is refused (named; by its line when streamed).",
                    411: "Also: a streamed declaration sent without a Content-Length.",
                    413: "Also: a declaration as one JSON body over 64 MiB (stream it).",
                },
            ),
        },
    )
    def start_version(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        if request.data.get("source") == "checkpoint":
            # Made if new, as `tau data model register` makes it, but only once the
            # checkpoint is found: a refused one leaves no empty model behind.
            return self._register_checkpoint(request)
        asset = self._asset()
        streamed = request.data.get("streamed")
        if isinstance(streamed, StreamedDeclaration):
            try:
                version, created = uploads.start_streamed_upload(
                    asset, streamed.header, streamed.lines, user=request.user
                )
            except CatalogError as exc:
                raise exceptions.ValidationError({"files": [str(exc)]}) from exc
            return Response(
                self._started(version),
                status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
            )
        if request.content_type.startswith(uploads.STREAMED_DECLARATION):
            # DRF reads no body without a length: chunked, or empty.
            if not request.META.get("CONTENT_LENGTH"):
                return Response(
                    {"detail": "Send a streamed declaration with its Content-Length."},
                    status=status.HTTP_411_LENGTH_REQUIRED,
                )
            raise exceptions.ParseError(
                'An empty declaration: line 1 is {"source": "upload", "files_count": N}, then a '
                "line per file."
            )
        source = request.data.get("source")
        if source == "run":
            return self._register_from_run(asset, request)
        if source == "url":
            return self._ingest_url(asset, request)
        if source == "prefix":
            return self._ingest_prefix(asset, request)
        if source != "upload":
            raise exceptions.ValidationError(
                {
                    "source": [
                        f"{source!r} is not a source here: declare the files of an 'upload', "
                        "give the 'url' of a file, name a 'prefix' of the workspace's folder, "
                        "name a 'run' and the path of its artifacts, or a run whose "
                        "'checkpoint' becomes the version."
                    ]
                }
            )
        files = request.data.get("files")
        if not isinstance(files, list):
            raise exceptions.ValidationError({"files": ["A list of {path, size, sha256}."]})
        try:
            version, created = uploads.start_upload(asset, files, user=request.user)
        except CatalogError as exc:
            raise exceptions.ValidationError({"files": [str(exc)]}) from exc
        return Response(
            self._started(version),
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )

    def _ingest_url(self, asset: Asset, request: Request) -> Response:
        url, path = request.data.get("url"), request.data.get("path")
        if not isinstance(url, str) or not url:
            raise exceptions.ValidationError({"url": ["The file's URL, https://…"]})
        if path is not None and not isinstance(path, str):
            raise exceptions.ValidationError({"path": ["Where the file goes in the version."]})
        try:
            version = tasks.start_url_ingest(asset, url, path=path or None, user=request.user)
        except CatalogError as exc:
            raise exceptions.ValidationError({"url": [str(exc)]}) from exc
        return Response(self._started(version), status=status.HTTP_201_CREATED)

    def _ingest_prefix(self, asset: Asset, request: Request) -> Response:
        prefix = request.data.get("prefix")
        if not isinstance(prefix, str) or len(prefix) > 1024:
            raise exceptions.ValidationError(
                {"prefix": ["A folder of the workspace's own, e.g. raw/2026-11 ('' is all of it)."]}
            )
        try:
            version = tasks.start_prefix_ingest(asset, prefix, user=request.user)
        except CatalogError as exc:
            raise exceptions.ValidationError({"prefix": [str(exc)]}) from exc
        return Response(self._started(version), status=status.HTTP_201_CREATED)

    def _register_from_run(self, asset: Asset, request: Request) -> Response:
        path = request.data.get("path")
        if not isinstance(path, str) or not path.strip("/"):
            raise exceptions.ValidationError(
                {"path": ["Name the path of its artifacts that becomes the version (model/)."]}
            )
        run = self._named_run(request)
        try:
            version = register_from_run(asset, run, path, user=request.user)
        except CatalogError as exc:
            raise exceptions.ValidationError({"detail": str(exc)}) from exc
        if version.state != AssetVersion.State.READY:
            raise exceptions.ValidationError({"detail": f"{version.ref} failed: {version.error}"})
        return Response(self._started(version), status=status.HTTP_201_CREATED)

    def _register_checkpoint(self, request: Request) -> Response:
        step = request.data.get("step")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            raise exceptions.ValidationError(
                {"step": ["A checkpoint's step, a whole number (none: the newest complete one)."]}
            )
        run = self._named_run(request)
        try:
            version = register_checkpoint(
                run, kind=self.kind, name=self.kwargs["name"], step=step, user=request.user
            )
        except CatalogError as exc:
            raise exceptions.ValidationError({"detail": str(exc)}) from exc
        if version.state != AssetVersion.State.READY:
            raise exceptions.ValidationError({"detail": f"{version.ref} failed: {version.error}"})
        return Response(self._started(version), status=status.HTTP_201_CREATED)

    def _named_run(self, request: Request) -> Run:
        """The workspace's run the body's ``run`` names (another workspace's is not there)."""
        name = request.data.get("run")
        if not isinstance(name, str) or not name:
            raise exceptions.ValidationError({"run": ["Name the run (its full name)."]})
        run = (
            None
            if "\x00" in name
            else Run.objects.for_workspace(self.workspace).filter(name=name).first()
        )
        if run is None:
            raise exceptions.ValidationError({"run": [f"This workspace has no run {name!r}."]})
        return run

    @extend_schema(
        parameters=[
            OpenApiParameter("metric", str, required=True, description="A metric's name."),
            OpenApiParameter(
                "mode", str, enum=["min", "max"], description="The smallest value or the largest."
            ),
        ],
        responses={
            200: VersionSerializer,
            **refusals(400, words={404: "Also: no ready version recorded that metric."}),
        },
    )
    def best(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        asset = self._asset()
        metric = request.query_params.get("metric") or ""
        mode = request.query_params.get("mode") or "min"
        if not metric or "\x00" in metric or len(metric) > 200:
            raise exceptions.ValidationError({"metric": ["Name a metric: ?metric=val_loss."]})
        if mode not in ("min", "max"):
            raise exceptions.ValidationError({"mode": ["min or max."]})
        ready = self._versions(asset).filter(state=AssetVersion.State.READY)
        scored = [
            (float(version.metrics[metric]), version)
            for version in ready
            if isinstance(version.metrics.get(metric), int | float)
        ]
        if not scored:
            raise exceptions.NotFound(f"No ready version of {asset.name} recorded {metric!r}.")
        # The best value; among equals, the newest version.
        sign = 1 if mode == "min" else -1
        _, found = min(scored, key=lambda pair: (sign * pair[0], -pair[1].number))
        return Response(VersionSerializer(version_fields(found)).data)

    def _started(self, version: AssetVersion) -> dict[str, Any]:
        fresh = self._versions(version.asset).get(pk=version.pk)
        missing = (
            AssetFile.objects.for_workspace(self.workspace)
            .filter(version=fresh, stored=False)
            .count()
        )
        return dict(StartedSerializer({**version_fields(fresh), "files_missing": missing}).data)

    @extend_schema(
        request=OpenApiRequest(OpenApiTypes.BINARY),
        parameters=[
            OpenApiParameter(
                "Content-Range",
                str,
                OpenApiParameter.HEADER,
                description="`bytes <first>-<last>/<size>` for a piece of the file; without "
                "it the body is the whole file.",
            )
        ],
        responses={
            200: PieceSerializer,
            **refusals(
                400,
                409,
                411,
                413,
                503,
                words={
                    400: "Also: the file's bytes did not match its declared SHA-256 (send it "
                    "again from its first byte; `received` says 0).",
                    409: "Also: the piece does not start where the file's bytes end "
                    "(`received` says where), or the version takes no more files.",
                },
            ),
        },
    )
    def put_file(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        version = self._version(self._asset())
        path = self.kwargs["file_path"]
        try:
            length = int(request.META.get("CONTENT_LENGTH") or "")
        except ValueError:
            return Response(
                {"detail": "Send the piece with a Content-Length."},
                status=status.HTTP_411_LENGTH_REQUIRED,
            )
        start, total = 0, None
        if "HTTP_CONTENT_RANGE" in request.META:
            found = _CONTENT_RANGE.fullmatch(request.META["HTTP_CONTENT_RANGE"].strip())
            if found is None:
                raise exceptions.ValidationError(
                    {"detail": "Content-Range is `bytes <first>-<last>/<size>`."}
                )
            start, last = int(found.group(1)), int(found.group(2))
            total = None if found.group(3) == "*" else int(found.group(3))
            if last - start + 1 != length:
                raise exceptions.ValidationError(
                    {
                        "detail": f"Content-Range says {last - start + 1:,} bytes, the body "
                        f"{length:,}."
                    }
                )
        body = request.stream
        try:
            result = uploads.receive(
                version,
                path,
                body if body is not None else io.BytesIO(),
                length=length,
                start=start,
                total=total,
            )
        except uploads.NotDeclared as exc:
            raise exceptions.NotFound(str(exc)) from exc
        except uploads.TooLarge as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
        except uploads.OutOfOrder as exc:
            return Response(
                {"detail": str(exc), "received": exc.received}, status=status.HTTP_409_CONFLICT
            )
        except uploads.NotReceiving as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        except CatalogError as exc:
            raise exceptions.ValidationError({"detail": str(exc)}) from exc
        except storage.StorageError as exc:
            # The bytes are on the portal's disk; the same request again keeps them.
            return Response(
                {
                    "detail": f"{path} arrived whole but could not be kept: {exc.strerror}. "
                    "Send the same request again; no byte needs sending twice."
                },
                status=status.HTTP_503_SERVICE_UNAVAILABLE,
            )
        if result.mismatch:
            return Response(
                {"detail": result.mismatch, "received": 0}, status=status.HTTP_400_BAD_REQUEST
            )
        state = (
            AssetVersion.objects.for_workspace(self.workspace)
            .filter(pk=version.pk)
            .values_list("state", flat=True)
            .get()
        )
        row = result.file
        return Response(
            PieceSerializer(
                {
                    "path": row.path,
                    "size": row.size,
                    "received": row.received,
                    "stored": row.stored,
                    "version_state": state,
                }
            ).data
        )

    @extend_schema(
        responses={
            200: VersionSerializer,
            204: None,
            **refusals(
                409,
                words={
                    409: "Also: the version is being ingested, or deleted; or an endpoint's "
                    "record names it (the model version it serves)."
                },
            ),
        }
    )
    def delete_version(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Delete a version's files. Gone whole (204) when no record names it; kept as a
        record (200, state ``deleted``, its manifest still listed) when a run read or made it
        or a version was made from it; refused (409) while an endpoint's record names it. The
        blobs no other version holds leave the store."""
        version = self._version(self._asset())
        try:
            gone = deletion.delete_version(version, user=request.user)
        except CatalogError as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        if gone:
            return Response(status=status.HTTP_204_NO_CONTENT)
        return Response(VersionSerializer(version_fields(self._version(self._asset()))).data)

    @extend_schema(request=None, responses={200: VerifiedSerializer, **refusals(409)})
    def verify(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        version = self._version(self._asset())
        if version.state != AssetVersion.State.READY:
            return Response(
                {"detail": f"{version.ref} is {version.state}: only a ready version is verified."},
                status=status.HTTP_409_CONFLICT,
            )
        problems = verify(version)
        return Response(
            VerifiedSerializer(
                {"ok": not problems, "problems": problems, "verified_at": version.verified_at}
            ).data
        )

    @extend_schema(request=AliasSetSerializer, responses={200: AliasSerializer, **refusals(400)})
    def set_alias(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        asset = self._asset()
        body = AliasSetSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        ref = body.validated_data["version"]
        version = find_version(self.workspace, asset, ref)
        if version is None:
            raise exceptions.ValidationError({"version": [f"{asset.name} has no version {ref!r}."]})
        try:
            alias = set_alias(version, self.kwargs["alias"], user=request.user)
        except CatalogError as exc:
            raise exceptions.ValidationError({"detail": str(exc)}) from exc
        return Response(AliasSerializer({"alias": alias.name, "version": version.number}).data)

    @extend_schema(request=None, responses={204: None, **refusals(400)})
    def delete_alias(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        asset = self._asset()
        name = self.kwargs["alias"]
        if name in AUTOMATIC_ALIASES:
            raise exceptions.ValidationError(
                {"detail": f"{name!r} is kept by the catalog; it cannot be removed."}
            )
        removed, _ = (
            AssetAlias.objects.for_workspace(self.workspace).filter(asset=asset, name=name).delete()
        )
        if not removed:
            raise exceptions.NotFound(f"{asset.name} has no alias {name!r}.")
        return Response(status=status.HTTP_204_NO_CONTENT)


class DatasetViewSet(AssetViewSet):
    """A workspace's datasets: each with its versions, aliases and files."""

    kind = Asset.Kind.DATASET


class ModelViewSet(AssetViewSet):
    """A workspace's models: each with its versions, aliases and files."""

    kind = Asset.Kind.MODEL


class VersionDownloadViewSet(AssetViewSet):
    """A version's files as one tar (catalog.download)."""

    content_negotiation_class = FileDownloadNegotiation

    @extend_schema(
        responses={
            (200, "application/x-tar"): OpenApiResponse(
                OpenApiTypes.BINARY,
                description="Every file of the version, by path, as an uncompressed tar; "
                "`X-Manifest-Digest` is the version's manifest digest.",
            ),
            **refusals(409, words={409: "Also: the version is not ready."}),
        }
    )
    def download(self, request: Request, *args: Any, **kwargs: Any) -> HttpResponseBase:
        version = self._version(self._asset())
        if version.state != AssetVersion.State.READY:
            return Response(
                {"detail": f"{version.ref} is {version.state}: only a ready version downloads."},
                status=status.HTTP_409_CONFLICT,
            )
        rows = (
            AssetFile.objects.for_workspace(self.workspace)
            .filter(version=version)
            .order_by("path")
            .values_list("path", "size", "sha256")
        )
        if version.in_place:
            try:
                members = self._in_place_members(version, list(rows))
            except in_place.ChangedInPlace as exc:
                return Response(
                    {
                        "detail": f"{version.ref} is registered in place at {version.prefix or '.'}"
                        f": {exc.strerror}. `tau data dataset verify {version.ref}` says what "
                        "changed."
                    },
                    status=status.HTTP_409_CONFLICT,
                )
        else:
            members = [
                Member(path, size, functools.partial(storage.open_blob, self.workspace.pk, sha256))
                for path, size, sha256 in rows
            ]
        mtime = version.ready_at.timestamp() if version.ready_at else 0
        response = StreamingHttpResponse(
            tar_stream(members, mtime), content_type="application/x-tar"
        )
        response["Content-Length"] = str(tar_length(members, mtime))
        response["Content-Disposition"] = (
            f'attachment; filename="{version.asset.name}-{version.number}.tar"'
        )
        response["X-Manifest-Digest"] = version.manifest_digest
        return response

    def _in_place_members(
        self, version: AssetVersion, rows: builtins.list[tuple[str, int, str]]
    ) -> builtins.list[Member]:
        """The files read where they live, each checked as it streams; ChangedInPlace
        (naming the file) when one is plainly not as registered before the first byte."""
        try:
            folder = in_place.location(self.workspace, version.prefix).folder()
        except OSError as exc:
            raise in_place.ChangedInPlace(str(exc.strerror)) from None
        members = []
        for path, size, sha256 in rows:
            wrong = in_place.unreadable(folder, path, size)
            if wrong is not None:
                raise in_place.ChangedInPlace(f"{path} is {wrong}")
            opener = functools.partial(
                in_place.read_checked, self.workspace.pk, folder, path, size, sha256
            )
            members.append(Member(path, size, opener))
        return members


class DatasetDownloadViewSet(VersionDownloadViewSet):
    kind = Asset.Kind.DATASET


class ModelDownloadViewSet(VersionDownloadViewSet):
    kind = Asset.Kind.MODEL


class RunDataViewSet(WorkspaceScopedViewSet):
    """The files a run was pinned to read, for a cluster's stager (its run token) and the
    workspace's members: ``data/`` lists them, ``data/blobs/{sha256}/`` answers one's bytes
    (``catalog.api.staging``, which lists an endpoint's model the same way). A run token
    reaches its own run only; a blob only if the run reads it."""

    accepts_run_tokens = True
    base_queryset = Run.objects.all()
    content_negotiation_class = FileDownloadNegotiation

    def _run(self) -> Run:
        name = self.kwargs["run_name"]
        run = (
            None
            if "\x00" in name
            else Run.objects.for_workspace(self.workspace).filter(name=name).first()
        )
        token = token_of(self.request)
        if run is None or (
            token is not None
            and token.kind == ApiToken.Kind.RUN
            and run_tokens.run_id_of(token) != run.pk
        ):
            raise exceptions.NotFound("No such run.")
        return run

    @extend_schema(
        responses={
            (200, "application/x-ndjson"): OpenApiResponse(
                OpenApiTypes.BINARY,
                description="JSON lines: first `{files, bytes, datasets: [{ref, path, "
                "manifest_digest}]}`, " + staging.LISTING_LINES + " `path` is under "
                "TAU_DATA_DIR: the dataset's folder, then the file's path in its version.",
            ),
            **refusals(),
        }
    )
    def listing(self, request: Request, *args: Any, **kwargs: Any) -> HttpResponseBase:
        run = self._run()
        plan = RunInput.objects.for_workspace(self.workspace).filter(run=run).order_by("path")
        inputs = list(plan.select_related("version__asset"))
        datasets = [
            {
                "ref": item.version.ref,
                "path": item.path,
                "manifest_digest": item.version.manifest_digest,
            }
            for item in inputs
        ]
        return staging.listing_response(
            self.workspace.pk,
            [staging.Staged(item.version, item.path) for item in inputs],
            {"datasets": datasets},
        )

    @extend_schema(
        responses={
            (200, "application/octet-stream"): staging.BLOB_RESPONSE,
            **refusals(
                409,
                words={
                    404: "Also: the run reads no such file, or it is gone.",
                    409: "Also: the file of a version registered in place changed since (named).",
                },
            ),
        }
    )
    def blob(self, request: Request, *args: Any, **kwargs: Any) -> HttpResponseBase:
        run = self._run()
        return staging.blob_response(
            self.workspace,
            AssetFile.objects.for_workspace(self.workspace).filter(version__readers__run=run),
            kwargs["sha256"],
            not_listed="This run reads no file with that SHA-256.",
        )
