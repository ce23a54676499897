"""The catalog's S3 store (issue 33), against a real S3 server (SeaweedFS, started by
deploy/dev/test_services.py; tests/s3.py): a folder ingested into a bucket becomes a ready
version whose objects are the workspace's blobs by SHA-256, read back whole, by a presigned
URL too; verify names a corrupted object; a file past the multipart threshold goes in parts
and a file that changes between its two readings is never kept; an upload's last piece puts
the file; keys from files work and wrong ones say so without showing them."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from catalog import storage, uploads
from catalog.ingest import asset_named, delete_asset, ingest_folder, verify
from catalog.models import Asset, AssetFile, AssetVersion
from tau.manifest import ManifestError, scan
from tests.s3 import S3Prefix, S3Service

pytestmark = [pytest.mark.django_db, pytest.mark.services]

FILES = {
    "a.txt": b"alpha\n",
    "sub/b.txt": b"beta\n",
    "copy-of-a.txt": b"alpha\n",
    "empty": b"",
}
BASE = Path(__file__).resolve().parents[2]


def folder(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_folder_ingested_into_a_bucket_is_ready_and_reads_back(
    world: Any, tmp_path: Path, s3_store: S3Prefix
) -> None:
    raw = folder(tmp_path / "raw", FILES)
    wiki = asset_named(world.alpha, Asset.Kind.DATASET, "wiki")
    version = ingest_folder(wiki, raw, source=AssetVersion.Source.PREFIX)
    assert (version.state, version.error) == (AssetVersion.State.READY, "")
    assert version.manifest_digest == scan(raw).digest
    # One object per distinct file, under <prefix>/workspaces/<id>/blobs/<ab>/<sha256>.
    expected = sorted(
        f"{s3_store.prefix}/workspaces/{world.alpha.pk}/blobs/{sha(data)[:2]}/{sha(data)}"
        for data in set(FILES.values())
    )
    assert s3_store.object_keys() == expected
    for data in FILES.values():
        assert storage.has_blob(world.alpha.pk, sha(data), len(data))
        assert not storage.has_blob(world.alpha.pk, sha(data), len(data) + 1)
        with storage.open_blob(world.alpha.pk, sha(data)) as reader:
            assert reader.read() == data
        assert storage.hash_blob(world.alpha.pk, sha(data)) == (len(data), sha(data))
    assert not storage.has_blob(world.beta.pk, sha(b"alpha\n"), 6)  # beta's store is apart
    url = storage.blob_url(world.alpha.pk, sha(b"beta\n"), seconds=60)
    assert url is not None
    assert url.startswith(s3_store.service.endpoint)
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.read() == b"beta\n"
    assert verify(version) == []
    # Nothing of it stayed on this machine.
    assert [p for p in (tmp_path / "var").rglob("*") if p.is_file()] == []
    with pytest.raises(FileNotFoundError):
        storage.open_blob(world.alpha.pk, sha(b"never stored"))


def test_verify_names_a_corrupted_object_and_a_missing_one(
    world: Any, tmp_path: Path, s3_store: S3Prefix
) -> None:
    raw = folder(tmp_path / "raw", {"a.txt": b"alpha\n", "b.txt": b"beta\n", "c.txt": b"c\n"})
    version = ingest_folder(
        asset_named(world.alpha, Asset.Kind.DATASET, "wiki"), raw, source="prefix"
    )
    assert version.state == AssetVersion.State.READY
    prefix = f"{s3_store.prefix}/workspaces/{world.alpha.pk}/blobs"
    bucket = s3_store.service.bucket
    a, b = sha(b"alpha\n"), sha(b"beta\n")
    s3_store.client.put_object(Bucket=bucket, Key=f"{prefix}/{a[:2]}/{a}", Body=b"ALPHA\n")
    s3_store.client.delete_object(Bucket=bucket, Key=f"{prefix}/{b[:2]}/{b}")
    assert verify(version) == [
        "a.txt: the stored copy differs from the manifest (SHA-256)",
        "b.txt: missing from the store",
    ]
    version.refresh_from_db()
    assert version.verify_problems.startswith("a.txt: the stored copy differs")


def test_a_file_past_the_multipart_threshold_goes_in_parts_and_round_trips(
    world: Any, tmp_path: Path, s3_store: S3Prefix, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storage, "MULTIPART_THRESHOLD_BYTES", 10 * 2**20)
    monkeypatch.setattr(storage, "PART_BYTES", 5 * 2**20)
    big = os.urandom(12 * 2**20 + 3)  # read again: 5 MiB, 5 MiB, 2 MiB + 3 bytes
    middling = os.urandom(7 * 2**20)  # under the threshold: one PUT, from memory
    raw = folder(
        tmp_path / "raw", {"weights.bin": big, "optimizer.bin": middling, "config.json": b"{}"}
    )
    seen: list[int] = []
    size, digest = storage.write_blob(world.alpha.pk, raw / "weights.bin", seen.append)
    assert (size, digest) == (len(big), sha(big))
    assert sum(seen) == len(big)  # progress as the parts were read
    key = f"{s3_store.prefix}/workspaces/{world.alpha.pk}/blobs/{digest[:2]}/{digest}"
    head = s3_store.client.head_object(Bucket=s3_store.service.bucket, Key=key)
    assert head["ContentLength"] == len(big)
    assert head["ETag"].strip('"').endswith("-3")  # a multipart upload's ETag: 3 parts
    version = ingest_folder(
        asset_named(world.alpha, Asset.Kind.MODEL, "tiny"), raw, source="prefix"
    )
    assert version.state == AssetVersion.State.READY
    key = f"{s3_store.prefix}/workspaces/{world.alpha.pk}/blobs/{sha(middling)[:2]}/{sha(middling)}"
    head = s3_store.client.head_object(Bucket=s3_store.service.bucket, Key=key)
    assert "-" not in head["ETag"]
    with storage.open_blob(world.alpha.pk, sha(middling)) as reader:
        assert reader.read() == middling
    with storage.open_blob(world.alpha.pk, digest) as reader:
        hashed = hashlib.sha256()
        while chunk := reader.read(2**20):
            hashed.update(chunk)
    assert hashed.hexdigest() == digest
    assert verify(version) == []


def test_a_file_that_changes_between_its_two_readings_is_never_kept(
    world: Any, tmp_path: Path, s3_store: S3Prefix, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storage, "MULTIPART_THRESHOLD_BYTES", 5 * 2**20)
    monkeypatch.setattr(storage, "PART_BYTES", 5 * 2**20)
    source = tmp_path / "log.bin"
    original = os.urandom(11 * 2**20)
    source.write_bytes(original)

    def rewrite_the_tail(count: int) -> None:  # called as the second reading goes
        with source.open("r+b") as file:
            file.seek(10 * 2**20)
            file.write(b"X" * 1024)

    with pytest.raises(ManifestError, match=r"log\.bin changed while it was stored"):
        storage.write_blob(world.alpha.pk, source, rewrite_the_tail)
    assert not storage.has_blob(world.alpha.pk, sha(original), len(original))
    assert s3_store.object_keys() == []
    pending = s3_store.client.list_multipart_uploads(
        Bucket=s3_store.service.bucket, Prefix=s3_store.prefix + "/"
    )
    assert pending.get("Uploads", []) == []  # aborted, not left to be billed


def test_an_uploaded_file_is_put_when_its_last_piece_arrives(
    world: Any, s3_store: S3Prefix, tmp_path: Path
) -> None:
    data = b"a small corpus, sent in two pieces\n"
    asset = asset_named(world.alpha, Asset.Kind.DATASET, "sent")
    version, _ = uploads.start_upload(
        asset, [{"path": "corpus.txt", "size": len(data), "sha256": sha(data)}]
    )
    first = uploads.receive(
        version, "corpus.txt", io.BytesIO(data[:10]), length=10, start=0, total=len(data)
    )
    assert not first.file.stored
    part = storage.upload_part(world.alpha.pk, version.pk, first.file.pk)
    assert part.is_relative_to(tmp_path / "var")  # the pieces gather on this machine's disk
    uploads.receive(
        version,
        "corpus.txt",
        io.BytesIO(data[10:]),
        length=len(data) - 10,
        start=10,
        total=len(data),
    )
    version.refresh_from_db()
    assert version.state == AssetVersion.State.READY
    with storage.open_blob(world.alpha.pk, sha(data)) as reader:
        assert reader.read() == data
    assert not part.exists()
    # Deleting the asset deletes its objects.
    delete_asset(asset)
    assert s3_store.object_keys() == []


def test_a_last_piece_the_store_refused_is_kept_when_the_request_comes_again(
    world: Any, s3_store: S3Prefix, settings: Any
) -> None:
    """Over the API: the file is whole on the portal's disk when the store refuses it (wrong
    keys here); the answer is a 503 that says so, nothing is marked stored, and the same
    request again, once the store takes it, keeps it without a byte sent twice."""
    data = b"a corpus the store refused once\n"
    api = world.api_client_for("researcher")
    base = "/api/v1/workspaces/alpha/datasets"
    api.post(f"{base}/", {"name": "refused"}, format="json")
    declared = {
        "source": "upload",
        "files": [{"path": "c.txt", "size": len(data), "sha256": sha(data)}],
    }
    assert api.post(f"{base}/refused/versions/", declared, format="json").status_code == 201
    secret = settings.TAU_STORAGE_SECRET_ACCESS_KEY
    settings.TAU_STORAGE_SECRET_ACCESS_KEY = "not-the-secret-" + "x" * 20
    url = f"{base}/refused/versions/1/files/c.txt"
    refused = api.put(url, data, content_type="application/octet-stream")
    assert refused.status_code == 503
    assert "c.txt arrived whole but could not be kept" in refused.json()["detail"]
    assert "not-the-secret" not in refused.content.decode()
    row = AssetFile.objects.for_workspace(world.alpha).get(path="c.txt")
    assert (row.received, row.stored) == (len(data), False)

    settings.TAU_STORAGE_SECRET_ACCESS_KEY = secret
    kept = api.put(url, data, content_type="application/octet-stream")
    assert kept.status_code == 200, kept.content
    assert (kept.json()["stored"], kept.json()["version_state"]) == (True, "ready")
    version = AssetVersion.objects.for_workspace(world.alpha).get(asset__name="refused")
    assert version.bytes_done == len(data)  # counted once
    with storage.open_blob(world.alpha.pk, sha(data)) as reader:
        assert reader.read() == data


def test_wrong_credentials_say_so_without_showing_them(
    world: Any, tmp_path: Path, s3_store: S3Prefix, settings: Any
) -> None:
    settings.TAU_STORAGE_SECRET_ACCESS_KEY = "not-the-secret-" + "x" * 20
    with pytest.raises(storage.StorageError) as refused:
        storage.has_blob(world.alpha.pk, sha(b"alpha\n"), 6)
    message = refused.value.strerror or ""
    assert "refused the portal's credentials" in message
    assert "TAU_STORAGE_SECRET_ACCESS_KEY_FILE" in message
    assert s3_store.service.endpoint in message
    assert settings.TAU_STORAGE_SECRET_ACCESS_KEY not in message
    assert s3_store.service.access_key not in message
    # An ingest fails its version with that message, naming the file.
    raw = folder(tmp_path / "raw", {"a.txt": b"alpha\n"})
    version = ingest_folder(asset_named(world.alpha, "dataset", "wiki"), raw, source="prefix")
    assert version.state == AssetVersion.State.FAILED
    assert version.error.startswith("a.txt could not be stored: The S3 store")
    assert "refused the portal's credentials" in version.error


def test_keys_given_in_files_reach_the_store(
    s3_service: S3Service, s3_store: S3Prefix, tmp_path: Path
) -> None:
    """The production path: the settings read TAU_STORAGE_*_FILE at start, in a process of
    its own, and the store answers with them; with a wrong key file, it refuses."""
    key_id, secret = tmp_path / "access-key-id", tmp_path / "secret-access-key"
    key_id.write_text(s3_service.access_key + "\n")
    secret.write_text(s3_service.secret_key + "\n")
    script = (
        "import django, sys; django.setup()\n"
        "from catalog import storage\n"
        "try:\n"
        "    storage.write_blob(1, __import__('pathlib').Path(sys.argv[1]))\n"
        "    print('kept', storage.has_blob(1, sys.argv[2], 6))\n"
        "except storage.StorageError as exc:\n"
        "    print('refused:', exc.strerror)\n"
    )
    (tmp_path / "a.txt").write_bytes(b"alpha\n")
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("AWS_", "TAU_STORAGE_"))
    }
    env.update(
        DJANGO_SETTINGS_MODULE="portal.settings",
        TAU_VAR_DIR=str(tmp_path / "var"),
        TAU_STORAGE_URL=s3_store.url,
        TAU_STORAGE_ENDPOINT_URL=s3_service.endpoint,
        TAU_STORAGE_REGION="us-east-1",
        TAU_STORAGE_ACCESS_KEY_ID_FILE=str(key_id),
        TAU_STORAGE_SECRET_ACCESS_KEY_FILE=str(secret),
    )

    def run() -> str:
        done = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / "a.txt"), sha(b"alpha\n")],
            env=env,
            cwd=BASE,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert run() == "kept True"
    secret.write_text("wrong\n")
    said = run()
    assert said.startswith("refused: The S3 store")
    assert "wrong" not in said
