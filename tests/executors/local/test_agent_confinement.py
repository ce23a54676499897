"""The local executor's confinement, part by part (no database): the seccomp filter inside
real sandboxes (as root with a run's own uid, and without root in a user namespace), cgroups
(the real ones of this machine, and v2 set-up on a stand-in tree), resource limits, the disk
meter, and how the agent reads run folders that hold links to host paths (issue 30)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from executors.local.agent import cgroups, environments, outcomes, run_limits, seccomp
from executors.local.agent import sandbox as sandboxing
from executors.local.agent.artifact_collection import matching_files
from executors.local.agent.collect import CheckpointScanner, read_bounded
from runs import trials

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"  # readable by any uid (the portal's Python is under /root)

# Tries what a workload that wants out would try, and what an ordinary program does, and
# prints what happened: "ok" or the errno's name for each call.
ESCAPES = """\
import ctypes, errno, json, multiprocessing, os, subprocess, sys, threading
from concurrent.futures import ThreadPoolExecutor

numbers = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)


def answer(result):
    return "ok" if result != -1 else errno.errorcode[ctypes.get_errno()]


def call(name, *arguments):
    return answer(libc.syscall(numbers[name], *arguments))


seen = {
    "unshare user": answer(libc.unshare(0x10000000)),
    "unshare mount": answer(libc.unshare(0x00020000)),
    "unshare net": answer(libc.unshare(0x40000000)),
    "unshare files": answer(libc.unshare(0x00000400)),
    "clone user": call("clone", 0x10000000 | 17, 0, 0, 0, 0),
    "clone3": call("clone3", 0, 0),
    "setns": answer(libc.setns(-1, 0)),
    "mount": answer(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)),
    "umount2": answer(libc.umount2(b"/tmp", 0)),
    "keyctl": call("keyctl", 0, 0, 0, 0, 0),
    "add_key": call("add_key", 0, 0, 0, 0, 0),
    "bpf": call("bpf", 0, 0, 0),
    "perf_event_open": call("perf_event_open", 0, 0, -1, -1, 0),
    "userfaultfd": call("userfaultfd", 0),
    "io_uring_setup": call("io_uring_setup", 1, 0),
    "open_by_handle_at": call("open_by_handle_at", -1, 0, 0),
    "fsopen": call("fsopen", 0, 0),
    "personality read_implies_exec": answer(libc.personality(0x0400000)),
    "personality query": answer(libc.personality(0xFFFFFFFF)),
}
command = subprocess.run(["unshare", "-U", "-r", "-m", "true"], capture_output=True, text=True)
seen["unshare -U -r -m"] = command.returncode
if hasattr(os, "unshare"):
    try:
        os.unshare(os.CLONE_NEWUSER)
        seen["os.unshare"] = "ok"
    except OSError as exc:
        seen["os.unshare"] = errno.errorcode[exc.errno]
# What ordinary programs do: threads (glibc makes them with clone3, then clone), a pool of
# them as torch's intra-op pool is, fork, subprocess, multiprocessing with shared memory.
with ThreadPoolExecutor(8) as pool:
    seen["threads"] = sum(pool.map(lambda n: n * n, range(100)))
child = os.fork()
if child == 0:
    os._exit(7)
seen["fork"] = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
seen["subprocess"] = subprocess.run([sys.executable, "-c", "print(6 * 7)"],
                                    capture_output=True, text=True).stdout.strip()
with multiprocessing.Pool(2) as pool:
    seen["multiprocessing"] = pool.map(abs, [-1, -2, -3])
seen["seccomp"] = open("/proc/self/status").read().split("Seccomp:")[1].split()[0]
print(json.dumps(seen), flush=True)
"""

REFUSED = {
    "unshare user": "EPERM",
    "unshare mount": "EPERM",
    "unshare net": "EPERM",
    "clone user": "EPERM",
    "clone3": "ENOSYS",
    "setns": "EPERM",
    "mount": "EPERM",
    "umount2": "EPERM",
    "keyctl": "EPERM",
    "add_key": "EPERM",
    "bpf": "EPERM",
    "perf_event_open": "EPERM",
    "userfaultfd": "EPERM",
    "io_uring_setup": "ENOSYS",
    "open_by_handle_at": "EPERM",
    "fsopen": "ENOSYS",
    "personality read_implies_exec": "EPERM",
}
WORKING = {
    "unshare files": "ok",
    "personality query": "ok",
    "threads": sum(n * n for n in range(100)),
    "fork": 7,
    "subprocess": "42",
    "multiprocessing": [1, 2, 3],
    "seccomp": "2",  # a filter is in force
}


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder any uid can reach (pytest's own are root's 0700)."""
    path = Path(tempfile.mkdtemp(prefix="taugrid-confinement-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def detected_sandbox() -> sandboxing.Sandbox:
    detection = sandboxing.detect("auto", interpreter=environments.base_interpreter())
    assert detection.sandbox is not None, detection.reason
    return detection.sandbox


@pytest.mark.parametrize("mode", ["root, the run's own uid", "without root"])
def test_a_sandboxed_program_cannot_make_namespaces_or_mounts_but_runs_normally(
    mode: str, shared_dir: Path
) -> None:
    """Issue 30: with the portal as root, ``unshare -U -r -m`` inside a run gave uid 0 and a
    mount over /usr. Now the filter refuses it in both modes, and programs still work."""
    if mode == "without root":
        sandbox = sandboxing.Sandbox(
            bwrap=detected_sandbox().bwrap,
            version="bubblewrap",
            privileged=False,
            python_roots=(),  # all of it under /usr
        )
        interpreter, uid, as_user = SYSTEM_PYTHON, None, NOBODY
    else:
        sandbox = detected_sandbox()
        assert sandbox.privileged  # the tests run as root, as the attacked portal did
        interpreter, uid, as_user = environments.base_interpreter(), sandbox.run_uid(30), None
    work, status = shared_dir / "work", shared_dir / "status"
    work.mkdir(mode=0o700)
    status.mkdir(mode=0o700)
    owner = uid if uid is not None else as_user
    assert owner is not None
    os.chown(work, owner, owner)
    if as_user is not None:
        os.chown(status, as_user, as_user)
    numbers = {
        name: seccomp.number_of(name)
        for name in (
            "clone",
            "clone3",
            "keyctl",
            "add_key",
            "bpf",
            "perf_event_open",
            "userfaultfd",
            "io_uring_setup",
            "open_by_handle_at",
            "fsopen",
        )
    }
    command = sandbox.command(
        sandboxing.Layout(
            command=[interpreter, "-I", "-c", ESCAPES, json.dumps(numbers)],
            cwd=work,
            writable=[work, status],
            outcome_dir=status,
            uid=uid,
        ),
        python=interpreter,
    )
    user: dict[str, Any] = (
        {"user": as_user, "group": as_user, "extra_groups": []} if as_user else {}
    )
    result = sandboxing.run(
        command,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        **user,
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert {name: seen[name] for name in REFUSED} == REFUSED
    assert seen["unshare -U -r -m"] != 0
    assert seen.get("os.unshare", "EPERM") == "EPERM"  # Python 3.12 and later have it
    assert {name: seen[name] for name in WORKING} == WORKING


def test_without_a_filter_for_its_architecture_there_is_no_sandbox(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fail closed: a machine the filter is not built for gets no sandbox, and says why."""
    with pytest.raises(seccomp.SeccompUnsupported, match=r"\(riscv64\).*aarch64 and x86_64"):
        seccomp.filter_program("riscv64")
    monkeypatch.setattr(seccomp, "machine", lambda: "riscv64")
    detection = sandboxing.detect("auto", interpreter=environments.base_interpreter())
    assert detection.sandbox is None
    assert detection.reason == (
        "no sandbox without its seccomp filter: no seccomp filter for this machine's "
        "architecture (riscv64); TauGrid builds one for aarch64 and x86_64"
    )
    # Both known architectures get a whole program that starts by checking its own.
    for architecture, audit in seccomp.AUDIT_ARCH.items():
        program = seccomp.filter_program(architecture)
        assert len(program) % 8 == 0
        assert int.from_bytes(program[12:16], "little") == audit


# --- cgroups -------------------------------------------------------------------------------

# Forks children (each waits on a pipe) until the kernel says no, then allocates memory.
FLOOD = """\
import os, sys, time
read_end, write_end = os.pipe()
children = 0
for _ in range(int(sys.argv[1])):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.close(write_end)
        os.read(read_end, 1)
        os._exit(0)
    children += 1
print("children", children, flush=True)
os.close(write_end)
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
held = []
for _ in range(int(sys.argv[2])):
    held.append(bytearray(2**20))
print("allocated", len(held), flush=True)
"""


def test_an_attempt_cgroup_holds_processes_and_memory_and_is_removed(tmp_path: Path) -> None:
    """On this machine (cgroup v1, root) both controllers are there; the attempt's cgroup
    stops a fork flood at its limit, kills a memory hog inside it only, and goes away."""
    found = cgroups.detect(tmp_path / "var")
    try:
        assert found.memory, found.reasons
        assert found.pids, found.reasons
        group = found.create("run-30-attempt-1", memory=48 * 2**20, processes=24)
        command = group.enter_command(
            [environments.base_interpreter(), "-I", "-S", "-c", FLOOD, "200", "200"],
            python=environments.base_interpreter(),
        )
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        children = int(result.stdout.split("children ")[1].split()[0])
        assert 5 < children < 24  # the parent counts too
        assert result.returncode == -signal.SIGKILL  # over 48 MiB: killed inside its cgroup
        assert "allocated" not in result.stdout
        assert group.oom_kills() >= 1
        # Something left running in it is killed when it is released.
        sleeper = subprocess.Popen(
            group.enter_command(
                [environments.base_interpreter(), "-c", "import time; time.sleep(300)"],
                python=environments.base_interpreter(),
            )
        )
        procs = group.directories[0][1] / "cgroup.procs"
        while str(sleeper.pid) not in procs.read_text().split():
            assert sleeper.poll() is None
            time.sleep(0.01)
        assert group.release()
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
        assert all(not directory.exists() for _, directory in group.directories)
        # A crashed agent's leftover: found and removed at the next start.
        left = found.create("run-31-attempt-2", memory=2**30, processes=64)
        assert found.remove_stale(keep={"run-32-attempt-1"}) == ["run-31-attempt-2"]
        assert all(not directory.exists() for _, directory in left.directories)
    finally:
        found.remove_stale(keep=())
        found.close()
    assert all(not hierarchy.base.exists() for hierarchy in found.hierarchies)


def test_cgroup_v2_is_used_where_the_agent_is_delegated_memory_and_pids(tmp_path: Path) -> None:
    """cgroup v2 as a delegated systemd service sees it, on a stand-in tree (this machine's
    v2 hierarchy has no controllers): the files the kernel would read are written."""
    root = tmp_path / "cgroup"
    own = root / "system.slice" / "taugrid.service"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpu io memory pids\n")
    (own / "cgroup.subtree_control").write_text("memory pids\n")
    key = cgroups.installation_key(tmp_path / "var")
    base = own / f"taugrid-{key}"
    attempt = base / "run-7-attempt-2"
    attempt.mkdir(parents=True)  # the kernel makes a cgroup's files with it
    for name in ("cgroup.subtree_control",):
        (base / name).write_text("")
    for name in ("memory.max", "memory.swap.max", "pids.max", "cgroup.procs"):
        (attempt / name).write_text("max\n" if name != "cgroup.procs" else "")
    mountinfo = f"41 31 0:38 / {root} rw,relatime - cgroup2 cgroup2 rw\n"
    found = cgroups.detect(
        tmp_path / "var", mountinfo=mountinfo, proc_cgroup="0::/system.slice/taugrid.service\n"
    )
    assert found.reasons == ()
    assert [(h.version, h.controllers, h.base) for h in found.hierarchies] == [
        (2, ("memory", "pids"), base)
    ]
    assert (base / "cgroup.subtree_control").read_text() == "+memory +pids"
    group = found.create("run-7-attempt-2", memory=512 * 2**20, processes=100)
    assert (attempt / "memory.max").read_text().startswith(str(512 * 2**20))
    assert (attempt / "memory.swap.max").read_text().startswith("0")
    assert (attempt / "pids.max").read_text().startswith("100")
    assert group.enter_command(["true"], python="py")[5:] == [
        str(attempt / "cgroup.procs"),
        "--",
        "true",
    ]
    enforcement = run_limits.Enforcement(
        allowances=run_limits.Allowances(processes=100, disk=2**30),
        cgroups=found,
        nproc_per_run=True,
    )
    assert enforcement.describe() == {
        "memory": "each run's memory limit from its spec (cgroup v2 memory)",
        "tmp": "tmpfs of at most the run's memory, charged to it (cgroup v2)",
        "processes": "100 per run (cgroup v2 pids, RLIMIT_NPROC)",
        "disk": "1 GiB per run (measured every 2 s; RLIMIT_FSIZE per file)",
    }
    # Not delegated: said, and nothing used.
    (own / "cgroup.controllers").write_text("cpu io\n")
    refused = cgroups.detect(
        tmp_path / "other",
        mountinfo=mountinfo,
        proc_cgroup="0::/system.slice/taugrid.service\n",
    )
    assert refused.reasons[0] == (
        "cgroup v2: the agent's cgroup /system.slice/taugrid.service is not given the memory "
        "and pids controllers (it has: cpu, io)"
    )


def test_rlimit_nproc_is_used_only_where_it_counts_one_run() -> None:
    assert run_limits.nproc_counts_one_run(sandboxed=True, privileged=True)
    assert run_limits.nproc_counts_one_run(sandboxed=True, privileged=False, release="6.1.0-13")
    assert not run_limits.nproc_counts_one_run(
        sandboxed=True, privileged=False, release="5.10.0-28-amd64"
    )
    assert not run_limits.nproc_counts_one_run(sandboxed=False, privileged=False)


# --- the disk allowance ----------------------------------------------------------------------


def test_disk_use_counts_what_the_run_holds_and_follows_no_link(tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    big = host / "big"
    big.write_bytes(os.urandom(4 * 2**20))  # 4 MiB of the host's, linked from the run
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    (work / "data" / "part").write_bytes(os.urandom(2 * 2**20))
    os.link(work / "data" / "part", work / "data" / "same-part")  # one file, two names
    (work / "link-to-host-file").symlink_to(big)
    (work / "link-to-host-folder").symlink_to(host, target_is_directory=True)
    with open(work / "sparse", "wb") as sparse:
        sparse.truncate(2**30)  # a gigabyte in name only
    usage = run_limits.measure({"work/": work, "output/": tmp_path / "missing"})
    assert 2 * 2**20 <= usage.by_folder["work/"] < 3 * 2**20
    assert usage.by_folder["output/"] == 0
    assert run_limits.overrun(usage, 3 * 2**20) is None
    assert run_limits.overrun(usage, 2**20) == (
        f"Stopped: it used {run_limits.bytes_text(usage.total)} of its 1 MiB disk allowance "
        f"(work/ {run_limits.bytes_text(usage.total)}). The allowance is this machine's "
        "TAU_LOCAL_RUN_DISK; keep data and outputs smaller, or ask an administrator for more."
    )
    crowded = run_limits.measure({"work/": work}, max_entries=3)
    assert crowded.too_many_entries
    assert "more than 1000000 files and folders" in (run_limits.overrun(crowded, 2**40) or "")


def test_the_wrapper_sets_the_workloads_limits_and_keeps_its_own(tmp_path: Path) -> None:
    """RLIMIT_FSIZE caps each file of the workload; the wrapper still writes the log."""
    status = tmp_path / "status"
    status.mkdir()
    log = tmp_path / "run.log"
    script = (
        "import os, resource\n"
        "print('limits', resource.getrlimit(resource.RLIMIT_FSIZE)[0],"
        " resource.getrlimit(resource.RLIMIT_NPROC)[0], flush=True)\n"
        "try:\n"
        "    open('big', 'wb').write(b'x' * 2 * 2**20)\n"
        "except OSError as exc:\n"
        "    print('refused', exc.strerror, flush=True)\n"
        "print('y' * 3 * 2**20)\n"  # more than the file cap, through the wrapper's log
    )
    with open(log, "wb") as out:
        code = subprocess.run(
            [
                environments.base_interpreter(),
                "-I",
                "-S",
                str(sandboxing.WRAPPER),
                "--outcome",
                str(status),
                "--cwd",
                str(tmp_path),
                "--rlimit",
                f"fsize={2**20}",
                "--rlimit",
                "nproc=4000",
                "--",
                environments.base_interpreter(),
                "-c",
                script,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=60,
            check=False,
        ).returncode
    text = log.read_text()
    assert code == 0, text
    assert f"limits {2**20} 4000" in text
    assert "refused File too large" in text
    assert log.stat().st_size > 3 * 2**20


# --- links to host paths in the run's folders ----------------------------------------------


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A host folder a run must learn nothing about: a secret file, and a complete-looking
    checkpoint."""
    folder = tmp_path / "host"
    (folder / "step-9").mkdir(parents=True)
    (folder / "step-9" / "COMPLETE").touch()
    (folder / "secret").write_bytes(b"s" * 4096)
    return folder


def test_checkpoints_never_follow_a_link_out_of_the_run(tmp_path: Path, host: Path) -> None:
    """Issue 30: the agent (root) checked ``COMPLETE`` through links, so linking it to a host
    path told the run whether that path exists. Now a link is never followed: a marker
    linked to an existing host file and one linked to a missing path look the same (no
    checkpoint), and a checkpoint's size counts no linked file."""
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    for step, target in ((1, host / "secret"), (2, host / "missing")):
        (checkpoints / f"step-{step}").mkdir()
        (checkpoints / f"step-{step}" / "COMPLETE").symlink_to(target)
    (checkpoints / "step-3").symlink_to(host / "step-9", target_is_directory=True)
    (checkpoints / "model-4.pt").symlink_to(host / "secret")
    real = checkpoints / "step-5"
    real.mkdir()
    (real / "weights").write_bytes(b"w" * 100)
    (real / "linked").symlink_to(host / "secret")
    (real / "COMPLETE").touch()
    found = CheckpointScanner(checkpoints).scan()
    assert [(Path(c.path).name, c.step, c.size, c.kind) for c in found] == [
        ("step-5", 5, 100, "directory")
    ]
    # The checkpoint folder itself swapped for a link: nothing is read through it.
    linked = tmp_path / "linked-checkpoints"
    linked.symlink_to(host, target_is_directory=True)
    assert CheckpointScanner(linked).scan() == []


def test_outputs_trials_and_outcomes_are_read_without_following_links(
    tmp_path: Path, host: Path
) -> None:
    output = tmp_path / "output"
    (output / "models").mkdir(parents=True)
    (output / "models" / "final.bin").write_bytes(b"model")
    (output / "models" / "host.bin").symlink_to(host / "secret")
    (output / "host-folder").symlink_to(host, target_is_directory=True)
    (host / "leak.bin").write_bytes(b"host")
    assert matching_files(output, ["**/*.bin"]) == ["models/final.bin"]
    # trials.json linked to a host file that reads as trials: not read.
    (host / "trials.json").write_text(
        json.dumps({"trials": [{"trial": 1, "state": "succeeded", "config": {}}]})
    )
    (output / trials.TRIALS_FILE).symlink_to(host / "trials.json")
    read = read_bounded(output / trials.TRIALS_FILE, output, limit=trials.MAX_TRIALS_FILE_BYTES)
    assert read is None
    assert trials.parse_trials_file(read) is None
    # A FIFO would hold the agent's loop forever: refused at once.
    (output / trials.TRIALS_FILE).unlink()
    os.mkfifo(output / trials.TRIALS_FILE)
    answer: list[bytes | None] = []
    reader = threading.Thread(
        target=lambda: answer.append(
            read_bounded(output / trials.TRIALS_FILE, output, limit=trials.MAX_TRIALS_FILE_BYTES)
        ),
        daemon=True,
    )
    reader.start()
    reader.join(30)
    if reader.is_alive():  # free the thread before failing
        with contextlib.suppress(OSError):
            os.close(os.open(output / trials.TRIALS_FILE, os.O_WRONLY | os.O_NONBLOCK))
    assert answer == [None]
    # The outcome: a link to a host file is not an outcome.
    status = tmp_path / "status"
    status.mkdir()
    (status / "outcome.json").symlink_to(host / "secret")
    assert not outcomes.outcome_written(status / "outcome.json")
    (status / "outcome.json").unlink()
    (status / "outcome.json").write_text("{}")
    assert outcomes.outcome_written(status / "outcome.json")
