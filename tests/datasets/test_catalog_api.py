"""The catalog's read API (issue 33): exact field names, versions by number, alias or
``latest``, files in pages, datasets apart from models and from other workspaces, and a
constant number of queries for the list."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from catalog.ingest import asset_named, ingest_folder, set_alias
from tau.manifest import scan
from tests.datasets.test_catalog import folder

pytestmark = pytest.mark.django_db

API = "/api/v1/workspaces/alpha"


@pytest.fixture(autouse=True)
def store(settings: Any, tmp_path: Path) -> None:
    settings.TAU_STORAGE_URL = f"file://{tmp_path / 'store'}"


def test_a_dataset_its_versions_and_files_read_as_documented(world: Any, tmp_path: Path) -> None:
    raw = folder(tmp_path / "raw", {f"shard-{n:02}.txt": b"x" * n for n in range(5)})
    wiki = asset_named(world.alpha, "dataset", "wiki")
    one = ingest_folder(wiki, raw, source="prefix", source_detail="raw/")
    (raw / "bad").symlink_to(raw / "shard-01.txt")
    ingest_folder(wiki, raw, source="prefix")  # fails: version 2
    (raw / "bad").unlink()
    tokenized = ingest_folder(
        asset_named(world.alpha, "dataset", "wiki-tokenized"),
        folder(tmp_path / "tok", {"ids.bin": b"\x01\x02"}),
        source="run",
        derived_from=[one],
    )
    set_alias(one, "train")
    client = world.client_for("viewer")

    listed = client.get(f"{API}/datasets/").json()
    assert [item["name"] for item in listed] == ["wiki", "wiki-tokenized"]
    assert listed[0] | {"created_at": None} == {
        "name": "wiki",
        "kind": "dataset",
        "description": "",
        "created_at": None,
        "versions_count": 2,
        "latest": 1,
        "aliases": {"train": 1},
    }

    detail = client.get(f"{API}/datasets/wiki/versions/train/").json()
    assert detail | {"created_at": None, "ready_at": None} == {
        "number": 1,
        "ref": "wiki@1",
        "state": "ready",
        "source": "prefix",
        "source_detail": "raw/",
        "in_place": False,  # a folder ingested (copied), not registered in place
        "prefix": None,
        "manifest_digest": one.manifest_digest,
        "files_count": 5,
        "bytes": 10,
        "progress": {"bytes_done": 10, "bytes_total": 10},
        "error": "",
        "derived_from": [],
        "produced_by": None,
        "aliases": ["train"],
        "metrics": {},
        "created_at": None,
        "ready_at": None,
        "deleted_at": None,
    }
    assert client.get(f"{API}/datasets/wiki/versions/1/").json() == detail
    assert client.get(f"{API}/datasets/wiki/versions/latest/").json()["number"] == 1
    failed = client.get(f"{API}/datasets/wiki/versions/2/").json()
    assert (failed["state"], failed["error"]) == (
        "failed",
        "bad is a symlink; only files and folders are kept.",
    )
    derived = client.get(f"{API}/datasets/wiki-tokenized/versions/1/").json()
    assert derived["derived_from"] == ["wiki@1"]
    assert derived["manifest_digest"] == tokenized.manifest_digest
    versions = client.get(f"{API}/datasets/wiki/versions/").json()
    assert [version["number"] for version in versions] == [2, 1]

    page = client.get(f"{API}/datasets/wiki/versions/1/files/?limit=2&offset=1").json()
    assert page["count"] == 5
    recorded = {entry.path: entry.sha256 for entry in scan(tmp_path / "raw").files}
    assert page["results"] == [
        {
            "path": f"shard-{n:02}.txt",
            "size": n,
            "sha256": recorded[f"shard-{n:02}.txt"],
            "stored": True,
            "received": n,
        }
        for n in (1, 2)
    ]
    assert page["next"] is not None


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("datasets/books/", "This workspace has no dataset named 'books'."),
        ("datasets/wiki/versions/7/", "wiki has no version '7'."),
        ("datasets/wiki/versions/eval/", "wiki has no version 'eval'."),
        ("models/wiki/", "This workspace has no model named 'wiki'."),
    ],
)
def test_what_is_not_there_is_a_404_that_says_so(
    world: Any, tmp_path: Path, path: str, said: str
) -> None:
    ingest_folder(
        asset_named(world.alpha, "dataset", "wiki"),
        folder(tmp_path / "raw", {"a": b"a"}),
        source="prefix",
    )
    response = world.client_for("researcher").get(f"{API}/{path}")
    assert response.status_code == 404
    assert response.json()["detail"] == said


def test_another_workspaces_datasets_and_models_are_not_listed(world: Any, tmp_path: Path) -> None:
    ingest_folder(
        asset_named(world.beta, "dataset", "wiki"),
        folder(tmp_path / "raw", {"a": b"beta's"}),
        source="prefix",
    )
    ingest_folder(
        asset_named(world.alpha, "model", "tiny-gpt"),
        folder(tmp_path / "model", {"w.bin": b"weights"}),
        source="run",
    )
    client = world.client_for("researcher")
    assert client.get(f"{API}/datasets/").json() == []
    assert client.get(f"{API}/datasets/wiki/").status_code == 404
    assert [item["name"] for item in client.get(f"{API}/models/").json()] == ["tiny-gpt"]


def test_the_list_takes_the_same_queries_for_one_dataset_or_many(
    world: Any, tmp_path: Path
) -> None:
    client = world.client_for("viewer")

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(f"{API}/datasets/").status_code == 200
        return len(captured)

    source = folder(tmp_path / "raw", {"a": b"a"})
    version = ingest_folder(asset_named(world.alpha, "dataset", "d0"), source, source="prefix")
    set_alias(version, "train")
    one = queries()
    for number in range(1, 6):
        version = ingest_folder(
            asset_named(world.alpha, "dataset", f"d{number}"), source, source="prefix"
        )
        set_alias(version, "train")
    assert queries() == one
