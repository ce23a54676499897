"""A pipeline's record, server side: one file holding its signed manifest, pipeline.yaml, its
hash-chained history and every stage's own record (format and offline check:
``tau.evidence.pipeline_record``).

It is made when asked for, once the pipeline has ended and each of its stages' runs has its
record sealed (a run's record is sealed by a worker right after it ends): the members are
written to a scratch folder first (each stage's run record is its export, exactly the bytes
``GET …/runs/{run}/evidence/`` answers), their digests go into the manifest, the manifest is
signed with the portal's evidence key, and the tar is written whole before a byte is sent.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from django.db import transaction

from evidence.export import FileGone, export_stream
from evidence.keys import signing_key
from evidence.selectors import current_record, file_name
from pipelines.events import SUBJECT
from pipelines.models import Pipeline, PipelineEvent, PipelineStage
from pipelines.orchestration import lock_pipeline
from pipelines.planning import PipelineState, StageState
from portal.event_chain import export_line
from tau.evidence import archive
from tau.evidence.canonical import canonical_json
from tau.evidence.chain import GENESIS_HASH, event_line
from tau.evidence.keys import signature_document
from tau.evidence.pipeline_record import (
    FORMAT,
    HISTORY,
    MANIFEST,
    SIGNATURE,
    SOURCE,
    sha256_of,
    stage_member,
)

#: Stages whose run has ended, so that its record exists once sealed.
ENDED = frozenset(
    {StageState.SUCCEEDED, StageState.REUSED, StageState.FAILED, StageState.CANCELLED}
)


class NotReady(Exception):
    """The record cannot be made yet; the message says why and when it can."""


def _time(moment: Any) -> str | None:
    return moment.isoformat() if moment is not None else None


def record_name(pipeline: Pipeline) -> str:
    return f"{pipeline.name}.pipeline.tar"


def build_record(pipeline: Pipeline) -> IO[bytes]:
    """The pipeline's record as an open file, read from its start (its path already removed:
    closing it frees it). ``NotReady`` while it runs or a stage's record is being sealed."""
    with transaction.atomic():
        locked = lock_pipeline(pipeline.pk)
        if locked.state == PipelineState.RUNNING:
            raise NotReady(f"{locked.name} is still running: its record is made once it has ended.")
        last = (
            PipelineEvent.objects.for_workspace(locked.workspace_id)
            .filter(pipeline=locked)
            .order_by("-seq")
            .only("seq", "hash")
            .first()
        )
        stages = list(
            PipelineStage.objects.for_workspace(locked.workspace_id)
            .filter(pipeline=locked)
            .select_related("run__bundle", "endpoint__model_version__asset")
            .order_by("position")
        )
    count = last.seq if last is not None else 0
    with tempfile.TemporaryDirectory(prefix="pipeline-record-") as scratch:
        folder = Path(scratch)
        files: dict[str, dict[str, Any]] = {}
        members: list[archive.Member] = []

        def keep(name: str, path: Path) -> None:
            with open(path, "rb") as handle:
                digest, size = sha256_of(handle)
            files[name] = {"sha256": digest, "size": size}
            members.append(archive.Member(name, size, lambda: open(path, "rb")))  # noqa: SIM115

        source = folder / "source"
        source.write_bytes(locked.source.encode("utf-8"))
        keep(SOURCE, source)
        history = folder / "history"
        with open(history, "wb") as out:
            for line in _history_lines(locked, count):
                out.write(line)
        keep(HISTORY, history)
        described = []
        for index, stage in enumerate(stages):
            entry = _stage_entry(stage)
            made = _stage_file(stage, folder / f"stage-{index}")
            if made is not None:
                member_name, path = made
                member = stage_member(stage.name, member_name)
                keep(member, path)
                (entry["run"] or entry["endpoint"])["record"] = member
            described.append(entry)
        manifest = {
            "format": FORMAT,
            "workspace": locked.workspace.slug,
            "pipeline": {
                "id": locked.pk,
                "name": locked.name,
                "spec_name": locked.spec_name,
                "state": locked.state,
                "state_reason": locked.state_reason,
                "created_by": locked.created_by_username,
                "created_at": _time(locked.created_at),
                "ended_at": _time(locked.ended_at),
                "rerun": list(locked.rerun),
            },
            "history": {
                "event_count": count,
                "head": last.hash if last is not None else GENESIS_HASH,
            },
            "stages": described,
            "lineage": {"edges": _lineage(described)},
            "files": files,
        }
        manifest_bytes = canonical_json(manifest)
        signature = signature_document(signing_key(), manifest_bytes)
        ordered = [
            archive.bytes_member(MANIFEST, manifest_bytes),
            archive.bytes_member(SIGNATURE, signature),
            *members,
        ]
        handle, target = tempfile.mkstemp(prefix="pipeline-record-", suffix=".tar")
        try:
            with os.fdopen(handle, "wb") as out:
                mtime = int((locked.ended_at or locked.created_at).timestamp())
                for chunk in archive.tar_stream(ordered, mtime=mtime):
                    out.write(chunk)
            result = open(target, "rb")  # noqa: SIM115 - the caller closes it
        finally:
            os.unlink(target)
    return result


def _history_lines(pipeline: Pipeline, count: int) -> Iterator[bytes]:
    after = 0
    while after < count:
        page = list(
            PipelineEvent.objects.for_workspace(pipeline.workspace_id)
            .filter(pipeline=pipeline, seq__gt=after, seq__lte=count)
            .order_by("seq")[:2000]
        )
        if not page:
            return
        for event in page:
            yield event_line(export_line(event, subject=SUBJECT, subject_id=pipeline.pk))
        after = page[-1].seq


def _stage_entry(stage: PipelineStage) -> dict[str, Any]:
    """What the manifest says of a stage: its state and decisions, and what stands for it
    with what that read and made, each version by its manifest digest."""
    from catalog.models import AssetVersion, RunInput

    run = stage.run
    inputs: list[dict[str, Any]] = []
    outputs: list[dict[str, Any]] = []
    if run is not None:
        for item in (
            RunInput.objects.for_workspace(run.workspace_id)
            .filter(run=run)
            .select_related("version__asset")
            .order_by("id")
        ):
            inputs.append(
                {
                    "kind": item.version.asset.kind,
                    "ref": item.version.ref,
                    "manifest_digest": item.version.manifest_digest,
                    "path": item.path,
                }
            )
        for version in (
            AssetVersion.objects.for_workspace(run.workspace_id)
            .filter(produced_by=run)
            .select_related("asset")
            .order_by("asset__kind", "asset__name", "number")
        ):
            outputs.append(
                {
                    "kind": version.asset.kind,
                    "ref": version.ref,
                    "manifest_digest": version.manifest_digest,
                }
            )
    endpoint = stage.endpoint
    model = endpoint.model_version if endpoint is not None else None
    return {
        "name": stage.name,
        "state": stage.state,
        "reason": stage.reason,
        "needs": list(stage.needs),
        "config": stage.config,
        "gate": stage.gate or None,
        "gate_decision": dict(stage.gate_decision) or None,
        "metrics": dict(stage.metrics),
        "started_at": _time(stage.started_at),
        "ended_at": _time(stage.ended_at),
        "run": {
            "name": run.name,
            "state": run.state,
            "spec_hash": run.spec_hash,
            "bundle": run.bundle.sha256 if run.bundle else None,
            "reused": stage.state == StageState.REUSED,
        }
        if run is not None
        else None,
        "endpoint": {
            "name": endpoint.name,
            "state": endpoint.state,
            "spec_hash": endpoint.spec_hash,
            "model": {"ref": model.ref, "manifest_digest": model.manifest_digest}
            if model is not None
            else None,
        }
        if endpoint is not None
        else None,
        "inputs": inputs,
        "outputs": outputs,
    }


def _stage_file(stage: PipelineStage, path: Path) -> tuple[str, Path] | None:
    """The stage's own record written to ``path``: its run's sealed record (``NotReady`` while
    it is being sealed), or its endpoint's history; None for a stage that never started."""
    if stage.endpoint is not None:
        from serving.history import history_export

        with open(path, "wb") as out:
            for line in history_export(stage.endpoint):
                out.write(line)
        return f"{stage.endpoint.name}.history.jsonl", path
    run = stage.run
    if run is None or stage.state not in ENDED:
        return None
    record = current_record(run)
    if record is None:
        raise NotReady(
            f"the record of {run.name} (stage {stage.name}) is still being sealed: ask again "
            "in a moment."
        )
    try:
        _, chunks = export_stream(record)
    except FileGone as error:
        message = f"the record of {run.name} (stage {stage.name}) cannot be read: {error}"
        raise NotReady(message) from None
    with open(path, "wb") as out:
        for chunk in chunks:
            out.write(chunk)
    return file_name(run, record.attempt_count), path


def record_bytes(pipeline: Pipeline) -> bytes:
    """The whole record in memory (tests, small pipelines)."""
    with build_record(pipeline) as handle:
        return handle.read()


def _lineage(stages: list[dict[str, Any]]) -> list[list[str]]:
    """The lineage graph's edges, each ``[from, to]``: a version a run read → the run, the
    run → a version it made, the model version an endpoint serves → the endpoint. Nodes are
    ``run:NAME``, ``endpoint:NAME``, ``dataset:NAME@N``, ``model:NAME@N``."""
    edges: list[list[str]] = []
    for stage in stages:
        run, endpoint = stage["run"], stage["endpoint"]
        if run is not None:
            node = f"run:{run['name']}"
            edges += [[f"{item['kind']}:{item['ref']}", node] for item in stage["inputs"]]
            edges += [[node, f"{item['kind']}:{item['ref']}"] for item in stage["outputs"]]
        if endpoint is not None and endpoint["model"] is not None:
            edges.append([f"model:{endpoint['model']['ref']}", f"endpoint:{endpoint['name']}"])
    unique: list[list[str]] = []
    for edge in edges:
        if edge not in unique:
            unique.append(edge)
    return unique
