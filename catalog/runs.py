"""Runs and the catalog (issue 33): the dataset and model versions a run reads, pinned when
it is submitted; what an executor stages for it; the versions its outputs become when it
succeeds.

- **Pinning** (:data:`DATASET_INPUTS`, a ``runs.submission.Extension``): each
  ``inputs.datasets`` and ``inputs.models`` entry is resolved once, at submission, to a ready
  version; a missing dataset or model, version or alias refuses the submission at that key
  (batch inference reads a model version as it reads data). The versions are recorded
  as :class:`~catalog.models.RunInput` rows and in the run's ``submitted`` event (ref,
  manifest digest, path), so the run's sealed evidence names the exact bytes it read.
- **Staging** (:func:`staging_plan`): what an executor puts under ``TAU_DATA_DIR`` — every
  file of every pinned version and its digest, by which the executor asks the workspace's
  store for it, or, for a version registered in place, where it reads it (checked:
  catalog.in_place).
- **Outputs** (:func:`keep_outputs`): ``outputs.dataset`` / ``outputs.model``, folders under
  the successful attempt's ``TAU_OUTPUT_DIR``, become the next versions of their names,
  ``produced_by`` the run and ``derived_from`` the versions it read.
- **Registered later**: a succeeded run's kept artifacts under a path
  (:func:`register_from_run`), or one of a run's complete checkpoints, read where its backend
  says its files are (:func:`register_checkpoint`), become the next version of a model.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction

from catalog.in_place import Location, location, workspace_folder
from catalog.ingest import (
    CatalogError,
    Listing,
    asset_named,
    check_storage_quota,
    fail,
    find_version,
    ingest_files,
    ingest_folder,
)
from catalog.models import Asset, AssetFile, AssetVersion, RunInput
from runs import artifacts
from runs.backends import BackendUnavailable, CheckpointUnreadable
from runs.backends.registry import backend_for_run
from runs.events import append_event
from runs.models import Artifact, Checkpoint, EventKind, Run, RunState
from runs.submission import Extension
from tau.manifest import ManifestError, check_path, list_files

if TYPE_CHECKING:
    from tau.spec import Spec
    from tau.spec.model import AssetInput
    from workspaces.models import Workspace


class OutputsNotKept(Exception):
    """A declared output that could not become a version; the message names it and why."""


@dataclass(frozen=True)
class Pinned:
    """One ``inputs.datasets`` or ``inputs.models`` entry, resolved."""

    version: AssetVersion
    asked: str
    path: str


#: While a pipeline starts a stage (``pipelines.orchestration``): what each stage before it
#: made, ``(stage, kind) → version``, for the stage's ``{from: STAGE}`` inputs. Unset
#: elsewhere: such an input is then refused (it means something only inside a pipeline).
HANDED_OVER: ContextVar[Mapping[tuple[str, str], AssetVersion] | None] = ContextVar(
    "handed_over", default=None
)


#: ``HANDED_OVER`` while a pipeline is checked at submission: its stages have made nothing
#: yet, and a ``{from: STAGE}`` input is taken as it is (the pipeline's own check holds it to
#: a stage that makes such a version).
LATER: Mapping[tuple[str, str], AssetVersion] = MappingProxyType({})


@contextlib.contextmanager
def handing_over(made: Mapping[tuple[str, str], AssetVersion]) -> Iterator[None]:
    """Resolve ``{from: STAGE}`` inputs from ``made`` within the block."""
    token = HANDED_OVER.set(made)
    try:
        yield
    finally:
        HANDED_OVER.reset(token)


def handed_over(kind: str, at: str, stage: str) -> tuple[tuple[str, str] | None, Any]:
    """The version stage ``stage`` made for a ``{from: stage}`` input, or the problem."""
    made = HANDED_OVER.get()
    if made is None:
        return (
            f"{at}.from",
            f"`from: {stage}` reads what a pipeline's stage made: this tau.yaml reads it only "
            "when it runs as a stage of a pipeline (`tau pipeline run`)",
        ), None
    if made is LATER:
        return None, None
    version = made.get((stage, kind))
    if version is None:
        return (f"{at}.from", f"the stage {stage} made no {kind} version"), None
    return None, version


def check_inputs(spec: Spec, workspace: Workspace) -> tuple[list[tuple[str, str]], list[Pinned]]:
    """Each of the spec's datasets and models resolved to a ready version, or a problem at
    its key. A ``{from: STAGE}`` input is the version that stage made (``HANDED_OVER``)."""
    problems: list[tuple[str, str]] = []
    pinned: list[Pinned] = []
    wanted_inputs: list[tuple[str, str, AssetInput]] = [
        (Asset.Kind.DATASET, f"inputs.datasets[{index}]", wanted)
        for index, wanted in enumerate(spec.inputs.datasets)
    ]
    wanted_inputs += [
        (Asset.Kind.MODEL, f"inputs.models[{index}]", wanted)
        for index, wanted in enumerate(spec.inputs.models)
    ]
    for kind, at, wanted in wanted_inputs:
        if wanted.from_stage is not None:
            problem, made = handed_over(kind, at, wanted.from_stage)
            if problem is not None:
                problems.append(problem)
            elif made is not None:
                pinned.append(Pinned(made, f"from:{wanted.from_stage}", wanted.path))
            continue
        asset = Asset.objects.for_workspace(workspace).filter(kind=kind, name=wanted.name).first()
        if asset is None:
            problems.append(
                (
                    f"{at}.name",
                    f"this workspace has no {kind} named {wanted.name!r} (`tau data {kind} "
                    f"list` shows its {kind}s).",
                )
            )
            continue
        version = find_version(workspace, asset, wanted.version)
        if version is None:
            what = "version" if wanted.version.isdecimal() else "alias"
            problems.append(
                (f"{at}.version", f"{wanted.name} has no {what} {wanted.version!r}.")
                if wanted.version != "latest"
                else (f"{at}.version", f"{wanted.name} has no ready version yet.")
            )
            continue
        if version.state == AssetVersion.State.DELETED:
            problems.append(
                (
                    f"{at}.version",
                    f"{version.ref}'s files were deleted (its manifest stays as a record): "
                    "name a ready version.",
                )
            )
            continue
        if version.state != AssetVersion.State.READY:
            problems.append(
                (
                    f"{at}.version",
                    f"{version.ref} is {version.state}, not ready: name a ready version.",
                )
            )
            continue
        pinned.append(Pinned(version, wanted.version, wanted.path))
    return problems, pinned


def record_inputs(run: Run, checked: list[Pinned]) -> dict[str, Any]:
    """The pinned versions written with the run; their refs and digests for its history
    (``datasets``, and ``models`` when it reads any)."""
    if not checked:
        return {}
    RunInput.objects.bulk_create(
        RunInput(run=run, version=item.version, asked=item.asked, path=item.path)
        for item in checked
    )
    recorded: dict[str, Any] = {"datasets": []}
    for item in checked:
        key = "models" if item.version.asset.kind == Asset.Kind.MODEL else "datasets"
        recorded.setdefault(key, []).append(
            {
                "ref": item.version.ref,
                "asked": item.asked
                if item.asked.startswith("from:")
                else f"{item.version.asset.name}@{item.asked}",
                "manifest_digest": item.version.manifest_digest,
                "path": item.path,
            }
        )
    return recorded


DATASET_INPUTS = Extension("datasets", check_inputs, record_inputs)


@dataclass(frozen=True)
class StagedFile:
    """One file of a pinned version: an executor asks the store for its bytes by
    ``sha256`` (``catalog.storage.local_copy``, ``open_blob``), or reads it at ``path`` under
    the version's prefix when it is registered in place (``catalog.in_place.local_copy``)."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class StagedDataset:
    """One pinned version, as an executor puts it at ``TAU_DATA_DIR/<path>``."""

    workspace_id: int
    ref: str
    path: str
    manifest_digest: str
    files: tuple[StagedFile, ...]
    #: Where its files live, for a version registered in place; None: the workspace's store.
    in_place: Location | None = None

    @property
    def bytes(self) -> int:
        return sum(item.size for item in self.files)


def staging_plan(run: Run) -> tuple[StagedDataset, ...]:
    """The run's pinned versions and their files, as its workspace keeps them."""
    inputs = (
        RunInput.objects.for_workspace(run.workspace_id)
        .filter(run=run)
        .select_related("version__asset", "version__asset__workspace")
        .order_by("path")
    )
    return tuple(staged_version(item.version, path=item.path) for item in inputs)


def staged_version(version: AssetVersion, *, path: str) -> StagedDataset:
    """One version and its files, to be staged at ``<staging folder>/<path>``: a run's pinned
    dataset, or the model version an endpoint serves (a model version is a catalog version
    too, staged the same way at ``TAU_MODEL_DIR``)."""
    workspace = version.asset.workspace
    rows = (
        AssetFile.objects.for_workspace(workspace.pk)
        .filter(version=version)
        .order_by("path")
        .values_list("path", "size", "sha256")
    )
    return StagedDataset(
        workspace_id=workspace.pk,
        ref=version.ref,
        path=path,
        manifest_digest=version.manifest_digest,
        files=tuple(StagedFile(name, size, sha256) for name, size, sha256 in rows),
        in_place=location(workspace, version.prefix) if version.in_place else None,
    )


def staged_totals(run: Run) -> tuple[int, int] | None:
    """(files, bytes) of every version the run reads, or None when it reads none (what a
    cluster's stager sizes its volume for)."""
    versions = read_versions(run)
    if not versions:
        return None
    return (
        sum(version.files_count for version in versions),
        sum(version.bytes for version in versions),
    )


def read_versions(run: Run) -> list[AssetVersion]:
    """The dataset and model versions the run was pinned to read."""
    return [
        item.version
        for item in RunInput.objects.for_workspace(run.workspace_id)
        .filter(run=run)
        .select_related("version")
    ]


def cluster_outputs(run: Run, attempt: int) -> Path:
    """Where the portal reads a cluster attempt's TAU_OUTPUT_DIR: the workspace's storage
    claim, mounted in the portal at ``TAU_DATA_PREFIX_DIR/<workspace>/``, holds it at
    ``runs/<run>/outputs/attempt-<n>`` (executors.kubernetes.render's subPath)."""
    return workspace_folder(run.workspace) / "runs" / run.name / "outputs" / f"attempt-{attempt}"


def keep_outputs(run: Run, spec: Spec, output: Path) -> list[AssetVersion]:
    """``outputs.dataset`` and ``outputs.model`` of a succeeded attempt, each the next version
    of its name; OutputsNotKept names the first that could not be kept."""
    read = read_versions(run)
    declared = [
        (kind, output_asset)
        for kind, output_asset in (("dataset", spec.outputs.dataset), ("model", spec.outputs.model))
        if output_asset is not None
    ]
    # Every promised folder first: nothing is kept of a run that did not write them all.
    for kind, output_asset in declared:
        folder = output / output_asset.path
        if not folder.is_dir() or folder.is_symlink():
            raise OutputsNotKept(
                f"outputs.{kind}: the run wrote no folder {output_asset.path.rstrip('/')} under "
                f"TAU_OUTPUT_DIR, so no version of the {kind} {output_asset.name} was made."
            )
    made: list[AssetVersion] = []
    for kind, output_asset in declared:
        version = ingest_folder(
            asset_named(run.workspace, kind, output_asset.name, user=run.submitted_by),
            output / output_asset.path,
            source=AssetVersion.Source.RUN,
            source_detail=f"{run.name}: {output_asset.path}",
            user=run.submitted_by,
            produced_by=run,
            derived_from=read,
        )
        if version.state != AssetVersion.State.READY:
            reason = f"outputs.{kind}: {version.ref} could not be kept: {version.error}"
            for earlier in made:  # a run that fails leaves no ready output behind
                fail(earlier, f"Its run failed: {reason}")
            raise OutputsNotKept(reason)
        made.append(version)
    if made:
        with transaction.atomic():
            locked = Run.objects.for_workspace(run.workspace_id).select_for_update().get(pk=run.pk)
            append_event(
                locked,
                EventKind.OUTPUTS_KEPT,
                message="Kept " + ", ".join(f"{v.asset.kind} {v.ref}" for v in made) + ".",
                data={
                    "versions": [
                        {
                            "kind": version.asset.kind,
                            "ref": version.ref,
                            "manifest_digest": version.manifest_digest,
                            "derived_from": [item.ref for item in read],
                        }
                        for version in made
                    ]
                },
            )
    return made


def register_from_run(asset: Asset, run: Run, path: str, *, user: Any = None) -> AssetVersion:
    """The next version of ``asset``, made of the artifacts a succeeded run kept under
    ``path`` (``outputs.artifacts``: both executors keep them), produced by the run and derived
    from the versions it read; CatalogError says what is missing."""
    if run.state != RunState.SUCCEEDED:
        raise CatalogError(
            f"{run.name} is {run.state}: register a version from a run that succeeded."
        )
    prefix = path.strip("/")
    try:
        check_path(prefix)
    except ManifestError as exc:
        raise CatalogError(f"path: {exc}") from exc
    chosen: Listing = []
    for artifact in Artifact.objects.for_workspace(run.workspace_id).filter(run=run):
        if artifact.path == prefix:
            relative = prefix.rsplit("/", 1)[-1]
        elif artifact.path.startswith(f"{prefix}/"):
            relative = artifact.path[len(prefix) + 1 :]
        else:
            continue
        chosen.append((relative, artifacts.content_path(artifact.sha256), artifact.size))
    if not chosen:
        raise CatalogError(
            f"{run.name} kept no artifact at {prefix} or under {prefix}/: a run keeps the files "
            "its outputs.artifacts patterns match (see its artifacts)."
        )
    read = read_versions(run)
    return ingest_files(
        asset,
        lambda: chosen,
        source=AssetVersion.Source.RUN,
        source_detail=f"{run.name}: {prefix}",
        user=user,
        produced_by=run,
        derived_from=read,
    )


def register_checkpoint(
    run: Run, *, kind: str, name: str, step: int | None = None, user: Any = None
) -> AssetVersion:
    """The next version of the run's workspace's ``kind`` ``name`` (made if new), made of the
    run's complete checkpoint at ``step`` (None: its newest complete one), read where the
    run's backend says its files are; produced by the run and derived from the versions it
    read. A run need not have succeeded: a cancelled fine-tune's checkpoint is still one.
    CatalogError says what is wrong before anything is made, the model included: the
    checkpoint is found, listed and measured first."""
    checkpoint = chosen_checkpoint(run, step)
    try:
        where = backend_for_run(run).checkpoint_files(run, checkpoint)
    except (CheckpointUnreadable, BackendUnavailable) as exc:
        raise CatalogError(str(exc)) from None
    listed = checkpoint_listing(run, checkpoint, where)
    check_storage_quota(
        run.workspace,
        sum(size for _, _, size in listed),
        what=f"{run.name}'s checkpoint at step {checkpoint.step}",
    )
    return ingest_files(
        asset_named(run.workspace, kind, name, user=user),
        lambda: listed,
        source=AssetVersion.Source.RUN,
        source_detail=f"{run.name}: checkpoint step {checkpoint.step}",
        user=user,
        produced_by=run,
        derived_from=read_versions(run),
        max_files=int(settings.TAU_DATA_MAX_FILES),
    )


def chosen_checkpoint(run: Run, step: int | None) -> Checkpoint:
    """The run's complete checkpoint at ``step`` (the newest reported of that step), or its
    newest complete one; CatalogError naming what the run has instead."""
    rows = Checkpoint.objects.for_workspace(run.workspace_id).filter(run=run)
    complete = rows.filter(complete=True).order_by("-step", "-created_at")
    chosen = (complete if step is None else complete.filter(step=step)).first()
    if chosen is not None:
        return chosen
    if step is not None and rows.filter(step=step).exists():
        raise CatalogError(
            f"{run.name}'s checkpoint at step {step} is incomplete (the workload reported it "
            "unfinished): name a complete one."
        )
    steps = list(complete.order_by("-step").values_list("step", flat=True).distinct()[:10])
    if step is not None and steps:
        raise CatalogError(
            f"{run.name} has no checkpoint at step {step}; its complete checkpoints' steps: "
            + ", ".join(str(number) for number in steps)
            + (" …" if len(steps) == 10 else "")
            + "."
        )
    if rows.exists():
        raise CatalogError(f"{run.name} wrote no complete checkpoint (only unfinished ones).")
    raise CatalogError(f"{run.name} wrote no checkpoint.")


def checkpoint_listing(run: Run, checkpoint: Checkpoint, where: Path) -> Listing:
    """The checkpoint's files as a version holds them: a folder's files by their paths in it
    (nothing under it may be a link: ``list_files``), or one file by its name; within the
    catalog's limits (``TAU_DATA_MAX_FILES``, ``TAU_DATA_MAX_FILE_BYTES``)."""
    label = f"{run.name}'s checkpoint at step {checkpoint.step}"
    most, largest = int(settings.TAU_DATA_MAX_FILES), int(settings.TAU_DATA_MAX_FILE_BYTES)
    try:
        info = os.lstat(where)
    except (FileNotFoundError, NotADirectoryError):
        raise CatalogError(f"{label} is gone ({checkpoint.path}).") from None
    try:
        if stat.S_ISDIR(info.st_mode):
            listed: Listing = [
                (item.path, item.absolute, item.size)
                for item in list_files(where, max_files=most, max_file_bytes=largest)
            ]
        elif stat.S_ISREG(info.st_mode):
            if info.st_size > largest:
                raise ManifestError(
                    f"it is {info.st_size:,} bytes; one file may have at most {largest:,} "
                    "(TAU_DATA_MAX_FILE_BYTES)."
                )
            listed = [(check_path(where.name), where, info.st_size)]
        else:
            raise ManifestError("it is neither a file nor a folder.")
    except ManifestError as exc:
        raise CatalogError(f"{label} cannot be registered: {exc}") from None
    except OSError as exc:
        raise CatalogError(f"{label} cannot be read: {exc.strerror}.") from None
    if not listed:
        raise CatalogError(f"{label} holds no files ({checkpoint.path}).")
    return listed
