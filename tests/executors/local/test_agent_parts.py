"""The local agent's parts on their own: admission rule, metrics and checkpoint collection,
the capped log, process groups, environments and the child's command line, the wrapper and
its outcome record, the sandbox. No database."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from executors.local.agent import admission, environments, outcomes, processes
from executors.local.agent import sandbox as sandboxing
from executors.local.agent.admission import Candidate, Quota, Usage, WorkspaceShare, plan_admission
from executors.local.agent.collect import CheckpointScanner, MetricsReader, checkpoint_step
from executors.local.agent.prepare import (
    AttemptLayout,
    PreparationFailed,
    child_environment,
    entrypoint_command,
)
from executors.local.agent.wrapper import LogPump, truncation_marker
from tau.spec import Spec, load_spec

GiB = Decimal(2**30)
MACHINE = {"cpu": Decimal(2), "memory": 4 * GiB, "nvidia.com/gpu": Decimal(0)}


def demand(cpu: str = "1", memory: Decimal = GiB / 4, gpus: int = 0) -> dict[str, Decimal]:
    return {"cpu": Decimal(cpu), "memory": memory, "nvidia.com/gpu": Decimal(gpus)}


def plan(
    candidates: list[Candidate],
    *,
    usage: Usage | None = None,
    shares: dict[int, WorkspaceShare] | None = None,
) -> dict[int, admission.Decision]:
    decisions = plan_admission(
        candidates, capacity=MACHINE, usage=usage or Usage(), shares=shares or {}
    )
    return {decision.run_id: decision for decision in decisions}


# --- admission ---------------------------------------------------------------------------


def test_runs_start_in_queue_order_while_the_machine_has_room() -> None:
    decisions = plan([Candidate(run, 1, demand()) for run in (1, 2, 3)])
    assert [decisions[run].admit for run in (1, 2, 3)] == [True, True, False]
    assert decisions[3].position == 1
    assert decisions[3].reason == "Waiting for 1 CPU: 0 of this machine's 2 are free."


def test_later_runs_do_not_overtake_one_waiting_for_the_machine() -> None:
    usage = Usage()
    usage.add(9, demand("1"))
    decisions = plan(
        [Candidate(1, 1, demand("2")), Candidate(2, 1, demand("1")), Candidate(3, 2, demand("1"))],
        usage=usage,
    )
    assert not any(decision.admit for decision in decisions.values())
    assert decisions[1].reason == "Waiting for 2 CPUs: 1 of this machine's 2 are free."
    assert (decisions[2].position, decisions[3].position) == (2, 3)
    assert (
        decisions[2].reason
        == "Waiting: 1 earlier run is waiting for this machine's resources first."
    )


def test_a_run_that_can_never_fit_holds_nobody_up() -> None:
    decisions = plan([Candidate(1, 1, demand("4")), Candidate(2, 1, demand("1"))])
    assert not decisions[1].admit
    assert decisions[1].position is None
    assert decisions[1].reason == (
        "Cannot start on this machine. The run needs 4 CPUs at once, but this machine has 2 "
        "(TAU_LOCAL_CPUS); ask for at most 2 in total."
    )
    assert decisions[2].admit


def test_memory_and_gpus_count_too() -> None:
    decisions = plan(
        [Candidate(1, 1, demand("1", memory=3 * GiB)), Candidate(2, 1, demand("1", memory=2 * GiB))]
    )
    assert decisions[1].admit
    assert decisions[2].reason == "Waiting for 2Gi of memory: 1Gi of this machine's 4Gi are free."
    decisions = plan([Candidate(1, 1, demand("1", gpus=1))])
    assert decisions[1].reason == (
        "Cannot start on this machine. The run needs 1 GPU, but this machine has 0 GPUs "
        "(TAU_LOCAL_GPUS); runs that need GPUs must go to a cluster."
    )


def test_a_workspace_quota_holds_its_own_runs_only() -> None:
    shares = {1: WorkspaceShare(quotas={"cpu": Quota(Decimal(1))})}
    decisions = plan(
        [
            Candidate(1, 1, demand("1")),
            Candidate(2, 1, demand("1")),
            Candidate(3, 1, demand("0.5")),
            Candidate(4, 2, demand("1")),
        ],
        shares=shares,
    )
    assert decisions[1].admit
    assert decisions[2].reason == "Waiting for 1 CPU: the workspace uses 1 of its 1."
    assert decisions[2].position == 1
    assert decisions[3].reason == "Waiting behind an earlier run of this workspace for its quota."
    assert decisions[4].admit  # another workspace (no quota rows: only the machine limits it)


def test_more_than_the_quota_can_never_start() -> None:
    shares = {1: WorkspaceShare(quotas={"cpu": Quota(Decimal("0.5"))})}
    decisions = plan([Candidate(1, 1, demand("1")), Candidate(2, 1, demand("0.5"))], shares=shares)
    assert decisions[1].position is None
    assert decisions[1].reason.startswith("Cannot start: it needs 1 CPU at once")
    assert decisions[2].admit


def test_a_cohort_lends_unused_quota_within_the_borrowing_limit() -> None:
    shares = {
        1: WorkspaceShare(quotas={"cpu": Quota(Decimal(1), borrowing_limit=Decimal(1))}, cohort=7),
        2: WorkspaceShare(quotas={"cpu": Quota(Decimal(3))}, cohort=7),
    }
    capacity = {**MACHINE, "cpu": Decimal(8)}
    decisions = plan_admission(
        [Candidate(1, 1, demand("2")), Candidate(2, 1, demand("1"))],
        capacity=capacity,
        usage=Usage(),
        shares=shares,
    )
    assert decisions[0].admit  # 1 own + 1 borrowed
    assert (
        decisions[1].reason
        == "Waiting for 1 CPU: the workspace uses 2 of its 1 and may borrow at most 1."
    )
    usage = Usage()
    usage.add(2, demand("3"))  # the lender uses all of its own
    decisions = plan_admission(
        [Candidate(1, 1, demand("2"))], capacity=capacity, usage=usage, shares=shares
    )
    assert decisions[0].reason == (
        "Waiting for 2 CPUs: the workspace uses 0 of its 1 and its cohort has none to lend "
        "right now."
    )


def test_detect_memory_reads_memtotal(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       2048 kB\nMemFree: 1 kB\n")
    assert admission.detect_memory_bytes(str(meminfo)) == Decimal(2048 * 1024)


# --- metrics and checkpoints ------------------------------------------------------------


def test_metrics_are_read_by_complete_lines(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    reader = MetricsReader(path)
    assert reader.read().points == []  # no file yet
    path.write_text('{"step": 1, "loss": 0.5, "acc": 1, "ok": true, "tag": "x"}\n{"step": 2, "lo')
    batch = reader.read()
    assert sorted(batch.points) == [("acc", 1, 1.0), ("loss", 1, 0.5)]
    assert reader.offset == path.read_text().index("\n") + 1
    with open(path, "a") as handle:
        handle.write(
            'ss": 0.25}\nnot json\n[1]\n{"loss": 1}\n{"step": 2.5, "x": 1}\n{"step": 3, "n": NaN}\n'
        )
    batch = reader.read()
    assert batch.points == [("loss", 2, 0.25)]
    assert batch.bad_lines == 4
    assert reader.first_problem == "line 3: not JSON"
    with open(path, "a") as handle:
        handle.write('{"step": 4, "loss": 0.1}')  # the program ended without a newline
    assert reader.read().points == []
    assert reader.read(final=True).points == [("loss", 4, 0.1)]
    assert reader.offset == path.stat().st_size


def test_a_replaced_metrics_file_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 1}\n' * 3)
    reader = MetricsReader(path)
    assert len(reader.read().points) == 3
    path.write_text('{"step": 9, "loss": 2}\n')
    batch = reader.read()
    assert batch.points == [("loss", 9, 2.0)]
    assert "shrank" in batch.problems[0]


def test_the_metrics_file_is_read_only_as_a_plain_file_inside_the_output_folder(
    tmp_path: Path,
) -> None:
    """The agent may run as root and the workload owns its output folder: a link to a host
    file, a link on the way, or a FIFO (which would block a plain open) is reported as the
    workload's problem and nothing is read through it."""
    output = tmp_path / "output"
    output.mkdir()
    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"step": 1, "secret": 42}\n')

    linked = MetricsReader(output / "metrics.jsonl", root=output)
    (output / "metrics.jsonl").symlink_to(secret)
    batch = linked.read()
    assert batch.points == []
    assert "could not read the metrics file" in batch.problems[0]

    (output / "sub").symlink_to(tmp_path, target_is_directory=True)
    through = MetricsReader(output / "sub" / "secret.jsonl", root=output)
    batch = through.read()
    assert batch.points == []
    assert "a folder on its path is a link" in batch.problems[0]

    os.mkfifo(output / "fifo.jsonl")
    fifo = MetricsReader(output / "fifo.jsonl", root=output)
    batch = fifo.read()  # returns at once instead of waiting for a writer
    assert batch.points == []
    assert "not a regular file" in batch.problems[0]

    (output / "deep").mkdir()
    (output / "deep" / "m.jsonl").write_text('{"step": 2, "loss": 0.5}\n')
    assert MetricsReader(output / "deep" / "m.jsonl", root=output).read().points == [
        ("loss", 2, 0.5)
    ]
    assert MetricsReader(output / "missing.jsonl", root=output).read().problems == []


@pytest.mark.parametrize(
    ("name", "step"),
    [
        ("step-700", 700),
        ("checkpoint-700", 700),
        ("700", 700),
        ("step_12.pt", 12),
        ("model-3.tar.gz", 3),
        ("epoch5.ckpt", 5),
        (".step-700-abc", None),
        ("step-700.tmp", None),
        ("step-700.partial", None),
        ("latest", None),
        ("step-7a", None),
    ],
)
def test_checkpoint_names(name: str, step: int | None) -> None:
    assert checkpoint_step(name) == step


def test_checkpoints_count_once_complete(tmp_path: Path) -> None:
    scanner = CheckpointScanner(tmp_path / "checkpoints")
    assert scanner.scan() == []  # no folder yet
    root = tmp_path / "checkpoints"
    (root / "step-100").mkdir(parents=True)
    (root / "step-100" / "state.json").write_text("{}")
    (root / "model-50.pt").write_bytes(b"12345")
    (root / "model-60.pt.tmp").write_bytes(b"half")
    (root / ".step-200-x").mkdir()
    found = scanner.scan()
    assert [(item.step, item.kind, item.size) for item in found] == [(50, "file", 5)]
    scanner.known.update(item.path for item in found)
    (root / "step-100" / "COMPLETE").write_text("100\n")
    (found_dir,) = scanner.scan()
    assert (found_dir.step, found_dir.kind, found_dir.path) == (
        100,
        "directory",
        str(root / "step-100"),
    )
    assert found_dir.size == len("{}") + len("100\n")


# --- the log -----------------------------------------------------------------------------


def open_log(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)


def test_the_log_stops_at_its_cap_with_one_marker(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_bytes(b"[taugrid] before\n")
    read_end, write_end = os.pipe()
    out = open_log(log)
    pump = LogPump(read_end, out, limit=100)
    pump.start()
    for _ in range(10):
        os.write(write_end, b"y" * 50)
    os.close(write_end)
    pump.stop(timeout=5)
    os.close(out)
    assert not pump.is_alive()
    content = log.read_bytes()
    assert content.startswith(b"[taugrid] before\ny")
    assert content.endswith(truncation_marker(100))
    assert len(content) == 100 + len(truncation_marker(100)) == pump.size
    assert pump.dropped == 17 + 500 - 100


def test_the_log_pump_gives_up_on_a_pipe_kept_open(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    out = open_log(tmp_path / "run.log")
    pump = LogPump(read_end, out, limit=1000)
    pump.start()
    os.write(write_end, b"hello\n")
    started = time.monotonic()
    pump.stop(timeout=0.3)  # a writer outside the group still holds the pipe
    os.close(out)
    assert not pump.is_alive()
    assert time.monotonic() - started < 10  # it gave up (a pump that waits would wait forever)
    assert (tmp_path / "run.log").read_bytes() == b"hello\n"
    os.close(write_end)


# --- processes ---------------------------------------------------------------------------


def test_a_process_is_known_by_pid_and_start_time() -> None:
    me = processes.read_process(os.getpid())
    assert me is not None
    assert me.start_ticks > 0
    assert processes.is_same_process(os.getpid(), me.start_ticks)
    assert not processes.is_same_process(os.getpid(), me.start_ticks + 1)
    assert processes.read_process(2**22 + 12345) is None


def test_an_orphaned_group_is_found_and_stopped() -> None:
    stubborn = (
        "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    )
    leader = subprocess.Popen(
        [sys.executable, "-c", stubborn],
        start_new_session=True,
        env={**os.environ, "TAU_RUN_ID": "41", "TAU_ATTEMPT": "2"},
    )
    try:
        ticks = processes.start_ticks(leader.pid)
        deadline = time.monotonic() + 10
        while len(processes.group_members(leader.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        members = processes.orphaned_group(
            leader.pid, ticks, {"TAU_RUN_ID": "41", "TAU_ATTEMPT": "2"}
        )
        assert leader.pid in members
        assert len(members) == 2
        assert processes.orphaned_group(leader.pid, (ticks or 0) + 1, {}) == []  # not our process
        assert processes.stop_group(leader.pid, grace=0.3)  # SIGTERM is ignored: SIGKILL
        leader.wait(timeout=5)
        assert processes.group_members(leader.pid) == []
    finally:
        processes.signal_group(leader.pid, signal.SIGKILL)
        leader.wait(timeout=5)


def test_signal_names() -> None:
    assert processes.signal_name(9) == "SIGKILL"
    assert processes.signal_name(200) == "signal 200"


# --- environments and commands -----------------------------------------------------------


def test_environments_are_keyed_by_requirements() -> None:
    assert environments.environment_key(["a==1", " b "]) == environments.environment_key(
        ["a==1", "b", ""]
    )
    assert environments.environment_key(["a==1"]) != environments.environment_key(["a==2"])
    assert environments.environment_key([]) != environments.environment_key(["a"])


def test_an_empty_environment_is_built_once_and_isolated(tmp_path: Path) -> None:
    log = open(tmp_path / "build.log", "w+b")  # noqa: SIM115 - closed below
    try:
        path = environments.ensure_environment(
            tmp_path / "venvs", [], log=log, cancelled=threading.Event()
        )
        assert environments.is_ready(path)
        python = path / "bin" / "python"
        result = subprocess.run(
            [str(python), "-c", "import sys, json; print(json.dumps([sys.prefix, sys.path]))"],
            capture_output=True,
            check=True,
            env={"PATH": "/usr/bin:/bin"},
        )
        prefix, search_path = json.loads(result.stdout)
        assert prefix == str(path)
        assert not any("site-packages" in entry and str(path) not in entry for entry in search_path)
        marker_time = (path / environments.READY_MARKER).stat().st_mtime_ns
        again = environments.ensure_environment(
            tmp_path / "venvs", [], log=log, cancelled=threading.Event()
        )
        assert again == path
        assert (path / environments.READY_MARKER).stat().st_mtime_ns == marker_time
        # A build that never finished (no marker) is thrown away and built again.
        (path / environments.READY_MARKER).unlink()
        (path / "leftover").write_text("x")
        environments.ensure_environment(
            tmp_path / "venvs", [], log=log, cancelled=threading.Event()
        )
        assert environments.is_ready(path)
        assert not (path / "leftover").exists()
    finally:
        log.close()


def spec_with(entrypoint: str, args: str = "[]") -> Spec:
    return load_spec(
        f"schema_version: 1\nname: t\nrun:\n  entrypoint: {entrypoint}\n  args: {args}\n"
        "  workload_kind: job\ncompute:\n  cpus: 1\n  memory: 64Mi\n"
        "runtime:\n  env:\n    MY_SETTING: one\n    PATH: /spec/bin\n",
        filename="tau.yaml",
    )


def test_the_entrypoint_becomes_an_argument_vector(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "run.sh").write_text("")
    spec = spec_with("train.py", "[--lr, '0.1', two words]")
    assert entrypoint_command(spec, tmp_path) == ["python", "train.py", "--lr", "0.1", "two words"]
    spec = spec_with("'tools/run.sh --fast'")
    assert entrypoint_command(spec, tmp_path) == ["bash", "tools/run.sh", "--fast"]
    spec = spec_with("'python -m pkg.train'", "[--x]")
    assert entrypoint_command(spec, tmp_path) == ["python", "-m", "pkg.train", "--x"]
    with pytest.raises(PreparationFailed) as missing:
        entrypoint_command(spec_with("other.py"), tmp_path)
    assert missing.value.failure_class == "user_error"


def test_the_child_environment_is_built_from_nothing(tmp_path: Path) -> None:
    layout = AttemptLayout.for_attempt(tmp_path, 5, 2)
    env = child_environment(
        venv=tmp_path / "venv",
        layout=layout,
        spec_env={"MY_SETTING": "one", "PATH": "/spec/bin"},
        platform_env={"TAU_RUN_ID": "5", "TAU_ATTEMPT": "2"},
    )
    assert env["MY_SETTING"] == "one"
    assert env["PATH"] == "/spec/bin"  # the spec may set its own PATH
    assert env["TAU_ATTEMPT"] == "2"
    assert env["HOME"] == str(tmp_path / "5" / "attempt-2" / "work")
    assert set(env) == {
        "PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV", "PYTHONUNBUFFERED",
        "MY_SETTING", "TAU_RUN_ID", "TAU_ATTEMPT",
    }  # fmt: skip


# --- the wrapper and its outcome record ---------------------------------------------------

WRAPPER = [environments.base_interpreter(), "-I", "-S", str(sandboxing.WRAPPER)]


def wrapped(tmp_path: Path, script: str, *extra: str) -> tuple[list[str], Path, Path]:
    status = tmp_path / "status"
    status.mkdir(exist_ok=True)
    log = tmp_path / "run.log"
    command = [*WRAPPER, "--outcome", str(status), *extra, "--", sys.executable, "-c", script]
    return command, status / "outcome.json", log


def run_wrapped(command: list[str], log: Path, **kwargs: object) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
            command, stdout=out, stderr=out, start_new_session=True, **kwargs
        )


def test_the_wrapper_records_an_exit_code_and_keeps_the_log(tmp_path: Path) -> None:
    command, outcome, log = wrapped(
        tmp_path, "import sys; print('hello'); sys.exit(3)", "--log-limit", "1000"
    )
    process = run_wrapped(command, log)
    assert process.wait(timeout=30) == 3
    recorded = outcomes.read_outcome(outcome)
    assert recorded is not None
    assert (recorded.exit_code, recorded.signal, recorded.error) == (3, None, None)
    assert recorded.stop_signals == ()
    assert recorded.duration is not None
    assert log.read_text() == "hello\n"
    assert oct(outcome.stat().st_mode & 0o777) == "0o600"


def test_the_wrapper_ends_as_its_workload_was_ended(tmp_path: Path) -> None:
    """A SIGKILL nobody sent on purpose (the OOM killer) reads the same in the file and in
    the wrapper's own exit status."""
    command, outcome, log = wrapped(tmp_path, "import os, signal; os.kill(os.getpid(), 9)")
    process = run_wrapped(command, log)
    assert process.wait(timeout=30) == -signal.SIGKILL
    recorded = outcomes.read_outcome(outcome)
    assert recorded is not None
    assert (recorded.exit_code, recorded.signal) == (None, signal.SIGKILL)
    assert not recorded.after_a_stop


TERM_COUNTER = """\
import os, signal, sys, time
if os.environ.get("LEAVE_GROUP"):
    os.setsid()
got = []
signal.signal(signal.SIGTERM, lambda *_: got.append(1))
open(sys.argv[1], "w").close()
while not got:
    time.sleep(0.01)
time.sleep(0.3)  # a second SIGTERM would arrive meanwhile
print("terms", len(got), flush=True)
sys.exit(0)
"""


@pytest.mark.parametrize("leave_group", [False, True])
def test_a_stop_reaches_the_workload_once_and_is_recorded(
    tmp_path: Path, leave_group: bool
) -> None:
    """SIGTERM to the attempt's group (a cancel): the workload gets it once — straight from
    the group, or passed on by the wrapper when it left the group — and the wrapper survives
    to record an end that followed a stop."""
    ready = tmp_path / "ready"
    status = tmp_path / "status"
    status.mkdir()
    log = tmp_path / "run.log"
    command = [
        *WRAPPER, "--outcome", str(status), "--",
        sys.executable, "-c", TERM_COUNTER, str(ready),
    ]  # fmt: skip
    env = {**os.environ, **({"LEAVE_GROUP": "1"} if leave_group else {})}
    process = run_wrapped(command, log, env=env)
    deadline = time.monotonic() + 20
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGTERM)
    assert process.wait(timeout=30) == 0  # it survived the SIGTERM, and mirrors the exit
    assert log.read_text() == "terms 1\n"
    recorded = outcomes.read_outcome(status / "outcome.json")
    assert recorded is not None
    assert recorded.exit_code == 0
    assert recorded.stop_signals == (signal.SIGTERM,)
    assert recorded.after_a_stop


def test_a_command_that_cannot_start_is_recorded(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.mkdir()
    log = tmp_path / "run.log"
    command = [*WRAPPER, "--outcome", str(status), "--", "no-such-program-xyz", "--flag"]
    assert run_wrapped(command, log).wait(timeout=30) == 127
    recorded = outcomes.read_outcome(status / "outcome.json")
    assert recorded is not None
    assert recorded.error == "no-such-program-xyz: No such file or directory"
    assert "could not start no-such-program-xyz" in log.read_text()


def test_an_outcome_is_read_as_untrusted_input(tmp_path: Path) -> None:
    good = {"version": 1, "exit_code": 0, "signal": None, "stop_signals": [15]}
    path = tmp_path / "outcome.json"
    path.write_text(json.dumps(good))
    recorded = outcomes.read_outcome(path)
    assert recorded is not None
    assert recorded.stop_signals == (15,)
    for bad in ({**good, "signal": 9}, {**good, "exit_code": None}, {**good, "exit_code": 999}):
        path.write_text(json.dumps(bad))
        assert outcomes.read_outcome(path) is None
    path.write_text("not json")
    assert outcomes.read_outcome(path) is None
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps(good))
    path.unlink()
    path.symlink_to(secret)  # planted by a workload: never followed
    assert outcomes.read_outcome(path) is None
    path.unlink()
    os.mkfifo(path)  # would block a reader that waits for a writer
    assert outcomes.read_outcome(path) is None


# --- the sandbox ---------------------------------------------------------------------------


def sandbox_here() -> sandboxing.Sandbox:
    detection = sandboxing.detect("auto", interpreter=environments.base_interpreter())
    # deploy/dev/test_tools.py installs bubblewrap: its absence is a failure, not a skip.
    assert detection.sandbox is not None, detection.reason
    return detection.sandbox


def test_the_sandbox_shows_only_what_a_run_needs(tmp_path: Path) -> None:
    sandbox = sandbox_here()
    work, status = tmp_path / "work", tmp_path / "status"
    work.mkdir(mode=0o700)
    status.mkdir(mode=0o700)
    uid = sandbox.run_uid(7)
    if uid is not None:
        os.chown(work, uid, uid)
    (tmp_path / "not-mounted").write_text("secret")
    probe = (
        "import json, os\n"
        "print(json.dumps({'root': sorted(os.listdir('/')), 'uid': os.getuid(),\n"
        "  'parent': sorted(os.listdir(os.path.dirname(os.getcwd()))),\n"
        "  'pids': sorted(int(p) for p in os.listdir('/proc') if p.isdigit())}))\n"
    )
    command = sandbox.command(
        sandboxing.Layout(
            command=[environments.base_interpreter(), "-I", "-S", "-c", probe],
            cwd=work,
            writable=[work, status],
            outcome_dir=status,
            uid=uid,
        ),
        python=environments.base_interpreter(),
    )
    result = sandboxing.run(command, capture_output=True, text=True, timeout=30, check=True)
    seen = json.loads(result.stdout)
    system = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "sys", "proc"}
    mounted = {Path(path).parts[1] for path in (tmp_path, *sandbox.python_roots)}
    assert set(seen["root"]) <= system | mounted | {"dev", "tmp", "run"}  # run: the wrapper
    assert "not-mounted" not in seen["parent"]  # only what was mounted exists
    assert seen["uid"] == (uid if uid is not None else os.getuid())
    assert len(seen["pids"]) <= 3  # its own pid namespace: init, the wrapper, itself


def test_a_sigkill_to_the_group_ends_everything_in_the_sandbox(tmp_path: Path) -> None:
    """The agent's last resort reaches even a process that left the group (setsid): killing
    the namespace's pid 1 ends the namespace."""
    sandbox = sandbox_here()
    work, status = tmp_path / "work", tmp_path / "status"
    work.mkdir()
    status.mkdir(mode=0o700)
    escaper = (
        "import os, subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import os, time; os.setsid(); time.sleep(300)'],"
        " env={'TAU_ESCAPER': '1'})\n"
        "time.sleep(300)\n"
    )
    command = sandbox.command(
        sandboxing.Layout(
            command=[environments.base_interpreter(), "-I", "-S", "-c", escaper],
            cwd=work,
            writable=[work, status],
            outcome_dir=status,
            uid=sandbox.run_uid(8),
        ),
        python=environments.base_interpreter(),
    )
    leader = sandboxing.start(command, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while True:  # until it has left the group
            found = [
                info
                for pid in processes.marked_processes({"TAU_ESCAPER": "1"})
                if (info := processes.read_process(pid)) and info.process_group != leader.pid
            ]
            if found:
                break
            assert time.monotonic() < deadline, "the escaper did not start"
            time.sleep(0.05)
        (info,) = found
        escaped = info.pid
        processes.signal_group(leader.pid, signal.SIGKILL)
        leader.wait(timeout=10)
        deadline = time.monotonic() + 10
        while processes.is_same_process(escaped, info.start_ticks):
            assert time.monotonic() < deadline, "the escaped process outlived its sandbox"
            time.sleep(0.05)
    finally:
        processes.signal_group(leader.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            leader.wait(timeout=5)


# --- cached environments are checked before reuse ------------------------------------------


def test_a_changed_environment_is_noticed_even_with_its_times_put_back(tmp_path: Path) -> None:
    log = open(tmp_path / "build.log", "w+b")  # noqa: SIM115 - closed below
    try:
        path = environments.ensure_environment(
            tmp_path / "venvs", [], log=log, cancelled=threading.Event()
        )
    finally:
        log.close()
    assert environments.verify_environment(path) is None
    config = path / "pyvenv.cfg"
    before = config.stat()
    text = config.read_text()
    config.write_text(text.replace("false", "FALSE"))  # the same size
    os.utime(config, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert config.stat().st_size == before.st_size
    assert environments.verify_environment(path) == "pyvenv.cfg was changed"
    config.write_text(text)
    config.chmod(0o666)
    assert environments.verify_environment(path) == "the mode or owner of pyvenv.cfg changed"
    config.chmod(before.st_mode & 0o777)
    assert environments.verify_environment(path) is None  # the same content again
    (path / "bin" / "python").unlink()
    assert environments.verify_environment(path) == "bin/python was removed"
    environments.manifest_path(path).unlink()
    assert environments.verify_environment(path) == "it has no readable manifest"


def test_demo_passwords_are_readable_by_the_portal_only(tmp_path: Path, settings: Any) -> None:
    from web.management.commands import bootstrap_demo

    settings.VAR_DIR = tmp_path
    passwords = bootstrap_demo.load_or_create_passwords()
    path = bootstrap_demo.credentials_path()
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    path.chmod(0o644)  # as an older version left it
    assert bootstrap_demo.load_or_create_passwords() == passwords
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_the_runs_environments_follow_var_dir_unless_a_folder_is_given(
    settings: Any, tmp_path: Path
) -> None:
    """TAU_LOCAL_VENVS_DIR: where the local executor keeps the runs' environments (the
    example tests share one across sessions); unset, VAR_DIR/venvs, read when asked, as the
    evidence of a run reads it after a test moved VAR_DIR."""
    from executors.local.agent.prepare import venvs_root

    settings.TAU_LOCAL_VENVS_DIR = ""
    settings.VAR_DIR = tmp_path / "var"
    assert venvs_root() == tmp_path / "var" / "venvs"
    settings.TAU_LOCAL_VENVS_DIR = str(tmp_path / "shared")
    assert venvs_root() == (tmp_path / "shared").resolve()
