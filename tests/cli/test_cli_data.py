"""``tau data dataset`` against a live portal (issue 33): an ingest killed halfway and run
again ends ``ready`` with exactly ``sha256sum``'s view of the folder, sending nothing twice; a
changed byte in the portal's store or in a local copy is named by ``verify``; aliases, show
and list as a script reads them."""

from __future__ import annotations

import hashlib
import io
import json
import signal
import subprocess
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from catalog import storage
from catalog.models import AssetVersion
from runs.artifacts import store_artifact
from runs.models import MetricPoint, RunState
from tau.cli import data as cli_data
from tau.cli.client import CliError
from tau.cli.data import FolderDeclaration, read_folder
from tau.manifest import read_listed, scan
from tests.cli.test_cli_members import TAU, as_user
from tests.runs.factories import TINY_SPEC, make_run

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

MIB = 2**20


def corpus(root: Path) -> Path:
    """24 files of 1 MiB in nested folders, a small one with a space in its name, an empty
    one: about 24 MiB, different bytes in each file."""
    for n in range(24):
        seed = hashlib.sha256(f"shard {n}".encode()).digest()
        path = root / f"shards/{n % 3}/part-{n:03}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes((seed * (MIB // len(seed)))[:MIB])
    (root / "README for people.txt").write_text("a corpus for the test\n")
    (root / "empty").write_bytes(b"")
    return root


def sha256sum_lines(folder: Path) -> str:
    paths = sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())
    done = subprocess.run(
        ["sha256sum", "--", *paths], cwd=folder, capture_output=True, text=True, check=True
    )
    return done.stdout


def test_an_ingest_killed_halfway_goes_on_and_ends_as_sha256sum_sees_the_folder(
    world: Any, live_server: Any, tmp_path: Path, settings: Any
) -> None:
    settings.TAU_STORAGE_URL = f"file://{tmp_path / 'store'}"
    folder = corpus(tmp_path / "wiki")
    total = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
    tau = as_user(world, "researcher", live_server, tmp_path / "home")

    first = subprocess.Popen(
        [str(TAU), "data", "dataset", "ingest", "wiki", str(folder), "--piece-size", "65536"],
        env=tau.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    versions = AssetVersion.objects.for_workspace(world.alpha)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        sent = versions.filter(number=1).values_list("bytes_done", flat=True).first()
        if sent is not None and sent >= 2 * MIB:
            break
        assert first.poll() is None, first.communicate()
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    halfway = versions.get(number=1)
    assert halfway.state == AssetVersion.State.INGESTING
    assert 2 * MIB <= halfway.bytes_done < total

    again = tau("data", "dataset", "ingest", "wiki", str(folder), "--piece-size", "65536")
    assert again.returncode == 0, again.stderr + again.stdout
    assert "Going on with wiki@1:" in again.stdout
    assert "wiki@1: ready, 26 files, 24.0 MiB" in again.stdout
    ready = versions.get(number=1)
    assert versions.count() == 1
    assert ready.manifest_digest == scan(folder).digest
    assert f"manifest {ready.manifest_digest}" in again.stdout

    # What the portal recorded is, line for line, what sha256sum says of the folder.
    assert tau.json("data", "dataset", "show", "wiki@1")["files_count"] == 26
    listed = (
        world.client_for("researcher")
        .get("/api/v1/workspaces/alpha/datasets/wiki/versions/1/files/?limit=1000")
        .json()["results"]
    )
    lines = "".join(f"{row['sha256']}  {row['path']}\n" for row in listed)
    assert lines == sha256sum_lines(folder)

    # Nothing was sent twice: the store holds each file once, and no piece is left over.
    store = Path(settings.TAU_STORAGE_URL.removeprefix("file://"))
    blobs = (store / "workspaces" / str(world.alpha.pk) / "blobs").rglob("*")
    assert len([blob for blob in blobs if blob.is_file() and len(blob.name) == 64]) == 26
    assert not (store / "workspaces" / str(world.alpha.pk) / "uploads" / str(ready.pk)).exists()


def test_verify_names_a_changed_byte_in_the_store_or_in_a_local_copy(
    world: Any, live_server: Any, tmp_path: Path, settings: Any
) -> None:
    settings.TAU_STORAGE_URL = f"file://{tmp_path / 'store'}"
    folder = tmp_path / "raw"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("alpha\n")
    (folder / "sub" / "b.txt").write_text("beta\n")
    tau = as_user(world, "researcher", live_server, tmp_path / "home")
    made = tau("data", "dataset", "ingest", "raw", str(folder), "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["state"] == "ready"

    assert tau("data", "dataset", "verify", "raw@1").returncode == 0
    local = tau("data", "dataset", "verify", "raw", "--local", str(folder))
    assert (local.returncode, local.stdout.strip()) == (0, f"{folder} holds exactly raw@latest.")

    blob = storage.blob_path(world.alpha.pk, hashlib.sha256(b"beta\n").hexdigest())
    blob.write_bytes(b"Beta\n")
    found = tau("data", "dataset", "verify", "raw@1")
    assert found.returncode == 1
    assert found.stdout == "sub/b.txt: the stored copy differs from the manifest (SHA-256)\n"

    (folder / "a.txt").write_text("ALPHA\n")
    (folder / "extra").write_text("?\n")
    changed = tau("data", "dataset", "verify", "raw@1", "--local", str(folder), "--json")
    assert changed.returncode == 1
    assert json.loads(changed.stdout) == {
        "ok": False,
        "problems": ["a.txt: its content differs (SHA-256)", "extra: not in the manifest"],
    }


def test_aliases_list_and_show_as_a_script_reads_them(
    world: Any, live_server: Any, tmp_path: Path, settings: Any
) -> None:
    settings.TAU_STORAGE_URL = f"file://{tmp_path / 'store'}"
    tau = as_user(world, "researcher", live_server, tmp_path / "home")
    for number in (1, 2):
        folder = tmp_path / f"v{number}"
        folder.mkdir()
        (folder / "weights.bin").write_bytes(bytes([number]) * 100)
        assert tau("data", "model", "ingest", "tiny", str(folder)).returncode == 0
    assert tau.json("data", "model", "alias", "set", "tiny", "production", "1") == {
        "alias": "production",
        "version": 1,
    }
    got = tau("data", "model", "alias", "get", "tiny", "production")
    assert got.stdout == "tiny@production is tiny@1.\n"
    listed = tau.json("data", "model", "list")
    assert [(row["name"], row["latest"], row["aliases"]) for row in listed] == [
        ("tiny", 2, {"production": 1})
    ]
    versions = tau.json("data", "model", "show", "tiny")
    assert [row["number"] for row in versions] == [2, 1]
    missing = tau("data", "model", "show", "tiny@9")
    assert missing.returncode == 4
    assert "tiny has no version '9'" in missing.stderr
    bad = tau("data", "model", "alias", "set", "tiny", "latest", "1")
    assert bad.returncode == 2
    assert "kept by the catalog" in bad.stderr
    assert tau("data", "model", "alias", "rm", "tiny", "production").returncode == 0
    assert tau("data", "model", "alias", "get", "tiny", "production").returncode == 4
    refused = tau("data", "model", "rm", "tiny", "--yes")
    assert refused.returncode == 3  # a researcher may not delete a whole model
    admin = as_user(world, "workspace_admin", live_server, tmp_path / "admin")
    assert admin("data", "model", "rm", "tiny", "--yes").returncode == 0
    assert tau.json("data", "model", "list") == []


def test_a_model_registered_from_runs_is_picked_by_best_and_pulled_checked(
    world: Any, live_server: Any, tmp_path: Path, settings: Any
) -> None:
    settings.TAU_STORAGE_URL = f"file://{tmp_path / 'store'}"
    tau = as_user(world, "researcher", live_server, tmp_path / "home")
    names = []
    for loss in (0.4, 0.2):
        run = make_run(
            world,
            spec=TINY_SPEC + b"outputs:\n  artifacts: [model/**]\n",
            state=RunState.SUCCEEDED,
        )
        for path, data in (("model/w.bin", str(loss).encode() * 100), ("model/cfg/a.json", b"{}")):
            store_artifact(run=run, attempt=1, name=path, source=io.BytesIO(data))
        MetricPoint.objects.create(run=run, attempt=1, key="val_loss", step=5, value=loss)
        made = tau.json("data", "model", "register", "tiny", "--run", run.name, "--path", "model")
        assert (made["state"], made["produced_by"]) == ("ready", run.name)
        names.append(run.name)
    best = tau("data", "model", "best", "tiny", "--metric", "val_loss")
    assert best.stdout == "tiny@2: val_loss 0.2\n"
    assert (
        tau.json("data", "model", "best", "tiny", "--metric", "val_loss", "--mode", "max")["ref"]
        == "tiny@1"
    )

    target = tmp_path / "pulled"
    pulled = tau("data", "model", "pull", "tiny@2", "-o", str(target))
    assert pulled.returncode == 0, pulled.stderr
    assert "Wrote tiny@2 to" in pulled.stdout
    assert (target / "w.bin").read_bytes() == b"0.2" * 100
    assert (target / "cfg" / "a.json").read_bytes() == b"{}"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".pulled")) == []
    again = tau("data", "model", "pull", "tiny@2", "-o", str(target))
    assert again.returncode == 2
    assert "exists; use --force" in again.stderr
    assert tau("data", "model", "pull", "tiny@1", "-o", str(target), "--force").returncode == 0
    assert (target / "w.bin").read_bytes() == b"0.4" * 100
    assert tau("data", "model", "verify", "tiny@1", "--local", str(target)).returncode == 0


def test_rm_deletes_one_versions_files_keeping_the_manifest_a_run_names(
    world: Any, live_server: Any, tmp_path: Path, settings: Any
) -> None:
    settings.TAU_STORAGE_URL = f"file://{tmp_path / 'store'}"
    folder = tmp_path / "wiki"
    folder.mkdir()
    (folder / "a.txt").write_text("a\n")
    researcher = as_user(world, "researcher", live_server, tmp_path / "rob")
    assert researcher("data", "dataset", "ingest", "wiki", str(folder)).returncode == 0
    assert researcher("data", "dataset", "ingest", "wiki", str(folder)).returncode == 0
    make_run(world, spec=TINY_SPEC + b"inputs:\n  datasets:\n    - {name: wiki, version: '1'}\n")
    admin = as_user(world, "workspace_admin", live_server, tmp_path / "alice")

    kept = admin("data", "dataset", "rm", "wiki@1", "--yes")
    assert kept.returncode == 0, kept.stderr
    assert "Deleted the files of wiki@1; its manifest stays, because a run's record" in kept.stdout
    gone = admin("data", "dataset", "rm", "wiki@2", "--yes")
    assert (gone.returncode, gone.stdout.strip()) == (0, "Deleted wiki@2.")
    assert [v.state for v in AssetVersion.objects.for_workspace(world.alpha)] == ["deleted"]
    refused = researcher("data", "dataset", "rm", "wiki@1", "--yes")
    assert refused.returncode != 0


# --- Reading a folder and declaring it (tau.cli.data) ------------------------------------------


def many_files(root: Path, count: int, per_folder: int = 1000) -> Path:
    for n in range(count):
        path = root / f"part-{n // per_folder:04}" / f"{n % per_folder:04}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * (n % 3))
    return root


def read(folder: Path) -> tuple[FolderDeclaration, bytes]:
    with tempfile.TemporaryFile() as lines:
        declaration = read_folder(folder, lines, quiet=True)
        length, chunks = declaration.body()
        body = b"".join(chunks)
    assert len(body) == length
    return declaration, body


def test_a_folder_is_declared_as_the_portal_reads_it_in_the_memory_of_a_few_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The declaration is the folder's manifest, a line a file, with scan()'s digest;
    reading ten times the files takes no more memory (Python's, at its peak), and a second
    read of an unchanged folder reads no file again."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    small, large = many_files(tmp_path / "small", 1000), many_files(tmp_path / "large", 10_000)
    (large / "a!x").write_text("sorts before part-…/ and after a folder named a\n")

    def peak(folder: Path) -> int:
        with tempfile.TemporaryFile() as lines:
            tracemalloc.start()
            try:
                read_folder(folder, lines, quiet=True)
                return tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()

    # Holding the files (as scan() does) takes about 800 bytes a file: 8 MB more here. What
    # is left is the interpreter's own tables, growing now and then by a fixed step.
    peak(small)  # once first: what any first read sets up
    assert peak(large) - peak(small) < 1.5 * 2**20

    declaration, body = read(large)
    expected = scan(large)
    assert (declaration.files_count, declaration.total_bytes, declaration.digest) == (
        expected.files_count,
        expected.total_bytes,
        expected.digest,
    )
    first, *rest = body.decode().splitlines()
    assert json.loads(first) == {"source": "upload", "files_count": 10_001}
    assert [json.loads(line) for line in rest] == expected.as_dict()["files"]

    def no_reading(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("read again")

    monkeypatch.setattr(cli_data, "read_listed", no_reading)
    assert read(large)[0].digest == expected.digest


def test_a_scan_cut_short_goes_on_where_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = many_files(tmp_path / "wiki", 30, per_folder=10)
    reading = read_listed
    read_paths: list[str] = []

    def interrupted_at_the_eleventh(item: Any, on_bytes: Any = None) -> Any:
        if len(read_paths) == 10:
            raise KeyboardInterrupt
        read_paths.append(item.path)
        return reading(item, on_bytes)

    monkeypatch.setattr(cli_data, "read_listed", interrupted_at_the_eleventh)
    with pytest.raises(KeyboardInterrupt):
        read(folder)

    def counted(item: Any, on_bytes: Any = None) -> Any:
        read_paths.append(item.path)
        return reading(item, on_bytes)

    monkeypatch.setattr(cli_data, "read_listed", counted)
    (folder / "part-0000" / "0003.txt").write_bytes(b"changed since")
    read_paths.clear()
    assert read(folder)[0].digest == scan(folder).digest
    assert read_paths == [
        "part-0000/0003.txt",
        *(f"part-0001/{n:04}.txt" for n in range(10)),
        *(f"part-0002/{n:04}.txt" for n in range(10)),
    ]

    # Killed (nothing folded): the digests written so far are still found by the next scan.
    cache = cli_data._cache_file(folder)
    cache.replace(cache.with_suffix(".part"))
    read_paths.clear()
    assert read(folder)[0].digest == scan(folder).digest
    assert read_paths == []
    assert not cache.with_suffix(".part").exists()


def test_the_files_the_portal_lacks_are_asked_a_page_at_a_time_from_the_first() -> None:
    """Each page asked from the first (those sent drop out); a file sent whole that the
    portal still lists is said, not sent forever."""
    lacking = [f"f{n:05}" for n in range(2500)]

    class Portal:
        def get(self, path: str, **params: Any) -> dict[str, Any]:
            assert "offset" not in params
            return {"results": [{"path": p} for p in lacking[: params["limit"]]]}

    sent = []
    for row in cli_data._missing_files(Portal(), "/v/"):  # type: ignore[arg-type]
        sent.append(row["path"])
        lacking.remove(row["path"])
    assert sent == [f"f{n:05}" for n in range(2500)]

    lacking = ["stuck", "other"]

    def send_all_but_stuck() -> None:
        for row in cli_data._missing_files(Portal(), "/v/"):  # type: ignore[arg-type]
            if row["path"] != "stuck":
                lacking.remove(row["path"])

    with pytest.raises(CliError, match="stuck was sent whole, but the portal still lacks it"):
        send_all_but_stuck()
