"""The catalog's versions (issue 33): a folder becomes the next version of a dataset or a
model, kept once per SHA-256 in the workspace's store, ready with its manifest in one step or
failed with the file named; verify reads the store again; references and aliases resolve to
ready versions of the workspace's own assets only."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, transaction

from catalog import ingest, storage
from catalog.ingest import CatalogError, asset_named, ingest_folder, resolve, set_alias, verify
from catalog.models import Asset, AssetFile, AssetVersion
from portal.tenancy import UnscopedQueryError
from tau.manifest import scan

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def store(settings: Any, tmp_path: Path) -> Path:
    settings.TAU_STORAGE_URL = f"file://{tmp_path / 'store'}"
    return tmp_path / "store"


def folder(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def test_a_folder_becomes_the_next_ready_version_with_its_manifest(
    world: Any, tmp_path: Path, store: Path
) -> None:
    raw = folder(tmp_path / "raw", {"a.txt": b"alpha\n", "sub/b.txt": b"beta\n", "e": b""})
    wiki = asset_named(world.alpha, Asset.Kind.DATASET, "wiki", user=world.users["researcher"])
    first = ingest_folder(wiki, raw, source=AssetVersion.Source.PREFIX, source_detail="raw/")
    assert (first.number, first.state, first.error) == (1, AssetVersion.State.READY, "")
    assert first.manifest_digest == scan(raw).digest
    assert (first.files_count, first.bytes, first.bytes_done) == (3, 11, 11)
    files = AssetFile.objects.for_workspace(world.alpha).filter(version=first)
    assert sorted(files.values_list("path", "size")) == [("a.txt", 6), ("e", 0), ("sub/b.txt", 5)]
    for entry in scan(raw).files:
        assert (
            storage.blob_path(world.alpha.pk, entry.sha256).read_bytes()
            == (raw / entry.path).read_bytes()
        )
    # The next version keeps a file it shares with the first once.
    (raw / "a.txt").write_bytes(b"alpha, revised\n")
    second = ingest_folder(wiki, raw, source=AssetVersion.Source.PREFIX, derived_from=[first])
    assert (second.number, second.state) == (2, AssetVersion.State.READY)
    assert list(second.derived_from.all()) == [first]
    blobs = sorted(p.name for p in (store / "workspaces" / str(world.alpha.pk)).rglob("*"))
    assert len([name for name in blobs if len(name) == 64]) == 4  # a, a revised, b, empty
    assert not list((store / "workspaces" / str(world.alpha.pk) / "blobs" / "incoming").iterdir())


def test_a_folder_with_a_symlink_fails_naming_it_and_nothing_is_ready(
    world: Any, tmp_path: Path
) -> None:
    raw = folder(tmp_path / "raw", {"a.txt": b"alpha\n"})
    (raw / "secrets").symlink_to("/etc/shadow")
    wiki = asset_named(world.alpha, Asset.Kind.DATASET, "wiki")
    version = ingest_folder(wiki, raw, source=AssetVersion.Source.PREFIX)
    assert version.state == AssetVersion.State.FAILED
    assert version.error == "secrets is a symlink; only files and folders are kept."
    assert version.manifest_digest == ""
    assert not AssetFile.objects.for_workspace(world.alpha).filter(version=version).exists()
    with pytest.raises(CatalogError, match="wiki has no ready version yet"):
        resolve(world.alpha, Asset.Kind.DATASET, "wiki")


def test_a_file_that_changes_while_it_is_stored_fails_the_version(
    world: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = folder(tmp_path / "raw", {"log.txt": b"line 1\n"})
    real = storage.write_blob

    def grown(workspace_id: int, source: Path, *args: Any, **kwargs: Any) -> tuple[int, str]:
        with source.open("ab") as file:
            file.write(b"line 2\n")
        return real(workspace_id, source, *args, **kwargs)

    monkeypatch.setattr(storage, "write_blob", grown)
    version = ingest_folder(
        asset_named(world.alpha, Asset.Kind.DATASET, "logs"), raw, source="prefix"
    )
    assert version.state == AssetVersion.State.FAILED
    assert version.error.startswith("log.txt changed while it was read (7 bytes listed, 14 read)")


def test_a_lost_blob_between_copy_and_check_fails_the_version(
    world: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = folder(tmp_path / "raw", {"model.bin": b"weights"})
    real = storage.write_blob

    def lost(workspace_id: int, source: Path, *args: Any, **kwargs: Any) -> tuple[int, str]:
        size, sha256 = real(workspace_id, source, *args, **kwargs)
        storage.blob_path(workspace_id, sha256).unlink()
        return size, sha256

    monkeypatch.setattr(storage, "write_blob", lost)
    tiny = asset_named(world.alpha, Asset.Kind.MODEL, "tiny-gpt")
    version = ingest_folder(tiny, raw, source=AssetVersion.Source.RUN)
    assert version.state == AssetVersion.State.FAILED
    assert version.error == "model.bin: its stored copy is missing or incomplete."


def test_a_ready_version_without_a_manifest_cannot_be_written(world: Any) -> None:
    wiki = asset_named(world.alpha, Asset.Kind.DATASET, "wiki")
    with pytest.raises(IntegrityError), transaction.atomic():
        AssetVersion.objects.for_workspace(world.alpha).create(
            asset=wiki, number=1, source="upload", state=AssetVersion.State.READY
        )


def test_verify_reads_the_store_again_and_names_what_differs(world: Any, tmp_path: Path) -> None:
    raw = folder(tmp_path / "raw", {"a.txt": b"alpha\n", "b.txt": b"beta\n", "c.txt": b"c\n"})
    version = ingest_folder(
        asset_named(world.alpha, Asset.Kind.DATASET, "wiki"), raw, source="prefix"
    )
    assert verify(version) == []
    manifest = scan(raw)
    a, b = manifest.get("a.txt"), manifest.get("b.txt")
    assert a is not None
    assert b is not None
    storage.blob_path(world.alpha.pk, a.sha256).write_bytes(b"ALPHA\n")  # same size
    os.remove(storage.blob_path(world.alpha.pk, b.sha256))
    assert verify(version) == [
        "a.txt: the stored copy differs from the manifest (SHA-256)",
        "b.txt: missing from the store",
    ]


def test_references_resolve_to_ready_versions_by_number_alias_or_latest(
    world: Any, tmp_path: Path
) -> None:
    wiki = asset_named(world.alpha, Asset.Kind.DATASET, "wiki")
    raw = folder(tmp_path / "raw", {"a.txt": b"1"})
    one = ingest_folder(wiki, raw, source="prefix")
    (raw / "a.txt").write_bytes(b"2")
    two = ingest_folder(wiki, raw, source="prefix")
    (raw / "link").symlink_to(raw / "a.txt")
    broken = ingest_folder(wiki, raw, source="prefix")
    assert broken.number == 3
    assert broken.state == AssetVersion.State.FAILED
    assert resolve(world.alpha, "dataset", "wiki") == two
    assert resolve(world.alpha, "dataset", "wiki@latest") == two
    assert resolve(world.alpha, "dataset", "wiki@1") == one
    set_alias(one, "train", user=world.users["researcher"])
    assert resolve(world.alpha, "dataset", "wiki@train") == one
    set_alias(two, "train")  # moved
    assert resolve(world.alpha, "dataset", "wiki@train") == two
    refusals = {
        "wiki@9": "wiki has no version 9.",
        "wiki@eval": "wiki has no alias 'eval'; name a version number or an alias.",
        "wiki@3": (
            "wiki@3 is failed, not ready: link is a symlink; only files and folders are kept."
        ),
        "books": "This workspace has no dataset named 'books'.",
    }
    for text, said in refusals.items():
        with pytest.raises(CatalogError) as refused:
            resolve(world.alpha, "dataset", text)
        assert str(refused.value) == said
    # A model of the same name is another asset.
    with pytest.raises(CatalogError, match="no model named 'wiki'"):
        resolve(world.alpha, "model", "wiki")


@pytest.mark.parametrize(
    ("alias", "said"),
    [
        ("latest", "kept by the catalog"),
        ("7", "kept by the catalog or is a number"),
        ("Prod", "is not a name here"),
        ("a@b", "is not a name here"),
    ],
)
def test_an_alias_the_catalog_keeps_or_cannot_read_back_is_refused(
    world: Any, tmp_path: Path, alias: str, said: str
) -> None:
    version = ingest_folder(
        asset_named(world.alpha, Asset.Kind.DATASET, "wiki"),
        folder(tmp_path / "raw", {"a": b"a"}),
        source="prefix",
    )
    with pytest.raises(CatalogError, match=said):
        set_alias(version, alias)


def test_only_a_ready_version_gets_an_alias(world: Any, tmp_path: Path) -> None:
    raw = folder(tmp_path / "raw", {"a": b"a"})
    os.mkfifo(raw / "pipe")
    failed = ingest_folder(asset_named(world.alpha, "dataset", "wiki"), raw, source="prefix")
    with pytest.raises(CatalogError, match="wiki@1 is failed: only a ready version"):
        set_alias(failed, "train")


def test_another_workspaces_assets_are_out_of_reach(world: Any, tmp_path: Path) -> None:
    ingest_folder(
        asset_named(world.alpha, "dataset", "wiki"),
        folder(tmp_path / "raw", {"a": b"alpha's"}),
        source="prefix",
    )
    with pytest.raises(CatalogError, match="This workspace has no dataset named 'wiki'"):
        resolve(world.beta, "dataset", "wiki@1")
    # The new tables fail closed like every tenant table.
    for model in (Asset, AssetVersion, AssetFile):
        with pytest.raises(UnscopedQueryError):
            list(model.objects.all())
    # And the stores are apart: beta's holds nothing of alpha's.
    assert not storage.workspace_root(world.beta.pk).exists()


def test_the_store_is_a_folder_named_by_a_file_url(settings: Any, tmp_path: Path) -> None:
    settings.TAU_STORAGE_URL = ""
    assert storage.root() == Path(settings.VAR_DIR) / "storage"
    settings.TAU_STORAGE_URL = f"file://{tmp_path}/with%20space"
    assert storage.root() == tmp_path / "with space"
    settings.TAU_STORAGE_URL = "s3://bucket/prefix"
    with pytest.raises(ImproperlyConfigured, match="only a file:///path/to/storage store has one"):
        storage.root()
    with pytest.raises(ImproperlyConfigured, match="its blobs are no files here"):
        storage.blob_path(1, "0" * 64)
    settings.TAU_STORAGE_URL = "gs://bucket/prefix"
    with pytest.raises(
        ImproperlyConfigured, match=r"a folder \(file:///path/to/storage\) or an S3"
    ):
        storage.store()


def test_names_are_checked(world: Any) -> None:
    with pytest.raises(CatalogError, match="is not a name here"):
        asset_named(world.alpha, "dataset", "../etc")
    assert ingest.parse_ref("wiki@train") == ("wiki", "train")
    assert ingest.parse_ref("wiki") == ("wiki", "latest")
