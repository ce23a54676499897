"""Versions a dead process left on the way (issue 33): an ingest killed halfway is failed by
the sweep saying how far it got, never made ready; an upload whose checker died is checked
again; an upload nobody finishes is abandoned with its pieces; live ones are left alone."""

from __future__ import annotations

import hashlib
import io
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from catalog import storage
from catalog.ingest import asset_named
from catalog.models import AssetVersion
from catalog.sweep import sweep_versions
from catalog.uploads import receive, start_upload
from tests.runs.processes import ROOT, session_database_url

MIB = 2**20


@pytest.fixture(autouse=True)
def store(settings: Any, tmp_path: Path) -> Path:
    settings.TAU_STORAGE_URL = f"file://{tmp_path / 'store'}"
    return tmp_path / "store"


def declared(files: dict[str, bytes]) -> list[dict[str, Any]]:
    return [
        {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        for path, data in files.items()
    ]


def later(seconds: float) -> Any:
    return timezone.now() + timedelta(seconds=seconds)


@pytest.mark.django_db
def test_an_upload_whose_checker_died_is_checked_again_and_made_ready(world: Any) -> None:
    files = {"a.txt": b"alpha\n", "b.txt": b"beta\n"}
    version, _ = start_upload(asset_named(world.alpha, "dataset", "wiki"), declared(files))
    for path, data in files.items():
        receive(version, path, io.BytesIO(data), length=len(data))
    version.refresh_from_db()
    assert version.state == "ready"
    # As if the process died between keeping the last file and checking the version.
    AssetVersion.objects.unscoped().filter(pk=version.pk).update(
        state="verifying", manifest_digest="", files_count=0
    )
    assert sweep_versions(now=later(10)) == {"checked_again": 0, "abandoned": 0, "failed": 0}
    assert (
        sweep_versions(now=later(django_settings.TAU_DATA_STALE_SECONDS + 1))["checked_again"] == 1
    )
    version.refresh_from_db()
    assert (version.state, version.files_count) == ("ready", 2)
    assert version.manifest_digest == version.declared_digest


@pytest.mark.django_db
def test_an_upload_nobody_finishes_is_abandoned_with_its_pieces(world: Any, store: Path) -> None:
    data = b"x" * 1000
    version, _ = start_upload(
        asset_named(world.alpha, "dataset", "wiki"), declared({"big.bin": data})
    )
    receive(version, "big.bin", io.BytesIO(data[:400]), length=400, start=0, total=1000)
    pieces = store / "workspaces" / str(world.alpha.pk) / "uploads" / str(version.pk)
    assert pieces.exists()
    assert sweep_versions(now=later(3600))["abandoned"] == 0  # only quiet, not abandoned
    counts = sweep_versions(now=later(django_settings.TAU_DATA_UPLOAD_ABANDON_SECONDS + 1))
    assert counts["abandoned"] == 1
    version.refresh_from_db()
    assert version.state == "failed"
    assert version.error.startswith("The upload was abandoned: no piece arrived for 3 days")
    assert "(400 of 1,000 bytes had)" in version.error
    assert not pieces.exists()


@pytest.mark.django_db(transaction=True)
def test_an_ingest_killed_halfway_is_failed_by_the_sweep_and_never_ready(
    world: Any, tmp_path: Path, store: Path
) -> None:
    folder = tmp_path / "big"
    folder.mkdir()
    for n in range(128):
        (folder / f"part-{n:02}.bin").write_bytes(bytes([n]) * MIB)
    asset = asset_named(world.alpha, "dataset", "wiki")
    script = (
        "import django; django.setup()\n"
        "from catalog.ingest import ingest_folder\n"
        "from catalog.models import Asset\n"
        f"asset = Asset.objects.unscoped().get(pk={asset.pk})\n"
        f"ingest_folder(asset, __import__('pathlib').Path({str(folder)!r}), source='prefix')\n"
    )
    env = {
        **{k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")},
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "DATABASE_URL": session_database_url(),
        "TAU_STORAGE_URL": str(django_settings.TAU_STORAGE_URL),
        "TAU_SECRET_KEY": str(django_settings.SECRET_KEY),
    }
    process = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env)
    versions = AssetVersion.objects.for_workspace(world.alpha)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        # Listed, so copying: each file is copied, hashed and synced to disk, 128 of them.
        if versions.filter(bytes_total__gt=0).exists():
            break
        assert process.poll() is None, "the ingest ended before it could be killed"
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)
    killed = versions.get()
    assert killed.state == "ingesting"
    assert killed.bytes_done < killed.bytes_total == 128 * MIB
    assert sweep_versions(now=later(10))["failed"] == 0  # it may still be alive
    assert sweep_versions(now=later(django_settings.TAU_DATA_STALE_SECONDS + 5))["failed"] == 1
    killed.refresh_from_db()
    assert killed.state == "failed"
    assert killed.error.startswith("Its ingest stopped (the process making it ended) after ")
    assert killed.manifest_digest == ""
    assert not killed.files.exists()
    # The blobs it wrote are its content, nothing else: any that exist are whole.
    for blob in (store / "workspaces" / str(world.alpha.pk) / "blobs").rglob("*"):
        if blob.is_file() and len(blob.name) == 64:  # not a .checked mark, not incoming
            assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name
    assert storage.root() == store


def test_an_ingest_has_the_time_its_data_takes_and_the_sweep_watches_it() -> None:
    """A URL's or a prefix's ingest runs past the 5 minutes every other task gets (a 50 GB
    download would be killed halfway and failed by the sweep): a day, while a hung one is
    the sweep's, by its progress (the test above)."""
    from catalog.tasks import INGEST_TIME_LIMIT_SECONDS, ingest_prefix, ingest_url

    for task in (ingest_url, ingest_prefix):
        assert task.time_limit == INGEST_TIME_LIMIT_SECONDS >= 24 * 3600
        assert task.soft_time_limit is not None
        assert django_settings.CELERY_TASK_TIME_LIMIT < task.soft_time_limit < task.time_limit
    assert django_settings.TAU_DATA_STALE_SECONDS < 3600
