"""Staging a cluster run's datasets (issue 33): the stager the init container runs
(``executors.kubernetes.render.STAGE_SCRIPT``), run for real against the portal's own listing and
blob endpoints (``GET …/runs/{run}/data/``, ``…/data/blobs/{sha256}/``) with the attempt's run
token, as the pod does. It lays out every pinned file read-only under its folder, checks each
SHA-256 before the file gets its name, names the version and the file when the store's bytes
are not the manifest's, and tells the portal what it staged (the run page shows it). The token
reaches its own run's files only."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from catalog import storage
from catalog.ingest import asset_named, ingest_folder, set_alias
from catalog.models import AssetVersion
from executors.kubernetes.render import STAGE_SCRIPT
from runs.models import EventKind, RunAttempt, RunEvent
from runs.run_tokens import issue_run_token
from tests.runs.factories import TINY_SPEC, make_run

pytestmark = pytest.mark.django_db(transaction=True)

READS = (
    TINY_SPEC
    + b"""inputs:
  datasets:
    - {name: wiki, version: train, path: corpus/wiki}
"""
)


def wiki(world: Any, tmp_path: Path) -> AssetVersion:
    folder = tmp_path / "raw"
    (folder / "part").mkdir(parents=True)
    (folder / "part" / "a.txt").write_text("The Quick Brown Fox\n")
    (folder / "b.txt").write_text("Jumps Over\n")
    (folder / "same-as-b.txt").write_text("Jumps Over\n")  # one blob, two files
    (folder / "blank.bin").write_bytes(b"")
    version = ingest_folder(asset_named(world.alpha, "dataset", "wiki"), folder, source="upload")
    set_alias(version, "train")
    return version


def body(response: Any) -> bytes:
    """A streamed answer's bytes."""
    return b"".join(response.streaming_content)


def token_for(run: Any) -> str:
    attempt = RunAttempt.objects.for_workspace(run.workspace_id).get(run=run, number=1)
    token = issue_run_token(run=run, attempt=attempt, max_runtime_seconds=None)
    assert token is not None
    return token


def stage(
    live_server: Any, run: Any, token: str, root: Path, limit: int = 10**6
) -> subprocess.CompletedProcess[str]:
    base = f"{live_server.url}/api/v1/workspaces/alpha/runs/{run.name}/"
    return subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            STAGE_SCRIPT,
            f"{base}data/",
            str(root),
            str(limit),
            f"{base}report/data-staged/",
        ],
        env={"TAU_RUN_TOKEN": token, "PATH": os.environ.get("PATH", "")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_stager_lays_out_every_pinned_file_read_only_checked_and_reports_it(
    world: Any, live_server: Any, tmp_path: Path
) -> None:
    version = wiki(world, tmp_path)
    run = make_run(world, spec=READS)
    root = tmp_path / "volume"
    root.mkdir()

    done = stage(live_server, run, token_for(run), root)

    assert done.returncode == 0, done.stderr
    assert "tau-stage-data: 4 files, 42 bytes verified" in done.stdout
    staged = root / "corpus" / "wiki"
    found = {
        str(path.relative_to(staged)): path.read_bytes()
        for path in staged.rglob("*")
        if path.is_file()
    }
    assert found == {
        "part/a.txt": b"The Quick Brown Fox\n",
        "b.txt": b"Jumps Over\n",
        "same-as-b.txt": b"Jumps Over\n",
        "blank.bin": b"",
    }
    for path in staged.rglob("*"):
        assert path.stat().st_mode & 0o222 == 0, path  # files and folders read-only
    # A blob kept twice in the version is downloaded once and linked.
    assert (staged / "b.txt").stat().st_ino == (staged / "same-as-b.txt").stat().st_ino
    assert sorted(os.listdir(root)) == ["corpus"]  # no listing, no partial file left
    for name, content in found.items():
        assert version.files.get(path=name).sha256 == hashlib.sha256(content).hexdigest()

    (event,) = RunEvent.objects.for_workspace(world.alpha).filter(
        run=run, kind=EventKind.DATA_STAGED
    )
    assert event.data["attempt"] == 1
    assert (event.data["files"], event.data["bytes"]) == (4, 42)
    # The run page says it, beside what the run read.
    page = world.client_for("viewer").get(f"/w/alpha/runs/{run.name}/")
    assert "Attempt 1 staged 4 files, 42\xa0bytes in" in page.content.decode()


def test_a_stored_file_that_is_not_its_manifest_fails_the_staging_naming_it(
    world: Any, live_server: Any, tmp_path: Path
) -> None:
    version = wiki(world, tmp_path)
    run = make_run(world, spec=READS)
    sha = version.files.get(path="part/a.txt").sha256
    blob = storage.blob_path(world.alpha.pk, sha)
    blob.chmod(0o644)
    blob.write_bytes(b"The Quick Brown Cat\n")  # same size, other bytes
    root = tmp_path / "volume"
    root.mkdir()

    done = stage(live_server, run, token_for(run), root)

    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("tau-stage-data: wiki@1 file part/a.txt: SHA-256 mismatch")
    assert sha in last
    assert not (root / "corpus" / "wiki" / "part" / "a.txt").exists()
    assert not RunEvent.objects.for_workspace(world.alpha).filter(
        run=run, kind=EventKind.DATA_STAGED
    )


def test_the_stager_refuses_more_bytes_than_its_volume_was_sized_for(
    world: Any, live_server: Any, tmp_path: Path
) -> None:
    wiki(world, tmp_path)
    run = make_run(world, spec=READS)
    root = tmp_path / "volume"
    root.mkdir()

    done = stage(live_server, run, token_for(run), root, limit=41)

    assert done.returncode != 0
    assert "the datasets hold 42 bytes, more than the 41 this volume was sized for" in (done.stderr)
    assert os.listdir(root) == [".tau-listing"]


def test_a_run_token_reaches_its_own_runs_files_only(
    world: Any, live_server: Any, tmp_path: Path
) -> None:
    version = wiki(world, tmp_path)
    run = make_run(world, spec=READS)
    other = make_run(world)  # reads nothing
    token = token_for(other)
    api = APIClient()
    sha = version.files.get(path="b.txt").sha256
    base = f"/api/v1/workspaces/alpha/runs/{run.name}/data/"

    # Another run's token: the run does not exist for it.
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert api.get(base).status_code == 404
    assert api.get(f"{base}blobs/{sha}/").status_code == 404
    # Its own: a file it does not read is not there.
    other_base = f"/api/v1/workspaces/alpha/runs/{other.name}/data/"
    assert api.get(f"{other_base}blobs/{sha}/").status_code == 404
    listing = body(api.get(other_base)).decode().splitlines()
    assert [json.loads(line) for line in listing] == [{"files": 0, "bytes": 0, "datasets": []}]
    # A member reads the run's listing and files.
    member = world.api_client_for("viewer")
    head, *files = body(member.get(base)).decode().splitlines()
    assert json.loads(head)["datasets"] == [
        {"ref": "wiki@1", "path": "corpus/wiki", "manifest_digest": version.manifest_digest}
    ]
    assert {json.loads(line)["path"] for line in files} == {
        "corpus/wiki/part/a.txt",
        "corpus/wiki/b.txt",
        "corpus/wiki/same-as-b.txt",
        "corpus/wiki/blank.bin",
    }
    blob = member.get(f"{base}blobs/{sha}/")
    assert (blob.status_code, body(blob)) == (200, b"Jumps Over\n")
    # The report is the run token's alone.
    assert member.post(
        f"/api/v1/workspaces/alpha/runs/{run.name}/report/data-staged/",
        {"files": 1, "bytes": 1, "seconds": 1},
        format="json",
    ).status_code in (403, 404)


def test_from_an_s3_store_the_stager_reads_presigned_urls_and_checks_every_byte(
    world: Any, live_server: Any, tmp_path: Path, s3_store: Any
) -> None:
    """With the data in S3 (the suite's SeaweedFS), the listing hands the pod presigned URLs
    it reads from the store directly (the portal passes no byte on), and a changed object is
    named just the same."""
    version = wiki(world, tmp_path)
    run = make_run(world, spec=READS)
    token = token_for(run)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    lines = body(api.get(f"/api/v1/workspaces/alpha/runs/{run.name}/data/")).splitlines()
    urls = [json.loads(line)["url"] for line in lines[1:]]
    assert len(urls) == 4
    assert all(url.startswith(s3_store.service.endpoint) for url in urls)
    assert all("X-Amz-Signature=" in url for url in urls)

    root = tmp_path / "volume"
    root.mkdir()
    done = stage(live_server, run, token, root)
    assert done.returncode == 0, done.stderr
    assert "X-Amz-Signature" not in done.stdout + done.stderr  # a credential while valid
    assert (root / "corpus" / "wiki" / "part" / "a.txt").read_bytes() == b"The Quick Brown Fox\n"

    sha = version.files.get(path="b.txt").sha256
    key = f"{s3_store.prefix}/workspaces/{world.alpha.pk}/blobs/{sha[:2]}/{sha}"
    s3_store.client.put_object(Bucket=s3_store.service.bucket, Key=key, Body=b"Jumps 0ver\n")
    again = tmp_path / "again"
    again.mkdir()
    failed = stage(live_server, run, token, again)
    assert failed.returncode != 0
    assert "tau-stage-data: wiki@1 file b.txt: SHA-256 mismatch" in failed.stderr
