"""Staging from an S3 store (issue 33), against the suite's real S3 server (tests/s3.py): each
file is fetched once into this machine's cache, hashed as it is fetched, and hard-linked
read-only into the attempt's data folder; a second staging links the cached copy without a
request; an object whose bytes are not those its name says fails staging naming the file, and
is never cached."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from catalog import storage
from catalog.ingest import asset_named, ingest_folder
from catalog.models import AssetVersion
from catalog.runs import StagedDataset, StagedFile
from executors.local.agent.staging import StagingFailed, stage
from tests.s3 import S3Prefix

pytestmark = [pytest.mark.django_db, pytest.mark.services]


def staged_dataset(version: AssetVersion) -> StagedDataset:
    rows = version.files.order_by("path").values_list("path", "size", "sha256")
    return StagedDataset(
        workspace_id=version.asset.workspace_id,
        ref=version.ref,
        path="corpus",
        manifest_digest=version.manifest_digest,
        files=tuple(StagedFile(path, size, sha256) for path, size, sha256 in rows),
    )


def ingested(world: Any, tmp_path: Path, files: dict[str, bytes]) -> AssetVersion:
    raw = tmp_path / "raw"
    for name, data in files.items():
        (raw / name).parent.mkdir(parents=True, exist_ok=True)
        (raw / name).write_bytes(data)
    version = ingest_folder(asset_named(world.alpha, "dataset", "wiki"), raw, source="prefix")
    assert version.state == AssetVersion.State.READY, version.error
    return version


def test_staging_from_s3_fetches_each_file_once_and_links_it_read_only(
    world: Any, tmp_path: Path, s3_store: S3Prefix, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {"part/a.txt": b"The Quick Brown Fox\n", "b.txt": b"Jumps Over\n", "c.txt": b""}
    dataset = staged_dataset(ingested(world, tmp_path, files))
    data = tmp_path / "attempt-1" / "data"
    staged = stage((dataset,), data)
    assert (staged.files, staged.bytes) == (3, sum(map(len, files.values())))
    for name, content in files.items():
        target = data / "corpus" / name
        assert target.read_bytes() == content
        assert target.stat().st_mode & 0o222 == 0
        cached = storage.local_copy(world.alpha.pk, hashlib.sha256(content).hexdigest())
        assert cached.is_relative_to(tmp_path / "var" / "cache" / "blobs")
        assert target.stat().st_ino == cached.stat().st_ino  # a link, not a copy
        assert storage.is_checked(cached)

    # Again, for the next attempt: the cached copies, with no request to the store.
    def no_request(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the store was asked again")

    monkeypatch.setattr(storage.S3Store, "open_blob", no_request)
    assert stage((dataset,), tmp_path / "attempt-2" / "data").files == 3


def test_an_object_that_differs_from_its_name_fails_staging_naming_the_file(
    world: Any, tmp_path: Path, s3_store: S3Prefix
) -> None:
    version = ingested(world, tmp_path, {"a.txt": b"alpha\n", "b.txt": b"beta\n"})
    digest = hashlib.sha256(b"beta\n").hexdigest()
    s3_store.client.put_object(
        Bucket=s3_store.service.bucket,
        Key=f"{s3_store.prefix}/workspaces/{world.alpha.pk}/blobs/{digest[:2]}/{digest}",
        Body=b"BETA\n",
    )
    with pytest.raises(StagingFailed) as failed:
        stage((staged_dataset(version),), tmp_path / "attempt" / "data")
    found = hashlib.sha256(b"BETA\n").hexdigest()
    assert str(failed.value).startswith(
        "wiki@1: b.txt: the stored copy differs from the manifest "
        f"(SHA-256 {found} instead of {digest})"
    )
    cache = tmp_path / "var" / "cache" / "blobs"
    assert not list(cache.rglob(f"*{digest}*"))  # never cached, not even half


def test_an_object_gone_from_the_store_fails_staging_naming_the_file(
    world: Any, tmp_path: Path, s3_store: S3Prefix
) -> None:
    version = ingested(world, tmp_path, {"a.txt": b"alpha\n"})
    digest = hashlib.sha256(b"alpha\n").hexdigest()
    s3_store.client.delete_object(
        Bucket=s3_store.service.bucket,
        Key=f"{s3_store.prefix}/workspaces/{world.alpha.pk}/blobs/{digest[:2]}/{digest}",
    )
    with pytest.raises(StagingFailed, match=r"^wiki@1: a\.txt is missing from the workspace's"):
        stage((staged_dataset(version),), tmp_path / "attempt" / "data")
