"""Deleting one version (issue 33, ``catalog.deletion``): a version nothing names goes whole;
one a run's record names keeps its manifest as state ``deleted`` (the run's evidence still
proves which bytes were used) while its files leave the store; blobs another version holds
stay; aliases go; nothing can read, stage or download it any more; only the workspace admin
deletes, and never a version still on its way."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from catalog import storage
from catalog.ingest import asset_named, ingest_folder, set_alias, storage_used
from catalog.models import AssetAlias, AssetFile, AssetVersion
from runs.submission import SubmissionRefused
from tests.runs.factories import TINY_SPEC, make_run

pytestmark = pytest.mark.django_db

API = "/api/v1/workspaces/alpha/datasets"
SHARED = b"the same in both versions\n"
OWN = b"only in version 1\n"


@pytest.fixture
def versions(world: Any, settings: Any, tmp_path: Path) -> tuple[AssetVersion, AssetVersion]:
    """wiki@1 (shared.txt, own.txt) and wiki@2 (shared.txt), each aliased."""
    settings.TAU_STORAGE_URL = f"file://{tmp_path / 'store'}"
    asset = asset_named(world.alpha, "dataset", "wiki")
    first = tmp_path / "one"
    first.mkdir()
    (first / "shared.txt").write_bytes(SHARED)
    (first / "own.txt").write_bytes(OWN)
    second = tmp_path / "two"
    second.mkdir()
    (second / "shared.txt").write_bytes(SHARED)
    one = ingest_folder(asset, first, source="upload")
    two = ingest_folder(asset, second, source="upload")
    set_alias(one, "train")
    return one, two


def held(world: Any, content: bytes) -> bool:
    sha = hashlib.sha256(content).hexdigest()
    return storage.has_blob(world.alpha.pk, sha, len(content))


def test_a_version_nothing_names_goes_whole_and_only_its_own_blobs_leave(
    world: Any, versions: tuple[AssetVersion, AssetVersion]
) -> None:
    one, _ = versions
    before = storage_used(world.alpha.pk)
    response = world.api_client_for("workspace_admin").delete(f"{API}/wiki/versions/1/")
    assert response.status_code == 204
    assert not AssetVersion.objects.for_workspace(world.alpha).filter(pk=one.pk).exists()
    assert not AssetAlias.objects.for_workspace(world.alpha).filter(name="train").exists()
    assert not held(world, OWN)
    assert held(world, SHARED)  # wiki@2 holds it
    assert storage_used(world.alpha.pk) == before - len(OWN)
    assert world.api_client_for("viewer").get(f"{API}/wiki/versions/1/").status_code == 404


def test_a_version_a_run_read_keeps_its_manifest_and_loses_its_files(
    world: Any, versions: tuple[AssetVersion, AssetVersion]
) -> None:
    one, _ = versions
    run = make_run(
        world, spec=TINY_SPEC + b"inputs:\n  datasets:\n    - {name: wiki, version: train}\n"
    )
    digest = one.manifest_digest
    admin = world.api_client_for("workspace_admin")

    response = admin.delete(f"{API}/wiki/versions/1/")

    assert response.status_code == 200, response.content
    answer = response.json()
    assert (answer["state"], answer["manifest_digest"], answer["files_count"]) == (
        "deleted",
        digest,
        2,
    )
    assert answer["deleted_at"] is not None
    assert answer["aliases"] == []
    # The manifest is still there, file by file; the bytes are not.
    files = world.api_client_for("viewer").get(f"{API}/wiki/versions/1/files/").json()
    assert sorted(row["path"] for row in files["results"]) == ["own.txt", "shared.txt"]
    assert not held(world, OWN)
    assert held(world, SHARED)
    assert AssetFile.objects.for_workspace(world.alpha).filter(version=one).count() == 2
    # Nothing reads it any more.
    assert admin.get(f"{API}/wiki/versions/1/download/").status_code == 409
    assert admin.post(f"{API}/wiki/versions/1/verify/").status_code == 409
    with pytest.raises(SubmissionRefused) as refused:
        make_run(
            world, spec=TINY_SPEC + b"inputs:\n  datasets:\n    - {name: wiki, version: '1'}\n"
        )
    assert "wiki@1's files were deleted" in str(refused.value.problems)
    # The run's record still names the exact bytes it read; the page says what happened.
    assert run.pk is not None
    page = world.client_for("viewer").get("/w/alpha/datasets/wiki/versions/1/").content.decode()
    assert "Its files were deleted" in page
    assert digest in page
    # Deleting it again, or a version on its way, is refused; only an admin deletes.
    assert admin.delete(f"{API}/wiki/versions/1/").status_code == 409
    assert world.api_client_for("researcher").delete(f"{API}/wiki/versions/2/").status_code == 403


def test_a_version_still_being_ingested_is_not_deleted(
    world: Any, versions: tuple[AssetVersion, AssetVersion]
) -> None:
    _, two = versions
    AssetVersion.objects.for_workspace(world.alpha).filter(pk=two.pk).update(
        state=AssetVersion.State.INGESTING
    )
    response = world.api_client_for("workspace_admin").delete(f"{API}/wiki/versions/2/")
    assert response.status_code == 409
    assert "wait until it is ready or failed" in response.json()["detail"]
    assert held(world, SHARED)


def test_another_workspaces_version_cannot_be_deleted(
    world: Any, versions: tuple[AssetVersion, AssetVersion]
) -> None:
    outsider = world.api_client_for("outsider")  # beta's admin
    assert outsider.delete(f"{API}/wiki/versions/1/").status_code == 404
    assert outsider.delete("/api/v1/workspaces/beta/datasets/wiki/versions/1/").status_code == 404
    assert held(world, OWN)
