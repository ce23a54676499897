#!/usr/bin/env python3
"""A real Ray head on loopback: the test cluster's (``controlplane.py up --ray``, as ``make
cluster-up``, starts one through deploy/cluster/ray_submitter.py), whose dashboard KubeRay's
operator polls for every RayJob, and that tests/executors/kubernetes/test_kube_rayjob_ray.py
uses. Standard library only.

    python deploy/dev/ray_head.py install        # what deploy/dev/test_tools.py (make test) runs
    python deploy/dev/ray_head.py start DIR      # prints the head as JSON; DIR holds its log
    python deploy/dev/ray_head.py stop DIR

**Install.** ``ray[default,serve,tune]`` (the dashboard and its job API need ``default``;
the sweeps' Ray Tune driver, ``tau.ray_tune``, needs ``tune``; an endpoint's Ray Serve
application, ``serve``, which KubeRay deploys through the dashboard's Serve API), pinned at
:data:`RAY_VERSION`, goes into its own virtual environment outside the repository,
``~/.cache/taugrid/ray-<version>-<extras>/`` (``TAUGRID_CACHE_DIR`` moves the cache, as for
the control plane's binaries), made with the interpreter that runs this script. Ray's pins
must not meet the project's own constraints, hence a venv of its own. A lock keeps two
callers from installing at once; the ``installed.json`` marker is written last, so a broken
install is redone. About 40 s and 450 MB when cold.

**Start.** ``ray start --head --block`` in its own session, one CPU, a small object store,
usage stats off, every port chosen here (free ports on 127.0.0.1; Ray's defaults, 6379 for
the GCS, 10001 for the client server, 44217/44227 for two metrics servers, would collide with
other heads and with test services), its temporary directory short (Ray's Unix socket paths
must fit in 107 bytes) and private. Everything listens on loopback only, which takes two
settings, both checked with ``ss -ltnp``:

* ``--node-ip-address 127.0.0.1``: Ray's C++ servers (GCS, raylet, agents) bind 127.0.0.1 only
  when the node address is exactly that, and 0.0.0.0 otherwise;
* ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``: on Linux ``ray start`` (and every Ray process that
  connects to the GCS, the dashboard agent included) replaces a loopback node address by the
  machine's outward address; with this variable Ray keeps 127.0.0.1, as it does on a laptop
  (the variable only otherwise forbids *worker* nodes joining, which a single head never does).

The dashboard alone listens elsewhere: on a loopback address of its own, ``127.x.y.z:8265``.
KubeRay dials a RayJob's dashboard as ``<head-svc>.<namespace>.svc.cluster.local:8265`` (the
head Service's ``dashboard`` port, 8265 unless the pod template says otherwise), so the port is
fixed; a random address of 127.0.0.0/8 (checked free) lets several heads (several sessions)
coexist. deploy/cluster/ray_submitter.py maps each RayJob's head Service name to that address
in the operator's hosts file (deploy/cluster/README.md, "The KubeRay operator's hosts file").

Before it returns, :func:`start_head` runs one trivial job through the job API and waits for
``SUCCEEDED``: that proves the whole path (dashboard, job agent, raylet, a worker) and pays
the first job's start-up (several seconds) up front, so tests see Ray answer quickly.

**Stop.** SIGTERM to ``ray start --block``, which stops its processes; whatever is left of its
process group, or names its temporary directory, is killed; the directory is removed. Never
``ray stop``: it stops every Ray on the machine, other sessions' too.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: Ray from PyPI, pinned; changing it changes the cache directory (a new venv).
RAY_VERSION = "2.60.0"
#: The extras installed; part of the cached venv's marker, so a venv without one is redone.
RAY_EXTRAS = "default,serve,tune"
#: The port of the head Service's ``dashboard`` port that KubeRay dials (its default).
DASHBOARD_PORT = 8265
START_TIMEOUT_SECONDS = 120
STATE_FILE = "ray-head.json"
TERMINAL_STATUSES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})

# Ray's ports besides the dashboard's, each given a free port on 127.0.0.1.
_PORT_OPTIONS = (
    "--port",  # the GCS
    "--node-manager-port",
    "--object-manager-port",
    "--ray-client-server-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--runtime-env-agent-port",
    "--metrics-export-port",
)
# Two metrics servers whose ports only environment variables set.
_PORT_VARIABLES = ("AUTOSCALER_METRIC_PORT", "DASHBOARD_METRIC_PORT")


class RayHeadError(RuntimeError):
    """Ray could not be installed or started; the message says why, with its log's end."""


def log(message: str) -> None:
    print(f"[ray-head] {message}", file=sys.stderr, flush=True)


# -- install ----------------------------------------------------------------------------------


def cache_dir() -> Path:
    return Path(os.environ.get("TAUGRID_CACHE_DIR", Path.home() / ".cache" / "taugrid"))


def venv_dir(version: str = RAY_VERSION) -> Path:
    # The extras in the name: a checkout that wants others gets a venv of its own instead of
    # redoing one that another checkout's cluster may be running a head from.
    return cache_dir() / f"ray-{version}-{RAY_EXTRAS.replace(',', '-')}"


def ray_executable(version: str = RAY_VERSION) -> Path:
    return venv_dir(version) / "bin" / "ray"


def is_installed(version: str = RAY_VERSION) -> bool:
    marker = venv_dir(version) / "installed.json"
    try:
        recorded = json.loads(marker.read_text())
        return bool(recorded.get("ray") == version and recorded.get("extras") == RAY_EXTRAS)
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_ray(version: str = RAY_VERSION) -> Path:
    """Install ``ray[RAY_EXTRAS]==version`` into its cached venv unless it is there; returns the
    ``ray`` executable."""
    target = venv_dir(version)
    if is_installed(version):
        return ray_executable(version)
    with _locked(cache_dir() / f".ray-{version}.lock"):
        if is_installed(version):
            return ray_executable(version)
        log(f"installing ray[{RAY_EXTRAS}]=={version} into {target} (once; about a minute)")
        shutil.rmtree(target, ignore_errors=True)
        started = time.monotonic()
        subprocess.run(  # noqa: S603 - this interpreter, fixed arguments
            [sys.executable, "-m", "venv", str(target)], check=True
        )
        subprocess.run(  # noqa: S603 - the venv's own pip, a pinned requirement
            [
                str(target / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                f"ray[{RAY_EXTRAS}]=={version}",
            ],
            check=True,
        )
        (target / "installed.json").write_text(
            json.dumps(
                {
                    "ray": version,
                    "extras": RAY_EXTRAS,
                    "seconds": round(time.monotonic() - started, 1),
                }
            )
            + "\n"
        )
        log(f"ray {version} installed in {time.monotonic() - started:.0f}s")
    return ray_executable(version)


# -- start and stop ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RayHead:
    """A running head: ``dashboard_host`` is the loopback address its dashboard listens on
    (port :data:`DASHBOARD_PORT`); ``pid`` is ``ray start --block``'s, the leader of its own
    process group; ``temp_dir`` is Ray's session directory root, ``log`` its output."""

    dashboard_host: str
    pid: int
    temp_dir: str
    log: str
    version: str = RAY_VERSION

    @property
    def dashboard_url(self) -> str:
        return f"http://{self.dashboard_host}:{DASHBOARD_PORT}"


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_dashboard_host(attempts: int = 50) -> str:
    """A random loopback address (not 127.0.0.x) whose port 8265 is free."""
    chooser = random.SystemRandom()
    for _ in range(attempts):
        host = f"127.{chooser.randint(16, 250)}.{chooser.randint(0, 255)}.{chooser.randint(2, 254)}"
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, DASHBOARD_PORT))
            except OSError:
                continue
        return host
    raise RayHeadError(f"no loopback address with port {DASHBOARD_PORT} free")


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def request_json(
    url: str, body: dict[str, Any] | None = None, timeout: float = 10
) -> tuple[int, Any]:
    """GET (or POST ``body``) and decode the JSON answer: (status, body or text)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(  # noqa: S310 - a loopback http URL we built
        url, data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            text = response.read().decode()
            status = int(response.status)
    except urllib.error.HTTPError as error:
        text = error.read().decode(errors="replace")
        status = int(error.code)
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def submit_job(head: RayHead, entrypoint: str, submission_id: str) -> None:
    """``POST /api/jobs/`` — what ``ray job submit --submission-id ID -- ENTRYPOINT`` sends."""
    status, answer = request_json(
        f"{head.dashboard_url}/api/jobs/",
        {"entrypoint": entrypoint, "submission_id": submission_id},
        timeout=60,
    )
    if status != 200:
        raise RayHeadError(f"Ray refused job {submission_id!r} ({status}): {answer}")


def job_info(head: RayHead, submission_id: str) -> dict[str, Any] | None:
    """``GET /api/jobs/<id>`` — what KubeRay's dashboard client asks; None for 404."""
    status, answer = request_json(f"{head.dashboard_url}/api/jobs/{submission_id}")
    if status == 404:
        return None
    if status != 200 or not isinstance(answer, dict):
        raise RayHeadError(f"GET /api/jobs/{submission_id}: {status} {answer}")
    return answer


def finished_job(head: RayHead, submission_id: str) -> dict[str, Any] | None:
    """The job's info once it has ended (SUCCEEDED, FAILED or STOPPED), else None."""
    info = job_info(head, submission_id)
    return info if info is not None and info.get("status") in TERMINAL_STATUSES else None


def start_serve(head: RayHead, port: int, timeout: float = START_TIMEOUT_SECONDS) -> None:
    """Start Ray Serve on the head with its HTTP proxy on ``127.0.0.1:port``, through a job
    that ends once it is up (Serve's controller outlives it). A Serve config deployed later
    through the dashboard (``PUT /api/serve/applications/``, what KubeRay sends for a
    RayService) starts Serve on 0.0.0.0:8000 when none runs; one that runs keeps its address
    (Ray Serve warns that the config's differs, and keeps it)."""
    python = venv_dir(head.version) / "bin" / "python"
    code = (
        "from ray import serve; "
        f"serve.start(http_options={{'host': '127.0.0.1', 'port': {int(port)}}})"
    )
    submission = f"taugrid-serve-start-{os.getpid()}-{int(time.time() * 1000)}"
    submit_job(head, subprocess.list2cmdline([str(python), "-c", code]), submission)
    deadline = time.monotonic() + timeout
    while (info := finished_job(head, submission)) is None:
        if time.monotonic() > deadline:
            raise RayHeadError(f"Ray Serve did not start within {timeout:.0f}s on {head}")
        time.sleep(0.5)
    if info["status"] != "SUCCEEDED":
        logs = request_json(f"{head.dashboard_url}/api/jobs/{submission}/logs")[1]
        raise RayHeadError(f"Ray Serve did not start ({info['status']}): {logs}")


def _wait_for(
    what: str, probe: Callable[[], Any], process: subprocess.Popen[bytes], log_file: Path
) -> Any:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while True:
        if process.poll() is not None:
            raise RayHeadError(
                f"ray start exited with code {process.returncode} before {what}; "
                f"the end of {log_file}:\n{_tail(log_file)}"
            )
        with contextlib.suppress(OSError, RayHeadError):
            result = probe()
            if result:
                return result
        if time.monotonic() > deadline:
            raise RayHeadError(
                f"timed out after {START_TIMEOUT_SECONDS}s waiting for {what}; "
                f"the end of {log_file}:\n{_tail(log_file)}"
            )
        time.sleep(0.3)


def start_head(
    work_dir: Path,
    version: str = RAY_VERSION,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> RayHead:
    """Start a head (installing Ray first if needed), wait until a job runs on it, and record
    it in ``work_dir/ray-head.json``. ``env`` is added to its environment and ``cwd`` is its
    working directory (its workers' too): what a Ray pod's container sets, for a head that
    stands in for one (an endpoint's, whose Ray Serve application imports the project)."""
    ray = ensure_ray(version)
    work_dir.mkdir(parents=True, exist_ok=True)
    log_file = work_dir / "ray-head.log"
    # Short: Ray puts Unix sockets under it, and their paths must fit in 107 bytes.
    temp_dir = tempfile.mkdtemp(prefix="tg-ray-", dir="/tmp")
    host = free_dashboard_host()
    ports = free_ports(len(_PORT_OPTIONS) + len(_PORT_VARIABLES))
    port_args = [f"{option}={port}" for option, port in zip(_PORT_OPTIONS, ports, strict=False)]
    environment = {**os.environ, **(env or {})}
    environment.update(zip(_PORT_VARIABLES, map(str, ports[len(_PORT_OPTIONS) :]), strict=True))
    environment.update(
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",  # keep 127.0.0.1 as the node address
        RAY_USAGE_STATS_ENABLED="0",
        RAY_DISABLE_DOCKER_CPU_WARNING="1",
        # Ray turns token authentication on by itself when ~/.ray/auth_token exists (any
        # `ray.init` on this machine writes one), and KubeRay's operator, which stands for a
        # cluster's pods here, calls the dashboard without a token: off, whatever the home
        # folder holds (the dashboard listens on a loopback address of its own).
        RAY_AUTH_MODE="disabled",
    )
    command = [
        str(ray),
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        *port_args,
        "--min-worker-port=0",  # workers take random ports (on 127.0.0.1)
        "--max-worker-port=0",
        "--include-dashboard=true",
        f"--dashboard-host={host}",
        f"--dashboard-port={DASHBOARD_PORT}",
        "--num-cpus=1",
        "--num-gpus=0",
        f"--object-store-memory={100 * 2**20}",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
        "--log-style=record",
    ]
    with log_file.open("ab") as out:
        out.write(f"$ {' '.join(command)}\n".encode())
        out.flush()
        process = subprocess.Popen(  # noqa: S603 - the pinned ray, arguments made here
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=environment,
            cwd=cwd,
            start_new_session=True,
        )
    head = RayHead(dashboard_host=host, pid=process.pid, temp_dir=temp_dir, log=str(log_file))
    (work_dir / STATE_FILE).write_text(json.dumps(asdict(head)) + "\n")
    try:
        started = time.monotonic()
        _wait_for(
            f"the dashboard on {head.dashboard_url}",
            lambda: request_json(f"{head.dashboard_url}/api/version", timeout=2)[0] == 200,
            process,
            log_file,
        )
        warm_up = f"taugrid-warm-up-{os.getpid()}-{int(time.time())}"
        submit_job(head, "true", warm_up)
        info = _wait_for(
            "the warm-up job `true` to finish",
            lambda: finished_job(head, warm_up),
            process,
            log_file,
        )
        if info["status"] != "SUCCEEDED":
            raise RayHeadError(f"the warm-up job `true` ended {info['status']}: {info}")
        log(f"ray {version} head up in {time.monotonic() - started:.1f}s, {head.dashboard_url}")
    except BaseException:
        stop_head(head)
        raise
    return head


def pids_naming(marker: str) -> list[int]:
    """The processes whose command line contains ``marker`` (a head's temporary directory:
    every process of that head names it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in cmdline:
                found.append(int(entry.name))
    return found


def stop_head(head: RayHead, timeout: float = 20) -> None:
    """Stop this head's processes (only these) and remove its temporary directory."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(head.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and pids_naming(head.temp_dir):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(head.pid, os.WNOHANG)
        time.sleep(0.3)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(head.pid, signal.SIGKILL)
    for pid in pids_naming(head.temp_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(head.pid, os.WNOHANG)
    shutil.rmtree(head.temp_dir, ignore_errors=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["install"]:
        ensure_ray()
        return 0
    if len(argv) == 2 and argv[0] == "start":
        print(json.dumps(asdict(start_head(Path(argv[1])))))
        return 0
    if len(argv) == 2 and argv[0] == "stop":
        state = Path(argv[1]) / STATE_FILE
        stop_head(RayHead(**json.loads(state.read_text())))
        state.unlink()
        return 0
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
