"""The catalog's pages (issue 33): a workspace's datasets and models, one of them with its
versions, and one version with its progress, files and lineage both ways.

The same views serve both kinds (``kind`` set in catalog/urls.py), as the API does. A version
still being ingested or verified is live: its page polls the version's fragment, which
answers 304 after the few queries that find the version when nothing changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.decorators import method_decorator
from django.views.decorators.vary import vary_on_headers
from django.views.generic import TemplateView

from catalog import selectors
from catalog.models import Asset, AssetFile, AssetVersion
from portal import live
from workspaces.access import WorkspaceViewMixin

#: Rows per page: datasets or models, versions of one, files of a version.
ASSETS_PER_PAGE = 50
VERSIONS_PER_PAGE = 100
FILES_PER_PAGE = 200
#: Verification problems a version page lists (the rest are counted).
PROBLEMS_SHOWN = 20
#: A version in these states changes by itself: its page polls.
LIVE_STATES = frozenset({AssetVersion.State.INGESTING, AssetVersion.State.VERIFYING})


@dataclass(frozen=True)
class KindWords:
    """How the pages speak of one kind."""

    kind: str
    plural: str  # "datasets"
    title: str  # "Datasets"


WORDS = {
    Asset.Kind.DATASET: KindWords(kind="dataset", plural="datasets", title="Datasets"),
    Asset.Kind.MODEL: KindWords(kind="model", plural="models", title="Models"),
}


def page_of(rows: QuerySet[Any], request: HttpRequest, per_page: int) -> Page[Any]:
    """The page ``?page=N`` asks for (the nearest one when N is not a page): two queries."""
    return Paginator(rows, per_page).get_page(request.GET.get("page"))


@dataclass(frozen=True)
class VersionRow:
    version: AssetVersion
    aliases: list[str]


class CatalogViewMixin(WorkspaceViewMixin):
    kind: ClassVar[str] = ""

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["words"] = WORDS[Asset.Kind(self.kind)]
        return context


class AssetListView(CatalogViewMixin, TemplateView):
    """The workspace's datasets (or models): each with its newest ready version and aliases."""

    template_name = "catalog/list.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["assets"] = page_of(
            selectors.assets_of(self.workspace, self.kind), self.request, ASSETS_PER_PAGE
        )
        return context


class AssetDetailView(CatalogViewMixin, TemplateView):
    """One dataset (or model): its versions, newest first."""

    template_name = "catalog/detail.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        asset = selectors.asset_or_404(self.workspace, self.kind, kwargs["name"])
        versions = page_of(
            selectors.versions_of(self.workspace, asset), self.request, VERSIONS_PER_PAGE
        )
        context.update(
            {
                "asset": asset,
                "versions": versions,
                "rows": [
                    VersionRow(version, selectors.alias_names(version, asset.latest))  # type: ignore[attr-defined]
                    for version in versions
                ],
            }
        )
        return context


@method_decorator(vary_on_headers("HX-Request"), name="dispatch")  # fragments for htmx
class VersionView(CatalogViewMixin, TemplateView):
    """One version: its state (live while ingesting or verifying), manifest, files by path,
    aliases, metrics, verification, and lineage both ways."""

    template_name = "catalog/version.html"

    def _context(self, asset: Asset, version: AssetVersion, asked: str) -> dict[str, Any]:
        files = page_of(
            AssetFile.objects.for_workspace(self.workspace)
            .filter(version=version)
            .order_by("path")
            .only("path", "size", "sha256", "stored", "received"),
            self.request,
            FILES_PER_PAGE,
        )
        problems = version.verify_problems.splitlines()
        progress = None
        if version.state in LIVE_STATES and version.bytes_total:
            progress = min(100, 100 * version.bytes_done // version.bytes_total)
        return {
            "asset": asset,
            "version": version,
            "asked": asked,
            "aliases": selectors.alias_names(version, asset.latest),  # type: ignore[attr-defined]
            "lineage": selectors.lineage(self.workspace, version),
            "files": files,
            "is_live": version.state in LIVE_STATES,
            "progress": progress,
            "metrics": sorted(version.metrics.items()) if isinstance(version.metrics, dict) else [],
            "problems": problems[:PROBLEMS_SHOWN],
            "problems_more": max(0, len(problems) - PROBLEMS_SHOWN),
        }

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        asset = selectors.asset_or_404(self.workspace, self.kind, kwargs["name"])
        version = selectors.version_or_404(self.workspace, asset, kwargs["version"])
        if not request.headers.get("HX-Request"):
            return self.render_to_response(self._full_context(asset, version, kwargs))
        # The live part polls while the version is being made: what it shows moves with these
        # (and with the page of files asked for, part of the address).
        etag = live.etag(
            "version",
            version.pk,
            version.state,
            version.bytes_done,
            version.bytes_total,
            version.files_count,
            version.manifest_digest,
            version.error,
            request.GET.get("page", ""),
        )
        if live.not_modified(request, etag):
            return live.fragment_response(request, "catalog/version.html#live", {}, etag)
        context = self._full_context(asset, version, kwargs)
        return live.fragment_response(request, "catalog/version.html#live", context, etag)

    def _full_context(
        self, asset: Asset, version: AssetVersion, kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            **self.get_context_data(**kwargs),
            **self._context(asset, version, kwargs["version"]),
        }
