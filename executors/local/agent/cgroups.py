"""Control groups for local attempts: each attempt in a cgroup of its own that holds its
memory (the page cache and the RAM-backed ``/tmp`` included) and its number of processes.

Two kinds of machine give the agent cgroups:

* **cgroup v2 with delegation**: the agent's own cgroup (``/proc/self/cgroup``, line
  ``0::``) offers the ``memory`` and ``pids`` controllers and the agent may write there
  (root, or a cgroup delegated to its user, e.g. systemd's ``Delegate=yes``). v2 forbids
  processes in a cgroup whose children use controllers, so when the agent's cgroup holds
  only the agent, the agent moves itself into a leaf (``taugrid-agent-<key>``) first; when
  other processes share it (the web server under ``make run``, say), v2 is not used and
  the log says why.
* **cgroup v1** (the "hybrid" layout of older systemd and of many containers): the
  ``memory`` and ``pids`` hierarchies are mounted and writable (root). Each controller is
  used when its hierarchy is there, independently.

Attempts' cgroups live below the agent's own cgroup (its limits stay above theirs), in a
folder per installation, ``taugrid-<key>`` (the key is derived from ``VAR_DIR``: two
installations on one machine, or two test agents, never touch each other's), named
``run-<run id>-attempt-<n>``. The agent creates one before the attempt starts, with
``memory.max`` (v2) or ``memory.limit_in_bytes`` (v1) set to the memory the run was
admitted with, and no swap beyond it, and ``pids.max`` to the process limit; the attempt's
first process enters it before it becomes the sandbox (``enter_command``), so nothing the
attempt starts is ever outside it. When the attempt has ended, whatever is left in it is
killed and the cgroup removed (``release``); at start, and every sweep, the folders of
attempts no agent supervises are removed the same way (``remove_stale``), so a crashed
agent's cgroups do not outlive the next start.

Without either, nothing here is used: ``run_limits`` says what holds instead.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

CONTROLLERS = ("memory", "pids")
ATTEMPT_PREFIX = "run-"
RELEASE_WAIT_SECONDS = 1.0

# Run by the base interpreter (-I -S) as the attempt's first process: it writes its own pid
# into each cgroup's process list, then becomes the attempt's command (the same pid, so the
# agent's process group and start time are unchanged). Nothing it starts is outside.
ENTER_SCRIPT = """\
import os, sys
arguments = sys.argv[1:]
cut = arguments.index("--")
for path in arguments[:cut]:
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(descriptor, str(os.getpid()).encode())
        finally:
            os.close(descriptor)
    except OSError as exc:
        sys.stderr.write(f"[taugrid] could not enter the attempt's cgroup {path}: {exc}\\n")
        sys.exit(126)
os.execv(arguments[cut + 1], arguments[cut + 1 :])
"""


class CgroupFailed(RuntimeError):
    """An attempt's cgroup could not be made; the message says why."""


def installation_key(var_dir: Path) -> str:
    """A short name for this installation, from its ``VAR_DIR``."""
    return hashlib.sha256(str(var_dir.resolve()).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Hierarchy:
    """Where one or more controllers are written: a folder of the installation in a
    mounted cgroup hierarchy."""

    version: int  # 1 or 2
    controllers: tuple[str, ...]
    base: Path  # .../taugrid-<key>


@dataclass(frozen=True)
class Cgroups:
    """The cgroup hierarchies this agent uses, and why the others are not."""

    hierarchies: tuple[Hierarchy, ...] = ()
    reasons: tuple[str, ...] = ()  # why a controller is not used

    @property
    def memory(self) -> bool:
        return any("memory" in hierarchy.controllers for hierarchy in self.hierarchies)

    @property
    def pids(self) -> bool:
        return any("pids" in hierarchy.controllers for hierarchy in self.hierarchies)

    def describe(self, controller: str) -> str | None:
        """``cgroup v2`` or ``cgroup v1``, for the controller that is used; else None."""
        for hierarchy in self.hierarchies:
            if controller in hierarchy.controllers:
                return f"cgroup v{hierarchy.version}"
        return None

    def create(self, name: str, *, memory: int | None, processes: int | None) -> AttemptCgroup:
        """The attempt's cgroup in each hierarchy, with its limits written. Raises
        CgroupFailed (and leaves nothing behind) when the kernel refuses."""
        made: list[tuple[Hierarchy, Path]] = []
        try:
            for hierarchy in self.hierarchies:
                directory = hierarchy.base / name
                with contextlib.suppress(FileExistsError):  # left by a crash: reused
                    directory.mkdir()
                made.append((hierarchy, directory))
                _write_limits(hierarchy, directory, memory=memory, processes=processes)
        except OSError as exc:
            for _, directory in made:
                with contextlib.suppress(OSError):
                    directory.rmdir()
            raise CgroupFailed(f"could not make the attempt's cgroup {name}: {exc}") from None
        return AttemptCgroup(name=name, directories=tuple(made))

    def close(self) -> None:
        """At the agent's stop: remove the installation's folders when no attempt's cgroup
        is left in them (one that is stays, for the next start to remove)."""
        for hierarchy in self.hierarchies:
            with contextlib.suppress(OSError):
                hierarchy.base.rmdir()

    def remove_stale(self, keep: Iterable[str]) -> list[str]:
        """Remove the attempt cgroups that are not in ``keep`` (the names of attempts this
        agent supervises): killing what is left in them first. The names removed."""
        kept = set(keep)
        stale: dict[str, list[tuple[Hierarchy, Path]]] = {}
        for hierarchy in self.hierarchies:
            try:
                entries = list(os.scandir(hierarchy.base))
            except OSError:
                continue
            for entry in entries:
                if (
                    entry.name.startswith(ATTEMPT_PREFIX)
                    and entry.name not in kept
                    and entry.is_dir(follow_symlinks=False)
                ):
                    stale.setdefault(entry.name, []).append((hierarchy, Path(entry.path)))
        removed = []
        for name, directories in sorted(stale.items()):
            if AttemptCgroup(name=name, directories=tuple(directories)).release():
                removed.append(name)
        return removed


@dataclass
class AttemptCgroup:
    name: str
    directories: tuple[tuple[Hierarchy, Path], ...]
    released: bool = field(default=False)

    def enter_command(self, command: list[str], *, python: str) -> list[str]:
        """``command``, started so that its first process is in this cgroup before it runs."""
        procs = [str(directory / "cgroup.procs") for _, directory in self.directories]
        return [python, "-I", "-S", "-c", ENTER_SCRIPT, *procs, "--", *command]

    def oom_kills(self) -> int:
        """How many processes the kernel killed in it for going over its memory limit."""
        for hierarchy, directory in self.directories:
            if "memory" not in hierarchy.controllers:
                continue
            name = "memory.events" if hierarchy.version == 2 else "memory.oom_control"
            try:
                text = (directory / name).read_text()
            except OSError:
                return 0
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    return int(value)
        return 0

    def release(self) -> bool:
        """Kill whatever is still in it and remove it; False when the kernel still holds
        it (a process that takes long to die): the next sweep tries again."""
        deadline = time.monotonic() + RELEASE_WAIT_SECONDS
        left = list(self.directories)
        while left:
            for hierarchy, directory in list(left):
                _kill_members(hierarchy, directory)
                try:
                    directory.rmdir()
                except FileNotFoundError:
                    left.remove((hierarchy, directory))
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        return False
                else:
                    left.remove((hierarchy, directory))
            if not left:
                break
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        self.released = True
        return True


def _write_limits(
    hierarchy: Hierarchy, directory: Path, *, memory: int | None, processes: int | None
) -> None:
    if "memory" in hierarchy.controllers and memory is not None:
        if hierarchy.version == 2:
            _write(directory / "memory.max", str(memory))
            # No swap beyond the limit: the limit is what the run was admitted with.
            _write_if_present(directory / "memory.swap.max", "0")
        else:
            # memory+swap may never be below memory: lift it first (a reused cgroup may
            # hold a lower one), then set both.
            _write_if_present(directory / "memory.memsw.limit_in_bytes", "-1")
            _write(directory / "memory.limit_in_bytes", str(memory))
            _write_if_present(directory / "memory.memsw.limit_in_bytes", str(memory))
    if "pids" in hierarchy.controllers and processes is not None:
        _write(directory / "pids.max", str(processes))


def _kill_members(hierarchy: Hierarchy, directory: Path) -> None:
    if hierarchy.version == 2 and (directory / "cgroup.kill").exists():
        with contextlib.suppress(OSError):
            _write(directory / "cgroup.kill", "1")
        return
    try:
        members = (directory / "cgroup.procs").read_text().split()
    except OSError:
        return
    for pid in members:
        with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def _write(path: Path, value: str) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(descriptor, value.encode())
    finally:
        os.close(descriptor)


def _write_if_present(path: Path, value: str) -> None:
    if path.exists():
        _write(path, value)


# --- finding the hierarchies -------------------------------------------------------------


@dataclass(frozen=True)
class _Mount:
    point: Path
    root: str  # the hierarchy's folder that is mounted there (not "/" in some containers)
    fstype: str
    options: frozenset[str]

    def folder(self, path: str) -> Path:
        """Where the hierarchy's ``path`` (as ``/proc/self/cgroup`` says) is mounted."""
        if self.root != "/" and (path == self.root or path.startswith(self.root + "/")):
            path = path[len(self.root) :]
        return self.point / path.lstrip("/")


def _mounts(mountinfo: str) -> list[_Mount]:
    """cgroup and cgroup2 mounts from ``/proc/self/mountinfo``'s text."""
    found = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in {"cgroup", "cgroup2"}:
            continue
        point = fields[4].replace("\\040", " ")
        found.append(_Mount(Path(point), fields[3], tail[0], frozenset(tail[2].split(","))))
    return found


def _own_paths(proc_cgroup: str) -> dict[str, str]:
    """controller -> this process's cgroup path (``""`` for the v2 line)."""
    paths: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            paths[""] = path
        for controller in controllers.split(","):
            if controller:
                paths[controller] = path
    return paths


def detect(
    var_dir: Path,
    *,
    mountinfo: str | None = None,
    proc_cgroup: str | None = None,
    pid: int | None = None,
) -> Cgroups:
    """The hierarchies this agent can use, set up for use (the installation's folders made,
    controllers enabled). ``mountinfo``/``proc_cgroup``/``pid`` are this process's by
    default (tests give others)."""
    if mountinfo is None:
        mountinfo = _read("/proc/self/mountinfo")
    if proc_cgroup is None:
        proc_cgroup = _read("/proc/self/cgroup")
    pid = os.getpid() if pid is None else pid
    key = installation_key(var_dir)
    mounts = _mounts(mountinfo)
    own = _own_paths(proc_cgroup)
    reasons: list[str] = []
    unified = next((mount for mount in mounts if mount.fstype == "cgroup2"), None)
    if unified is not None and "" in own:
        try:
            return Cgroups(hierarchies=(_set_up_v2(unified, own[""], key, pid),))
        except _NotUsable as exc:
            reasons.append(f"cgroup v2: {exc}")
    hierarchies = []
    for controller in CONTROLLERS:
        mount = next((m for m in mounts if m.fstype == "cgroup" and controller in m.options), None)
        if mount is None or controller not in own:
            reasons.append(f"cgroup v1: no {controller} hierarchy is mounted")
            continue
        base = mount.folder(own[controller]) / f"taugrid-{key}"
        try:
            base.mkdir(exist_ok=True)
        except OSError as exc:
            reasons.append(f"cgroup v1: cannot write the {controller} hierarchy ({exc.strerror})")
            continue
        hierarchies.append(Hierarchy(version=1, controllers=(controller,), base=base))
    if len(hierarchies) == len(CONTROLLERS):
        # cgroup v1 holds every limit: why v2 could not is not worth a line at start-up.
        return Cgroups(hierarchies=tuple(hierarchies))
    return Cgroups(hierarchies=tuple(hierarchies), reasons=tuple(reasons))


class _NotUsable(Exception):
    pass


def _set_up_v2(mount: _Mount, own: str, key: str, pid: int) -> Hierarchy:
    here = mount.folder(own)
    try:
        offered = set((here / "cgroup.controllers").read_text().split())
    except OSError as exc:
        raise _NotUsable(f"cannot read {here / 'cgroup.controllers'} ({exc.strerror})") from None
    missing = [controller for controller in CONTROLLERS if controller not in offered]
    if missing:
        raise _NotUsable(
            f"the agent's cgroup {own} is not given the {' and '.join(missing)} controller"
            f"{'s' if len(missing) > 1 else ''} (it has: {', '.join(sorted(offered)) or 'none'})"
        )
    if not os.access(here, os.W_OK):
        raise _NotUsable(f"the agent may not write its cgroup {own} (not delegated to it)")
    _enable_controllers(here, own, key, pid)
    base = here / f"taugrid-{key}"
    try:
        base.mkdir(exist_ok=True)
        _write(base / "cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS))
    except OSError as exc:
        raise _NotUsable(f"cannot set up {base} ({exc.strerror})") from None
    return Hierarchy(version=2, controllers=CONTROLLERS, base=base)


def _enable_controllers(here: Path, own: str, key: str, pid: int) -> None:
    """Let the children of the agent's cgroup use memory and pids. v2 allows that only in a
    cgroup without processes of its own (the root excepted): the agent moves into a leaf."""
    control = here / "cgroup.subtree_control"
    try:
        enabled = set(control.read_text().split())
    except OSError as exc:
        raise _NotUsable(f"cannot read {control} ({exc.strerror})") from None
    if all(controller in enabled for controller in CONTROLLERS):
        return
    wanted = " ".join(f"+{c}" for c in CONTROLLERS)
    try:
        _write(control, wanted)
        return
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise _NotUsable(f"cannot enable memory and pids in {own} ({exc.strerror})") from None
    leaf = here / f"taugrid-agent-{key}"
    try:
        leaf.mkdir(exist_ok=True)
        _write(leaf / "cgroup.procs", str(pid))
    except OSError as exc:
        raise _NotUsable(f"cannot move the agent into {leaf} ({exc.strerror})") from None
    try:
        _write(control, wanted)
    except OSError as exc:
        with contextlib.suppress(OSError):
            _write(here / "cgroup.procs", str(pid))
            leaf.rmdir()
        others = "other processes share the agent's cgroup" if exc.errno == errno.EBUSY else ""
        raise _NotUsable(
            f"cannot enable memory and pids in {own}: {others or exc.strerror} (run the agent "
            "in a cgroup of its own, e.g. a systemd service with Delegate=yes)"
        ) from None


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return ""
