"""The bundle fetcher the init container runs (``executors.kubernetes.render.FETCH_SCRIPT``), run
for real against a local HTTP server: it sends the run token, verifies the digest before unpacking,
retries only what is worth retrying, and never writes outside its directory."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from executors.kubernetes.render import FETCH_SCRIPT, MAX_BUNDLE_BYTES
from runs import workload_sdk

TOKEN = "tau_run_test.fetch-token"


@dataclass
class Portal:
    """A stand-in for the portal's bundle endpoint: answers ``statuses`` in turn, then 200."""

    body: bytes = b""
    statuses: list[int] = field(default_factory=list)
    seen: list[dict[str, str]] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def portal() -> Iterator[Portal]:
    state = Portal()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.seen.append({"path": self.path, **dict(self.headers)})
            status = state.statuses.pop(0) if state.statuses else 200
            self.send_response(status)
            self.send_header("Content-Length", str(len(state.body) if status == 200 else 0))
            self.end_headers()
            if status == 200:
                self.wfile.write(state.body)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_port}/api/v1/workspaces/alpha/runs/r/bundle/"
    yield state
    server.shutdown()
    server.server_close()


def zip_of(entries: dict[str, bytes], modes: dict[str, int] | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (modes or {}).get(name, stat.S_IFREG | 0o644) << 16
            archive.writestr(info, data)
    return buffer.getvalue()


def fetch(
    portal: Portal, root: Path, digest: str | None = None
) -> subprocess.CompletedProcess[str]:
    root.mkdir(exist_ok=True)
    digest = digest or hashlib.sha256(portal.body).hexdigest()
    command = [sys.executable, "-I", "-c", FETCH_SCRIPT, portal.url, digest, str(root)]
    return subprocess.run(
        [*command, str(MAX_BUNDLE_BYTES)],
        env={"TAU_RUN_TOKEN": TOKEN, "PATH": os.environ.get("PATH", "")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_verified_bundle_is_unpacked(portal: Portal, tmp_path: Path) -> None:
    portal.body = zip_of(
        {"train.py": b"print('hi')\n", "pkg/util.py": b"X = 1\n", "run.sh": b"#!/bin/sh\n"},
        modes={"run.sh": stat.S_IFREG | 0o755},
    )
    result = fetch(portal, tmp_path / "fetch")
    assert result.returncode == 0, result.stderr
    assert "verified" in result.stdout
    code = tmp_path / "fetch" / "code"
    assert (code / "train.py").read_bytes() == b"print('hi')\n"
    assert (code / "pkg" / "util.py").read_bytes() == b"X = 1\n"
    assert os.access(code / "run.sh", os.X_OK)
    assert sorted(p.name for p in (tmp_path / "fetch").iterdir()) == ["code"]  # zip removed
    assert portal.seen[0]["Authorization"] == f"Bearer {TOKEN}"
    assert portal.seen[0]["path"] == "/api/v1/workspaces/alpha/runs/r/bundle/"


def test_a_digest_mismatch_unpacks_nothing(portal: Portal, tmp_path: Path) -> None:
    portal.body = zip_of({"train.py": b"evil\n"})
    result = fetch(portal, tmp_path / "fetch", digest="0" * 64)
    assert result.returncode == 1
    assert "SHA-256 mismatch" in result.stderr
    assert not (tmp_path / "fetch" / "code").exists()


def test_a_refusal_is_final_and_a_server_error_is_retried(portal: Portal, tmp_path: Path) -> None:
    portal.statuses = [403]
    started = time.monotonic()
    refused = fetch(portal, tmp_path / "a")
    assert refused.returncode == 1
    assert "answered 403" in refused.stderr
    assert len(portal.seen) == 1  # no retry
    assert time.monotonic() - started < 10  # nor a wait for one

    portal.body = zip_of({"train.py": b"ok\n"})
    portal.statuses = [503]
    retried = fetch(portal, tmp_path / "b")
    assert retried.returncode == 0, retried.stderr
    assert "try 1 failed (503" in retried.stderr
    assert (tmp_path / "b" / "code" / "train.py").read_bytes() == b"ok\n"


def test_entries_that_escape_or_are_links_are_refused(portal: Portal, tmp_path: Path) -> None:
    outside = tmp_path / "escaped.txt"
    for entries, modes in [
        ({"../escaped.txt": b"x"}, None),
        ({str(outside): b"x"}, None),
        ({"link": b"/etc/passwd"}, {"link": stat.S_IFLNK | 0o777}),
    ]:
        portal.body = zip_of(entries, modes)
        root = tmp_path / f"fetch-{len(portal.seen)}"
        result = fetch(portal, root)
        assert result.returncode == 1, result.stdout
        assert "refusing bundle entry" in result.stderr
        assert not outside.exists()
        assert not (root / "code" / "link").exists()


def test_an_oversized_download_stops(portal: Portal, tmp_path: Path) -> None:
    portal.body = b"x" * 100
    root = tmp_path / "fetch"
    root.mkdir()
    result = subprocess.run(
        [sys.executable, "-I", "-c", FETCH_SCRIPT, portal.url, "0" * 64, str(root), "10"],
        env={"TAU_RUN_TOKEN": TOKEN},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "larger than 10 bytes" in result.stderr


def test_the_workload_sdk_is_written_next_to_the_code_and_imports(
    portal: Portal, tmp_path: Path
) -> None:
    """What a pod gets: the packed SDK from the fetcher's last argument, unpacked read-only
    beside the code, and ``import tau`` working from the code folder with it on the path —
    in an interpreter that knows nothing of TauGrid (``-I`` drops site-packages' influence
    and PYTHONPATH comes only from the pod's environment)."""
    program = b"import tau\nprint(tau.__file__, tau.resume_from(), callable(tau.log_metrics))\n"
    portal.body = zip_of({"train.py": program})
    root = tmp_path / "fetch"
    root.mkdir()
    digest = hashlib.sha256(portal.body).hexdigest()
    result = subprocess.run(
        [
            sys.executable,
            *("-I", "-c", FETCH_SCRIPT, portal.url, digest, str(root), str(MAX_BUNDLE_BYTES)),
            workload_sdk.packed(),
        ],
        env={"TAU_RUN_TOKEN": TOKEN, "PATH": os.environ.get("PATH", "")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "the workload SDK is in" in result.stdout
    sdk = root / "sdk"
    for name, content in workload_sdk.sources().items():
        written = sdk / name
        assert written.read_bytes() == content
        assert stat.S_IMODE(written.stat().st_mode) == 0o644
    assert stat.S_IMODE((sdk / "tau").stat().st_mode) == 0o755

    ran = subprocess.run(
        [sys.executable, "-S", "train.py"],  # -S: no site-packages, so not the checkout's tau
        cwd=root / "code",
        env={"PYTHONPATH": str(sdk), "PATH": os.environ.get("PATH", "")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == [str(sdk / "tau" / "__init__.py"), "None", "True"]
