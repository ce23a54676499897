"""A Ray cluster of the attempt's own on this machine: ``python -m tau.ray_cluster --workers N
--cpus C --memory BYTES [--gpus G] -- <the driver's command…>``.

The local executor starts this for a ``workload_kind: rayjob`` run whose ``runtime.pip``
installs Ray, so that the run meets the cluster it would meet on Kubernetes, where KubeRay
starts a head pod and ``compute.workers`` worker pods for it:

* a **head** that runs no tasks or actors (``num_cpus=0``, as the rendered RayJob's
  ``rayStartParams``), holding the GCS;
* **N worker nodes**, each a raylet of its own with one worker's ``compute`` as its resources
  (CPUs, GPUs, ``memory``), so ``ScalingConfig(num_workers=2)``, ``tune.with_resources`` and
  placement groups spread over them as they would over pods;
* the **driver** (the run's entry point, or ``tau.ray_tune`` around it for a sweep) started
  once every node is up, with ``RAY_ADDRESS`` naming the head, as ``ray job submit`` runs it
  on the head.

Everything listens on 127.0.0.1 only. Ray puts a node on the machine's outward address unless
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, and that setting makes ``ray start`` refuse to add
worker nodes; the nodes are therefore started through Ray's own one-machine cluster
(``ray.cluster_utils.Cluster``, the mini-cluster Ray's testing guide describes), which keeps
every node, and every server on it, on loopback. ``RAY_TMPDIR`` is a fresh short folder
(Ray's Unix sockets need short paths), so nothing is shared with another Ray on the machine,
the ``/tmp/ray`` of a ``ray start`` included.

The attempt ends with its driver: the exit code is the driver's. A node that dies first (its
raylet or GCS gone: a lost pod on a cluster) stops the driver and fails the attempt (code
1), whose retry resumes from the newest checkpoint. SIGTERM (a cancel, a deadline) stops the
driver, then the nodes. What happens is said in the log in lines that start with
``[ray-cluster]``.

Standard library only until the cluster starts: it runs in the run's own Python, next to the
SDK, and imports the run's Ray.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

POLL_SECONDS = 0.5
#: How long the nodes may take to come up (a cold machine with two cores: ~15 s).
START_TIMEOUT_SECONDS = 120.0
#: What a driver has to stop after SIGTERM before it is killed.
STOP_GRACE_SECONDS = 10.0
#: The object store of each node: small, as the workloads here pass little through it; Ray
#: takes it from /dev/shm, which the sandbox sizes with the run's memory.
OBJECT_STORE_BYTES = 96 * 1024 * 1024
#: Ray's setting that keeps every node on 127.0.0.1 (see the module's docstring).
LOOPBACK_SETTING = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def say(message: str) -> None:
    print(f"[ray-cluster] {message}", flush=True)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tau.ray_cluster")
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--cpus", type=float, required=True, help="CPUs of each worker node")
    parser.add_argument("--memory", type=int, required=True, help="bytes of each worker node")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs of each worker node")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    arguments = parser.parse_args(list(argv))
    if arguments.command[:1] == ["--"]:
        arguments.command = arguments.command[1:]
    if not arguments.command:
        parser.error("the driver's command is missing (after --)")
    if arguments.workers < 1:
        parser.error("--workers must be at least 1")
    return arguments


def free_ports(count: int) -> list[int]:
    """``count`` different ports free on 127.0.0.1, for the nodes started one after another.

    Taken between 20000 and the start of the kernel's ephemeral range
    (``net.ipv4.ip_local_port_range``, 32768 by default): a port the kernel may hand out, to
    another process's ``bind(0)`` or outgoing connection, can be taken between the choice and
    the server's own bind, which may come many seconds later on a busy machine (seen: a port
    gone in the seconds before a Ray node bound it). Ray's worker ports (10002-19999 by
    default) stay below. Each port is checked free by binding it, all held together while
    chosen; the kernel's own choice is the fallback when the range is too small.
    """
    chooser = random.SystemRandom()
    low = _ephemeral_low()
    candidates = list(range(_LISTEN_FLOOR, low)) if low - _LISTEN_FLOOR >= 1000 else []
    chooser.shuffle(candidates)
    sockets: list[socket.socket] = []
    try:
        for port in [*candidates, *[0] * count]:
            if len(sockets) == count:
                break
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            sockets.append(sock)
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


_LISTEN_FLOOR = 20000


def _ephemeral_low(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    """The first port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def gpu_slices(visible: str | None, workers: int, per_worker: int) -> list[str | None]:
    """Which of the attempt's GPUs each worker node sees (``CUDA_VISIBLE_DEVICES``): the
    attempt's devices cut into consecutive slices of ``per_worker``, as each pod of a cluster
    gets GPUs of its own. None for a node without GPUs."""
    if per_worker <= 0:
        return [None] * workers
    devices = [device for device in (visible or "").split(",") if device.strip()]
    if not devices:
        devices = [str(index) for index in range(workers * per_worker)]
    return [
        ",".join(devices[rank * per_worker : (rank + 1) * per_worker]) for rank in range(workers)
    ]


#: The ports a node would otherwise take a fixed default for (8265, 52365, …), and those of
#: the head alone; every one is given a free port on 127.0.0.1.
NODE_PORTS = ("dashboard_agent_listen_port", "metrics_export_port", "runtime_env_agent_port")
HEAD_PORTS = ("gcs_server_port", "dashboard_port")


def node_ports(workers: int) -> tuple[dict[str, int], list[dict[str, int]]]:
    """The head's ports and each worker node's, all different."""
    ports = iter(free_ports(len(HEAD_PORTS) + len(NODE_PORTS) * (workers + 1)))
    head = {name: next(ports) for name in (*HEAD_PORTS, *NODE_PORTS)}
    return head, [{name: next(ports) for name in NODE_PORTS} for _ in range(workers)]


def short_temp_root() -> str | None:
    """Where Ray's folder goes: ``/tmp`` (the sandbox's own), whose short path leaves room for
    Ray's Unix socket paths (at most 107 bytes, ~70 of them Ray's own), else ``TMPDIR``."""
    fixed = "/tmp"  # noqa: S108 - a folder made in it by mkdtemp (private, unique)
    return fixed if os.access(fixed, os.W_OK) else None


class Stopped(Exception):
    """SIGTERM or SIGINT arrived."""


def _stop_on_signal(signum: int, frame: Any) -> None:
    raise Stopped(signal.Signals(signum).name)


def stop_on_signals() -> None:
    signal.signal(signal.SIGTERM, _stop_on_signal)
    signal.signal(signal.SIGINT, _stop_on_signal)


def start_cluster(arguments: argparse.Namespace) -> Any:
    """The head and the worker nodes, up; returns Ray's ``Cluster``."""
    from ray.cluster_utils import Cluster  # type: ignore[import-not-found]

    started = time.monotonic()
    head_ports, worker_ports = node_ports(arguments.workers)
    cluster = Cluster(
        initialize_head=True,
        shutdown_at_exit=True,
        head_node_args={
            "num_cpus": 0,
            "num_gpus": 0,
            # With ray[default] (as Ray's images have it): the state API, which Ray Train's
            # controller and `ray list` ask, and the job API; without it, none (Ray decides).
            "include_dashboard": None,
            "dashboard_host": "127.0.0.1",
            "object_store_memory": OBJECT_STORE_BYTES,
            **head_ports,
        },
    )
    say(f"head up at {cluster.address} ({time.monotonic() - started:.1f}s)")
    slices = gpu_slices(os.environ.get("CUDA_VISIBLE_DEVICES"), arguments.workers, arguments.gpus)
    for rank, devices in enumerate(slices):
        cluster.add_node(
            num_cpus=arguments.cpus,
            num_gpus=arguments.gpus,
            memory=arguments.memory,
            object_store_memory=OBJECT_STORE_BYTES,
            env_vars={"CUDA_VISIBLE_DEVICES": devices} if devices is not None else None,
            wait=False,
            **worker_ports[rank],
        )
        say(f"worker {rank + 1} of {arguments.workers} started")
    # Each node set Ray's own SIGTERM handler (clean up, exit 1); ours says what happened and
    # stops the driver first.
    stop_on_signals()
    cluster.wait_for_nodes(timeout=START_TIMEOUT_SECONDS)
    say(
        f"{arguments.workers} worker node{'s' if arguments.workers != 1 else ''} "
        f"({arguments.cpus:g} CPU, {arguments.gpus} GPU, "
        f"{arguments.memory / 2**30:.1f} GiB each) and the head are up "
        f"({time.monotonic() - started:.1f}s)"
    )
    return cluster


def dead_node(cluster: Any) -> str | None:
    """What died first, said plainly, or None while every node's processes live."""
    nodes = [("the head", cluster.head_node)] + [
        (f"a worker node ({node.unique_id[:8]})", node) for node in cluster.worker_nodes
    ]
    for name, node in nodes:
        dead = node.dead_processes()
        if dead:
            kind, process = dead[0]
            return f"{name} lost its {kind} (exit code {process.returncode})"
    return None


def stop_driver(driver: subprocess.Popen[bytes]) -> None:
    if driver.poll() is not None:
        return
    driver.terminate()
    try:
        driver.wait(STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        driver.kill()
        driver.wait()


def run(arguments: argparse.Namespace, driver_tmpdir: str | None = None) -> int:
    cluster = None
    driver: subprocess.Popen[bytes] | None = None
    try:
        try:
            cluster = start_cluster(arguments)
        except Stopped:
            raise
        except Exception as exc:
            say(f"could not start the Ray cluster: {type(exc).__name__}: {exc}")
            return 1
        env = {**os.environ, "RAY_ADDRESS": cluster.address}
        if driver_tmpdir is not None:
            env["TMPDIR"] = driver_tmpdir
        driver = subprocess.Popen(list(arguments.command), env=env)  # noqa: S603 - the run's own
        while True:
            code = driver.poll()
            if code is not None:
                say(f"the driver exited with code {code}; stopping the cluster")
                return code
            lost = dead_node(cluster)
            if lost is not None:
                say(f"{lost}: the attempt fails; stopping the driver")
                stop_driver(driver)
                return 1
            time.sleep(POLL_SECONDS)
    except Stopped as why:
        say(f"stopped ({why}); stopping the driver and the cluster")
        if driver is not None:
            stop_driver(driver)
        return 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if cluster is not None:
            try:
                cluster.shutdown()
            except Exception as exc:
                say(f"stopping the cluster: {type(exc).__name__}: {exc}")


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parse_args(sys.argv[1:] if argv is None else argv)
    # Before Ray is imported: these are read once, at import.
    temp = Path(tempfile.mkdtemp(prefix="ray-", dir=short_temp_root()))
    driver_tmpdir = os.environ.get("TMPDIR")
    os.environ.update(
        {
            LOOPBACK_SETTING: "0",
            "RAY_TMPDIR": str(temp),
            # The nodes' own temporary files too: the dashboard's multiprocessing sockets.
            "TMPDIR": str(temp),
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_DISABLE_DOCKER_CPU_WARNING": "1",
        }
    )
    stop_on_signals()
    try:
        import ray  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        say(
            "this run's Python has no Ray: add it to runtime.pip "
            "(for example ray[train]==2.60.0) or run the entry point as a Job"
        )
        shutil.rmtree(temp, ignore_errors=True)
        return 2
    try:
        return run(arguments, driver_tmpdir)
    finally:
        shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
