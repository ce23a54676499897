"""The attempt wrapper: runs one workload, keeps its log, and writes down how it ended.

    python -I -S wrapper.py [--outcome DIR] [--cwd DIR] [--user UID --group GID]
                            [--log-limit BYTES] [--rlimit NAME=VALUE ...]
                            [--environment-fd FD] -- COMMAND [ARG ...]

The agent starts every attempt through this script (inside the sandbox when there is one),
with the attempt's ``run.log`` open as stdout and stderr. The wrapper starts COMMAND as its
child, copies the child's output into the log, waits for it, and then writes
``DIR/outcome.json``::

    {"version": 1, "exit_code": 3, "signal": null, "error": null,
     "started_at": 1767000000.1, "ended_at": 1767000042.7, "stop_signals": [],
     "log_dropped": 0}

atomically (a temporary file, fsync, rename, fsync of the folder), before it exits itself.
Why: an agent that crashed and was started again cannot learn the exit status of a process
it did not start, so without this file a workload that had finished while no agent was
watching would be run again. With it, recovery closes the attempt with its real result.

``stop_signals`` lists SIGTERM, SIGINT or SIGHUP received before the workload ended: an
outcome that follows a stop (a cancel, a deadline, an agent stopping it) is not a natural
end, and recovery must not take it for one.

The log. The wrapper, not the agent, reads the workload's output pipe, so a workload goes on
writing its log while no agent runs (if the agent held the pipe, the workload's next write
after an agent crash would kill it with SIGPIPE). The log is capped at ``--log-limit``
bytes, counting what is already in it (the environment build's output): at the cap one
marker line says so and the rest is only counted (``log_dropped``), so a noisy program
cannot fill the disk and is never blocked on a full pipe.

Signals and process groups. The wrapper is in the attempt's process group with its
workload, so the agent's ``killpg`` (SIGTERM, the grace period, SIGKILL) reaches the
workload directly; the wrapper catches those signals so that it survives a SIGTERM to write
the outcome, and passes a signal on only to a workload that left the group (which the group
signal did not reach) — never twice. A SIGKILL to the group ends the wrapper too: then there
is no outcome, and the agent, who sent it, knows why. When the workload was killed by a
signal, the wrapper ends itself with the same signal, so the agent's own view of the exit
(``waitid``) says the same as the file: a SIGKILL nobody in TauGrid sent is still an OOM kill.

``--user``/``--group``: when the agent runs as root, the sandbox starts this wrapper as
root (with no capability but CAP_SETUID and CAP_SETGID) and the workload gets the run's own
unprivileged uid; it enters ``--cwd`` only then (root without CAP_DAC_OVERRIDE may not enter
the run's 0700 folders). The outcome folder belongs to root with mode 0700, so the workload
can neither forge nor remove its outcome, nor reach the log's file descriptor. Without root
the wrapper and the workload share the portal's uid: the wrapper makes itself non-dumpable
(its ``/proc`` entries, the log's descriptor among them, are then closed to that uid), but
the workload could still write its own outcome, which changes nothing but the record of its
own attempt (it could as well exit with that status).

``--rlimit NAME=VALUE`` (repeated): resource limits for the workload alone, set between
its change of user and its start (``fsize`` for the per-file cap of its disk allowance,
``nproc`` for its processes: ``run_limits``). The wrapper itself stays unlimited, so it can
always write the log and the outcome.

``--environment-fd FD``: the workload's environment, a JSON object read from FD (then
closed, so the workload does not inherit it). The wrapper and the sandbox around it run
with a fixed environment of the agent's: nothing the run chose (``LD_PRELOAD``, say)
reaches a process that runs as root. Without it the workload inherits the wrapper's.

Standard library only, and run with ``-I -S``: inside the sandbox there is only the base
interpreter, and nothing of the run's (its ``PYTHONPATH``, a ``sitecustomize``) may run here.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import select
import signal
import subprocess
import sys
import threading
import time
from types import FrameType

OUTCOME_NAME = "outcome.json"
OUTCOME_VERSION = 1
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
PASSED_ON = (*STOP_SIGNALS, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT)
EXIT_CANNOT_START = 127
LOG_DRAIN_SECONDS = 2.0  # after the workload's end, for what its leftovers still write
_CHUNK = 64 * 1024
_PR_SET_DUMPABLE = 4


def truncation_marker(limit: int) -> bytes:
    return f"\n… log truncated at {limit} bytes; further output is dropped …\n".encode()


class LogPump(threading.Thread):
    """Copy a pipe into the open log ``out_fd`` until end of file or ``stop()``."""

    def __init__(self, pipe_fd: int, out_fd: int, *, limit: int | None) -> None:
        super().__init__(name="log", daemon=True)
        self._fd = pipe_fd
        self._out = out_fd
        self._limit = limit
        self._stop_requested = threading.Event()
        self._lock = threading.Lock()
        try:
            self._size = os.fstat(out_fd).st_size
        except OSError:
            self._size = 0
        self._dropped = 0
        self._truncated = limit is not None and self._size >= limit

    @property
    def size(self) -> int:
        """Bytes in the log file."""
        with self._lock:
            return self._size

    @property
    def dropped(self) -> int:
        """Bytes of output not written because of the cap."""
        with self._lock:
            return self._dropped

    def stop(self, timeout: float) -> None:
        """Wait up to ``timeout`` for end of file (all writers gone), then stop reading."""
        self.join(timeout)
        if self.is_alive():
            # A process that left the group (setsid) still holds the pipe open.
            self._stop_requested.set()
            self.join(1.0)

    def run(self) -> None:
        try:
            while True:
                ready, _, _ = select.select([self._fd], [], [], 0.2)
                if not ready:
                    if self._stop_requested.is_set():
                        return
                    continue
                try:
                    chunk = os.read(self._fd, _CHUNK)
                except OSError:
                    return
                if not chunk:
                    return  # end of file: every writer has exited
                self._write(chunk)
        finally:
            os.close(self._fd)

    def _write(self, chunk: bytes) -> None:
        with self._lock:
            if self._truncated:
                self._dropped += len(chunk)
                return
            room = len(chunk) if self._limit is None else self._limit - self._size
            head, tail = chunk[:room], chunk[room:]
            try:
                if head:
                    _write_all(self._out, head)
                    self._size += len(head)
                if tail and self._limit is not None:
                    marker = truncation_marker(self._limit)
                    _write_all(self._out, marker)
                    self._size += len(marker)
                    self._truncated = True
                    self._dropped += len(tail)
            except OSError:
                # Disk full, say: keep reading, or the workload would block on a full pipe.
                self._dropped += len(chunk)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def parse(argv: list[str]) -> dict[str, object]:
    options: dict[str, object] = {}
    names = {
        "--outcome": str,
        "--cwd": str,
        "--user": int,
        "--group": int,
        "--log-limit": int,
        "--environment-fd": int,
    }
    limits: list[tuple[int, int]] = []
    options["rlimits"] = limits
    index = 0
    while index < len(argv) and argv[index] != "--":
        name = argv[index]
        if name == "--rlimit" and index + 1 < len(argv):
            limits.append(_rlimit(argv[index + 1]))
        elif name not in names or index + 1 >= len(argv):
            raise SystemExit(f"wrapper: unknown option or missing value: {name}")
        else:
            options[name[2:].replace("-", "_")] = names[name](argv[index + 1])
        index += 2
    command = argv[index + 1 :]
    if not command:
        raise SystemExit("wrapper: no command after --")
    options["command"] = command
    return options


def _rlimit(text: str) -> tuple[int, int]:
    """``fsize=1073741824`` -> (resource.RLIMIT_FSIZE, 1073741824)."""
    name, _, value = text.partition("=")
    number = getattr(resource, f"RLIMIT_{name.upper()}", None)
    if not isinstance(number, int) or not value.isdigit():
        raise SystemExit(f"wrapper: not a resource limit: {text}")
    return number, int(value)


def read_environment(descriptor: int) -> dict[str, str]:
    """The workload's environment from ``descriptor`` (a JSON object of strings), which is
    closed."""
    chunks = []
    try:
        while chunk := os.read(descriptor, _CHUNK):
            chunks.append(chunk)
    finally:
        os.close(descriptor)
    try:
        environment = json.loads(b"".join(chunks))
    except ValueError:
        environment = None
    if not isinstance(environment, dict) or not all(
        isinstance(name, str) and isinstance(value, str) for name, value in environment.items()
    ):
        raise SystemExit("wrapper: the environment is not a JSON object of strings")
    return environment


def write_outcome(directory_fd: int, record: dict[str, object]) -> None:
    data = json.dumps(record, sort_keys=True).encode()
    temporary = f".{OUTCOME_NAME}.{os.getpid()}.tmp"
    descriptor = os.open(
        temporary,
        os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
        0o600,
        dir_fd=directory_fd,
    )
    try:
        _write_all(descriptor, data)
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    os.replace(temporary, OUTCOME_NAME, src_dir_fd=directory_fd, dst_dir_fd=directory_fd)
    os.fsync(directory_fd)


def _not_dumpable() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def main(argv: list[str]) -> int:
    options = parse(argv)
    command: list[str] = options["command"]  # type: ignore[assignment]
    outcome_dir = options.get("outcome")
    cwd = options.get("cwd")
    user = options.get("user")
    group = options.get("group")
    limit = options.get("log_limit")
    rlimits: list[tuple[int, int]] = options["rlimits"]  # type: ignore[assignment]
    environment_fd = options.get("environment_fd")
    assert environment_fd is None or isinstance(environment_fd, int)
    environment = read_environment(environment_fd) if environment_fd is not None else None
    assert outcome_dir is None or isinstance(outcome_dir, str)
    assert cwd is None or isinstance(cwd, str)
    assert user is None or isinstance(user, int)
    assert group is None or isinstance(group, int)
    assert limit is None or isinstance(limit, int)
    _not_dumpable()
    directory_fd = (
        os.open(outcome_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if outcome_dir else None
    )
    received: list[int] = []
    child: subprocess.Popen[bytes] | None = None

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if signum in STOP_SIGNALS and child is not None and child.returncode is None:
            received.append(signum)
        if child is None or child.returncode is not None:
            return
        try:
            left_the_group = os.getpgid(child.pid) != os.getpgrp()
        except ProcessLookupError:
            return
        if left_the_group:
            os.kill(child.pid, signum)

    # Handlers, not SIG_IGN: handlers are reset by exec, so the workload gets the defaults.
    for signum in PASSED_ON:
        signal.signal(signum, on_signal)
    record: dict[str, object] = {
        "version": OUTCOME_VERSION,
        "exit_code": None,
        "signal": None,
        "error": None,
        "started_at": time.time(),
    }
    read_end, write_end = os.pipe()
    pump = LogPump(read_end, sys.stdout.fileno(), limit=limit)
    status: int

    def before_exec() -> None:
        # In the child, after its change of user (subprocess changes the folder before it,
        # and root without CAP_DAC_OVERRIDE may not enter the run's 0700 folders).
        if user is not None and cwd:
            os.chdir(cwd)
        for number, value in rlimits:
            resource.setrlimit(number, (value, value))

    try:
        child = subprocess.Popen(  # noqa: S603 - the researcher's command, no shell
            command,
            stdout=write_end,
            stderr=write_end,
            close_fds=True,
            env=environment,
            cwd=cwd if user is None else None,
            # The log pump has not started yet: the wrapper has no other thread here.
            preexec_fn=before_exec if (user is not None and cwd) or rlimits else None,
            user=user,
            group=group,
            extra_groups=[] if user is not None else None,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        os.close(write_end)
        os.close(read_end)
        reason = getattr(exc, "strerror", None) or str(exc)
        if isinstance(exc, subprocess.SubprocessError) and cwd:
            reason = f"{reason} (could it enter {cwd}?)"
        sys.stderr.write(f"[taugrid] could not start {command[0]}: {reason}\n")
        sys.stderr.flush()
        record.update(exit_code=EXIT_CANNOT_START, error=f"{command[0]}: {reason}")
        status = EXIT_CANNOT_START << 8
    else:
        os.close(write_end)
        pump.start()
        _, status = os.waitpid(child.pid, 0)  # retried after a signal handler (PEP 475)
        child.returncode = -1  # ended: no signal is passed on from here
        pump.stop(timeout=LOG_DRAIN_SECONDS)
        if os.WIFSIGNALED(status):
            record["signal"] = os.WTERMSIG(status)
        else:
            record["exit_code"] = os.WEXITSTATUS(status)
    record["ended_at"] = time.time()
    record["stop_signals"] = sorted(set(received))
    record["log_dropped"] = pump.dropped
    if directory_fd is not None:
        try:
            write_outcome(directory_fd, record)
        except OSError as exc:
            sys.stderr.write(f"[taugrid] could not record how the workload ended: {exc}\n")
    if os.WIFSIGNALED(status):
        ended_by = os.WTERMSIG(status)
        with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
            signal.signal(ended_by, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [ended_by])
        os.kill(os.getpid(), ended_by)
        return 128 + ended_by  # a signal whose default is not to end the process
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
