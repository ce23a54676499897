"""A version registered in place from a prefix of the workspace's own folder on the portal
(issue 33, ``catalog.prefixes``, ``catalog.in_place``): the prefix is checked at once (a
relative path that stays inside the workspace's folder, symlinks resolved), then a worker
hashes every file into the manifest — nothing is copied into the store, nor counted against
the storage quota. Every read reads the files where they are, checked: verify names a file
changed or removed since, a run's staging (this machine's and a cluster's stager, through the
portal's own blob endpoint, never a presigned URL) and a download refuse it; deleting the
version leaves the folder as it was; another workspace's folder cannot be reached by any
spelling, at registration or later."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from catalog import prefixes as prefixes_module
from catalog import storage, tasks
from catalog.ingest import set_alias, storage_used
from catalog.models import AssetVersion
from catalog.runs import staging_plan
from executors.local.agent import staging
from identity import tokens
from tau.manifest import scan
from tests.runs.factories import TINY_SPEC, make_run

pytestmark = pytest.mark.django_db

API = "/api/v1/workspaces/alpha/datasets"
#: alpha's files under raw/2026-11, as the fixture writes them.
RAW = {
    "README": b"raw reviews\n",
    "shards/0.jsonl": b'{"text": "a"}\n' * 100,
    "shards/1.jsonl": b'{"text": "b"}\n' * 100,
}
READS = TINY_SPEC + b"inputs:\n  datasets:\n    - {name: reviews, version: train, path: reviews}\n"


@pytest.fixture
def prefixes(settings: Any, tmp_path: Path) -> Path:
    """alpha's folder holds raw/2026-11 (three files); beta's holds a secret."""
    root = tmp_path / "prefixes"
    settings.TAU_DATA_PREFIX_DIR = str(root)
    settings.TAU_STORAGE_URL = f"file://{tmp_path / 'store'}"
    settings.VAR_DIR = tmp_path / "var"
    raw = root / "alpha" / "raw" / "2026-11"
    for path, content in RAW.items():
        (raw / path).parent.mkdir(parents=True, exist_ok=True)
        (raw / path).write_bytes(content)
    (root / "beta").mkdir()
    (root / "beta" / "secret.txt").write_text("beta's\n")
    return root


def raw_folder(prefixes: Path) -> Path:
    return prefixes / "alpha" / "raw" / "2026-11"


def snapshot(folder: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file under ``folder``: its bytes, mode and modification time."""
    return {
        str(path.relative_to(folder)): (
            path.read_bytes(),
            path.stat().st_mode,
            path.stat().st_mtime_ns,
        )
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def files_in(folder: Path) -> list[Path]:
    return [path for path in folder.rglob("*") if path.is_file()] if folder.exists() else []


def register(world: Any, body: dict[str, Any], captured: Any, who: str = "researcher") -> Any:
    api = world.api_client_for(who)
    api.post(f"{API}/", {"name": "reviews"}, format="json")
    with captured() as callbacks:
        response = api.post(f"{API}/reviews/versions/", body, format="json")
    return response, callbacks


def registered(world: Any, captured: Any) -> AssetVersion:
    """reviews@1: raw/2026-11 registered in place, ready, aliased ``train``."""
    response, _ = register(world, {"source": "prefix", "prefix": "raw/2026-11"}, captured)
    assert response.status_code == 201, response.json()
    version = AssetVersion.objects.for_workspace(world.alpha).get()
    assert tasks.ingest_prefix(version.pk, "raw/2026-11") == "ready", version.error
    version.refresh_from_db()
    set_alias(version, "train")
    return version


def test_a_prefix_is_registered_in_place_nothing_copied_nor_counted(
    world: Any, prefixes: Path, tmp_path: Path, django_capture_on_commit_callbacks: Any
) -> None:
    world.alpha.storage_quota_bytes = 10  # far less than the files: they are not the store's
    world.alpha.save(update_fields=["storage_quota_bytes"])
    before = snapshot(raw_folder(prefixes))
    response, callbacks = register(
        world, {"source": "prefix", "prefix": "raw/2026-11/"}, django_capture_on_commit_callbacks
    )
    assert response.status_code == 201, response.json()
    started = response.json()
    assert (started["state"], started["source"], started["source_detail"]) == (
        "ingesting",
        "prefix",
        "raw/2026-11",
    )
    assert (started["in_place"], started["prefix"]) == (True, "raw/2026-11")
    assert len(callbacks) == 1
    version = AssetVersion.objects.for_workspace(world.alpha).get()
    assert tasks.ingest_prefix(version.pk, "raw/2026-11/") == "ready"
    version.refresh_from_db()
    # The same manifest as the folder's own scan: every file, its size and digest.
    assert version.manifest_digest == scan(raw_folder(prefixes)).digest
    assert sorted(version.files.values_list("path", flat=True)) == sorted(RAW)
    assert (version.bytes_done, version.bytes_total) == (version.bytes, sum(map(len, RAW.values())))

    # Nothing in the store, nothing counted; the folder exactly as it was.
    assert files_in(tmp_path / "store") == []
    assert storage_used(world.alpha.pk) == 0
    assert snapshot(raw_folder(prefixes)) == before

    shown = world.api_client_for("viewer").get(f"{API}/reviews/versions/1/").json()
    assert (shown["state"], shown["in_place"], shown["prefix"]) == ("ready", True, "raw/2026-11")
    files = world.api_client_for("viewer").get(f"{API}/reviews/versions/1/files/").json()
    assert {row["path"]: row["sha256"] for row in files["results"]} == {
        path: hashlib.sha256(content).hexdigest() for path, content in RAW.items()
    }
    page = world.client_for("viewer").get("/w/alpha/datasets/reviews/versions/1/").content.decode()
    assert "Registered in place." in page
    assert "checked against the manifest each time they are read" in page
    assert "do not count against its storage quota" in page

    # A version from an upload of the same bytes would be counted; this one never was.
    verified = world.api_client_for("researcher").post(f"{API}/reviews/versions/1/verify/")
    assert verified.json() == {
        "ok": True,
        "problems": [],
        "verified_at": verified.json()["verified_at"],
    }


def test_a_file_changed_or_removed_after_registration_is_named_by_verify_and_refused(
    world: Any, prefixes: Path, django_capture_on_commit_callbacks: Any
) -> None:
    registered(world, django_capture_on_commit_callbacks)
    raw = raw_folder(prefixes)
    (raw / "README").write_bytes(b"RAW REVIEWS\n")  # the same size, other bytes
    removed = (raw / "shards" / "1.jsonl").read_bytes()
    (raw / "shards" / "1.jsonl").unlink()
    api = world.api_client_for("researcher")

    verified = api.post(f"{API}/reviews/versions/1/verify/").json()
    assert verified["ok"] is False
    changed, missing = verified["problems"]
    assert changed.startswith("README: changed since it was registered (SHA-256 ")
    assert hashlib.sha256(b"RAW REVIEWS\n").hexdigest() in changed
    assert missing == "shards/1.jsonl: missing from raw/2026-11"
    # As for a corrupted blob: the version stays ready, with the problems recorded and shown.
    version = AssetVersion.objects.for_workspace(world.alpha).get()
    assert version.state == "ready"
    assert version.verify_problems.splitlines() == [changed, missing]
    page = world.client_for("viewer").get("/w/alpha/datasets/reviews/versions/1/").content.decode()
    assert "Does not verify" in page
    assert "shards/1.jsonl: missing from raw/2026-11" in page

    # A download is refused before its first byte when a file is plainly gone...
    download = api.get(f"{API}/reviews/versions/1/download/")
    assert download.status_code == 409
    assert "shards/1.jsonl is missing" in download.json()["detail"]
    # ...and ends short, never with the changed bytes, when one only differs in content.
    (raw / "shards" / "1.jsonl").write_bytes(removed)
    download = api.get(f"{API}/reviews/versions/1/download/")
    assert download.status_code == 200
    received = b"".join(download.streaming_content)
    assert len(received) < int(download["Content-Length"])
    assert b"RAW REVIEWS" not in received

    # Put back, it reads again: verify is clean and the download whole.
    (raw / "README").write_bytes(RAW["README"])
    assert api.post(f"{API}/reviews/versions/1/verify/").json()["ok"] is True
    download = api.get(f"{API}/reviews/versions/1/download/")
    received = b"".join(download.streaming_content)
    assert len(received) == int(download["Content-Length"])
    with tarfile.open(fileobj=io.BytesIO(received)) as tar:
        assert {
            member.name: tar.extractfile(member).read()  # type: ignore[union-attr]
            for member in tar.getmembers()
        } == RAW


def test_a_run_on_this_machine_stages_the_files_from_the_prefix_checked(
    world: Any, prefixes: Path, tmp_path: Path, django_capture_on_commit_callbacks: Any
) -> None:
    registered(world, django_capture_on_commit_callbacks)
    raw = raw_folder(prefixes)
    before = snapshot(raw)
    run = make_run(world, spec=READS)
    (plan,) = staging_plan(run)
    assert plan.in_place is not None
    assert plan.in_place.said == "raw/2026-11"

    staged = staging.stage((plan,), tmp_path / "attempt-1" / "data")
    assert (staged.files, staged.bytes) == (3, sum(map(len, RAW.values())))
    data = tmp_path / "attempt-1" / "data" / "reviews"
    assert {path: (data / path).read_bytes() for path in RAW} == RAW
    for path in RAW:
        assert (data / path).stat().st_mode & 0o222 == 0
    # The run links checked copies in this machine's cache of copies, not the user's files,
    # whose modes and times are untouched; the store holds nothing.
    readme = (data / "README").stat()
    cached = storage.cache_path(world.alpha.pk, hashlib.sha256(RAW["README"]).hexdigest())
    assert readme.st_ino == cached.stat().st_ino
    assert readme.st_ino != (raw / "README").stat().st_ino
    assert snapshot(raw) == before
    assert files_in(tmp_path / "store") == []

    # Again: the same copies, linked.
    staging.stage((plan,), tmp_path / "attempt-2" / "data")
    assert (tmp_path / "attempt-2" / "data" / "reviews" / "README").stat().st_ino == readme.st_ino

    # Changed since it was registered: staging fails naming the file, though a checked copy
    # of the registered bytes is in the cache.
    (raw / "README").write_bytes(b"RAW REVIEWS\n")
    with pytest.raises(staging.StagingFailed) as failed:
        staging.stage((plan,), tmp_path / "attempt-3" / "data")
    assert str(failed.value).startswith(
        "reviews@1: README: changed since it was registered (SHA-256 "
    )
    (raw / "README").write_bytes(RAW["README"])
    (raw / "shards" / "0.jsonl").unlink()
    with pytest.raises(staging.StagingFailed) as failed:
        staging.stage((plan,), tmp_path / "attempt-4" / "data")
    assert str(failed.value) == (
        "reviews@1: shards/0.jsonl is missing from raw/2026-11, where the version was "
        "registered in place."
    )

    # The cache is trimmed as ever, and its trimming never reaches the prefix.
    for attempt in ("attempt-1", "attempt-2", "attempt-3", "attempt-4"):
        shutil.rmtree(tmp_path / attempt, ignore_errors=True)
    assert files_in(storage.in_place_marks())  # what staging found of each file
    assert storage.trim_cache(0, now=time.time() + 3600) >= 2
    assert not cached.exists()
    assert files_in(storage.in_place_marks()) == []  # unused as long: read again next time
    assert sorted(str(path.relative_to(raw)) for path in files_in(raw)) == [
        "README",
        "shards/1.jsonl",
    ]


@pytest.mark.django_db(transaction=True)
def test_the_cluster_stager_reads_in_place_files_from_the_portal_never_the_store(
    world: Any,
    prefixes: Path,
    s3_store: Any,
    live_server: Any,
    tmp_path: Path,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """With an S3 store too: an in-place file has no object, so no presigned URL; the portal
    streams it from the prefix, checked, and refuses one that changed, naming it."""
    from tests.executors.kubernetes.test_stage_data import stage, token_for

    version = registered(world, django_capture_on_commit_callbacks)
    assert s3_store.object_keys() == []
    run = make_run(world, spec=READS)
    token = token_for(run)
    listing = world.api_client_for("viewer").get(f"/api/v1/workspaces/alpha/runs/{run.name}/data/")
    head, *lines = b"".join(listing.streaming_content).decode().splitlines()
    assert json.loads(head)["bytes"] == version.bytes
    assert {json.loads(line)["url"] for line in lines} == {
        f"blobs/{hashlib.sha256(content).hexdigest()}/" for content in RAW.values()
    }

    root = tmp_path / "volume"
    root.mkdir()
    done = stage(live_server, run, token, root)
    assert done.returncode == 0, done.stderr
    assert {path: (root / "reviews" / path).read_bytes() for path in RAW} == RAW

    # Changed after registration: the portal refuses the file before a byte, naming it.
    (raw_folder(prefixes) / "shards" / "0.jsonl").write_bytes(b'{"text": "c"}\n' * 100)
    sha = version.files.get(path="shards/0.jsonl").sha256
    answer = world.api_client_for("viewer").get(
        f"/api/v1/workspaces/alpha/runs/{run.name}/data/blobs/{sha}/"
    )
    assert answer.status_code == 409
    assert answer.json()["detail"].startswith(
        "reviews@1: shards/0.jsonl (registered in place at raw/2026-11): changed since it was "
        "registered (SHA-256 "
    )
    again = tmp_path / "again"
    again.mkdir()
    done = stage(live_server, run, token, again)
    assert done.returncode != 0
    assert "reviews@1 file shards/0.jsonl: the server answered 409" in done.stderr
    assert s3_store.object_keys() == []


def test_deleting_an_in_place_version_leaves_its_folder_as_it_was(
    world: Any, prefixes: Path, tmp_path: Path, django_capture_on_commit_callbacks: Any
) -> None:
    registered(world, django_capture_on_commit_callbacks)
    raw = raw_folder(prefixes)
    before = snapshot(raw)
    admin = world.api_client_for("workspace_admin")
    assert admin.delete(f"{API}/reviews/versions/1/").status_code == 204
    assert not AssetVersion.objects.for_workspace(world.alpha).exists()
    assert snapshot(raw) == before

    # One a run read stays as a record; the files stay where they are, and the page says so.
    registered_again = world.api_client_for("researcher").post(
        f"{API}/reviews/versions/", {"source": "prefix", "prefix": "raw/2026-11"}, format="json"
    )
    assert registered_again.status_code == 201
    version = AssetVersion.objects.for_workspace(world.alpha).get()
    tasks.ingest_prefix(version.pk, "raw/2026-11")
    version.refresh_from_db()
    set_alias(version, "train")
    make_run(world, spec=READS)
    kept = admin.delete(f"{API}/reviews/versions/{version.number}/")
    assert kept.status_code == 200
    assert (kept.json()["state"], kept.json()["in_place"]) == ("deleted", True)
    assert snapshot(raw) == before
    assert files_in(tmp_path / "store") == []
    page = world.client_for("viewer").get(f"/w/alpha/datasets/reviews/versions/{version.number}/")
    assert "they were left where they are" in page.content.decode()


def test_another_workspaces_folder_is_not_read_by_a_prefix_changed_after_registration(
    world: Any, prefixes: Path, tmp_path: Path, django_capture_on_commit_callbacks: Any
) -> None:
    """raw/2026-11 replaced by a symlink to beta's folder after registration: nothing of
    beta's is read — not by verify, a download, a run's staging nor the blob endpoint."""
    version = registered(world, django_capture_on_commit_callbacks)
    run = make_run(world, spec=READS)
    raw = raw_folder(prefixes)
    # beta holds the very same bytes: a read must still not reach them.
    for path, content in RAW.items():
        (prefixes / "beta" / path).parent.mkdir(parents=True, exist_ok=True)
        (prefixes / "beta" / path).write_bytes(content)
    shutil.rmtree(raw)
    raw.symlink_to(prefixes / "beta")
    api = world.api_client_for("researcher")

    assert api.post(f"{API}/reviews/versions/1/verify/").json()["problems"] == [
        "raw/2026-11: the prefix raw/2026-11 now leads out of the workspace's folder; the "
        "version's files were there"
    ]
    download = api.get(f"{API}/reviews/versions/1/download/")
    assert download.status_code == 409
    assert "leads out of the workspace's folder" in download.json()["detail"]
    with pytest.raises(staging.StagingFailed) as failed:
        staging.stage(staging_plan(run), tmp_path / "data")
    assert "now leads out of the workspace's folder" in str(failed.value)
    sha = version.files.get(path="README").sha256
    answer = api.get(f"/api/v1/workspaces/alpha/runs/{run.name}/data/blobs/{sha}/")
    assert answer.status_code == 409
    assert "leads out of the workspace's folder" in answer.json()["detail"]
    # A symlinked file inside the prefix is not followed either.
    os.unlink(raw)
    raw.mkdir()
    for path, content in RAW.items():
        (raw / path).parent.mkdir(parents=True, exist_ok=True)
        (raw / path).write_bytes(content)
    (raw / "README").unlink()
    (raw / "README").symlink_to(prefixes / "beta" / "README")
    assert api.post(f"{API}/reviews/versions/1/verify/").json()["problems"] == [
        "README: it (or a folder on its path) is a symlink or no longer what it was; only "
        "regular files are read"
    ]
    # And beta's members see nothing of alpha's version.
    outsider = world.api_client_for("outsider")
    assert outsider.get(f"{API}/reviews/versions/1/").status_code == 404


@pytest.mark.parametrize("symlink", [False, True])
def test_a_registration_the_sweep_failed_meanwhile_keeps_the_sweeps_word(
    world: Any, prefixes: Path, django_capture_on_commit_callbacks: Any, symlink: bool
) -> None:
    """A worker taken for dead (its version failed by the sweep) that then finishes, well or
    not, changes nothing: never ready after failed, never failed twice."""
    if symlink:
        (raw_folder(prefixes) / "leak.txt").symlink_to(prefixes / "beta" / "secret.txt")
    response, _ = register(
        world, {"source": "prefix", "prefix": "raw/2026-11"}, django_capture_on_commit_callbacks
    )
    assert response.status_code == 201
    version = AssetVersion.objects.for_workspace(world.alpha).select_related("asset").get()
    AssetVersion.objects.for_workspace(world.alpha).filter(pk=version.pk).update(
        state="failed", error="Its ingest stopped (swept)."
    )
    prefixes_module.read(version, "raw/2026-11")  # the late worker, with what it had loaded
    version.refresh_from_db()
    assert (version.state, version.error) == ("failed", "Its ingest stopped (swept).")
    assert not version.files.exists()


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
    raw = raw_folder(prefixes)
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
    assert "in place at the prefix raw/2026-11 (checked on each read)" in done.stdout
    assert files_in(tmp_path / "store") == []  # registered in place: nothing copied
    refused = tau("data", "dataset", "register", "reviews", "../beta")
    assert refused.returncode != 0
