"""What a run's evidence record holds: the export's members and the manifest that describes
them (docs/evidence.md, format ``taugrid-evidence/1``).

``record_members`` lists the members from where TauGrid keeps each thing (rows, the bundle
store, attempt logs, the artifact store), bounded by what the record covers — the first
``event_count`` events and the attempts up to ``attempt_count`` — so that the same list can
be made again at export time, long after sealing, even if the run was resumed since.
``build_manifest`` reads every member once, in chunks, to write its digest into ``files``.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from catalog import selectors
from catalog.models import AssetVersion
from runs import artifacts, bundles
from runs.backends.registry import describing_backend
from runs.models import Artifact, Checkpoint, MetricPoint, Run, RunAttempt, RunEvent
from tau import __version__
from tau.evidence import archive
from tau.evidence.canonical import canonical_json
from tau.evidence.chain import GENESIS_HASH, event_line
from tau.spec import spec_from_dict

#: Bytes read at a time when hashing a member: large enough that hashing runs at the speed
#: of sha256 itself, small enough to keep memory flat.
CHUNK = 1 << 20


def rfc3339(moment: datetime | None) -> str | None:
    """A time as the manifest writes it: UTC, microseconds, ``Z``."""
    if moment is None:
        return None
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Coverage:
    """How much of a run's history a record covers: what existed when it was sealed."""

    attempt_count: int
    event_count: int


Row = TypeVar("Row")


@contextmanager
def _read_through(rows: Iterator[Row]) -> Iterator[Iterator[Row]]:
    """A queryset's ``iterator()``, closed when the block ends, even when a row could not be
    written: a half-read server-side cursor left to the garbage collector is closed later,
    inside whatever transaction the connection is in by then, and aborts it."""
    try:
        yield rows
    finally:
        close = getattr(rows, "close", None)
        if close is not None:
            close()


def _events_bytes(run: Run, coverage: Coverage) -> tuple[bytes, str]:
    """``events.jsonl`` and the head hash. Each line carries exactly the content the chain
    hashed when the event was appended (``runs.events``: the time as ``isoformat()``)."""
    lines: list[bytes] = []
    head = GENESIS_HASH
    events = (
        RunEvent.objects.for_workspace(run.workspace_id)
        .filter(run=run, seq__lte=coverage.event_count)
        .order_by("seq")
    )
    with _read_through(events.iterator(chunk_size=2000)) as rows:
        for event in rows:
            lines.append(
                event_line(
                    {
                        "run": event.run_id,
                        "seq": event.seq,
                        "time": event.time.isoformat(),
                        "kind": event.kind,
                        "old_state": event.old_state,
                        "new_state": event.new_state,
                        "message": event.message,
                        "data": event.data,
                        "prev_hash": event.prev_hash,
                        "hash": event.hash,
                    }
                )
            )
            head = event.hash
    return b"".join(lines), head


def _metrics_bytes(run: Run, coverage: Coverage) -> tuple[bytes, int]:
    points = (
        MetricPoint.objects.for_workspace(run.workspace_id)
        .filter(run=run, attempt__lte=coverage.attempt_count)
        .order_by("attempt", "key", "step", "id")
        .values_list("attempt", "key", "step", "time", "value")
    )
    with _read_through(points.iterator(chunk_size=5000)) as rows:
        lines = [
            canonical_json(
                {
                    "attempt": attempt,
                    "key": key,
                    "step": step,
                    "time": rfc3339(time),
                    "value": value,
                }
            )
            + b"\n"
            for attempt, key, step, time, value in rows
        ]
    return b"".join(lines), len(lines)


def _file_member(name: str, path: Path, size: int | None = None) -> archive.Member:
    return archive.Member(
        name=name,
        size=path.stat().st_size if size is None else size,
        open=lambda: open(path, "rb"),
    )


def _attempts(run: Run, coverage: Coverage) -> list[RunAttempt]:
    return list(
        RunAttempt.objects.for_workspace(run.workspace_id)
        .filter(run=run, number__lte=coverage.attempt_count)
        .select_related("resume_from")
        .order_by("number")
    )


def _log_path(attempt: RunAttempt) -> Path | None:
    path = Path(attempt.log_path) if attempt.log_path else None
    return path if path is not None and path.is_file() else None


@dataclass(frozen=True)
class KeptArtifact:
    """An artifact as a record names it: its path, and the content (by SHA-256) it had."""

    path: str
    sha256: str
    size: int


def _artifacts(run: Run, sealed: dict[str, Any] | None) -> list[KeptArtifact]:
    """The run's artifacts now, or the ones a sealed manifest names. The store keeps content
    by its SHA-256, so a record's artifacts stay what they were even after a later attempt
    of a resumed run wrote the same path again."""
    if sealed is not None:
        return [
            KeptArtifact(entry["path"], entry["sha256"], int(entry["size"]))
            for entry in sealed["artifacts"]
        ]
    rows = Artifact.objects.for_workspace(run.workspace_id).filter(run=run)
    # By path in code point order, as the format says and the verifier checks: the
    # database's collation may order differently (case, punctuation).
    return sorted(
        (KeptArtifact(row.path, row.sha256, row.size) for row in rows), key=lambda kept: kept.path
    )


def _artifact_member(artifact: KeptArtifact) -> archive.Member:
    path = artifacts.content_path(artifact.sha256)
    return _file_member(archive.artifact_member(artifact.path), path, artifact.size)


@dataclass(frozen=True)
class Contents:
    """The members of a record (all but the manifest and its signature, in export order)
    and what the manifest says about the generated ones."""

    members: list[archive.Member]
    attempts: list[RunAttempt]
    artifacts: list[KeptArtifact]
    event_count: int
    event_head: str
    metric_count: int


def record_members(run: Run, coverage: Coverage, sealed: dict[str, Any] | None = None) -> Contents:
    """The export's members after the manifest and signature. With ``sealed`` (the record's
    manifest) each file keeps the size it was sealed with, so that a log that grew since fails
    the export instead of streaming what the record never said, and the artifacts are the
    ones it names."""
    sizes = {name: int(entry["size"]) for name, entry in (sealed or {}).get("files", {}).items()}
    members = [archive.bytes_member(archive.SPEC, canonical_json(run.spec))]
    if run.spec_source:
        members.append(archive.bytes_member(archive.TAU_YAML, run.spec_source.encode("utf-8")))
    if run.bundle is not None:
        members.append(_file_member(archive.BUNDLE, bundles.bundle_path(run.bundle.sha256)))
    attempts = _attempts(run, coverage)
    for attempt in attempts:
        name = archive.attempt_log(attempt.number)
        log = _log_path(attempt)
        if log is None and name in sizes and attempt.log_path:
            # Sealed with a log that is gone now: the member stays, so that opening it names
            # the missing file (``export.FileGone``) instead of the export leaving it out.
            log = Path(attempt.log_path)
        if log is not None:
            members.append(_file_member(name, log, sizes.get(name)))
    metrics_data, metric_count = _metrics_bytes(run, coverage)
    members.append(archive.bytes_member(archive.METRICS, metrics_data))
    events_data, head = _events_bytes(run, coverage)
    members.append(archive.bytes_member(archive.EVENTS, events_data))
    kept = _artifacts(run, sealed)
    members.extend(_artifact_member(artifact) for artifact in kept)
    return Contents(
        members=members,
        attempts=attempts,
        artifacts=kept,
        event_count=events_data.count(b"\n"),
        event_head=head,
        metric_count=metric_count,
    )


def _digest(member: archive.Member) -> dict[str, Any]:
    digest = hashlib.sha256()
    size = 0
    with member.open() as source:
        while chunk := source.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return {"sha256": digest.hexdigest(), "size": size}


def _bundle_files(path: Path) -> list[dict[str, Any]]:
    """Every regular file inside the bundle, with its digest (read from the zip in chunks)."""
    files = []
    with zipfile.ZipFile(path) as bundle:
        for info in bundle.infolist():
            if info.is_dir():
                continue
            digest = hashlib.sha256()
            with bundle.open(info) as source:
                while chunk := source.read(CHUNK):
                    digest.update(chunk)
            files.append(
                {"path": info.filename, "sha256": digest.hexdigest(), "size": info.file_size}
            )
    return sorted(files, key=lambda entry: entry["path"])


#: The log note of an attempt that never started (no process, no pod ever ran).
NEVER_STARTED = "no log was written: the attempt never started"


def _log_note(attempt: RunAttempt, has_log: bool, log_notes: dict[int, str]) -> str | None:
    """Why the record holds no log of ``attempt`` (None when it holds one, or nobody knows)."""
    if has_log:
        return None
    if attempt.number in log_notes:
        return log_notes[attempt.number]
    if attempt.log_note:
        return attempt.log_note
    return NEVER_STARTED if attempt.started_at is None else None


def _attempt_entry(
    run: Run, attempt: RunAttempt, has_log: bool, log_notes: dict[int, str]
) -> dict[str, Any]:
    flavors = sorted(set((attempt.flavors or {}).values()))
    checkpoint = attempt.resume_from
    return {
        "number": attempt.number,
        "backend": run.backend,
        "objects": describing_backend(run).attempt_objects(run, attempt),
        "cluster_queue": attempt.cluster_queue or None,
        "flavor": ",".join(flavors) or None,
        "nodes": list(attempt.node_names or []),
        "started_at": rfc3339(attempt.started_at),
        "finished_at": rfc3339(attempt.finished_at),
        "exit_code": attempt.exit_code,
        "failure_class": attempt.failure_class or None,
        "resume_from": None
        if checkpoint is None
        else {"step": checkpoint.step, "path": checkpoint.path},
        "log": archive.attempt_log(attempt.number) if has_log else None,
        "log_note": _log_note(attempt, has_log, log_notes),
    }


def build_manifest(
    run: Run,
    coverage: Coverage,
    *,
    state: str,
    sealed_at: datetime,
    log_notes: dict[int, str] | None = None,
) -> dict[str, Any]:
    """The manifest of ``run``'s record as of now: every field of docs/evidence.md, every
    member's digest read from its bytes. ``log_notes``: why attempts (by number) have no log,
    where the caller knows better than the attempt's own ``log_note``."""
    contents = record_members(run, coverage)
    files = {member.name: _digest(member) for member in contents.members}
    bundle = None
    if run.bundle is not None:
        bundle = {
            **files[archive.BUNDLE],
            "member": archive.BUNDLE,
            "files": _bundle_files(bundles.bundle_path(run.bundle.sha256)),
        }
    image = spec_from_dict(run.spec).runtime.image
    checkpoints = (
        Checkpoint.objects.for_workspace(run.workspace_id)
        .filter(run=run, attempt__lte=coverage.attempt_count)
        .order_by("step", "path")
    )
    return {
        "format": archive.FORMAT,
        "sealed_at": rfc3339(sealed_at),
        "portal": {"url": None, "version": __version__},
        "run": {
            "id": run.pk,
            "workspace": run.workspace.slug,
            "name": run.name,
            "submitter": run.submitted_by_username,
            "state": state,
            "failure_class": run.failure_class or None,
            "created_at": rfc3339(run.created_at),
            "started_at": rfc3339(run.started_at),
            "finished_at": rfc3339(run.finished_at),
            "attempts": coverage.attempt_count,
        },
        "spec": {"sha256": run.spec_hash, "member": archive.SPEC},
        "source": {"tau_yaml": archive.TAU_YAML if run.spec_source else None},
        "bundle": bundle,
        "image": {"reference": image or None, "digest": None},
        "environment": describing_backend(run).environment(run),
        "attempts": [
            _attempt_entry(
                run, attempt, archive.attempt_log(attempt.number) in files, log_notes or {}
            )
            for attempt in contents.attempts
        ],
        "events": {
            "count": contents.event_count,
            "head": contents.event_head,
            "member": archive.EVENTS,
        },
        "metrics": {"count": contents.metric_count, "member": archive.METRICS},
        "checkpoints": [
            {"attempt": point.attempt, "step": point.step, "path": point.path, "size": point.size}
            for point in checkpoints
        ],
        "artifacts": [
            {
                "path": artifact.path,
                "size": artifact.size,
                "sha256": artifact.sha256,
                "member": archive.artifact_member(artifact.path),
            }
            for artifact in contents.artifacts
        ],
        **_data(run),
        "files": files,
    }


def _data(run: Run) -> dict[str, Any]:
    """``data``: the dataset versions the run read and the versions it made, by manifest
    digest (issue 33) — so the record proves which bytes were used after the files are gone.
    Absent for a run that did neither (its record reads as before datasets existed)."""
    found = selectors.run_data(run)
    read = found.read if found else []
    made = [v for v in (found.made if found else []) if v.state == AssetVersion.State.READY]
    data = {
        "read": [
            {
                "ref": item.version.ref,
                "manifest_digest": item.version.manifest_digest,
                "path": item.path,
            }
            for item in read
        ],
        "produced": [
            {
                "kind": version.asset.kind,
                "ref": version.ref,
                "manifest_digest": version.manifest_digest,
            }
            for version in made
        ],
    }
    return {"data": data} if data["read"] or data["produced"] else {}


def export_members(
    run: Run, coverage: Coverage, manifest: bytes, signature: bytes
) -> Iterator[archive.Member]:
    """Every member of the export, in order: the sealed manifest and signature as stored,
    then the rest made again from where TauGrid keeps it."""
    yield archive.bytes_member(archive.MANIFEST, manifest)
    yield archive.bytes_member(archive.SIGNATURE, signature)
    yield from record_members(run, coverage, json.loads(manifest)).members
