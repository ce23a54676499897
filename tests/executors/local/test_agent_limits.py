"""The attacks of issue 30 on the local executor, from inside real sandboxed runs of a real
agent (``manage.py run_agent``) against the test PostgreSQL: nested namespaces and mounts, a
fork flood, a disk flood, a RAM-backed /tmp flood (each bounded in count and size), and links
from a run's folders to host paths. After each, the agent and the portal keep working."""

from __future__ import annotations

import json
import os
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from executors.local.agent import cgroups
from executors.local.agent.supervisor import attempt_markers
from runs.models import Artifact, Checkpoint, FailureClass, RunState
from tests.executors.local.agent_harness import (
    Agent,
    attempt_dir,
    attempts,
    host_pid,
    local_quota,
    spec,
    submit,
    wait_for_state,
    wait_until,
)

pytestmark = pytest.mark.django_db(transaction=True)

NO_RETRIES = """\
    resilience:
      max_retries: 0
    """


def finished(run: Any, agent: Agent, *, timeout: float = 90) -> tuple[Any, str]:
    """The run once it has ended, and the log of its only attempt."""
    wait_for_state(run, {RunState.SUCCEEDED, RunState.FAILED}, timeout=timeout, agent=agent)
    (attempt,) = attempts(run)
    return attempt, Path(attempt.log_path).read_text(errors="replace")


def still_serving(world: Any, agent: Agent) -> None:
    """The agent runs the next run as usual, and the portal answers."""
    assert agent.process is not None
    assert agent.process.poll() is None, agent.output()
    after = submit(world, spec("after"), {"main.py": "print('after ran')\n"})
    _, log = finished(after, agent)
    assert after.state == RunState.SUCCEEDED, log
    assert "after ran" in log
    assert Client().get("/readyz").status_code == 200


# --- nested namespaces and mounts ------------------------------------------------------------

ESCAPE = """\
    import ctypes, errno, json, os, subprocess, sys, threading
    libc = ctypes.CDLL(None, use_errno=True)
    seen = {}
    # The attack: a user namespace of its own (uid 0 there), then a mount over /usr.
    inside = "id -u; mount -t tmpfs none /usr && echo MOUNTED"
    attack = subprocess.run(["unshare", "-U", "-r", "-m", "sh", "-c", inside],
                            capture_output=True, text=True)
    seen["unshare -U -r -m"] = [attack.returncode, "MOUNTED" in attack.stdout]
    if hasattr(os, "unshare"):  # Python 3.12 and later
        try:
            os.unshare(os.CLONE_NEWUSER)
            seen["unshare(CLONE_NEWUSER)"] = "made"
        except OSError as exc:
            seen["unshare(CLONE_NEWUSER)"] = errno.errorcode[exc.errno]
    else:
        made = libc.unshare(0x10000000) == 0
        seen["unshare(CLONE_NEWUSER)"] = "made" if made else errno.errorcode[ctypes.get_errno()]
    mounted = libc.mount(b"none", os.environ["TMPDIR"].encode(), b"tmpfs", 0, None)
    seen["mount"] = "made" if mounted == 0 else errno.errorcode[ctypes.get_errno()]
    # An ordinary program still works: threads, a child process.
    results = []
    threads = [threading.Thread(target=lambda n=n: results.append(n * n)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seen["threads"] = sorted(results)
    seen["subprocess"] = subprocess.run([sys.executable, "-c", "print(6 * 7)"],
                                        capture_output=True, text=True).stdout.strip()
    print("SEEN " + json.dumps(seen), flush=True)
    """


def test_inside_a_run_user_namespaces_and_mounts_are_refused(world: Any, start_agent: Any) -> None:
    """Issue 30: with the portal as root, ``unshare -U -r -m`` in a run gave uid 0 and a
    mount over /usr. Now both are refused, and the run's program works as before."""
    local_quota(world.alpha)
    run = submit(world, spec("escape", extra=NO_RETRIES), {"main.py": ESCAPE})
    agent = start_agent()
    _, log = finished(run, agent)
    assert run.state == RunState.SUCCEEDED, log
    seen = json.loads(log.split("SEEN ", 1)[1].splitlines()[0])
    assert seen == {
        "unshare -U -r -m": [1, False],
        "unshare(CLONE_NEWUSER)": "EPERM",
        "mount": "EPERM",
        "threads": [n * n for n in range(8)],
        "subprocess": "42",
    }


# --- processes ------------------------------------------------------------------------------

FORK_FLOOD = """\
    import os
    read_end, write_end = os.pipe()
    children = 0
    for _ in range(400):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            os.close(write_end)
            os.read(read_end, 1)  # until the parent lets go
            os._exit(0)
        children += 1
    os.close(write_end)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            break
    print("FORKED", children, flush=True)
    """


def test_a_fork_flood_stops_at_the_run_s_process_limit(world: Any, start_agent: Any) -> None:
    """Issue 30: a run forked 400 children unchecked. Now it gets TAU_LOCAL_RUN_PROCESSES
    (processes and threads, the sandbox's own included); the agent reports how that holds."""
    local_quota(world.alpha)
    run = submit(world, spec("forks", extra=NO_RETRIES), {"main.py": FORK_FLOOD})
    agent = start_agent(TAU_LOCAL_RUN_PROCESSES="64")
    _, log = finished(run, agent)
    assert run.state == RunState.SUCCEEDED, log
    forked = int(log.split("FORKED ", 1)[1].split()[0])
    assert 32 < forked < 64, log
    limits = Client().get("/readyz").json()["local_executor"]["limits"]
    assert limits["processes"] == "64 per run (cgroup v1 pids, RLIMIT_NPROC)"  # this machine
    assert limits["memory"] == "each run's memory limit from its spec (cgroup v1 memory)"
    assert "limits per run: memory: each run's memory limit" in agent.output()
    still_serving(world, agent)


# --- disk -----------------------------------------------------------------------------------

DISK_FLOOD = """\
    import os, time
    # One file larger than the whole allowance: refused by the kernel (RLIMIT_FSIZE).
    try:
        with open("one-big-file", "wb") as big:
            big.write(b"x" * 40 * 2**20)
        print("ONE FILE WRITTEN", flush=True)
    except OSError as exc:
        print("ONE FILE REFUSED:", exc.strerror, flush=True)
    os.remove("one-big-file")
    # Many files, 40 MiB a second, up to 400 MiB: stopped by the agent's measurement.
    chunk = os.urandom(2**20)
    for number in range(400):
        with open(f"part-{number}", "wb") as part:
            part.write(chunk)
        if number % 2:
            time.sleep(0.05)
        if number % 16 == 15:
            print("wrote", number + 1, "MiB", flush=True)
    print("WROTE ALL", flush=True)
    """


def test_a_disk_flood_is_stopped_at_the_run_s_allowance(
    world: Any, var_dir: Path, start_agent: Any
) -> None:
    """Issue 30: a run wrote 300 MB into its work folder, on the filesystem of var/ and the
    database. Now one file cannot outgrow the allowance, and the run is stopped, saying how
    much it used where, when its folders outgrow it; it is not retried by default."""
    local_quota(world.alpha)
    run = submit(world, spec("fills-the-disk"), {"main.py": DISK_FLOOD})
    agent = start_agent(TAU_LOCAL_RUN_DISK="32Mi")
    attempt, log = finished(run, agent)
    assert "ONE FILE REFUSED: File too large" in log
    assert "WROTE ALL" not in log
    assert run.state == RunState.FAILED
    assert attempt.failure_class == FailureClass.USER_ERROR  # not in the default retry_on
    assert attempt.failure_message.startswith("Stopped: it used ")
    assert " of its 32 MiB disk allowance (work/ " in attempt.failure_message
    assert f"[taugrid] {attempt.failure_message}" in log
    work = attempt_dir(var_dir, run, 1) / "work"
    written = sum(path.stat().st_size for path in work.glob("part-*"))
    assert 32 * 2**20 < written < 400 * 2**20
    still_serving(world, agent)


# --- RAM-backed /tmp -----------------------------------------------------------------------

TMP_FLOOD = """\
    import os
    chunk = os.urandom(2**20)
    written = 0
    try:
        with open("/tmp/fill", "wb") as fill:
            for _ in range(256):
                fill.write(chunk)
                fill.flush()
                written += 1
                if written % 4 == 0:
                    print("in /tmp:", written, "MiB", flush=True)
    except OSError as exc:
        print("TMP FULL at", written, "MiB:", exc.strerror, flush=True)
        raise SystemExit(3)
    print("WROTE ALL", flush=True)
    """


def test_a_tmp_flood_is_bounded_by_and_charged_to_the_run_s_memory(
    world: Any, start_agent: Any
) -> None:
    """Issue 30: a run admitted with 512Mi filled its tmpfs /tmp with 1 GiB, charged to
    nobody. Now its /tmp counts against its own memory (64Mi here): it cannot hold more."""
    local_quota(world.alpha)
    run = submit(world, spec("fills-tmp", extra=NO_RETRIES), {"main.py": TMP_FLOOD})
    agent = start_agent()
    attempt, log = finished(run, agent)
    assert "WROTE ALL" not in log
    # Whole lines only: the kernel may stop it in the middle of one.
    held = [int(mib) for mib in re.findall(r"^in /tmp: (\d+) MiB$", log, re.MULTILINE)]
    assert max(held, default=0) <= 64
    assert run.state == RunState.FAILED
    if attempt.failure_class == FailureClass.OOM_KILLED:  # the cgroup's limit came first
        assert attempt.failure_message.startswith(
            "Used more than its 64 MiB of memory (its /tmp included), so the kernel stopped it"
        )
    else:  # the tmpfs's own size came first
        assert attempt.failure_class == FailureClass.USER_ERROR
        assert "TMP FULL at" in log
    still_serving(world, agent)


# --- cgroups come and go with attempts -------------------------------------------------------

WAITS = """\
    import os, time
    open(os.path.join(os.environ["TAU_OUTPUT_DIR"], "started"), "w").close()
    release = os.path.join(os.environ["TAU_CHECKPOINT_DIR"], "release")
    deadline = time.time() + 120
    while not os.path.exists(release) and time.time() < deadline:
        time.sleep(0.05)
    """


def test_a_run_s_cgroup_lives_as_long_as_its_attempt_even_across_an_agent_crash(
    world: Any, var_dir: Path, start_agent: Any
) -> None:
    local_quota(world.alpha)
    run = submit(world, spec("waits"), {"main.py": WAITS})
    agent = start_agent()
    wait_until(
        (attempt_dir(var_dir, run, 1) / "output" / "started").exists,
        timeout=60,
        what="the start",
        agent=agent,
    )
    # The agent is this process's child: its cgroups are below this process's own.
    found = cgroups.detect(var_dir)
    first = [hierarchy.base / f"run-{run.pk}-attempt-1" for hierarchy in found.hierarchies]
    assert first
    assert all(folder.is_dir() for folder in first)
    memory = next(
        folder
        for hierarchy, folder in zip(found.hierarchies, first, strict=True)
        if "memory" in hierarchy.controllers
    )
    assert (memory / "memory.limit_in_bytes").read_text().strip() == str(64 * 2**20)
    agent.kill()  # the workload goes on, in its cgroup
    assert all(folder.is_dir() for folder in first)
    agent = start_agent()
    # The restarted agent stops the orphan and removes its cgroup; the run starts again.
    wait_until(
        lambda: not any(folder.exists() for folder in first),
        timeout=60,
        what="the removal of the crashed agent's cgroup",
        agent=agent,
    )
    wait_until(
        (attempt_dir(var_dir, run, 2) / "output" / "started").exists,
        timeout=60,
        what="the second attempt",
        agent=agent,
    )
    second = [hierarchy.base / f"run-{run.pk}-attempt-2" for hierarchy in found.hierarchies]
    assert all(folder.is_dir() for folder in second)
    (var_dir / "runs" / str(run.pk) / "checkpoints" / "release").touch()
    wait_for_state(run, RunState.SUCCEEDED, timeout=60, agent=agent)
    assert not any(folder.exists() for folder in second)
    assert agent.stop() == 0
    assert not any(hierarchy.base.exists() for hierarchy in found.hierarchies)


# --- links to host paths --------------------------------------------------------------------

LINKS = """\
    import json, os
    targets = json.load(open("targets.json"))
    checkpoints, output = os.environ["TAU_CHECKPOINT_DIR"], os.environ["TAU_OUTPUT_DIR"]
    for name, target in targets["complete"].items():
        os.mkdir(os.path.join(checkpoints, name))
        os.symlink(target, os.path.join(checkpoints, name, "COMPLETE"))
    os.symlink(targets["folder"], os.path.join(checkpoints, "step-3"))
    os.symlink(targets["file"], os.path.join(checkpoints, "model-4.pt"))
    os.symlink(targets["file"], os.path.join(output, "model.bin"))
    os.symlink(targets["folder"], os.path.join(output, "host"))
    print("linked", flush=True)
    """


def test_links_from_a_run_s_folders_to_host_paths_reveal_nothing(
    world: Any, var_dir: Path, start_agent: Any
) -> None:
    """Issue 30: the agent (root) followed a checkpoint's ``COMPLETE`` link, so a run could
    learn whether any host path exists. Now no link out of the run's folders is followed:
    checkpoints, artifacts, nothing is recorded from them."""
    local_quota(world.alpha)
    secret = var_dir / "secret_key"
    secret.write_text("not for runs")
    host_checkpoint = var_dir / "host-checkpoint" / "step-9"
    host_checkpoint.mkdir(parents=True)
    (host_checkpoint / "COMPLETE").touch()
    (host_checkpoint / "model.bin").write_text("host's")
    targets = {
        "complete": {"step-1": str(secret), "step-2": str(var_dir / "missing")},
        "folder": str(host_checkpoint),
        "file": str(secret),
    }
    artifacts = """\
        outputs:
          artifacts: ["**/*.bin"]
        """
    run = submit(
        world,
        spec("links", extra=textwrap.dedent(NO_RETRIES) + textwrap.dedent(artifacts)),
        {"main.py": LINKS, "targets.json": json.dumps(targets)},
    )
    agent = start_agent()
    _, log = finished(run, agent)
    assert run.state == RunState.SUCCEEDED, log
    assert "linked" in log
    assert list(Checkpoint.objects.for_workspace(run.workspace_id).filter(run=run)) == []
    assert list(Artifact.objects.for_workspace(run.workspace_id).filter(run=run)) == []
    assert secret.read_text() == "not for runs"
    assert os.path.lexists(var_dir / "runs" / str(run.pk) / "checkpoints" / "step-3")


# --- the run's environment stays the workload's ----------------------------------------------

SHOWS_ITS_ENVIRONMENT = """\
    import json, os, time
    out = os.environ["TAU_OUTPUT_DIR"]
    seen = {"PLANTED": os.environ.get("PLANTED"), "wrapper": os.getppid()}
    with open(os.path.join(out, "seen.json"), "w") as handle:
        json.dump(seen, handle)
    release = os.path.join(out, "release")
    deadline = time.time() + 120
    while not os.path.exists(release) and time.time() < deadline:
        time.sleep(0.05)
    """


def environment_of(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as handle:
        entries = handle.read().decode(errors="replace").split("\0")
    return dict(entry.split("=", 1) for entry in entries if "=" in entry)


def test_a_run_s_environment_reaches_its_workload_only(
    world: Any, var_dir: Path, start_agent: Any
) -> None:
    """``runtime.env`` is the run's to choose (``LD_PRELOAD`` included), and bwrap runs as
    root outside the sandbox, in the run's folder: a library of the run's would load there
    as root. The sandbox and the wrapper get the agent's fixed environment; the workload
    (and only it) gets the run's, through a memory file, with its run token."""
    local_quota(world.alpha)
    environment = """\
        runtime:
          env:
            PLANTED: from-the-spec
            LD_PRELOAD: ./not-a-library.so
        """
    run = submit(
        world,
        spec("environment", extra=textwrap.dedent(NO_RETRIES) + textwrap.dedent(environment)),
        {"main.py": SHOWS_ITS_ENVIRONMENT},
    )
    agent = start_agent()
    seen_file = attempt_dir(var_dir, run, 1) / "output" / "seen.json"
    wait_until(seen_file.exists, timeout=60, what="the workload's start", agent=agent)
    seen = json.loads(seen_file.read_text())
    assert seen["PLANTED"] == "from-the-spec"
    (attempt,) = attempts(run)
    assert attempt.pid is not None
    wrapper = host_pid(run, 1, seen["wrapper"])
    assert wrapper is not None
    for pid in (attempt.pid, wrapper):  # the sandbox (root, outside), the wrapper inside
        launcher = environment_of(pid)
        # The agent's fixed variables (and the folder bwrap starts the wrapper in).
        assert set(launcher) <= {"LANG", "PATH", "PWD", *attempt_markers(run.pk, 1)}, launcher
    (seen_file.parent / "release").touch()
    _, log = finished(run, agent)
    assert run.state == RunState.SUCCEEDED, log
