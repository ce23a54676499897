"""A run's artifacts: the files it declared in ``outputs.artifacts`` that TauGrid keeps.

Two roads bring a file here, and both end in :func:`store_artifact`, the one writer of
:class:`~runs.models.Artifact` rows: the local agent collects the matching files from an
attempt's output folder when the attempt ends (``executors.local.agent.supervisor``), and a workload
on any backend uploads one with its run token (``tau.save_artifact``, the API's
``report/artifacts/``).

**Names.** An artifact's ``path`` is a normalised relative POSIX path (no ``.``/``..``
components, no leading ``/``, no backslashes, printable text: no control or invisible
characters such as a right-to-left override, ``tau.printable``) that matches one of the
run's declared glob patterns: ``*`` and ``?`` within one path component, ``**`` as a whole
component for any number of components (``model/**`` is every file below ``model/``).
A path is a name only; it is never joined to a folder to find the bytes.

**Storage.** Content is kept once per SHA-256 under ``VAR_DIR/artifacts/<ab>/<sha256>``
(read-only, written under a temporary name and renamed, so a reader never sees half a
file). The stored file's name is a hex digest, so no name a workload chooses can point
anywhere else; the same bytes saved by many runs are stored once.

**Limits.** ``TAU_ARTIFACT_MAX_BYTES_PER_RUN`` and ``TAU_ARTIFACT_MAX_BYTES_PER_WORKSPACE``
bound what is kept (a path saved again counts with its new size only). A file that would
pass either is not kept: :class:`ArtifactRefused` says why, the run's history gets an
``artifact-refused`` event, and what was kept before stays as it was.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import tempfile
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import BinaryIO, Protocol

from django.conf import settings
from django.db import transaction
from django.db.models import Sum

from runs.events import append_event
from runs.models import Artifact, EventKind, Run
from tau.printable import hidden_character_problem

MAX_PATH_LENGTH = 1000
_CHUNK = 2**16
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class Readable(Protocol):
    """Where an artifact's bytes come from: an open file, or an upload's request stream."""

    def read(self, size: int = -1, /) -> bytes: ...


class ArtifactRefused(Exception):
    """The file is not kept; the message says why, in words for the person who ran it.
    ``too_large``: it would pass a size limit (rather than being misnamed)."""

    def __init__(self, message: str, *, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large


def storage_root() -> Path:
    return Path(settings.VAR_DIR) / "artifacts"


def content_path(sha256: str) -> Path:
    """Where the bytes with this SHA-256 are stored."""
    if not _SHA256.fullmatch(sha256):
        raise ValueError(f"{sha256!r} is not a SHA-256 hex digest")
    return storage_root() / sha256[:2] / sha256


def open_artifact(artifact: Artifact) -> BinaryIO:
    """The stored bytes of ``artifact``, opened for reading (the caller closes it).
    FileNotFoundError when the store has lost them."""
    return open(content_path(artifact.sha256), "rb")


def normalise_path(name: str) -> str:
    """``name`` as an artifact path (relative POSIX, no ``.``/``..``), or ArtifactRefused."""
    if not name or len(name) > MAX_PATH_LENGTH:
        raise ArtifactRefused(f"An artifact's name must have 1 to {MAX_PATH_LENGTH} characters.")
    if "\\" in name:
        raise ArtifactRefused("An artifact's name may not hold backslashes; separate with '/'.")
    hidden = hidden_character_problem(name, "An artifact's name")
    if hidden:
        # A right-to-left override (U+202E) would make a name read backwards on the page.
        raise ArtifactRefused(f"{hidden}.")
    if name.startswith("/"):
        raise ArtifactRefused(f"{name!r} is absolute; name it relative to the output folder.")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise ArtifactRefused(f"{name!r} points outside the output folder (it holds '..').")
    if not parts:
        raise ArtifactRefused(f"{name!r} names no file.")
    return "/".join(parts)


@lru_cache(maxsize=256)
def _component_pattern(component: str) -> re.Pattern[str]:
    return re.compile(fnmatch.translate(component))


def _matches(parts: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        if not rest:  # ``dir/**``: every file below ``dir``, not a file named ``dir``
            return bool(parts)
        return any(_matches(parts[skip:], rest) for skip in range(len(parts) + 1))
    return (
        bool(parts) and bool(_component_pattern(head).match(parts[0])) and _matches(parts[1:], rest)
    )


def matches_declared(path: str, patterns: Iterable[str]) -> bool:
    """Whether the artifact path ``path`` matches one of the glob ``patterns``."""
    parts = tuple(path.split("/"))
    return any(
        _matches(parts, tuple(p for p in pattern.removeprefix("./").split("/") if p))
        for pattern in patterns
    )


def declared_patterns(run: Run) -> list[str]:
    outputs = run.spec.get("outputs") or {}
    return list(outputs.get("artifacts") or [])


def _limit_room(run: Run, path: str) -> int:
    """How many bytes ``path`` may take, given what the run and its workspace keep already
    (the path's earlier version does not count: saving it again replaces it)."""
    kept = Artifact.objects.for_workspace(run.workspace_id)
    per_run = kept.filter(run=run).exclude(path=path).aggregate(total=Sum("size"))["total"] or 0
    per_workspace = kept.exclude(run=run, path=path).aggregate(total=Sum("size"))["total"] or 0
    return min(
        settings.TAU_ARTIFACT_MAX_BYTES_PER_RUN - per_run,
        settings.TAU_ARTIFACT_MAX_BYTES_PER_WORKSPACE - per_workspace,
    )


def _limits_message(path: str, room: int) -> str:
    return (
        f"Artifact {path!r} was not kept: it is larger than the {max(room, 0)} bytes left of "
        f"the artifact limits ({settings.TAU_ARTIFACT_MAX_BYTES_PER_RUN} bytes per run, "
        f"{settings.TAU_ARTIFACT_MAX_BYTES_PER_WORKSPACE} bytes per workspace)."
    )


def _refuse_size(run: Run, path: str, message: str) -> ArtifactRefused:
    """Record in the run's history that ``path`` was not kept for its size; the error."""
    with transaction.atomic():
        locked = Run.objects.for_workspace(run.workspace_id).select_for_update().get(pk=run.pk)
        append_event(locked, EventKind.ARTIFACT_REFUSED, message=message, data={"path": path})
    return ArtifactRefused(message, too_large=True)


def store_artifact(
    *, run: Run, attempt: int, name: str, source: Readable, declared_size: int | None = None
) -> Artifact:
    """Keep the bytes read from ``source`` as the run's artifact ``name`` (written by
    attempt ``attempt``), or raise ArtifactRefused, keeping nothing, when the name is not
    acceptable, matches no declared pattern, or the file would pass a limit. ``source`` is
    read in chunks and never held in memory whole; reading stops one chunk past the room
    left, so an oversized upload costs no more disk than the limit, and one whose
    ``declared_size`` (an upload's Content-Length) is already too large is not read at all."""
    path = normalise_path(name)
    patterns = declared_patterns(run)
    if not matches_declared(path, patterns):
        declared = ", ".join(patterns) or "none"
        raise ArtifactRefused(
            f"{path!r} matches none of the run's outputs.artifacts patterns ({declared})."
        )
    room = _limit_room(run, path)
    if declared_size is not None and declared_size > room:
        raise _refuse_size(run, path, _limits_message(path, room))
    root = storage_root()
    root.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix="upload-", dir=root)
    try:
        digest = hashlib.sha256()
        size = 0
        with os.fdopen(handle, "wb") as out:
            while chunk := source.read(_CHUNK):
                size += len(chunk)
                if size > room:
                    raise _refuse_size(run, path, _limits_message(path, room))
                digest.update(chunk)
                out.write(chunk)
        sha256 = digest.hexdigest()
        final = content_path(sha256)
        final.parent.mkdir(parents=True, exist_ok=True)
        if not final.exists():
            os.chmod(temporary, 0o440)
            os.replace(temporary, final)  # atomic: readers never see half a file
    finally:
        Path(temporary).unlink(missing_ok=True)
    with transaction.atomic():
        # Under the run's row lock, so two files saved at once cannot both take the last room.
        locked = Run.objects.for_workspace(run.workspace_id).select_for_update().get(pk=run.pk)
        room = _limit_room(locked, path)
        if size <= room:
            artifact, _ = Artifact.objects.update_or_create(
                run=locked,
                path=path,
                defaults={"attempt": attempt, "size": size, "sha256": sha256},
            )
            return artifact
        message = _limits_message(path, room)
        append_event(locked, EventKind.ARTIFACT_REFUSED, message=message, data={"path": path})
    raise ArtifactRefused(message, too_large=True)
