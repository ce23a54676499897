"""A RayJob's Ray cluster on the local executor (issue 32): which runs get one, what it is
told, and ``tau.ray_cluster`` itself, run for real with the pinned Ray of
deploy/dev/ray_head.py (installed by make test's test tools): a head and worker nodes on
loopback, the driver started with ``RAY_ADDRESS``, a lost node failing the attempt, a stop
reaching everything. The examples that train on it: test_agent_ray_examples.py (Ray Train) and
test_agent_examples.py (Ray Tune)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from executors.local.agent import processes
from executors.local.agent.prepare import ray_cluster_options, runs_on_ray
from tau import ray_cluster
from tau.spec import load_spec
from tests.scripts import load_script

REPO = Path(__file__).resolve().parents[3]
ray_head = load_script(REPO / "deploy" / "dev" / "ray_head.py", "taugrid_ray_head")


def rayjob(pip: str, *, kind: str = "rayjob", compute: str = "cpus: 1\n  memory: 2Gi") -> Any:
    return load_spec(
        f"schema_version: 1\nname: r\nrun:\n  entrypoint: python main.py\n"
        f"  workload_kind: {kind}\ncompute:\n  workers: 2\n  {compute}\n"
        f"runtime:\n  image: rayproject/ray:2.60.0-py311\n  pip: {pip}\n".encode()
    )


@pytest.mark.parametrize(
    ("pip", "expected"),
    [
        (["ray==2.60.0"], True),
        (["torch==2.5.1", "ray[default,train]==2.60.0"], True),
        (["Ray >= 2.40"], True),
        (["ray ; python_version >= '3.10'"], True),
        (["Ray_Tune==1"], False),  # ray-tune, as PyPI reads the name
        (["ray-tune==0.1"], False),  # another project
        (["rayon"], False),
        (["torch==2.5.1"], False),
        ([], False),
    ],
)
def test_a_requirement_is_ray_by_its_project_name(pip: list[str], expected: bool) -> None:
    assert rayjob(json.dumps(pip)).runtime.installs("ray") is expected


def test_only_a_rayjob_that_installs_ray_gets_a_cluster() -> None:
    assert runs_on_ray(rayjob('["ray[train]==2.60.0"]'))
    assert not runs_on_ray(rayjob("[numpy==2.1.3]"))  # its entry point runs as one process
    assert not runs_on_ray(rayjob('["ray==2.60.0"]', kind="job"))  # a Job's workers are pods


def test_each_worker_node_has_one_workers_compute() -> None:
    spec = rayjob('["ray==2.60.0"]', compute="cpus: 500m\n  memory: 3Gi\n  gpus: 1")
    assert ray_cluster_options(spec) == [
        *("--workers", "2", "--cpus", "0.5"),
        *("--memory", str(3 * 2**30), "--gpus", "1"),
    ]


def test_the_attempts_gpus_are_cut_into_one_slice_per_worker_node() -> None:
    assert ray_cluster.gpu_slices("4,5,6,7", 2, 2) == ["4,5", "6,7"]
    assert ray_cluster.gpu_slices(None, 3, 1) == ["0", "1", "2"]
    assert ray_cluster.gpu_slices("0,1", 2, 0) == [None, None]


def test_the_driver_command_is_required() -> None:
    with pytest.raises(SystemExit):
        ray_cluster.parse_args(["--workers", "2", "--cpus", "1", "--memory", "1"])
    parsed = ray_cluster.parse_args(
        ["--workers", "2", "--cpus", "1", "--memory", "1", "--", "python", "-m", "x", "--y"]
    )
    assert parsed.command == ["python", "-m", "x", "--y"]


def test_every_node_gets_ports_of_its_own() -> None:
    head, workers = ray_cluster.node_ports(3)
    ports = [*head.values(), *(port for node in workers for port in node.values())]
    assert len(ports) == len(set(ports)) == 2 + 3 * 4
    assert set(head) == {*ray_cluster.HEAD_PORTS, *ray_cluster.NODE_PORTS}


# --- for real ---------------------------------------------------------------------------------

DRIVER = textwrap.dedent(
    """
    import os, sys, time
    import ray

    ray.init()
    alive = [node for node in ray.nodes() if node["Alive"]]
    cpus = sorted(node["Resources"].get("CPU", 0) for node in alive)
    print(f"driver: {len(alive)} nodes, CPUs {cpus}, at {os.environ['RAY_ADDRESS']}", flush=True)

    @ray.remote(num_cpus=1)
    def where():
        return ray.get_runtime_context().get_node_id()

    print(f"driver: tasks ran on {len(set(ray.get([where.remote() for _ in range(6)])))} nodes",
          flush=True)
    if sys.argv[1:] == ["wait"]:
        time.sleep(300)
    """
)


def start(
    tmp_path: Path, workers: int, *driver_args: str
) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """tau.ray_cluster with ``workers`` worker nodes and DRIVER, in Ray's pinned venv; every
    process it starts carries a marker of this test's."""
    python = ray_head.ensure_ray().parent / "python"
    (tmp_path / "driver.py").write_text(DRIVER)
    marker = {"TAU_TEST_RAY_CLUSTER": uuid.uuid4().hex}
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "PYTHONPATH": str(REPO),  # the SDK, as the agent puts it on the path
        **marker,
    }
    process = subprocess.Popen(
        [
            str(python),
            "-m",
            "tau.ray_cluster",
            *("--workers", str(workers), "--cpus", "1", "--memory", str(2**30)),
            "--",
            str(python),
            "driver.py",
            *driver_args,
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return process, marker


def read_until(process: subprocess.Popen[str], wanted: str, seen: list[str]) -> None:
    assert process.stdout is not None
    deadline = time.monotonic() + 180
    for line in process.stdout:
        seen.append(line)
        if wanted in line:
            return
        assert time.monotonic() < deadline, "".join(seen[-40:])
    pytest.fail(f"ended before {wanted!r}:\n" + "".join(seen[-40:]))


def descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, command name) of every living process below ``pid``, from /proc."""
    parents: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] not in {"Z", "X"}:
            parents[int(entry.name)] = (int(fields[1]), name)
    family, found = {pid}, []
    changed = True
    while changed:
        changed = False
        for child, (parent, name) in parents.items():
            if parent in family and child not in family:
                family.add(child)
                found.append((child, name))
                changed = True
    return found


def wait_ended(process: subprocess.Popen[str], seen: list[str]) -> int:
    assert process.stdout is not None
    seen.extend(process.stdout)
    return process.wait(timeout=60)


def stop_everything(process: subprocess.Popen[str], marker: dict[str, str]) -> None:
    """After a failed test: the launcher and whatever it started (the agent would kill the
    attempt's process group and cgroup)."""
    if process.poll() is None:
        process.kill()
        process.wait()
    for pid in processes.marked_processes(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_head_and_two_worker_nodes_run_the_driver_and_a_lost_node_fails_it(
    tmp_path: Path,
) -> None:
    process, marker = start(tmp_path, 2, "wait")
    seen: list[str] = []
    try:
        read_until(process, "driver: tasks ran on", seen)
        output = "".join(seen)
        assert "[ray-cluster] 2 worker nodes (1 CPU, 0 GPU, 1.0 GiB each) and the head are up" in (
            output
        )
        # The head runs no tasks; each worker node has one worker's CPU; the tasks spread.
        assert "driver: 3 nodes, CPUs [0, 1.0, 1.0], at 127.0.0.1:" in output
        assert "driver: tasks ran on 2 nodes" in output
        # Nothing of it listens beyond loopback.
        family = {pid for pid, _ in descendants(process.pid)}
        listening = subprocess.run(
            ["ss", "-Hltnp"], capture_output=True, text=True, check=True
        ).stdout.splitlines()
        ours = [line for line in listening if any(f"pid={pid}," in line for pid in family)]
        assert ours  # the GCS, raylets, agents…
        addresses = {line.split()[3].rsplit(":", 1)[0] for line in ours}
        assert addresses <= {"127.0.0.1", "[::ffff:127.0.0.1]"}, ours

        # A worker node's raylet dies (a pod lost): the driver is stopped, the attempt fails.
        raylets = [pid for pid, name in descendants(process.pid) if name == "raylet"]
        assert len(raylets) == 3  # the head's and two workers'
        os.kill(max(raylets), signal.SIGKILL)  # the last started: a worker node's
        code = wait_ended(process, seen)
    finally:
        stop_everything(process, marker)
    output = "".join(seen)
    assert code == 1, output[-3000:]
    assert "lost its raylet" in output
    assert "the attempt fails; stopping the driver" in output
    deadline = time.monotonic() + 30
    while processes.marked_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes.marked_processes(marker) == []


@pytest.mark.slow
def test_a_stop_ends_the_driver_and_every_node(tmp_path: Path) -> None:
    process, marker = start(tmp_path, 1, "wait")
    seen: list[str] = []
    try:
        read_until(process, "driver: tasks ran on", seen)
        assert len(processes.marked_processes(marker)) > 3  # driver, GCS, raylets, workers…
        process.send_signal(signal.SIGTERM)  # what a cancel or a deadline sends the group
        code = wait_ended(process, seen)
    finally:
        stop_everything(process, marker)
    output = "".join(seen)
    assert code == 128 + signal.SIGTERM, output[-3000:]
    assert "[ray-cluster] stopped (SIGTERM); stopping the driver and the cluster" in output
    deadline = time.monotonic() + 30
    while processes.marked_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes.marked_processes(marker) == []


WITHOUT_RAY = ("--workers", "1", "--cpus", "1", "--memory", "1", "--", "true")


def test_without_ray_it_says_what_to_add(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tau.ray_cluster", *WITHOUT_RAY],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)},
        check=False,
    )
    assert result.returncode == 2
    assert "this run's Python has no Ray: add it to runtime.pip" in result.stdout
