"""Versions from folders, their verification, aliases and references (issue 33).

:func:`ingest_folder` makes the next version of a dataset or a model from a folder the portal
can read (a run's output, a finished upload, a registered folder): every file is copied into
the workspace's store once, hashed as it is read, then the stored copies are checked and the
version becomes ``ready`` with its manifest in one transaction — or ``failed`` with the file
named, and nothing of it ``ready``. :func:`resolve` turns ``wiki``, ``wiki@3`` or
``wiki@train`` into a ready version.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Max, Model, ProtectedError, QuerySet
from django.utils import timezone

from catalog import in_place, storage
from catalog.models import (
    AUTOMATIC_ALIASES,
    Asset,
    AssetAlias,
    AssetFile,
    AssetVersion,
    RunInput,
    validate_name,
)
from runs.models import MetricPoint
from tau.manifest import MAX_FILES, Entry, Manifest, ManifestError, list_files

logger = logging.getLogger(__name__)

#: How often an ingest's progress is written while it copies (seconds).
PROGRESS_SECONDS = 1.0


class CatalogError(ValueError):
    """A reference or a change the catalog refuses; the message says what to do instead."""


def asset_named(workspace: Any, kind: str, name: str, *, user: Any = None) -> Asset:
    """The workspace's dataset or model ``name``, made if it is new."""
    try:
        validate_name(name)
    except ValidationError as exc:
        raise CatalogError(exc.messages[0]) from exc
    asset, _ = Asset.objects.for_workspace(workspace).get_or_create(
        workspace=workspace, kind=kind, name=name, defaults={"created_by": user}
    )
    return asset


def lock_asset(asset: Asset) -> None:
    """Hold the asset's row until the transaction ends: one new version at a time."""
    Asset.objects.for_workspace(asset.workspace_id).select_for_update().get(pk=asset.pk)


def create_version(asset: Asset, **fields: Any) -> AssetVersion:
    """The asset's next version; call inside a transaction that holds :func:`lock_asset`."""
    last = (
        AssetVersion.objects.for_workspace(asset.workspace_id)
        .filter(asset=asset)
        .aggregate(last=Max("number"))["last"]
    )
    return AssetVersion.objects.create(asset=asset, number=(last or 0) + 1, **fields)


def _new_version(asset: Asset, **fields: Any) -> AssetVersion:
    """The asset's next number, taken under a lock on the asset's row."""
    with transaction.atomic():
        lock_asset(asset)
        return create_version(asset, **fields)


def ingest_folder(
    asset: Asset,
    folder: Path,
    *,
    source: str,
    source_detail: str = "",
    user: Any = None,
    produced_by: Any = None,
    derived_from: Iterable[AssetVersion] = (),
    max_files: int = MAX_FILES,
    max_file_bytes: int | None = None,
) -> AssetVersion:
    """The asset's next version, made of the files under ``folder`` (module docstring).
    Returns it ``ready``, or ``failed`` with ``error`` naming the file."""
    return ingest_files(
        asset,
        lambda: [
            (item.path, item.absolute, item.size)
            for item in list_files(folder, max_files=max_files, max_file_bytes=max_file_bytes)
        ],
        source=source,
        source_detail=source_detail,
        user=user,
        produced_by=produced_by,
        derived_from=derived_from,
        max_files=max_files,
    )


#: ``(path in the version, where the file is, its size)``.
Listing = list[tuple[str, Path, int]]


def ingest_files(
    asset: Asset,
    listing: Callable[[], Listing],
    *,
    source: str,
    source_detail: str = "",
    user: Any = None,
    produced_by: Any = None,
    derived_from: Iterable[AssetVersion] = (),
    max_files: int = MAX_FILES,
) -> AssetVersion:
    """The asset's next version, made of the files ``listing()`` names (:func:`fill_version`)."""
    version = _new_version(
        asset,
        source=source,
        source_detail=source_detail[:1024],
        created_by=user,
        produced_by=produced_by,
        metrics=final_metrics(produced_by) if produced_by is not None else {},
    )
    inputs = list(derived_from)
    if inputs:
        version.derived_from.set(inputs)
    fill_version(version, listing, max_files=max_files)
    return version


def fill_version(
    version: AssetVersion, listing: Callable[[], Listing], *, max_files: int = MAX_FILES
) -> None:
    """Make the ``ingesting`` version of the files ``listing()`` names (ManifestError from it
    fails the version with its message): each copied into the store and hashed as it is
    read, then the stored copies checked; ``ready``, or ``failed`` naming the file."""
    asset = version.asset
    workspace_id = asset.workspace_id
    try:
        listed = listing()
        version.bytes_total = sum(size for _, _, size in listed)
        version.save(update_fields=["bytes_total"])
        try:
            check_storage_quota(asset.workspace, version.bytes_total, what=version.ref)
        except CatalogError as exc:
            raise ManifestError(str(exc)) from None
        progress = Progress(version)
        entries = []
        written = storage.write_blobs(
            workspace_id, ((absolute, path) for path, absolute, _ in listed), progress.add
        )
        with contextlib.closing(written):
            for path, _, listed_size in listed:
                try:
                    size, sha256 = next(written)
                except OSError as exc:
                    raise ManifestError(f"{path} could not be stored: {exc.strerror}.") from exc
                if size != listed_size:
                    raise ManifestError(
                        f"{path} changed while it was read ({listed_size:,} bytes listed, "
                        f"{size:,} read)."
                    )
                entries.append(Entry(path, size, sha256))
        manifest = Manifest.of(entries, max_files=max_files)
        version.state = AssetVersion.State.VERIFYING
        version.touched_at = timezone.now()
        version.save(update_fields=["state", "touched_at"])
        check_and_make_ready(version, manifest)
    except ManifestError as exc:
        fail(version, str(exc))


def final_metrics(run: Any) -> dict[str, float]:
    """The run's last value of each metric (the newest step's): what a version it made keeps
    as its snapshot, and what ``best`` compares."""
    rows = (
        MetricPoint.objects.for_workspace(run.workspace_id)
        .filter(run=run)
        .order_by("key", "-step", "-attempt")
        .values_list("key", "value")
    )
    final: dict[str, float] = {}
    for key, value in rows:
        final.setdefault(key, value)
    return final


def fail(version: AssetVersion, reason: str) -> None:
    version.state = AssetVersion.State.FAILED
    version.error = reason
    version.save(update_fields=["state", "error"])
    logger.warning("%s %s failed: %s", version.asset.kind, version.ref, reason)


def claim(version: AssetVersion, was: str, becomes: str) -> bool:
    """Move the version from ``was`` on to ``becomes`` unless something else (the sweep,
    which fails a version whose worker seems dead) moved it first; whether it moved."""
    moved = (
        AssetVersion.objects.for_workspace(version.asset.workspace_id)
        .filter(pk=version.pk, state=was)
        .update(state=becomes, touched_at=timezone.now())
    )
    if moved:
        version.state = becomes
    return bool(moved)


def fail_on_the_way(version: AssetVersion, reason: str) -> bool:
    """Fail the version if it is still on its way (ingesting or verifying): a worker that
    the sweep took for dead and failed, and that then fails too, changes nothing."""
    on_the_way = (AssetVersion.State.INGESTING, AssetVersion.State.VERIFYING)
    failed = (
        AssetVersion.objects.for_workspace(version.asset.workspace_id)
        .filter(pk=version.pk, state__in=on_the_way)
        .update(state=AssetVersion.State.FAILED, error=reason, touched_at=timezone.now())
    )
    if failed:
        version.state, version.error = AssetVersion.State.FAILED, reason
        logger.warning("%s %s failed: %s", version.asset.kind, version.ref, reason)
    return bool(failed)


def check_and_make_ready(
    version: AssetVersion, manifest: Manifest, *, files_recorded: bool = False
) -> None:
    """Every file of ``manifest`` whole in the store, then the version ``ready`` with it
    (ManifestError naming the first file that is not). ``files_recorded``: its AssetFile rows
    exist already (an upload's)."""
    for entry in manifest.files:
        _check_stored(version.asset.workspace_id, entry)
    make_ready(version, manifest, files_recorded=files_recorded)


class Progress:
    """Bytes copied so far, written to the version now and then (the pages poll it)."""

    def __init__(self, version: AssetVersion) -> None:
        self.version = version
        self.done = 0
        self.written_at = time.monotonic()

    def add(self, count: int) -> None:
        self.done += count
        if time.monotonic() - self.written_at >= PROGRESS_SECONDS:
            self.written_at = time.monotonic()
            AssetVersion.objects.for_workspace(self.version.asset.workspace_id).filter(
                pk=self.version.pk
            ).update(bytes_done=self.done, touched_at=timezone.now())


def _check_stored(workspace_id: int, entry: Entry) -> None:
    if not storage.has_blob(workspace_id, entry.sha256, entry.size):
        raise ManifestError(f"{entry.path}: its stored copy is missing or incomplete.")


def make_ready(version: AssetVersion, manifest: Manifest, *, files_recorded: bool) -> None:
    """The version ``ready`` with ``manifest``, its files recorded (``files_recorded``: an
    upload's are), in one transaction."""
    with transaction.atomic():
        if not files_recorded:
            AssetFile.objects.bulk_create(
                [
                    AssetFile(
                        version=version,
                        path=entry.path,
                        size=entry.size,
                        sha256=entry.sha256,
                        received=entry.size,
                    )
                    for entry in manifest.files
                ],
                batch_size=5000,
            )
        mark_ready(
            version,
            digest=manifest.digest,
            files_count=manifest.files_count,
            total_bytes=manifest.total_bytes,
        )


def mark_ready(version: AssetVersion, *, digest: str, files_count: int, total_bytes: int) -> None:
    """The version ``ready`` with the manifest of that digest, count and bytes, whose files
    are recorded already (an upload's: catalog.uploads takes the digest row by row)."""
    version.state = AssetVersion.State.READY
    version.manifest_digest = digest
    version.files_count = files_count
    version.bytes = total_bytes
    version.bytes_done = total_bytes
    version.ready_at = timezone.now()
    version.save(
        update_fields=["state", "manifest_digest", "files_count", "bytes", "bytes_done", "ready_at"]
    )


def manifest_of(version: AssetVersion) -> Manifest:
    """The version's manifest, from its recorded files."""
    files = AssetFile.objects.for_workspace(version.asset.workspace_id).filter(version=version)
    return Manifest.of(
        Entry(path, size, sha256)
        for path, size, sha256 in files.values_list("path", "size", "sha256")
    )


def verify(version: AssetVersion) -> list[str]:
    """Every stored file of the version read again — or, for a version registered in place,
    every file at its prefix (catalog.in_place) — : what is missing or differs, by path
    (empty: exactly the manifest's bytes); recorded on the version (``verified_at``,
    ``verify_problems``). The version stays as it is either way: reading it refuses what
    differs, naming the file."""
    workspace_id = version.asset.workspace_id
    problems = []
    if version.in_place:
        where = in_place.location(version.asset.workspace, version.prefix)
        problems = in_place.problems(workspace_id, where, manifest_of(version).files)
    for entry in () if version.in_place else manifest_of(version).files:
        try:
            size, sha256 = storage.hash_blob(workspace_id, entry.sha256)
        except FileNotFoundError:
            problems.append(f"{entry.path}: missing from the store")
            continue
        if (size, sha256) != (entry.size, entry.sha256):
            problems.append(f"{entry.path}: the stored copy differs from the manifest (SHA-256)")
    version.verified_at = timezone.now()
    version.verify_problems = "\n".join(problems)
    version.save(update_fields=["verified_at", "verify_problems"])
    if problems:
        logger.warning(
            "%s %s: verify found %d problem(s)", version.asset.kind, version.ref, len(problems)
        )
    return problems


def parse_ref(text: str) -> tuple[str, str]:
    """``wiki@train`` → ``("wiki", "train")``; ``wiki`` → ``("wiki", "latest")``."""
    name, _, ref = text.partition("@")
    return name, ref or "latest"


def find_version(
    workspace: Any, asset: Asset, ref: str, versions: QuerySet[AssetVersion] | None = None
) -> AssetVersion | None:
    """The version of ``asset`` that ``ref`` names, in any state: ``latest`` (the newest ready
    one), a number, or an alias; None when it names none. ``versions``: the asset's versions
    to take it from (with what the caller needs selected), by default all of them."""
    if versions is None:
        versions = AssetVersion.objects.for_workspace(workspace).filter(asset=asset)
    if ref == "latest":
        return versions.filter(state=AssetVersion.State.READY).order_by("-number").first()
    if ref.isdecimal() and len(ref) <= 9:
        return versions.filter(number=int(ref)).first()
    if "\x00" in ref:
        return None
    alias = AssetAlias.objects.for_workspace(workspace).filter(asset=asset, name=ref).first()
    return versions.filter(pk=alias.version_id).first() if alias is not None else None


def resolve(workspace: Any, kind: str, text: str) -> AssetVersion:
    """The ready version ``text`` names (``name``, ``name@<number>``, ``name@<alias>``)."""
    name, ref = parse_ref(text)
    asset = Asset.objects.for_workspace(workspace).filter(kind=kind, name=name).first()
    if asset is None:
        raise CatalogError(f"This workspace has no {kind} named {name!r}.")
    found = find_version(workspace, asset, ref)
    if found is None and ref == "latest":
        raise CatalogError(f"{name} has no ready version yet.")
    if found is None and ref.isdecimal():
        raise CatalogError(f"{name} has no version {int(ref)}.")
    if found is None:
        raise CatalogError(f"{name} has no alias {ref!r}; name a version number or an alias.")
    if found.state != AssetVersion.State.READY:
        said = f": {found.error}" if found.error else ""
        raise CatalogError(f"{name}@{found.number} is {found.state}, not ready{said}")
    return found


def set_alias(version: AssetVersion, alias: str, *, user: Any = None) -> AssetAlias:
    """``alias`` names ``version`` from now on (moved from another version if it named one)."""
    try:
        validate_name(alias)
    except ValidationError as exc:
        raise CatalogError(exc.messages[0]) from exc
    if alias in AUTOMATIC_ALIASES or alias.isdigit():
        raise CatalogError(f"{alias!r} cannot be set: it is kept by the catalog or is a number.")
    if version.state != AssetVersion.State.READY:
        raise CatalogError(f"{version.ref} is {version.state}: only a ready version gets an alias.")
    workspace_id = version.asset.workspace_id
    kept, _ = AssetAlias.objects.for_workspace(workspace_id).update_or_create(
        asset=version.asset,
        name=alias,
        defaults={"version": version, "set_by": user, "set_at": timezone.now()},
    )
    return kept


def kept_by(rows: Iterable[Model]) -> str:
    """The records that keep what was to be deleted, said for people: rows of other apps that
    name a version through a protected key (an endpoint's names the model version it serves,
    in its record for good), which the catalog knows only as Django's deletion reports them."""
    return ", ".join(sorted({f"the {row._meta.verbose_name} {row}" for row in rows}))


def delete_asset(asset: Asset) -> None:
    """The asset gone with every version, file row and alias; then the blobs no other version
    of the workspace holds, and any unfinished upload's pieces."""
    workspace_id = asset.workspace_id
    files = AssetFile.objects.for_workspace(workspace_id)
    read = (
        RunInput.objects.for_workspace(workspace_id)
        .filter(version__asset=asset)
        .select_related("version", "run")
        .first()
    )
    if read is not None:
        raise CatalogError(
            f"{read.version.ref} was read by the run {read.run.name}, whose record names it: "
            f"{asset.name} is kept."
        )
    try:
        with transaction.atomic():
            lock_asset(asset)
            shas = set(files.filter(version__asset=asset).values_list("sha256", flat=True))
            version_ids = list(
                AssetVersion.objects.for_workspace(workspace_id)
                .filter(asset=asset)
                .values_list("pk", flat=True)
            )
            asset.delete()
            still_held = held_shas(workspace_id, shas)
    except ProtectedError as exc:
        held = kept_by(exc.protected_objects)
        raise CatalogError(f"A version of {asset.name} is named by {held}: it is kept.") from None
    for sha256 in shas - still_held:
        storage.forget_blob(workspace_id, sha256)
    for version_id in version_ids:
        storage.drop_uploads(workspace_id, version_id)
    logger.info("%s %s deleted: %d version(s)", asset.kind, asset.name, len(version_ids))


#: Versions whose files the store need not keep: failed, or deleted (their manifest is a
#: record only).
_NOT_KEPT = (AssetVersion.State.FAILED, AssetVersion.State.DELETED)


def storage_used(workspace_id: int) -> int:
    """Bytes the workspace's datasets and models keep in the store, each file once (by
    SHA-256), counting what unfinished uploads have declared (so two uploads cannot both fit
    in one gap); not the files of versions registered in place, which stay in the
    workspace's own folder."""
    rows = (
        AssetFile.objects.for_workspace(workspace_id)
        .exclude(version__state__in=_NOT_KEPT)
        .exclude(version__in_place=True)
        .order_by()
        .values("sha256")
        .annotate(size=Max("size"))
        .values_list("size", flat=True)
    )
    return sum(rows)


def check_storage_quota(workspace: Any, adding: int, *, what: str, used: int | None = None) -> None:
    """CatalogError when ``adding`` more bytes would pass the workspace's storage quota
    (``used``: what the workspace keeps without them, if the caller measured it already)."""
    quota = workspace.storage_quota_bytes
    if quota is None or adding <= 0:
        return
    if used is None:
        used = storage_used(workspace.pk)
    if used + adding > quota:
        raise CatalogError(
            f"{what} needs {adding:,} more bytes, and {workspace.slug} keeps {used:,} of its "
            f"{quota:,}-byte storage quota: delete versions it no longer needs, or ask the "
            "platform team for more."
        )


def held_shas(workspace_id: int, shas: Iterable[str]) -> set[str]:
    """Those of ``shas`` the store must keep: a version of the workspace (not a failed or
    deleted one, nor one registered in place, read where it lives) lists them; asked 10,000
    at a time (SQLite takes at most 32,766 values in one query)."""
    ordered = sorted(set(shas))
    files = (
        AssetFile.objects.for_workspace(workspace_id)
        .exclude(version__state__in=_NOT_KEPT)
        .exclude(version__in_place=True)
    )
    return {
        sha256
        for first in range(0, len(ordered), 10_000)
        for sha256 in files.filter(sha256__in=ordered[first : first + 10_000]).values_list(
            "sha256", flat=True
        )
    }
