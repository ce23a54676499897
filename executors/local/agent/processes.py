"""Processes and process groups on this machine, read from ``/proc`` (Linux).

Every attempt runs as the leader of its own session and process group (``setsid``), so
"the attempt's processes" is "the members of the group whose id is the leader's pid". Two
facts of Linux make signalling that group safe:

* a pid is not handed to a new process while it is still in use as a process group id, so
  while any member of our group lives, nobody else can own that number;
* a process is identified by its pid *and* its start time (``/proc/<pid>/stat`` field 22, in
  clock ticks since boot), so a recorded (pid, start ticks) pair never matches a later process
  that happens to get the same pid.

After a crash of the agent the leader may be gone while members of its group live on; then
the group is only touched if one of its members still carries the attempt's marker
variables in its environment (``TAU_RUN_ID``, ``TAU_ATTEMPT`` and the installation's
``TAU_AGENT_INSTALLATION``: supervisor.attempt_markers).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

PROC = "/proc"
#: The marker naming the installation (its ``VAR_DIR``) that started an attempt or an
#: endpoint's generation. A run's id and attempt number alone repeat across installations on
#: one machine (two portals; the test databases of parallel test processes), and one agent's
#: recovery, looking for a stray attempt's processes by them, once stopped another
#: installation's running attempt.
INSTALLATION_MARKER = "TAU_AGENT_INSTALLATION"


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    state: str  # R, S, D, Z, T, ...
    process_group: int
    session: int
    start_ticks: int

    @property
    def is_zombie(self) -> bool:
        return self.state in {"Z", "X"}


def read_process(pid: int) -> ProcessInfo | None:
    """What ``/proc/<pid>/stat`` says, or None if there is no such process."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is in parentheses and may itself contain ") ".
    _, _, rest = raw.rpartition(b")")
    fields = rest.split()
    try:
        return ProcessInfo(
            pid=pid,
            state=fields[0].decode(),
            process_group=int(fields[2]),
            session=int(fields[3]),
            start_ticks=int(fields[19]),
        )
    except (IndexError, ValueError):
        return None


def start_ticks(pid: int) -> int | None:
    info = read_process(pid)
    return info.start_ticks if info is not None else None


def is_same_process(pid: int, ticks: int | None) -> bool:
    """Whether ``pid`` is still the (living) process that started at ``ticks``."""
    info = read_process(pid)
    if info is None or info.is_zombie:
        return False
    return ticks is None or info.start_ticks == ticks


def all_processes() -> Iterable[ProcessInfo]:
    for name in os.listdir(PROC):
        if name.isdigit():
            info = read_process(int(name))
            if info is not None:
                yield info


def group_members(group: int, *, exclude: int | None = None) -> list[int]:
    """Living (not zombie) members of process group ``group``."""
    return [
        info.pid
        for info in all_processes()
        if info.process_group == group and not info.is_zombie and info.pid != exclude
    ]


def signal_group(group: int, signum: int) -> bool:
    """Send ``signum`` to every process of the group; False if the group is gone."""
    try:
        os.killpg(group, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def has_markers(pid: int, markers: Mapping[str, str]) -> bool:
    """Whether the process's environment contains every ``NAME=value`` of ``markers``."""
    try:
        with open(f"{PROC}/{pid}/environ", "rb") as handle:
            entries = set(handle.read().split(b"\0"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return all(f"{name}={value}".encode() in entries for name, value in markers.items())


def marked_processes(markers: Mapping[str, str]) -> list[int]:
    """Living processes that carry every ``markers`` variable: an attempt whose leader's pid
    was never recorded (the agent died right after starting it) is found this way."""
    return [
        info.pid
        for info in all_processes()
        if not info.is_zombie and has_markers(info.pid, markers)
    ]


def orphaned_group(pid: int, ticks: int | None, markers: Mapping[str, str]) -> list[int]:
    """The living processes of an attempt whose supervisor is gone (an agent that crashed).

    ``pid``/``ticks`` are the leader as recorded. If the leader lives, its whole group is
    the attempt's. If another process owns the pid now, the group cannot exist any more. If
    nobody owns the pid, members of the group may still live: they count only when one of
    them carries the attempt's ``markers`` in its environment.
    """
    leader = read_process(pid)
    if leader is not None:
        if ticks is not None and leader.start_ticks != ticks:
            return []  # the pid was reused: our group is long gone
        return group_members(pid)  # the leader (perhaps a zombie) still holds the number
    members = group_members(pid)
    if members and any(has_markers(member, markers) for member in members):
        return members
    return []


def stop_group(group: int, *, grace: float, poll: float = 0.05) -> bool:
    """SIGTERM the group, wait up to ``grace`` seconds for it to empty, then SIGKILL it.
    Blocking: for recovery at start-up, when nothing else is supervised yet. True if it had
    to use SIGKILL."""
    if not signal_group(group, signal.SIGTERM):
        return False
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not group_members(group):
            return False
        time.sleep(poll)
    killed = signal_group(group, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while group_members(group) and time.monotonic() < deadline:
        time.sleep(poll)
    return killed


def child_exit_status(pid: int) -> tuple[int | None, int | None] | None:
    """(exit code, signal) of our child ``pid`` once it has exited, without reaping it (the
    zombie keeps the pid, and so the process group id, from being reused); None while it
    runs."""
    try:
        result = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return (None, None)
    if result is None or result.si_pid == 0:
        return None
    if result.si_code == os.CLD_EXITED:
        return (result.si_status, None)
    return (None, result.si_status)  # CLD_KILLED or CLD_DUMPED


def signal_name(signum: int) -> str:
    with contextlib.suppress(ValueError):
        return signal.Signals(signum).name
    return f"signal {signum}"
