"""The catalog's read API (issue 33): a workspace's datasets and models, their versions and
each version's files, for the workspace's members. ``{version}`` is a number, an alias or
``latest``; another workspace's assets do not exist here (404)."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db.models import Count, Max, Q, QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request
from rest_framework.response import Response

from catalog.api.serializers import (
    AssetSerializer,
    FileSerializer,
    FilesPageSerializer,
    VersionSerializer,
)
from catalog.ingest import find_version
from catalog.models import Asset, AssetFile, AssetVersion
from portal.api import refusals
from workspaces.access import WorkspaceScopedViewSet


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
        "created_at": version.created_at,
        "ready_at": version.ready_at,
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
        rows = (
            AssetFile.objects.for_workspace(self.workspace)
            .filter(version=version)
            .order_by("path")
            .values("path", "size", "sha256")
        )
        paginator = FilesPagination()
        page = paginator.paginate_queryset(rows, request, view=self)
        return paginator.get_paginated_response(FileSerializer(page, many=True).data)


class DatasetViewSet(AssetViewSet):
    """A workspace's datasets: each with its versions, aliases and files."""

    kind = Asset.Kind.DATASET


class ModelViewSet(AssetViewSet):
    """A workspace's models: each with its versions, aliases and files."""

    kind = Asset.Kind.MODEL
