"""Export -> verify round trips on records written by tests/evidence_format/record.py, and
tampering with each part of a record: verify fails and names what does not match."""

from __future__ import annotations

import base64
import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tau.evidence import archive
from tau.evidence.__main__ import main as module_main
from tau.evidence.canonical import canonical_json
from tau.evidence.keys import key_id, keyring_document, public_key_bytes, signature_document
from tau.evidence.verify import Report, verify_file
from tests.evidence_format.record import (
    SEALED_SECONDS,
    build,
    record,
    sample_parts,
    tar_of,
    zip_of,
)


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def _verify(tmp_path: Path, data: bytes, trusted: dict[str, bytes] | None = None) -> Report:
    path = tmp_path / "run.evidence.tar"
    # A new file each time: ext4 writes out a file truncated over its data when it is closed
    # (3 ms a time; test_changed_bytes_are_found writes 2,000 records here).
    path.unlink(missing_ok=True)
    path.write_bytes(data)
    return verify_file(path, trusted)


def _members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {info.name: info for info in tar}


def _flip(data: bytes, member: str, old: bytes, new: bytes) -> bytes:
    """The tar with ``old`` replaced by ``new`` (same length) inside one member's bytes."""
    assert len(old) == len(new)
    info = _members(data)[member]
    content = data[info.offset_data : info.offset_data + info.size]
    assert content.count(old) == 1
    start = info.offset_data + content.index(old)
    return data[:start] + new + data[start + len(old) :]


def _retar(data: bytes, *, drop: str | None = None, add: tuple[str, bytes] | None = None) -> bytes:
    """The same members (manifest and signature untouched), one dropped or one added."""
    members = []
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for info in tar:
            extracted = tar.extractfile(info)
            assert extracted is not None
            if info.name != drop:
                members.append(archive.bytes_member(info.name, extracted.read()))
    if add is not None:
        members.append(archive.bytes_member(*add))
    return b"".join(archive.tar_stream(members, mtime=SEALED_SECONDS))


def test_a_sealed_record_verifies_and_says_who_signed(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    report = _verify(tmp_path, record(sample_parts(), key))
    assert report.problems == []
    assert report.key_id == key_id(public_key_bytes(key))
    assert report.trusted is None  # no keyring given: the signer was not checked
    assert report.run["workspace"] == "alpha"
    assert report.run["state"] == "succeeded"
    assert report.counts == {
        "bundle_files": 2,
        "events": 5,
        "metrics": 3,
        "attempt_logs": 2,
        "artifacts": 2,
        "members": 11,
    }
    text = report.text()
    assert text.startswith("OK ")
    assert report.key_id in text
    assert "NOT checked against a trusted key" in text
    assert "2026-12-01T08:30:27.123456Z" in text


def test_a_record_without_bundle_log_or_events_verifies(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    parts = sample_parts()
    parts.bundle_files = None
    parts.tau_yaml = None
    parts.logs = {}
    parts.events = []
    parts.metrics = []
    parts.artifacts = {}
    report = _verify(tmp_path, record(parts, key))
    assert report.problems == []
    assert report.counts["events"] == 0


def test_the_same_record_gives_the_same_bytes(key: Ed25519PrivateKey) -> None:
    # Ed25519 signatures are deterministic too, so the whole export is.
    assert record(sample_parts(), key) == record(sample_parts(), key)


def test_a_changed_manifest_field_breaks_the_signature(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    data = _flip(record(sample_parts(), key), archive.MANIFEST, b'"succeeded"', b'"cancelled"')
    signer = key_id(public_key_bytes(key))
    assert _verify(tmp_path, data).problems == [
        f"manifest.sig: the signature does not match manifest.json (key {signer})"
    ]


def test_a_manifest_that_disagrees_with_its_members_is_named_even_when_signed(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    # A portal bug (or a stolen key) could sign a wrong manifest: the members still decide.
    parts = sample_parts()
    parts.manifest_changes = {"run.attempts": 3, "events.count": 4, "metrics.count": 2}
    problems = _verify(tmp_path, record(parts, key)).problems
    assert "manifest run.attempts: 3, the manifest lists 2" in problems
    assert "manifest events.count: 4, events.jsonl holds 5" in problems
    assert "manifest metrics.count: 2, metrics.jsonl holds 3 lines" in problems
    assert len(problems) == 3


def test_one_byte_of_an_attempt_log(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    data = _flip(record(sample_parts(), key), "attempts/2/log.txt", b"loss 1.0", b"loss 0.9")
    assert _verify(tmp_path, data).problems == [
        "attempts/2/log.txt: SHA-256 does not match manifest files['attempts/2/log.txt'].sha256"
    ]


def test_a_metric_value(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    data = _flip(record(sample_parts(), key), archive.METRICS, b'"value":2.5', b'"value":0.5')
    assert _verify(tmp_path, data).problems == [
        "metrics.jsonl: SHA-256 does not match manifest files['metrics.jsonl'].sha256"
    ]


def test_an_artifact_byte(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    data = _flip(record(sample_parts(), key), "artifacts/report.txt", b"0.93", b"0.99")
    problems = _verify(tmp_path, data).problems
    assert problems == [
        "artifacts/report.txt: SHA-256 does not match manifest "
        "files['artifacts/report.txt'].sha256",
        "artifacts/report.txt: SHA-256 does not match manifest artifacts[1].sha256",
    ]


def test_a_member_added(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    # Added where the format's order puts it, so that this is the one problem.
    data = _retar(record(sample_parts(), key), add=("artifacts/zz-extra.txt", b"slipped in\n"))
    assert _verify(tmp_path, data).problems == [
        "artifacts/zz-extra.txt: member not listed in the manifest's files"
    ]


def test_a_member_removed(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    data = _retar(record(sample_parts(), key), drop="artifacts/report.txt")
    assert _verify(tmp_path, data).problems == [
        "artifacts/report.txt: listed in the manifest's files, missing from the tar"
    ]


def test_two_events_swapped(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    parts = sample_parts()
    parts.events[1], parts.events[2] = parts.events[2], parts.events[1]
    # Signed after the swap, so the files digests agree: only the chain can tell.
    problems = _verify(tmp_path, record(parts, key)).problems
    assert problems == [
        "events.jsonl: event seq 3: expected seq 2 at line 2",
        "events.jsonl: event seq 3: prev_hash is not the hash of the event before it",
        "events.jsonl: event seq 2: expected seq 3 at line 3",
        "events.jsonl: event seq 2: prev_hash is not the hash of the event before it",
        "events.jsonl: event seq 4: prev_hash is not the hash of the event before it",
    ]
    # And swapped inside an exported record, the digest says so too.
    original = record(sample_parts(), key)
    info = _members(original)[archive.EVENTS]
    lines = original[info.offset_data : info.offset_data + info.size].splitlines(keepends=True)
    lines[1], lines[2] = lines[2], lines[1]
    swapped = (
        original[: info.offset_data] + b"".join(lines) + original[info.offset_data + info.size :]
    )
    problems = _verify(tmp_path, swapped).problems
    assert "events.jsonl: SHA-256 does not match manifest files['events.jsonl'].sha256" in problems
    assert "events.jsonl: event seq 3: expected seq 2 at line 2" in problems


def test_an_edited_event_message(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    parts = sample_parts()
    parts.events[3]["message"] = "Cancelled by ada."
    problems = _verify(tmp_path, record(parts, key)).problems
    assert problems == ["events.jsonl: event seq 4: hash does not match its content"]


def test_the_signature(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    manifest_bytes, members = build(sample_parts())
    document = json.loads(signature_document(key, manifest_bytes))
    signature = bytearray(base64.b64decode(document["signature"]))
    signature[0] ^= 1
    document["signature"] = base64.b64encode(bytes(signature)).decode()
    data = tar_of(manifest_bytes, canonical_json(document), members)
    problems = _verify(tmp_path, data).problems
    assert problems == [
        f"manifest.sig: the signature does not match manifest.json (key {document['key_id']})"
    ]


def test_a_signature_document_naming_another_key(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    manifest_bytes, members = build(sample_parts())
    document = json.loads(signature_document(key, manifest_bytes))
    document["key_id"] = "ed25519-0000000000000000"
    data = tar_of(manifest_bytes, canonical_json(document), members)
    (problem,) = _verify(tmp_path, data).problems
    assert problem.startswith("manifest.sig: key_id 'ed25519-0000000000000000' is not the id")


def test_a_file_inside_the_bundle(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    parts = sample_parts()
    assert parts.bundle_files is not None
    changed = {**parts.bundle_files, "src/train.py": b"print('trained')\n"}
    parts.bundle_override = zip_of({**changed, "src/extra.py": b""})
    problems = _verify(tmp_path, record(parts, key)).problems
    assert problems == [
        "bundle.zip: src/extra.py: not in manifest bundle.files",
        "bundle.zip: src/train.py: does not match manifest bundle.files",
    ]
    # Changed inside the exported record: bundle.zip's digest and the zip's own CRC say so.
    data = _flip(record(sample_parts(), key), archive.BUNDLE, b"torch==2.5.1", b"torch==2.5.2")
    problems = _verify(tmp_path, data).problems
    assert "bundle.zip: SHA-256 does not match manifest files['bundle.zip'].sha256" in problems
    assert "bundle.zip: SHA-256 does not match manifest bundle.sha256" in problems


def test_the_tar_structure_itself(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    data = record(sample_parts(), key)
    # Bytes nobody reads (the trailer, a header's mode) are still part of the record.
    trailing = data[:-1] + b"x"
    assert _verify(tmp_path, trailing).problems == [
        "the end of the tar is not two zero blocks padded to a 10 KiB record"
    ]
    info = _members(data)["spec.json"]
    mode_at = info.offset + 100  # ustar: mode, 8 octal digits
    assert data[mode_at : mode_at + 7] == b"0000644"
    executable = data[:mode_at] + b"0000755" + data[mode_at + 7 :]
    # tarfile checks the header checksum, so recompute it as a careful forger would.
    header = bytearray(executable[info.offset : info.offset + 512])
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    forged = executable[: info.offset] + bytes(header) + executable[info.offset + 512 :]
    problems = _verify(tmp_path, forged).problems
    assert problems == [
        "spec.json: tar header is not what the format writes (mode 0644, owner 0/0, "
        "mtime = sealed_at)"
    ]
    assert _verify(tmp_path, b"not a tar at all" * 100).problems[0].startswith("not a tar file")


def test_names_the_format_refuses(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        members = (
            ("../escape", tarfile.REGTYPE),
            ("dir", tarfile.DIRTYPE),
            ("\udcff", tarfile.REGTYPE),
        )
        for name, kind in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            tar.addfile(info, io.BytesIO(b""))
    problems = _verify(tmp_path, buffer.getvalue()).problems
    assert "'../escape': member name not allowed" in problems
    assert "dir: not a regular file" in problems
    assert "'\\udcff': member name not allowed" in problems  # a name that is not UTF-8
    assert "manifest.json: missing" in problems


def _keyring(*keys: Ed25519PrivateKey) -> dict[str, bytes]:
    return {key_id(public_key_bytes(key)): public_key_bytes(key) for key in keys}


def test_key_rotation(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    old, new = key, Ed25519PrivateKey.generate()
    sealed_before = record(sample_parts(), old)
    report = _verify(tmp_path, sealed_before, _keyring(old, new))
    assert (report.problems, report.trusted) == ([], True)
    assert "a trusted key" in report.text()
    refused = _verify(tmp_path, sealed_before, _keyring(new))
    assert refused.trusted is False
    assert refused.problems == [
        f"manifest.sig: signed by {key_id(public_key_bytes(old))}, which is not among the "
        f"trusted keys ({key_id(public_key_bytes(new))})"
    ]


def test_the_command(
    tmp_path: Path, key: Ed25519PrivateKey, capsys: pytest.CaptureFixture[str]
) -> None:
    other = Ed25519PrivateKey.generate()
    path = tmp_path / "run.evidence.tar"
    path.write_bytes(record(sample_parts(), key))
    keyring = tmp_path / "keys.json"
    keyring.write_text(
        json.dumps(
            keyring_document([(public_key_bytes(other), True), (public_key_bytes(key), False)])
        )
    )
    pem = tmp_path / "key.pem"
    pem.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    raw = tmp_path / "key.b64"
    raw.write_text(base64.b64encode(public_key_bytes(key)).decode() + "\n")

    assert module_main(["verify", str(path)]) == 0
    assert "NOT checked against a trusted key" in capsys.readouterr().out
    for trusted in (keyring, pem, raw):
        assert module_main(["verify", str(path), "--key", str(trusted)]) == 0
        assert "a trusted key" in capsys.readouterr().out
    assert module_main(["verify", str(path), "--key", str(keyring), "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["ok"] is True
    assert answer["signer"] == {"key_id": key_id(public_key_bytes(key)), "trusted": True}
    assert answer["counts"]["events"] == 5

    pem.write_bytes(
        other.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    assert module_main(["verify", str(path), "--key", str(pem)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAILED ")
    assert f"signed by {key_id(public_key_bytes(key))}, which is not among" in out

    assert module_main(["verify", str(tmp_path / "missing.tar")]) == 2
    assert "cannot read" in capsys.readouterr().err
    raw.write_text("not a key")
    assert module_main(["verify", str(path), "--key", str(raw)]) == 2
    assert "not valid base64" in capsys.readouterr().err
    assert module_main(["verify"]) == 2
    assert module_main(["check", str(path)]) == 2


def test_changed_bytes_are_found(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    # Flip one bit of every 23rd byte (headers, contents, padding, the trailer) and of every
    # byte of manifest.sig (where base64's unused bits hide): verify never passes, never crashes.
    data = record(sample_parts(), key)
    signature = _members(data)[archive.SIGNATURE]
    positions = sorted(
        {*range(0, len(data), 23), *range(signature.offset, signature.offset_data + signature.size)}
    )
    passed = []
    for position in positions:
        changed = bytearray(data)
        changed[position] ^= 0x01
        if _verify(tmp_path, bytes(changed)).ok:
            passed.append(position)
    assert passed == []


def _reordered(key: Ed25519PrivateKey, order: Callable[[list[str]], list[str]]) -> bytes:
    """The sample record, signed as sealed, with its members (after the manifest and the
    signature) written in ``order`` instead of the format's."""
    manifest_bytes, members = build(sample_parts())
    by_name = {member.name: member for member in members}
    shuffled = [by_name[name] for name in order([member.name for member in members])]
    return tar_of(manifest_bytes, signature_document(key, manifest_bytes), shuffled)


def _swap(first: str, second: str) -> Callable[[list[str]], list[str]]:
    def order(names: list[str]) -> list[str]:
        a, b = names.index(first), names.index(second)
        names[a], names[b] = names[b], names[a]
        return names

    return order


@pytest.mark.parametrize(
    ("order", "named"),
    [
        (
            _swap("metrics.jsonl", "events.jsonl"),
            "metrics.jsonl: out of order (after events.jsonl)",
        ),
        (
            _swap("attempts/1/log.txt", "attempts/2/log.txt"),
            "attempts/1/log.txt: out of order (after attempts/2/log.txt)",
        ),
        (
            _swap("artifacts/model/weights.bin", "artifacts/report.txt"),
            "artifacts/model/weights.bin: out of order (after artifacts/report.txt)",
        ),
        (_swap("spec.json", "bundle.zip"), "tau.yaml: out of order (after bundle.zip)"),
        (lambda names: [*names[1:], names[0]], "spec.json: out of order (after artifacts/"),
    ],
)
def test_members_out_of_the_documented_order_are_refused(
    tmp_path: Path, key: Ed25519PrivateKey, order: Callable[[list[str]], list[str]], named: str
) -> None:
    """docs/evidence.md fixes the members' order; a file that has every member, each
    matching its digest under a valid signature, but in another order, does not verify."""
    report = _verify(tmp_path, _reordered(key, order))
    assert any(problem.startswith(named) for problem in report.problems), report.problems
    # Nothing else is wrong with it: the order is the one problem (one per member moved).
    assert all("out of order" in problem for problem in report.problems), report.problems


def test_a_member_the_format_has_no_place_for_is_named(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    data = _retar(record(sample_parts(), key), add=("attempts/01/log.txt", b"sneaked in\n"))
    report = _verify(tmp_path, data)
    assert "attempts/01/log.txt: the format has no place for this member" in report.problems
