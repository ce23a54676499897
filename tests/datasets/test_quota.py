"""A workspace's storage quota for datasets and models (issue 33): an upload or a run's output
that would pass it is refused up front with the numbers, nothing kept; files the workspace
holds already cost nothing; no quota, no limit."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from catalog.ingest import asset_named, ingest_folder, storage_used
from catalog.models import AssetVersion
from tests.datasets.test_catalog import folder

pytestmark = pytest.mark.django_db

API = "/api/v1/workspaces/alpha"


@pytest.fixture(autouse=True)
def store(settings: Any, tmp_path: Path) -> None:
    settings.TAU_STORAGE_URL = f"file://{tmp_path / 'store'}"


def declared(files: dict[str, bytes]) -> list[dict[str, Any]]:
    return [
        {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        for path, data in files.items()
    ]


def test_an_upload_past_the_quota_is_refused_with_the_numbers(world: Any, tmp_path: Path) -> None:
    wiki = asset_named(world.alpha, "dataset", "wiki")
    ingest_folder(wiki, folder(tmp_path / "one", {"a.bin": b"a" * 60}), source="upload")
    assert storage_used(world.alpha.pk) == 60
    world.alpha.storage_quota_bytes = 100
    world.alpha.save()
    client = world.client_for("researcher")
    refused = client.post(
        f"{API}/datasets/wiki/versions/",
        {"source": "upload", "files": declared({"a.bin": b"a" * 60, "b.bin": b"b" * 50})},
        "application/json",
    )
    assert refused.status_code == 400
    assert refused.json()["files"] == [
        "This upload needs 50 more bytes, and alpha keeps 60 of its 100-byte storage quota: "
        "delete versions it no longer needs, or ask the platform team for more."
    ]
    assert AssetVersion.objects.for_workspace(world.alpha).count() == 1
    # What the workspace holds already is free: the same file again, and one of 40 bytes.
    fits = client.post(
        f"{API}/datasets/wiki/versions/",
        {"source": "upload", "files": declared({"a.bin": b"a" * 60, "c.bin": b"c" * 40})},
        "application/json",
    )
    assert fits.status_code == 201, fits.json()
    assert storage_used(world.alpha.pk) == 100  # declared, not yet sent: reserved


def test_a_runs_output_past_the_quota_fails_its_version_naming_the_quota(
    world: Any, tmp_path: Path
) -> None:
    world.alpha.storage_quota_bytes = 10
    world.alpha.save()
    version = ingest_folder(
        asset_named(world.alpha, "model", "tiny"),
        folder(tmp_path / "out", {"w.bin": b"w" * 11}),
        source="run",
    )
    assert version.state == "failed"
    assert "tiny@1 needs 11 more bytes, and alpha keeps 0 of its 10-byte storage quota" in (
        version.error
    )
    assert not version.files.exists()


def test_without_a_quota_there_is_no_limit(world: Any, tmp_path: Path) -> None:
    assert world.alpha.storage_quota_bytes is None
    version = ingest_folder(
        asset_named(world.alpha, "dataset", "big"),
        folder(tmp_path / "big", {"x.bin": b"x" * 100_000}),
        source="upload",
    )
    assert version.state == "ready"
    assert storage_used(world.alpha.pk) == 100_000


def test_the_workspace_and_usage_pages_show_what_is_kept_against_the_quota(
    world: Any, tmp_path: Path
) -> None:
    wiki = asset_named(world.alpha, "dataset", "wiki")
    ingest_folder(wiki, folder(tmp_path / "one", {"a.bin": b"a" * 3000}), source="upload")
    viewer = world.client_for("viewer")
    for page in ("/w/alpha/", "/w/alpha/usage/"):
        text = viewer.get(page).content.decode()
        assert "2.9\xa0KB</strong> kept by datasets and models" in text, page
        assert "No storage quota" in text, page
    world.alpha.storage_quota_bytes = 12000
    world.alpha.save(update_fields=["storage_quota_bytes"])
    for page in ("/w/alpha/", "/w/alpha/usage/"):
        text = viewer.get(page).content.decode()
        assert "2.9\xa0KB</strong> of 11.7\xa0KB kept by datasets and models (25%)" in text, page
        assert 'value="3000"' in text, page
