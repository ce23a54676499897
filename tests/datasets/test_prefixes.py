"""A version registered from a prefix of the workspace's own folder on the portal (issue 33,
``catalog.prefixes``): the prefix is checked at once (a relative path that stays inside the
workspace's folder, symlinks resolved), then a worker reads, checks and keeps every file;
anything that is not a regular file fails the version naming it; another workspace's folder
cannot be reached by any spelling."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from catalog import tasks
from catalog.models import AssetVersion
from identity import tokens
from tau.manifest import scan

pytestmark = pytest.mark.django_db

API = "/api/v1/workspaces/alpha/datasets"


@pytest.fixture
def prefixes(settings: Any, tmp_path: Path) -> Path:
    """alpha's folder holds raw/ (three files); beta's holds a secret."""
    root = tmp_path / "prefixes"
    settings.TAU_DATA_PREFIX_DIR = str(root)
    settings.TAU_STORAGE_URL = f"file://{tmp_path / 'store'}"
    raw = root / "alpha" / "raw" / "2026-11"
    (raw / "shards").mkdir(parents=True)
    (raw / "shards" / "0.jsonl").write_text('{"text": "a"}\n' * 100)
    (raw / "shards" / "1.jsonl").write_text('{"text": "b"}\n' * 100)
    (raw / "README").write_text("raw reviews\n")
    (root / "beta").mkdir()
    (root / "beta" / "secret.txt").write_text("beta's\n")
    return root


def register(world: Any, body: dict[str, Any], captured: Any, who: str = "researcher") -> Any:
    api = world.api_client_for(who)
    api.post(f"{API}/", {"name": "reviews"}, format="json")
    with captured() as callbacks:
        response = api.post(f"{API}/reviews/versions/", body, format="json")
    return response, callbacks


def test_a_prefix_becomes_a_version_of_every_file_under_it(
    world: Any, prefixes: Path, django_capture_on_commit_callbacks: Any
) -> None:
    response, callbacks = register(
        world, {"source": "prefix", "prefix": "raw/2026-11/"}, django_capture_on_commit_callbacks
    )
    assert response.status_code == 201, response.json()
    assert (response.json()["state"], response.json()["source_detail"]) == (
        "ingesting",
        "raw/2026-11",
    )
    assert len(callbacks) == 1
    version = AssetVersion.objects.for_workspace(world.alpha).get()
    assert tasks.ingest_prefix(version.pk, "raw/2026-11/") == "ready"
    version.refresh_from_db()
    # The same manifest as the folder's own scan: every file, its size and digest.
    assert version.manifest_digest == scan(prefixes / "alpha" / "raw" / "2026-11").digest
    assert sorted(version.files.values_list("path", flat=True)) == [
        "README",
        "shards/0.jsonl",
        "shards/1.jsonl",
    ]
    # Kept in the store: changing the folder afterwards changes nothing of the version.
    (prefixes / "alpha" / "raw" / "2026-11" / "README").write_text("changed\n")
    verified = world.api_client_for("researcher").post(f"{API}/reviews/versions/1/verify/")
    assert verified.json()["ok"] is True


@pytest.mark.parametrize(
    ("prefix", "said"),
    [
        ("../beta", "prefix: "),
        ("raw/../../beta", "prefix: "),
        ("nothing/here", "has no folder 'nothing/here'"),
        ("escape", "leads out of the workspace's folder"),
        ("raw/2026-11/README", "has no folder"),
    ],
)
def test_a_prefix_outside_the_workspaces_folder_is_refused_at_once(
    world: Any,
    prefixes: Path,
    django_capture_on_commit_callbacks: Any,
    prefix: str,
    said: str,
) -> None:
    (prefixes / "alpha" / "escape").symlink_to(prefixes / "beta")
    response, callbacks = register(
        world, {"source": "prefix", "prefix": prefix}, django_capture_on_commit_callbacks
    )
    assert response.status_code == 400
    assert said in response.json()["prefix"][0]
    assert callbacks == []
    assert not AssetVersion.objects.for_workspace(world.alpha).exists()


def test_a_symlink_under_the_prefix_fails_the_version_naming_it(
    world: Any, prefixes: Path, django_capture_on_commit_callbacks: Any
) -> None:
    raw = prefixes / "alpha" / "raw" / "2026-11"
    (raw / "shards" / "leak.txt").symlink_to(prefixes / "beta" / "secret.txt")
    response, _ = register(
        world, {"source": "prefix", "prefix": "raw/2026-11"}, django_capture_on_commit_callbacks
    )
    assert response.status_code == 201  # a file is only found when the folder is read
    version = AssetVersion.objects.for_workspace(world.alpha).get()
    tasks.ingest_prefix(version.pk, "raw/2026-11")
    version.refresh_from_db()
    assert version.state == "failed"
    assert "shards/leak.txt" in version.error
    assert not version.files.exists()


def test_a_workspace_without_a_folder_is_told_who_mounts_it(
    world: Any, settings: Any, tmp_path: Path, django_capture_on_commit_callbacks: Any
) -> None:
    settings.TAU_DATA_PREFIX_DIR = str(tmp_path / "nowhere")
    response, _ = register(
        world, {"source": "prefix", "prefix": "raw"}, django_capture_on_commit_callbacks
    )
    assert response.status_code == 400
    assert "the platform team mounts the workspace's data there" in response.json()["prefix"][0]


@pytest.fixture
def portal(tmp_path: Path, settings: Any, prefixes: Path) -> Iterator[Any]:
    """The portal's web server and Celery worker, reading the same folders."""
    from tests.runs.processes import portal_processes

    env = {"TAU_STORAGE_URL": settings.TAU_STORAGE_URL, "TAU_DATA_PREFIX_DIR": str(prefixes)}
    yield from portal_processes(tmp_path, settings.CELERY_BROKER_URL, extra_env=env)


@pytest.mark.django_db(transaction=True)
def test_tau_registers_a_prefix_through_the_portals_own_worker(
    world: Any, tmp_path: Path, portal: Any
) -> None:
    from tests.cli.test_cli_members import Tau

    portal.start(beat=False)
    token = tokens.issue_token(user=world.users["researcher"], name="cli").plaintext
    tau = Tau(portal.url, token, tmp_path / "home")
    done = tau("data", "dataset", "register", "reviews", "raw/2026-11")
    assert done.returncode == 0, done.stdout + done.stderr + portal.log("worker")[-2000:]
    assert "The portal is reading reviews@1." in done.stdout
    assert "reviews@1: ready, 3 files," in done.stdout
    refused = tau("data", "dataset", "register", "reviews", "../beta")
    assert refused.returncode != 0
