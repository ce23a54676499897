"""A pipeline's record (``GET …/pipelines/{name}/evidence/``), client side: its format and its
offline check (``python -m tau.evidence verify FILE`` tells it from a run's record by its
first member, ``pipeline.json``).

The file is a tar, written in this order::

    pipeline.json    the manifest: RFC 8785 canonical JSON, signed (below)
    pipeline.sig     the signature over exactly those bytes (as a run record's manifest.sig)
    pipeline.yaml    the file as submitted
    history.jsonl    the pipeline's hash-chained history, one event a line
    stages/STAGE/…   each stage's own record: the run's sealed record (a tar, signed) or the
                     endpoint's history (JSON lines)

The manifest names the pipeline, how its history ends (event count and head hash), each
stage (its state, needs, gate and what the gate read, its final metrics, its run — spec hash,
code digest, the member of its record — or its endpoint, and what it read and made, each
dataset and model version by manifest digest), the lineage graph (dataset versions → runs →
model versions → endpoint), and every other member's SHA-256 and size.

The check: the signature (by the key the record carries, or one of ``--key``'s), the
manifest's canonical form, every member's digest and size and no member unnamed, the chain
of the history and that it ends where the manifest says, pipeline.yaml's stages and needs,
each stage's run or endpoint named by the history, the lineage's nodes all known, and each
stage's record checked in full as its own file is (a run's signature and contents; an
endpoint's chain).
"""

from __future__ import annotations

import hashlib
import json
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tau.evidence.canonical import canonical_json
from tau.evidence.chain import ChainChecker, event_line
from tau.evidence.history import verify_history_file
from tau.evidence.keys import KeyFormatError, read_signature_document, signature_is_valid

FORMAT = "taugrid-pipeline-record/1"
MANIFEST = "pipeline.json"
SIGNATURE = "pipeline.sig"
SOURCE = "pipeline.yaml"
HISTORY = "history.jsonl"
STAGES = "stages/"
#: The members in their fixed order, before the stages' records.
FIXED = (MANIFEST, SIGNATURE, SOURCE, HISTORY)
#: The most a manifest, a signature, pipeline.yaml or the history may be, read whole.
MAX_SMALL = 64 << 20


def stage_member(stage: str, file_name: str) -> str:
    return f"{STAGES}{stage}/{file_name}"


def is_pipeline_record(first_block: bytes) -> bool:
    """Whether a file that starts with ``first_block`` (its first 512 bytes) is a pipeline's
    record: a tar whose first member is ``pipeline.json``."""
    return first_block[:100].rstrip(b"\0") == MANIFEST.encode()


def sha256_of(stream: IO[bytes]) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    while chunk := stream.read(1 << 20):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


@dataclass
class PipelineReport:
    path: str
    problems: list[str] = field(default_factory=list)
    key_id: str | None = None
    trusted: bool | None = None
    pipeline: dict[str, Any] = field(default_factory=dict)
    workspace: str = ""
    events: int = 0
    stages: list[str] = field(default_factory=list)
    records: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "file": self.path,
            "ok": self.ok,
            "format": FORMAT,
            "problems": self.problems,
            "signer": {"key_id": self.key_id, "trusted": self.trusted},
            "pipeline": {**self.pipeline, "workspace": self.workspace},
            "counts": {"events": self.events, "stages": len(self.stages), "records": self.records},
        }

    def text(self) -> str:
        if not self.ok:
            lines = [f"FAILED {self.path}: {len(self.problems)} problem(s)"]
            lines += [f"  - {problem}" for problem in self.problems]
            return "\n".join(lines)
        signer = (
            f"{self.key_id}, a trusted key"
            if self.trusted
            else f"{self.key_id} (the key the record carries); NOT checked against a trusted "
            "key: pass --key KEYRING to check who signed"
        )
        pipeline = self.pipeline
        return "\n".join(
            [
                f"OK {self.path} ({FORMAT})",
                f"  pipeline   {self.workspace}/{pipeline.get('name')} (id {pipeline.get('id')}), "
                f"state {pipeline.get('state')}, {len(self.stages)} stages",
                f"  signed by  {signer}",
                f"  verified   the signature; every member (SHA-256 and size); {self.events} "
                f"events (chain); pipeline.yaml; {self.records} stage records, each in full",
            ]
        )


class _Check:
    def __init__(
        self, tar: tarfile.TarFile, trusted_keys: dict[str, bytes] | None, check_run: RunCheck
    ) -> None:
        self.tar = tar
        self.trusted_keys = trusted_keys
        self.check_run = check_run
        self.problems: list[str] = []
        self.members: dict[str, tarfile.TarInfo] = {}
        self.order: list[str] = []

    def problem(self, text: str) -> None:
        self.problems.append(text)

    def read_members(self) -> None:
        try:
            for info in self.tar:
                if not info.isreg():
                    self.problem(f"{info.name}: not a regular file")
                    continue
                if info.name in self.members:
                    self.problem(f"{info.name}: member repeated")
                    continue
                self.members[info.name] = info
                self.order.append(info.name)
        except tarfile.TarError as error:
            self.problem(f"the tar is damaged after {len(self.order)} members: {error}")
        fixed = [name for name in FIXED if name in self.members]
        if self.order[: len(fixed)] != fixed:
            self.problem(f"members out of order: {', '.join(FIXED)} come first, in that order")
        for name in self.order:
            if name not in FIXED and not _is_stage_member(name):
                self.problem(f"{name!r}: no such member in a pipeline's record")

    def member_bytes(self, name: str, limit: int = MAX_SMALL) -> bytes | None:
        info = self.members.get(name)
        if info is None:
            self.problem(f"{name}: missing")
            return None
        if info.size > limit:
            self.problem(f"{name}: larger than {limit} bytes")
            return None
        extracted = self.tar.extractfile(info)
        assert extracted is not None  # a regular file
        return extracted.read()

    def digest(self, name: str) -> tuple[str, int]:
        extracted = self.tar.extractfile(self.members[name])
        assert extracted is not None
        return sha256_of(extracted)


def _object(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one (its absence is said elsewhere)."""
    return value if isinstance(value, dict) else {}


def _is_stage_member(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 3 and parts[0] == "stages" and all(parts[1:]) and ".." not in parts


#: How a stage's run record is checked: ``tau.evidence.verify.verify_file`` (given by the
#: caller: that module reads this one), called with the file's path and the trusted keys,
#: answering a report with ``problems`` and ``run``.
RunCheck = Callable[[str, "dict[str, bytes] | None"], Any]


def verify_pipeline_file(
    path: str | Path, trusted_keys: dict[str, bytes] | None = None, *, check_run: RunCheck
) -> PipelineReport:
    """Check the pipeline record at ``path`` (module docstring), each stage's run record with
    ``check_run``. ``OSError`` when it cannot be opened."""
    report = PipelineReport(path=str(path))
    with open(path, "rb") as raw:
        try:
            tar = tarfile.open(fileobj=raw, mode="r:")  # noqa: SIM115 - the with below closes it
        except tarfile.TarError as error:
            report.problems.append(f"not a tar file ({error})")
            return report
        with tar:
            check = _Check(tar, trusted_keys, check_run)
            _verify(check, report)
    report.problems = check.problems
    return report


def _verify(check: _Check, report: PipelineReport) -> None:
    check.read_members()
    manifest_bytes = check.member_bytes(MANIFEST)
    signature_bytes = check.member_bytes(SIGNATURE, 1 << 16)
    if manifest_bytes is None:
        return
    try:
        manifest = json.loads(manifest_bytes)
    except (UnicodeDecodeError, ValueError) as error:
        check.problem(f"{MANIFEST}: not JSON ({error})")
        return
    if not isinstance(manifest, dict):
        check.problem(f"{MANIFEST}: not a JSON object")
        return
    if canonical_json(manifest) != manifest_bytes:
        check.problem(f"{MANIFEST}: not canonical JSON (RFC 8785): a byte was changed")
    if manifest.get("format") != FORMAT:
        check.problem(f"{MANIFEST}: format {manifest.get('format')!r}, not {FORMAT!r}")
        return
    if signature_bytes is not None:
        _check_signature(check, report, manifest_bytes, signature_bytes)
    pipeline = _object(manifest.get("pipeline"))
    report.pipeline = {key: pipeline.get(key) for key in ("id", "name", "state")}
    report.workspace = str(manifest.get("workspace") or "")
    _check_files(check, manifest)
    stages = [stage for stage in manifest.get("stages") or [] if isinstance(stage, dict)]
    report.stages = [str(stage.get("name")) for stage in stages]
    _check_source(check, stages)
    events = _check_history(check, report, manifest, pipeline)
    _check_stages(check, report, stages, events)
    _check_lineage(check, manifest, stages)


def _check_signature(
    check: _Check, report: PipelineReport, manifest_bytes: bytes, signature_bytes: bytes
) -> None:
    try:
        signature = read_signature_document(signature_bytes)
    except KeyFormatError as error:
        check.problem(f"{SIGNATURE}: {error}")
        return
    report.key_id = signature.key_id
    if not signature_is_valid(signature, manifest_bytes):
        check.problem(
            f"{SIGNATURE}: the signature does not match {MANIFEST} (key {signature.key_id})"
        )
    if check.trusted_keys is None:
        return
    report.trusted = check.trusted_keys.get(signature.key_id) == signature.public_key
    if not report.trusted:
        check.problem(
            f"{SIGNATURE}: signed by {signature.key_id}, which is not among the trusted keys "
            f"({', '.join(sorted(check.trusted_keys)) or 'none'})"
        )


def _check_files(check: _Check, manifest: dict[str, Any]) -> None:
    files = manifest.get("files")
    if not isinstance(files, dict):
        check.problem(f"{MANIFEST}: no files")
        return
    for name in check.order:
        if name in (MANIFEST, SIGNATURE):
            continue
        expected = files.get(name)
        if not isinstance(expected, dict):
            check.problem(f"{name}: not named in {MANIFEST}")
            continue
        digest, size = check.digest(name)
        if size != expected.get("size"):
            check.problem(f"{name}: {size} bytes, {MANIFEST} says {expected.get('size')}")
        if digest != expected.get("sha256"):
            check.problem(f"{name}: its SHA-256 is not the one {MANIFEST} gives")
    for name in files:
        if name not in check.members:
            check.problem(f"{name}: named in {MANIFEST}, not in the file")


def _check_source(check: _Check, stages: list[dict[str, Any]]) -> None:
    source = check.member_bytes(SOURCE)
    if source is None:
        return
    from tau.pipeline import load_pipeline

    pipeline_file, problems = load_pipeline(source)
    if pipeline_file is None:
        check.problem(f"{SOURCE}: not a valid pipeline.yaml ({len(problems)} problem(s))")
        return
    said = [(str(stage.get("name")), list(stage.get("needs") or [])) for stage in stages]
    written = [(stage.name, list(stage.needs)) for stage in pipeline_file.stages]
    if said != written:
        check.problem(f"{MANIFEST}: its stages are not those of {SOURCE}")


def _check_history(
    check: _Check, report: PipelineReport, manifest: dict[str, Any], pipeline: dict[str, Any]
) -> list[dict[str, Any]]:
    data = check.member_bytes(HISTORY, 1 << 30)
    if data is None:
        return []
    checker = ChainChecker("pipeline")
    events: list[dict[str, Any]] = []
    for number, raw in enumerate(data.splitlines(keepends=True), start=1):
        try:
            event = json.loads(raw)
        except ValueError as error:
            check.problem(f"{HISTORY} line {number}: not JSON ({error})")
            continue
        if not isinstance(event, dict):
            check.problem(f"{HISTORY} line {number}: not a JSON object")
            continue
        if event_line(event) != raw:
            check.problem(f"{HISTORY} line {number}: not in its written form (a byte was changed)")
        if event.get("pipeline") != pipeline.get("id"):
            check.problem(f"{HISTORY} event seq {event.get('seq')}: of another pipeline")
        checker.add(event)
        events.append(event)
    check.problems += [f"{HISTORY}: {problem}" for problem in checker.problems]
    history = _object(manifest.get("history"))
    if history.get("event_count") != checker.count:
        check.problem(
            f"{MANIFEST}: says {history.get('event_count')} events, {HISTORY} holds {checker.count}"
        )
    if history.get("head") != checker.head:
        check.problem(f"{MANIFEST}: its history head is not the hash of the last event")
    ends = [event.get("new_state") for event in events if event.get("kind") == "ended"]
    if ends and pipeline.get("state") != ends[-1]:
        check.problem(f"{MANIFEST}: state {pipeline.get('state')!r}, the history ends {ends[-1]!r}")
    report.events = checker.count
    return events


#: The history's events that name the run (or endpoint) standing for a stage.
STARTS = {"stage_started", "stage_reused"}


def _check_stages(
    check: _Check,
    report: PipelineReport,
    stages: list[dict[str, Any]],
    events: list[dict[str, Any]],
) -> None:
    named: dict[str, set[str]] = {}
    for event in events:
        data = _object(event.get("data"))
        if event.get("kind") in STARTS and data.get("stage"):
            for key in ("run", "endpoint"):
                if data.get(key):
                    named.setdefault(str(data["stage"]), set()).add(str(data[key]))
    for stage in stages:
        name = str(stage.get("name"))
        run = stage.get("run") if isinstance(stage.get("run"), dict) else None
        endpoint = stage.get("endpoint") if isinstance(stage.get("endpoint"), dict) else None
        stands = (run or endpoint or {}).get("name")
        if stands is not None and str(stands) not in named.get(name, set()):
            check.problem(f"stage {name}: {stands} is not the one its history started")
        member = (run or endpoint or {}).get("record")
        if member is None:
            continue
        if member not in check.members or not str(member).startswith(f"{STAGES}{name}/"):
            check.problem(f"stage {name}: its record {member!r} is not in the file")
            continue
        report.records += 1
        for problem in _nested(check, str(member), run, endpoint):
            check.problem(f"{member}: {problem}")


def _nested(
    check: _Check, member: str, run: dict[str, Any] | None, endpoint: dict[str, Any] | None
) -> list[str]:
    """The problems of a stage's own record, checked in full as that file alone would be."""
    extracted = check.tar.extractfile(check.members[member])
    assert extracted is not None
    with tempfile.NamedTemporaryFile(suffix=Path(member).name) as copy:
        while chunk := extracted.read(1 << 20):
            copy.write(chunk)
        copy.flush()
        if endpoint is not None:
            history = verify_history_file(copy.name)
            problems = list(history.problems)
            if history.endpoint.get("name") != endpoint.get("name"):
                problems.append(f"the history is of {history.endpoint.get('name')!r}")
            return problems
        report = check.check_run(copy.name, check.trusted_keys)
        problems = list(report.problems)
        assert run is not None
        if report.run.get("name") != run.get("name"):
            problems.append(f"the record is of {report.run.get('name')!r}, not {run.get('name')}")
        return problems


def _check_lineage(check: _Check, manifest: dict[str, Any], stages: list[dict[str, Any]]) -> None:
    """Every node of the lineage graph is something the stages name: a run or endpoint of a
    stage, or a version one of them read or made."""
    known: set[str] = set()
    for stage in stages:
        for key in ("run", "endpoint"):
            value = stage.get(key)
            if isinstance(value, dict) and value.get("name"):
                known.add(f"{key}:{value['name']}")
        for item in [*(stage.get("inputs") or []), *(stage.get("outputs") or [])]:
            if isinstance(item, dict):
                known.add(f"{item.get('kind')}:{item.get('ref')}")
        endpoint = stage.get("endpoint")
        if isinstance(endpoint, dict) and isinstance(endpoint.get("model"), dict):
            known.add(f"model:{endpoint['model'].get('ref')}")
    lineage = manifest.get("lineage")
    edges = lineage.get("edges") if isinstance(lineage, dict) else None
    if not isinstance(edges, list):
        check.problem(f"{MANIFEST}: no lineage")
        return
    for edge in edges:
        if not (isinstance(edge, list) and len(edge) == 2):
            check.problem(f"{MANIFEST}: lineage edge {edge!r} is not a pair")
            continue
        for node in edge:
            if node not in known:
                check.problem(f"{MANIFEST}: lineage names {node!r}, which no stage read or made")
