"""Reads of the catalog for its pages and the run page, each scoped to one workspace and each
one query (or a fixed few) however many rows there are: a page's query count is part of its
contract (tests/datasets/test_pages.py pins them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, Max, OuterRef, Prefetch, Q, QuerySet, Subquery
from django.http import Http404

from catalog.ingest import find_version
from catalog.models import AUTOMATIC_ALIASES, Asset, AssetAlias, AssetVersion, RunInput
from runs.models import EventKind, Run, RunEvent

#: How many runs that read a version, and versions made from it, its page names.
LINEAGE_SHOWN = 50


def _annotated_assets(workspace: Any, kind: str) -> QuerySet[Asset]:
    """The workspace's datasets or models, each with ``versions_count``, ``latest`` (the
    newest ready version's number), that version's ``latest_files`` and ``latest_bytes``, and
    ``updated_at`` (its newest version's creation)."""
    newest_ready = (
        AssetVersion.objects.for_workspace(workspace)
        .filter(asset=OuterRef("pk"), state=AssetVersion.State.READY)
        .order_by("-number")
    )
    return (
        Asset.objects.for_workspace(workspace)
        .filter(kind=kind)
        .annotate(
            versions_count=Count("versions", distinct=True),
            latest=Max("versions__number", filter=Q(versions__state=AssetVersion.State.READY)),
            updated_at=Max("versions__created_at"),
            latest_files=Subquery(newest_ready.values("files_count")[:1]),
            latest_bytes=Subquery(newest_ready.values("bytes")[:1]),
        )
    )


def assets_of(workspace: Any, kind: str) -> QuerySet[Asset]:
    """The workspace's datasets or models by name, annotated (:func:`_annotated_assets`), with
    their aliases and the versions they name."""
    return (
        _annotated_assets(workspace, kind)
        .prefetch_related(
            Prefetch(
                "aliases",
                queryset=AssetAlias.objects.for_workspace(workspace)
                .select_related("version")
                .order_by("name"),
            )
        )
        .order_by("name")
    )


def asset_or_404(workspace: Any, kind: str, name: str) -> Asset:
    """The workspace's dataset or model ``name`` (annotated: :func:`_annotated_assets`), or
    404: another workspace's is as missing as one that was never made."""
    asset = None if "\x00" in name else _annotated_assets(workspace, kind).filter(name=name).first()
    if asset is None:
        raise Http404(f"This workspace has no {kind} named {name!r}.")
    return asset


def versions_of(workspace: Any, asset: Asset) -> QuerySet[AssetVersion]:
    """The asset's versions, newest first, with the run that made each and their aliases."""
    return (
        AssetVersion.objects.for_workspace(workspace)
        .filter(asset=asset)
        .select_related("asset", "produced_by")
        .prefetch_related(
            Prefetch(
                "aliases", queryset=AssetAlias.objects.for_workspace(workspace).order_by("name")
            )
        )
        .order_by("-number")
    )


def version_or_404(workspace: Any, asset: Asset, ref: str) -> AssetVersion:
    """The version ``ref`` names (a number, an alias or ``latest``: the newest ready one), in
    any state, or 404."""
    # Its aliases are read when the page is drawn, not for a poll that finds nothing changed.
    versions = (
        AssetVersion.objects.for_workspace(workspace)
        .filter(asset=asset)
        .select_related("asset", "produced_by", "deleted_by")
    )
    version = find_version(workspace, asset, ref, versions)
    if version is None:
        raise Http404(f"{asset.name} has no version {ref!r}.")
    return version


@dataclass(frozen=True)
class Lineage:
    """Where a version came from and what came of it."""

    #: The versions it was made from (``derived_from``).
    made_from: list[AssetVersion]
    #: The versions made from it (``derivatives``), newest first, at most LINEAGE_SHOWN.
    made_into: list[AssetVersion]
    #: The runs that read it (their RunInput rows, with the run), newest first, at most
    #: LINEAGE_SHOWN.
    read_by: list[RunInput]
    #: Whether either list above was cut.
    more_made_into: bool
    more_read_by: bool


def lineage(workspace: Any, version: AssetVersion) -> Lineage:
    """Three queries, whatever the counts."""
    versions = AssetVersion.objects.for_workspace(workspace).select_related("asset")
    made_from = list(
        versions.filter(derivatives=version).order_by("asset__kind", "asset__name", "-number")
    )
    made_into = list(
        versions.filter(derived_from=version).order_by("-created_at", "-id")[: LINEAGE_SHOWN + 1]
    )
    read_by = list(
        RunInput.objects.for_workspace(workspace)
        .filter(version=version)
        .select_related("run")
        .order_by("-run__created_at", "-run_id", "path")[: LINEAGE_SHOWN + 1]
    )
    return Lineage(
        made_from=made_from,
        made_into=made_into[:LINEAGE_SHOWN],
        read_by=read_by[:LINEAGE_SHOWN],
        more_made_into=len(made_into) > LINEAGE_SHOWN,
        more_read_by=len(read_by) > LINEAGE_SHOWN,
    )


def alias_names(version: AssetVersion, latest: int | None) -> list[str]:
    """The version's aliases by name (prefetched), ``latest`` first when it is the newest
    ready one."""
    names = [alias.name for alias in version.aliases.all()]
    if latest is not None and version.number == latest:
        names = [*sorted(AUTOMATIC_ALIASES), *names]
    return names


@dataclass(frozen=True)
class RunData:
    """What a run read (its pinned dataset versions, where it saw each) and what it made."""

    read: list[RunInput]
    made: list[AssetVersion]
    #: Each attempt's staging of what it read, as recorded: ``{attempt, files, bytes, seconds}``.
    staged: list[dict[str, Any]] = field(default_factory=list)


def run_data(run: Run) -> RunData | None:
    """The run page's Data section (None: the run read and made nothing); three queries."""
    read = list(
        RunInput.objects.for_workspace(run.workspace_id)
        .filter(run=run)
        .select_related("version__asset")
        .order_by("path")
    )
    made = list(
        AssetVersion.objects.for_workspace(run.workspace_id)
        .filter(produced_by=run)
        .select_related("asset")
        .order_by("asset__kind", "asset__name", "number")
    )
    if not read and not made:
        return None
    staged = [
        data
        for data in RunEvent.objects.for_workspace(run.workspace_id)
        .filter(run=run, kind=EventKind.DATA_STAGED)
        .order_by("seq")
        .values_list("data", flat=True)
        if isinstance(data, dict)
    ]
    return RunData(read=read, made=made, staged=staged)
