"""A small writer of evidence records for the tests, following docs/evidence.md field by field:
it doubles as a worked example of the format. The portal's writer (the ``evidence`` app) reads
its data from the database; this one takes it from a ``Parts`` the tests can change.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tau.evidence import archive
from tau.evidence.canonical import canonical_json
from tau.evidence.chain import GENESIS_HASH, event_hash, event_line
from tau.evidence.keys import signature_document

SEALED_AT = "2026-12-01T08:30:27.123456Z"
SEALED_SECONDS = int(datetime(2026, 12, 1, 8, 30, 27, tzinfo=UTC).timestamp())
RUN_ID = 42


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def zip_of(files: dict[str, bytes]) -> bytes:
    """A code bundle (fixed timestamps, so the same files give the same zip)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bundle:
        bundle.writestr(zipfile.ZipInfo("src/", date_time=(2026, 1, 1, 0, 0, 0)), b"")
        for path, content in sorted(files.items()):
            bundle.writestr(zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0)), content)
    return buffer.getvalue()


def chained(contents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events with ``prev_hash`` and ``hash``, as the portal appends them."""
    events = []
    prev = GENESIS_HASH
    for content in contents:
        event = {**content, "prev_hash": prev, "hash": event_hash(prev, content)}
        events.append(event)
        prev = event["hash"]
    return events


def _event(seq: int, kind: str, old: str, new: str, message: str, **data: Any) -> dict[str, Any]:
    return {
        "run": RUN_ID,
        "seq": seq,
        "time": f"2026-12-01T08:{seq:02d}:00.000001+00:00",
        "kind": kind,
        "old_state": old,
        "new_state": new,
        "message": message,
        "data": data,
    }


@dataclass
class Parts:
    """What a record is made of; ``manifest_changes`` are applied to the manifest after it is
    built from the rest (to make it say something the members do not)."""

    spec: dict[str, Any]
    tau_yaml: bytes | None
    bundle_files: dict[str, bytes] | None
    logs: dict[int, bytes]
    metrics: list[dict[str, Any]]
    events: list[dict[str, Any]]
    artifacts: dict[str, bytes]
    state: str = "succeeded"
    bundle_override: bytes | None = None  # bundle.zip bytes other than zip_of(bundle_files)
    manifest_changes: dict[str, Any] = field(default_factory=dict)


def sample_parts() -> Parts:
    """A run of two attempts (the first lost its node, the second resumed and succeeded)."""
    return Parts(
        spec={"name": "train-gpt", "resources": {"cpu": 2000, "memory": 4294967296}},
        tau_yaml=b"name: train-gpt\nresources:\n  cpu: 2\n",
        bundle_files={
            "src/train.py": b"print('training')\n",
            "requirements.txt": b"torch==2.5.1\n",
        },
        logs={1: b"step 1 loss 2.5\nnode lost\n", 2: b"resumed at 1\nstep 2 loss 1.0\ndone\n"},
        metrics=[
            {"attempt": 1, "key": "loss", "step": 1, "time": "2026-12-01T08:03:00Z", "value": 2.5},
            {"attempt": 2, "key": "loss", "step": 2, "time": "2026-12-01T08:05:00Z", "value": 1.0},
            {"attempt": 2, "key": "lr", "step": 2, "time": "2026-12-01T08:05:00Z", "value": 1e-7},
        ],
        events=chained(
            [
                _event(1, "submitted", "", "queued", "Submitted by ada."),
                _event(2, "state", "queued", "running", "Started.", attempt=1),
                _event(3, "workload.note", "", "", "ünïcode note", loss=1.0, ok=True),
                _event(4, "state", "running", "retrying", "Node lost.", attempt=1),
                _event(5, "state", "retrying", "succeeded", "Done.", attempt=2, exit_code=0),
            ]
        ),
        artifacts={"model/weights.bin": bytes(range(256)) * 40, "report.txt": b"accuracy 0.93\n"},
    )


def build(parts: Parts) -> tuple[bytes, list[archive.Member]]:
    """The canonical manifest and the members after it, in the export's order."""
    spec_bytes = canonical_json(parts.spec)
    members: list[archive.Member] = [archive.bytes_member(archive.SPEC, spec_bytes)]
    if parts.tau_yaml is not None:
        members.append(archive.bytes_member(archive.TAU_YAML, parts.tau_yaml))
    bundle: dict[str, Any] | None = None
    if parts.bundle_files is not None:
        bundle_bytes = parts.bundle_override or zip_of(parts.bundle_files)
        members.append(archive.bytes_member(archive.BUNDLE, bundle_bytes))
        bundle = {
            "sha256": _sha256(bundle_bytes),
            "size": len(bundle_bytes),
            "member": archive.BUNDLE,
            "files": [
                {"path": path, "sha256": _sha256(content), "size": len(content)}
                for path, content in sorted(parts.bundle_files.items())
            ],
        }
    for number, log in sorted(parts.logs.items()):
        members.append(archive.bytes_member(archive.attempt_log(number), log))
    metrics_bytes = b"".join(canonical_json(point) + b"\n" for point in parts.metrics)
    members.append(archive.bytes_member(archive.METRICS, metrics_bytes))
    events_bytes = b"".join(event_line(event) for event in parts.events)
    members.append(archive.bytes_member(archive.EVENTS, events_bytes))
    for path, content in sorted(parts.artifacts.items()):
        members.append(archive.bytes_member(archive.artifact_member(path), content))

    files = {}
    for member in members:
        with member.open() as stream:
            content = stream.read()
        files[member.name] = {"sha256": _sha256(content), "size": len(content)}
    attempt_count = max(parts.logs, default=0)
    manifest: dict[str, Any] = {
        "format": archive.FORMAT,
        "sealed_at": SEALED_AT,
        "portal": {"url": "https://tau.example.org", "version": "0.1.0"},
        "run": {
            "id": RUN_ID,
            "workspace": "alpha",
            "name": "train-gpt-7",
            "submitter": "ada",
            "state": parts.state,
            "failure_class": None,
            "created_at": "2026-12-01T08:01:00Z",
            "started_at": "2026-12-01T08:02:00Z",
            "finished_at": "2026-12-01T08:05:00Z",
            "attempts": attempt_count,
        },
        "spec": {"sha256": _sha256(spec_bytes), "member": archive.SPEC},
        "source": {"tau_yaml": archive.TAU_YAML if parts.tau_yaml is not None else None},
        "bundle": bundle,
        "image": {"reference": "python:3.11-slim", "digest": None},
        "environment": {
            "kind": "local-venv",
            "python": "3.11.9",
            "packages": [{"name": "torch", "version": "2.5.1"}],
        },
        "attempts": [
            {
                "number": number,
                "backend": "local",
                "objects": [],
                "cluster_queue": None,
                "flavor": None,
                "nodes": ["localhost"],
                "started_at": "2026-12-01T08:02:00Z",
                "finished_at": "2026-12-01T08:05:00Z",
                "exit_code": 0 if number == attempt_count else None,
                "failure_class": None if number == attempt_count else "node_lost",
                "resume_from": None if number == 1 else {"step": 1, "path": "ckpt/step-1"},
                "log": archive.attempt_log(number) if number in parts.logs else None,
            }
            for number in range(1, attempt_count + 1)
        ],
        "events": {
            "count": len(parts.events),
            "head": parts.events[-1]["hash"] if parts.events else GENESIS_HASH,
            "member": archive.EVENTS,
        },
        "metrics": {"count": len(parts.metrics), "member": archive.METRICS},
        "checkpoints": [{"attempt": 1, "step": 1, "path": "ckpt/step-1", "size": 1024}],
        "artifacts": [
            {
                "path": path,
                "size": len(content),
                "sha256": _sha256(content),
                "member": archive.artifact_member(path),
            }
            for path, content in sorted(parts.artifacts.items())
        ],
        "files": files,
    }
    for dotted, value in parts.manifest_changes.items():
        *outer, last = dotted.split(".")
        target = manifest
        for key in outer:
            target = target[key]
        target[last] = value
    return canonical_json(manifest), members


def tar_of(
    manifest_bytes: bytes,
    signature_bytes: bytes,
    members: list[archive.Member],
) -> bytes:
    head = [
        archive.bytes_member(archive.MANIFEST, manifest_bytes),
        archive.bytes_member(archive.SIGNATURE, signature_bytes),
    ]
    return b"".join(archive.tar_stream([*head, *members], mtime=SEALED_SECONDS))


def record(parts: Parts, key: Ed25519PrivateKey) -> bytes:
    """The sealed export of ``parts``, signed with ``key``."""
    manifest_bytes, members = build(parts)
    return tar_of(manifest_bytes, signature_document(key, manifest_bytes), members)
