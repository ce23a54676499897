"""Evidence export of a run with a 1 GiB log, through the real endpoint (gunicorn, one sync
worker, on the test PostgreSQL): how much the worker's peak memory grows while it streams
the tar (it must stay flat: a few MiB), and how fast the export goes compared with
``sha256sum`` over the same log (the client hashes what it receives, as ``tau evidence pull``
would; target at least 80 %). Sealing's time (hashing the log for the manifest) is reported
too.

The worker's peak is its ``VmHWM`` (the kernel's high-water mark of resident memory), read
after a small warm-up export and again after the large one: the difference is what the large
export cost, however briefly.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import django_test_database, report, sized

LOG_BYTES = sized(1 << 30, 4 << 20)
CHUNK = 1 << 20


def write_log(path: Path) -> None:
    """LOG_BYTES (1 GiB) of incompressible bytes (a repeated random MiB: hashing costs the
    same)."""
    block = os.urandom(CHUNK)
    with path.open("wb") as handle:
        for _ in range(LOG_BYTES // CHUNK):
            handle.write(block)


def vm_hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM")


def worker_pid(master: int) -> int:
    for _ in range(100):
        children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.1)
    raise RuntimeError("gunicorn started no worker")


def download(url: str, token: str) -> tuple[int, float]:
    """Bytes received and seconds taken, hashing as they arrive."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    digest = hashlib.sha256()
    received = 0
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        assert response.status == 200
        while chunk := response.read(CHUNK):
            digest.update(chunk)
            received += len(chunk)
        assert received == int(response.headers["Content-Length"])
    return received, time.perf_counter() - start


def sha256sum_seconds(path: Path) -> float:
    start = time.perf_counter()
    subprocess.run(["sha256sum", str(path)], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    var_dir = Path(tempfile.mkdtemp(prefix="bench-evidence-"))
    os.environ["TAU_VAR_DIR"] = str(var_dir)
    try:
        with django_test_database():
            measure_export(var_dir)
    finally:
        shutil.rmtree(var_dir, ignore_errors=True)


def finished_run(workspace: Any, user: Any, log: Path | None, name: str) -> Any:
    from evidence import sealing
    from evidence.models import SealRequest
    from runs import submission
    from runs.models import RunAttempt, RunState
    from runs.state import transition

    bundle = io.BytesIO()
    with zipfile.ZipFile(bundle, "w") as archive:
        archive.writestr("main.py", "print('hello')\n")
    bundle.seek(0)
    spec = (
        f"schema_version: 1\nname: {name}\nrun:\n  entrypoint: main.py\n  workload_kind: job\n"
        "compute:\n  cpus: 1\n  memory: 256Mi\n"
    ).encode()
    run = submission.submit(workspace=workspace, user=user, spec_source=spec, bundle=bundle)
    for state in (RunState.QUEUED, RunState.ADMITTED, RunState.RUNNING):
        transition(run, state)
    if log is not None:
        RunAttempt.objects.unscoped().filter(run=run).update(
            log_path=str(log), log_size=log.stat().st_size
        )
    transition(run, RunState.SUCCEEDED)
    sealing.seal(SealRequest.objects.unscoped().get(run=run).pk)
    return run


def measure_export(var_dir: Path) -> None:
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection

    from identity.tokens import issue_token
    from workspaces.models import Membership, Workspace

    settings.VAR_DIR = var_dir
    settings.TAU_EVIDENCE_GENERATED_KEY_PATH = var_dir / "evidence_signing_key.pem"
    user = get_user_model().objects.create_user(username="bench")
    workspace = Workspace.unscoped_objects.create(
        slug="bench", name="Bench", namespace="tau-bench", local_queue="bench"
    )
    Membership.objects.create(workspace=workspace, user=user, role="viewer")
    token = issue_token(user=user, name="bench").plaintext
    log = var_dir / "big.log"
    write_log(log)
    small = finished_run(workspace, user, None, "small")
    start = time.perf_counter()
    big = finished_run(workspace, user, log, "big")
    seal_seconds = time.perf_counter() - start

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "TAU_SECRET_KEY": settings.SECRET_KEY,
        "TAU_TOKEN_PEPPERS": settings.TAU_TOKEN_PEPPERS,
        "TAU_VAR_DIR": str(var_dir),
    }
    gunicorn = str(Path(sys.executable).parent / "gunicorn")
    command = [gunicorn, "portal.wsgi:application", "--bind", f"127.0.0.1:{port}"]
    command += ["--workers", "1", "--timeout", "600", "--log-level", "warning"]
    server = subprocess.Popen(
        command,
        cwd=Path(__file__).resolve().parents[1],
        env=env,
        start_new_session=True,
    )
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        worker = worker_pid(server.pid)
        base = f"http://127.0.0.1:{port}/api/v1/workspaces/bench/runs"
        download(f"{base}/{small.name}/evidence/", token)
        before = vm_hwm_kib(worker)
        sha256sum_seconds(log)  # the log in the page cache for both measurements
        received, export_seconds = download(f"{base}/{big.name}/evidence/", token)
        after = vm_hwm_kib(worker)
        reference = min(sha256sum_seconds(log) for _ in range(3))
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    mib = 1 << 20
    report(
        "evidence_export",
        {
            "log_bytes": LOG_BYTES,
            "export_bytes": received,
            "seal_seconds": round(seal_seconds, 2),
            "export_seconds": round(export_seconds, 2),
            "export_mib_per_s": round(received / mib / export_seconds, 1),
            "sha256sum_seconds": round(reference, 2),
            "sha256sum_mib_per_s": round(LOG_BYTES / mib / reference, 1),
            "export_vs_sha256sum": round((received / export_seconds) / (LOG_BYTES / reference), 3),
            "worker_peak_rss_growth_mib": round((after - before) / 1024, 2),
            "worker_peak_rss_mib": round(after / 1024, 1),
        },
    )


if __name__ == "__main__":
    main()
