"""The offline verifier of an exported evidence record (docs/evidence.md, "What verify checks").

It trusts nothing in the file until it has checked it: the tar's every header, padding and
trailer against what the writer produces, its members in the order the format fixes, the
signature over the manifest (and the signer against the keys it was told to trust), every
member's digest and size against the manifest, the files inside ``bundle.zip``, the event
chain, the metric count and the artifacts. It goes on after the first mismatch and names every
one (the member, the manifest field, the event's ``seq``), so a reader sees at once how much
of the record is affected.

Members are hashed as streams, a chunk at a time: a record holding a 1 GiB log is verified
in a few MiB of memory.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tarfile
import zipfile
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, Any

from tau.evidence import archive
from tau.evidence.canonical import canonical_json
from tau.evidence.chain import ChainChecker
from tau.evidence.history import HistoryReport, is_history, verify_history_file
from tau.evidence.keys import (
    KeyFormatError,
    load_trusted_keys,
    read_signature_document,
    signature_is_valid,
)
from tau.evidence.pipeline_record import PipelineReport, is_pipeline_record, verify_pipeline_file

__all__ = [
    "EXIT_MISMATCH",
    "EXIT_OK",
    "EXIT_USAGE",
    "Report",
    "UnreadableError",
    "verify_and_report",
    "verify_file",
]

EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_USAGE = 2

CHUNK = 1 << 20

# What zipfile raises for a damaged or unusual archive (an unknown compression method, an
# encrypted entry, a truncated stream): each is a mismatch to report, never a crash.
_ZIP_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    OSError,
    EOFError,
    ValueError,
    NotImplementedError,
    RuntimeError,
    zlib.error,
)


class UnreadableError(Exception):
    """The file cannot be read at all (missing, a directory, no permission): a usage error,
    not a verdict on the record."""


@dataclass
class Report:
    """What ``verify_file`` found. ``trusted`` is True when the signer is one of the trusted
    keys, False when trusted keys were given and it is not among them, None when none were
    given (the signature was checked with the key the record carries, the signer was not)."""

    path: str
    problems: list[str] = field(default_factory=list)
    key_id: str | None = None
    trusted: bool | None = None
    sealed_at: str | None = None
    run: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "file": self.path,
            "ok": self.ok,
            "format": archive.FORMAT,
            "problems": self.problems,
            "signer": {"key_id": self.key_id, "trusted": self.trusted},
            "sealed_at": self.sealed_at,
            "run": self.run,
            "counts": self.counts,
        }

    def text(self) -> str:
        if not self.ok:
            lines = [f"FAILED {self.path}: {len(self.problems)} problem(s)"]
            lines += [f"  - {problem}" for problem in self.problems]
            return "\n".join(lines)
        run = self.run
        if self.trusted:
            signer = f"{self.key_id}, a trusted key"
        else:
            signer = (
                f"{self.key_id} (the key the record carries); NOT checked against a trusted "
                "key: pass --key KEYRING to check who signed"
            )
        counts = self.counts
        checked = (
            f"the signature; {counts['members']} members (SHA-256 and size); "
            f"bundle.zip with {counts['bundle_files']} files; {counts['events']} events "
            f"(chain); {counts['metrics']} metric points; {counts['artifacts']} artifacts; "
            f"{counts['attempt_logs']} attempt logs"
        )
        return "\n".join(
            [
                f"OK {self.path} ({archive.FORMAT})",
                f"  run        {run.get('workspace')}/{run.get('name')} (id {run.get('id')}), "
                f"state {run.get('state')}, {run.get('attempts')} attempt(s)",
                f"  sealed at  {self.sealed_at}",
                f"  signed by  {signer}",
                f"  verified   {checked}",
            ]
        )


@dataclass
class _Digest:
    sha256: str
    size: int


def _hash_stream(stream: IO[bytes]) -> _Digest:
    digest = hashlib.sha256()
    size = 0
    while chunk := stream.read(CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return _Digest(digest.hexdigest(), size)


def _sealed_seconds(sealed_at: str) -> int | None:
    # datetime.fromisoformat reads "Z" only from Python 3.11 on; the client runs on 3.10.
    try:
        moment = datetime.fromisoformat(sealed_at.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.utcoffset() != timedelta(0):
        return None
    seconds = int(moment.timestamp())
    return seconds if 0 <= seconds < 8**11 else None  # what a tar header's mtime holds


class _Verifier:
    def __init__(self, tar: tarfile.TarFile, raw: IO[bytes], trusted_keys: dict[str, bytes] | None):
        self.tar = tar
        self.raw = raw
        self.trusted_keys = trusted_keys
        self.problems: list[str] = []
        self.members: dict[str, tarfile.TarInfo] = {}
        self.digests: dict[str, _Digest] = {}
        self.infos: list[tarfile.TarInfo] = []

    def problem(self, text: str) -> None:
        self.problems.append(text)

    # 1. The tar: regular files with allowed, unique names, each header and all padding
    # exactly as archive.tar_stream writes them, nothing after the end.
    def read_members(self) -> None:
        infos: list[tarfile.TarInfo] = []
        try:
            for info in self.tar:
                infos.append(info)
        except tarfile.TarError as error:
            self.problem(f"the tar is damaged after {len(infos)} members: {error}")
        for info in infos:
            try:
                archive.check_member_name(info.name)
            except archive.MemberNameError:
                self.problem(f"{info.name!r}: member name not allowed")
                continue
            if not info.isreg():
                self.problem(f"{info.name}: not a regular file")
                continue
            if info.name in self.members:
                self.problem(f"{info.name}: member repeated")
                continue
            self.members[info.name] = info
            try:
                extracted = self.tar.extractfile(info)
                assert extracted is not None  # a regular file always has content
                self.digests[info.name] = _hash_stream(extracted)
            except (OSError, tarfile.TarError) as error:
                self.problem(f"{info.name}: cannot be read ({error})")
        self.infos = infos

    def check_order(self) -> None:
        """The members in the order the format fixes (``archive.member_rank``): a reader
        may rely on it (the manifest first, to stream the rest against it), and an export
        written any other way was not written by the format's writer."""
        previous: tuple[str, tuple[int, int, str]] | None = None
        for info in self.infos:
            if info.name not in self.members:
                continue  # refused by name or type already
            rank = archive.member_rank(info.name)
            if rank is None:
                self.problem(f"{info.name}: the format has no place for this member")
                continue
            if previous is not None and rank <= previous[1]:
                self.problem(
                    f"{info.name}: out of order (after {previous[0]}); members come in the "
                    "order docs/evidence.md gives: manifest.json, manifest.sig, spec.json, "
                    "tau.yaml, bundle.zip, attempts/<n>/log.txt by n, metrics.jsonl, "
                    "events.jsonl, artifacts/<path> by path"
                )
            previous = (info.name, rank)

    def check_layout(self, mtime: int | None) -> None:
        position = 0
        for info in self.infos:
            self.raw.seek(info.offset)
            header = self.raw.read(info.offset_data - info.offset)
            # Members refused by name or type have been named already.
            if (
                mtime is not None
                and info.name in self.members
                and header != archive.member_header(info.name, info.size, mtime)
            ):
                self.problem(
                    f"{info.name}: tar header is not what the format writes "
                    "(mode 0644, owner 0/0, mtime = sealed_at)"
                )
            if info.offset != position:
                self.problem(f"{info.name}: unexpected bytes before its header")
            end = info.offset_data + info.size
            padding = -info.size % archive.BLOCK
            self.raw.seek(end)
            if self.raw.read(padding) != bytes(padding):
                self.problem(f"{info.name}: padding after the member is not zeros")
            position = end + padding
        self.raw.seek(position)
        trailer = _zeros_to_end(self.raw)
        expected = 2 * archive.BLOCK + (-(position + 2 * archive.BLOCK) % archive.RECORD)
        if trailer != expected:
            self.problem("the end of the tar is not two zero blocks padded to a 10 KiB record")

    def member_bytes(self, name: str, limit: int) -> bytes | None:
        info = self.members.get(name)
        if info is None:
            self.problem(f"{name}: missing")
            return None
        if info.size > limit:
            self.problem(f"{name}: {info.size} bytes, too large for this member")
            return None
        extracted = self.tar.extractfile(info)
        assert extracted is not None
        return extracted.read()

    def open_member(self, name: str) -> IO[bytes] | None:
        info = self.members.get(name)
        return None if info is None else self.tar.extractfile(info)


def _zeros_to_end(stream: IO[bytes]) -> int:
    """How many bytes are left, or -1 if any of them is not zero."""
    size = 0
    while chunk := stream.read(CHUNK):
        if chunk.count(0) != len(chunk):
            return -1
        size += len(chunk)
    return size


class _Fields:
    """Typed reads of the manifest that report a bad field instead of raising, so one wrong
    field never hides the checks after it."""

    def __init__(self, verifier: _Verifier) -> None:
        self.verifier = verifier

    def get(self, container: Any, key: str, kind: type, where: str) -> Any:
        value = container.get(key) if isinstance(container, dict) else None
        if not isinstance(value, kind):
            self.verifier.problem(f"manifest {where}: missing or not the right type")
            return None
        return value


def verify_file(path: str | Path, trusted_keys: dict[str, bytes] | None = None) -> Report:
    """Check the record at ``path`` (every check in docs/evidence.md); ``trusted_keys`` (key id
    to raw public key) are the signers to accept, None to accept the key the record carries
    and say so. Raises ``UnreadableError`` when the file cannot be opened."""
    report = Report(path=str(path))
    try:
        raw = open(path, "rb")  # noqa: SIM115 - the with below closes it; only opening may fail
    except OSError as error:
        raise UnreadableError(f"cannot read {path}: {error.strerror or error}") from None
    with raw:
        try:
            tar = tarfile.open(fileobj=raw, mode="r:")  # noqa: SIM115 - as for raw
        except tarfile.TarError as error:
            report.problems.append(f"not a tar file ({error})")
            return report
        with tar:
            verifier = _Verifier(tar, raw, trusted_keys)
            _verify(verifier, report)
    report.problems = verifier.problems
    return report


def _verify(verifier: _Verifier, report: Report) -> None:
    verifier.read_members()
    verifier.check_order()
    manifest_bytes = verifier.member_bytes(archive.MANIFEST, 64 << 20)
    signature_bytes = verifier.member_bytes(archive.SIGNATURE, 1 << 16)
    manifest: dict[str, Any] = {}
    if manifest_bytes is not None:
        try:
            parsed = json.loads(manifest_bytes)
        except (UnicodeDecodeError, ValueError) as error:
            verifier.problem(f"{archive.MANIFEST}: not JSON ({error})")
        else:
            if not isinstance(parsed, dict):
                verifier.problem(f"{archive.MANIFEST}: not a JSON object")
            else:
                manifest = parsed
                try:
                    canonical = canonical_json(manifest) == manifest_bytes
                except (TypeError, ValueError):
                    canonical = False
                if not canonical:
                    verifier.problem(f"{archive.MANIFEST}: not canonical JSON (RFC 8785)")
    fields = _Fields(verifier)
    if manifest and manifest.get("format") != archive.FORMAT:
        verifier.problem(f"manifest format: {manifest.get('format')!r}, not {archive.FORMAT!r}")
    sealed_at = fields.get(manifest, "sealed_at", str, "sealed_at") if manifest else None
    report.sealed_at = sealed_at
    mtime = _sealed_seconds(sealed_at) if sealed_at else None
    if sealed_at and mtime is None:
        verifier.problem(f"manifest sealed_at: {sealed_at!r} is not an RFC 3339 UTC time")
    verifier.check_layout(mtime)

    # 2. The signature, and the signer against the trusted keys.
    if manifest_bytes is not None and signature_bytes is not None:
        _check_signature(verifier, report, manifest_bytes, signature_bytes)
    if not manifest:
        return
    run = fields.get(manifest, "run", dict, "run") or {}
    report.run = {
        key: run.get(key) for key in ("id", "workspace", "name", "submitter", "state", "attempts")
    }

    # 3. Every member against files; none missing, none extra.
    files = fields.get(manifest, "files", dict, "files") or {}
    _check_files(verifier, files)

    # The manifest's own references to members.
    spec = fields.get(manifest, "spec", dict, "spec") or {}
    _expect_member(verifier, files, spec.get("member"), archive.SPEC, "spec.member")
    spec_file = files.get(archive.SPEC)
    if isinstance(spec_file, dict) and spec.get("sha256") != spec_file.get("sha256"):
        verifier.problem("manifest spec.sha256: not the SHA-256 of spec.json")
    source = fields.get(manifest, "source", dict, "source") or {}
    if source.get("tau_yaml") is not None:
        _expect_member(verifier, files, source.get("tau_yaml"), archive.TAU_YAML, "source.tau_yaml")

    # 4. bundle.zip and the files inside it.
    report.counts["bundle_files"] = _check_bundle(verifier, fields, manifest, files)

    # 5. The event chain.
    report.counts["events"] = _check_events(verifier, fields, manifest, files)

    # 6. Metrics, attempts' logs, artifacts.
    report.counts["metrics"] = _check_metrics(verifier, fields, manifest, files)
    report.counts["attempt_logs"] = _check_attempts(verifier, fields, manifest, run, files)
    report.counts["artifacts"] = _check_artifacts(verifier, fields, manifest, files)
    report.counts["members"] = len(verifier.members)


def _check_signature(
    verifier: _Verifier, report: Report, manifest_bytes: bytes, signature_bytes: bytes
) -> None:
    try:
        signature = read_signature_document(signature_bytes)
    except KeyFormatError as error:
        verifier.problem(str(error))  # it names manifest.sig already
        return
    report.key_id = signature.key_id
    if not signature_is_valid(signature, manifest_bytes):
        verifier.problem(
            f"{archive.SIGNATURE}: the signature does not match manifest.json "
            f"(key {signature.key_id})"
        )
    if verifier.trusted_keys is None:
        return
    report.trusted = verifier.trusted_keys.get(signature.key_id) == signature.public_key
    if not report.trusted:
        verifier.problem(
            f"{archive.SIGNATURE}: signed by {signature.key_id}, which is not among the trusted "
            f"keys ({', '.join(sorted(verifier.trusted_keys)) or 'none'})"
        )


def _check_files(verifier: _Verifier, files: dict[str, Any]) -> None:
    signed = {archive.MANIFEST, archive.SIGNATURE}
    for name in verifier.members:
        if name not in signed and name not in files:
            verifier.problem(f"{name}: member not listed in the manifest's files")
    for name, expected in sorted(files.items()):
        if name in signed:
            verifier.problem(
                f"manifest files[{name!r}]: manifest.json and manifest.sig are not listed"
            )
            continue
        if name not in verifier.members:
            verifier.problem(f"{name}: listed in the manifest's files, missing from the tar")
            continue
        actual = verifier.digests.get(name)
        if actual is None:
            continue  # unreadable, already said
        if not isinstance(expected, dict):
            verifier.problem(f"manifest files[{name!r}]: not an object")
            continue
        if expected.get("sha256") != actual.sha256:
            verifier.problem(f"{name}: SHA-256 does not match manifest files[{name!r}].sha256")
        if expected.get("size") != actual.size:
            verifier.problem(
                f"{name}: {actual.size} bytes, manifest files[{name!r}].size says "
                f"{expected.get('size')}"
            )


def _expect_member(
    verifier: _Verifier, files: dict[str, Any], named: Any, expected: str, where: str
) -> None:
    if named != expected:
        verifier.problem(f"manifest {where}: {named!r}, not {expected!r}")
    elif expected not in files:
        verifier.problem(f"manifest {where}: {expected} is not in files")


def _check_bundle(
    verifier: _Verifier, fields: _Fields, manifest: dict[str, Any], files: dict[str, Any]
) -> int:
    bundle = manifest.get("bundle")
    if bundle is None:
        if archive.BUNDLE in verifier.members:
            verifier.problem(f"{archive.BUNDLE}: present, but the manifest's bundle is null")
        return 0
    if not isinstance(bundle, dict):
        verifier.problem("manifest bundle: not an object or null")
        return 0
    _expect_member(verifier, files, bundle.get("member"), archive.BUNDLE, "bundle.member")
    actual = verifier.digests.get(archive.BUNDLE)
    if actual is None:
        return 0
    if bundle.get("sha256") != actual.sha256:
        verifier.problem("bundle.zip: SHA-256 does not match manifest bundle.sha256")
    if bundle.get("size") != actual.size:
        verifier.problem("bundle.zip: size does not match manifest bundle.size")
    listed = fields.get(bundle, "files", list, "bundle.files") or []
    expected: dict[str, Any] = {}
    for entry in listed:
        path = entry.get("path") if isinstance(entry, dict) else None
        if not isinstance(path, str) or path in expected:
            verifier.problem(f"manifest bundle.files: bad or repeated entry {entry!r}")
            continue
        expected[path] = entry
    if [entry.get("path") for entry in expected.values()] != sorted(expected):
        verifier.problem("manifest bundle.files: not sorted by path")
    stream = verifier.open_member(archive.BUNDLE)
    assert stream is not None  # it has a digest, so it is a member
    found: set[str] = set()
    try:
        with zipfile.ZipFile(stream) as bundle_zip:
            for item in bundle_zip.infolist():
                if item.is_dir():
                    continue
                found.add(item.filename)
                entry = expected.get(item.filename)
                if entry is None:
                    verifier.problem(f"bundle.zip: {item.filename}: not in manifest bundle.files")
                    continue
                try:
                    with bundle_zip.open(item) as inner:
                        digest = _hash_stream(inner)
                except _ZIP_ERRORS as error:
                    verifier.problem(f"bundle.zip: {item.filename}: cannot be read ({error})")
                    continue
                if entry.get("sha256") != digest.sha256 or entry.get("size") != digest.size:
                    verifier.problem(
                        f"bundle.zip: {item.filename}: does not match manifest bundle.files"
                    )
    except _ZIP_ERRORS as error:
        verifier.problem(f"bundle.zip: not a readable zip ({error})")
        return 0
    for path in sorted(set(expected) - found):
        verifier.problem(f"bundle.zip: {path}: in manifest bundle.files, missing from the zip")
    return len(found)


def _check_events(
    verifier: _Verifier, fields: _Fields, manifest: dict[str, Any], files: dict[str, Any]
) -> int:
    events = fields.get(manifest, "events", dict, "events") or {}
    _expect_member(verifier, files, events.get("member"), archive.EVENTS, "events.member")
    stream = verifier.open_member(archive.EVENTS)
    if stream is None:
        return 0
    checker = ChainChecker()
    for number, line in enumerate(stream, start=1):
        try:
            event = json.loads(line)
        except (UnicodeDecodeError, ValueError):
            verifier.problem(f"events.jsonl line {number}: not JSON")
            return 0
        if not isinstance(event, dict):
            verifier.problem(f"events.jsonl line {number}: not a JSON object")
            return 0
        checker.add(event)
    for problem in checker.problems:
        verifier.problem(f"events.jsonl: {problem}")
    if events.get("count") != checker.count:
        verifier.problem(
            f"manifest events.count: {events.get('count')!r}, events.jsonl holds {checker.count}"
        )
    if events.get("head") != checker.head:
        verifier.problem("manifest events.head: not the hash of the last event in events.jsonl")
    return checker.count


def _check_metrics(
    verifier: _Verifier, fields: _Fields, manifest: dict[str, Any], files: dict[str, Any]
) -> int:
    metrics = fields.get(manifest, "metrics", dict, "metrics") or {}
    _expect_member(verifier, files, metrics.get("member"), archive.METRICS, "metrics.member")
    stream = verifier.open_member(archive.METRICS)
    if stream is None:
        return 0
    count = 0
    last = b"\n"
    while chunk := stream.read(CHUNK):
        count += chunk.count(b"\n")
        last = chunk[-1:]
    if last != b"\n":
        verifier.problem("metrics.jsonl: the last line has no newline")
        count += 1
    if metrics.get("count") != count:
        verifier.problem(
            f"manifest metrics.count: {metrics.get('count')!r}, metrics.jsonl holds {count} lines"
        )
    return count


def _check_attempts(
    verifier: _Verifier,
    fields: _Fields,
    manifest: dict[str, Any],
    run: dict[str, Any],
    files: dict[str, Any],
) -> int:
    attempts = fields.get(manifest, "attempts", list, "attempts") or []
    if run.get("attempts") != len(attempts):
        verifier.problem(
            f"manifest run.attempts: {run.get('attempts')!r}, the manifest lists {len(attempts)}"
        )
    logs = 0
    for index, attempt in enumerate(attempts):
        number = attempt.get("number") if isinstance(attempt, dict) else None
        if number != index + 1:
            verifier.problem(f"manifest attempts[{index}].number: {number!r}, not {index + 1}")
            continue
        log = attempt.get("log")
        if log is not None:
            _expect_member(
                verifier, files, log, archive.attempt_log(number), f"attempts[{index}].log"
            )
            logs += 1
    return logs


def _check_artifacts(
    verifier: _Verifier, fields: _Fields, manifest: dict[str, Any], files: dict[str, Any]
) -> int:
    artifacts = fields.get(manifest, "artifacts", list, "artifacts") or []
    paths: list[str] = []
    for index, artifact in enumerate(artifacts):
        where = f"artifacts[{index}]"
        path = fields.get(artifact, "path", str, f"{where}.path")
        if path is None:
            continue
        paths.append(path)
        member = archive.artifact_member(path)
        _expect_member(verifier, files, artifact.get("member"), member, f"{where}.member")
        listed = files.get(member)
        actual = verifier.digests.get(member)
        if isinstance(listed, dict) and actual is not None:
            if artifact.get("sha256") != actual.sha256:
                verifier.problem(f"{member}: SHA-256 does not match manifest {where}.sha256")
            if artifact.get("size") != actual.size:
                verifier.problem(f"{member}: size does not match manifest {where}.size")
    if paths != sorted(set(paths)):
        verifier.problem("manifest artifacts: not sorted by path, or a path repeated")
    return len(paths)


def verify_and_report(path: str, key_file: str | None, *, as_json: bool) -> int:
    """``verify`` as both commands run it (``python -m tau.evidence verify`` and ``tau evidence
    verify``): the report on standard output, as text or JSON, and the exit status: 0 when
    every check passed, 1 when any did not, 2 when the record or the key cannot be read."""
    trusted: dict[str, bytes] | None = None
    try:
        if key_file is not None:
            try:
                key_data = Path(key_file).read_bytes()
            except OSError as error:
                raise UnreadableError(
                    f"cannot read {key_file}: {error.strerror or error}"
                ) from None
            try:
                trusted = load_trusted_keys(key_data)
            except KeyFormatError as error:
                raise UnreadableError(f"{key_file}: {error}") from None
        if _is_pipeline_record(path):
            # A pipeline's record: its own manifest, and each stage's record inside it.
            pipeline = _verify_pipeline(path, trusted)
            print(json.dumps(pipeline.as_dict(), indent=2) if as_json else pipeline.text())
            return EXIT_OK if pipeline.ok else EXIT_MISMATCH
        if _is_endpoint_history(path):
            # An endpoint's history (JSON lines), not a run's record: no signature yet.
            history = _verify_history(path)
            print(json.dumps(history.as_dict(), indent=2) if as_json else history.text())
            return EXIT_OK if history.ok else EXIT_MISMATCH
        report = verify_file(path, trusted)
    except UnreadableError as error:
        print(f"tau evidence: {error}", file=sys.stderr)
        if as_json:
            print(json.dumps({"file": path, "ok": False, "error": str(error)}))
        return EXIT_USAGE
    print(json.dumps(report.as_dict(), indent=2) if as_json else report.text())
    return EXIT_OK if report.ok else EXIT_MISMATCH


def _is_pipeline_record(path: str) -> bool:
    """Whether ``path`` is a pipeline's record (``tau.evidence.pipeline_record``): a tar whose
    first member is ``pipeline.json``."""
    try:
        with open(path, "rb") as handle:
            return is_pipeline_record(handle.read(archive.BLOCK))
    except OSError:
        return False


def _verify_pipeline(path: str, trusted: dict[str, bytes] | None) -> PipelineReport:
    try:
        return verify_pipeline_file(path, trusted, check_run=verify_file)
    except OSError as error:
        raise UnreadableError(f"cannot read {path}: {error.strerror or error}") from None


def _is_endpoint_history(path: str) -> bool:
    """Whether ``path`` is an endpoint's history (``tau.evidence.history``) by its first bytes;
    a file that cannot be read is left to the record's own check to say so."""
    try:
        with open(path, "rb") as handle:
            return is_history(handle.read(64))
    except OSError:
        return False


def _verify_history(path: str) -> HistoryReport:
    try:
        return verify_history_file(path)
    except OSError as error:
        raise UnreadableError(f"cannot read {path}: {error.strerror or error}") from None
