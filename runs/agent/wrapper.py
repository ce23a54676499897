"""The attempt wrapper: runs one workload and writes down how it ended, durably.

    python -I -S wrapper.py [--outcome DIR] [--cwd DIR] [--user UID --group GID] -- COMMAND …

The agent starts every attempt through this script (inside the sandbox when there is one).
It starts COMMAND as its child, waits for it, and then writes ``DIR/outcome.json``::

    {"version": 1, "exit_code": 3, "signal": null, "error": null,
     "started_at": 1767000000.1, "ended_at": 1767000042.7, "stop_signals": []}

atomically (a temporary file, fsync, rename, fsync of the folder), before it exits itself.
Why: an agent that crashed and was started again cannot learn the exit status of a process
it did not start, so without this file a workload that had finished while no agent was
watching would be run again. With it, recovery closes the attempt with its real result.

``stop_signals`` lists SIGTERM, SIGINT or SIGHUP received before the workload ended: an
outcome that follows a stop (a cancel, a deadline, an agent stopping it) is not a natural
end, and recovery must not take it for one.

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
the run's 0700 folders). The outcome folder belongs to root with mode 0700, so the workload can
neither forge nor remove its outcome. Without root the wrapper and the workload share the
portal's uid: a workload could then write its own outcome, which changes nothing but the
record of its own attempt (it could as well exit with that status).

Standard library only, and run with ``-I -S``: inside the sandbox there is only the base
interpreter, and nothing of the run's (its ``PYTHONPATH``, a ``sitecustomize``) may run here.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from types import FrameType

OUTCOME_NAME = "outcome.json"
OUTCOME_VERSION = 1
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
PASSED_ON = (*STOP_SIGNALS, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT)
EXIT_CANNOT_START = 127


def parse(argv: list[str]) -> tuple[str | None, str | None, int | None, int | None, list[str]]:
    outcome: str | None = None
    cwd: str | None = None
    user: int | None = None
    group: int | None = None
    index = 0
    while index < len(argv) and argv[index] != "--":
        name = argv[index]
        if index + 1 >= len(argv):
            raise SystemExit(f"wrapper: {name} needs a value")
        value = argv[index + 1]
        if name == "--outcome":
            outcome = value
        elif name == "--cwd":
            cwd = value
        elif name == "--user":
            user = int(value)
        elif name == "--group":
            group = int(value)
        else:
            raise SystemExit(f"wrapper: unknown option {name}")
        index += 2
    command = argv[index + 1 :]
    if not command:
        raise SystemExit("wrapper: no command after --")
    return outcome, cwd, user, group, command


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
        os.write(descriptor, data)
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    os.replace(temporary, OUTCOME_NAME, src_dir_fd=directory_fd, dst_dir_fd=directory_fd)
    os.fsync(directory_fd)


def main(argv: list[str]) -> int:
    outcome_dir, cwd, user, group, command = parse(argv)
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
    started_at = time.time()
    record: dict[str, object] = {
        "version": OUTCOME_VERSION,
        "exit_code": None,
        "signal": None,
        "error": None,
        "started_at": started_at,
    }
    status: int
    try:
        child = subprocess.Popen(  # noqa: S603 - the researcher's command, no shell
            command,
            close_fds=True,
            cwd=cwd if user is None else None,
            # After the change of user (subprocess changes the folder before it).
            preexec_fn=(lambda: os.chdir(cwd)) if user is not None and cwd else None,
            user=user,
            group=group,
            extra_groups=[] if user is not None else None,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        if isinstance(exc, subprocess.SubprocessError) and cwd:
            reason = f"{reason} (could it enter {cwd}?)"
        sys.stderr.write(f"[taugrid] could not start {command[0]}: {reason}\n")
        sys.stderr.flush()
        record.update(exit_code=EXIT_CANNOT_START, error=f"{command[0]}: {reason}")
        status = EXIT_CANNOT_START << 8
    else:
        _, status = os.waitpid(child.pid, 0)  # retried after a signal handler (PEP 475)
        child.returncode = -1  # ended: no signal is passed on from here
        if os.WIFSIGNALED(status):
            record["signal"] = os.WTERMSIG(status)
        else:
            record["exit_code"] = os.WEXITSTATUS(status)
    record["ended_at"] = time.time()
    record["stop_signals"] = sorted(set(received))
    if directory_fd is not None:
        try:
            write_outcome(directory_fd, record)
        except OSError as exc:
            sys.stderr.write(f"[taugrid] could not record how the workload ended: {exc}\n")
    if os.WIFSIGNALED(status):
        ended_by = os.WTERMSIG(status)
        signal.signal(ended_by, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [ended_by])
        os.kill(os.getpid(), ended_by)
        return 128 + ended_by  # a signal whose default is not to end the process
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
