"""What one local attempt may use — memory, processes, disk — and what holds it to that on
this machine.

The limits:

* **Memory**: what the run was admitted with (``compute.memory`` times ``compute.workers``,
  the amount admission counted), unless the spec sets a higher ``compute.limits.memory``
  (then that, as its pods would get on Kubernetes); its RAM-backed ``/tmp`` and
  ``/dev/shm`` included.
* **Processes**: ``TAU_LOCAL_RUN_PROCESSES`` tasks (processes and threads together, the
  sandbox's own two or three included), so a fork bomb stops at its own limit instead of at
  the machine's ``pid_max``.
* **Disk**: ``TAU_LOCAL_RUN_DISK`` bytes in the folders the run writes (``work/``,
  ``output/``, ``tmp/``, ``shm/`` and the run's ``checkpoints/``, all on the filesystem that
  also holds ``var/`` and the database), and no single file larger than that.

What holds them depends on the machine (``Enforcement``, found once at agent start, said in
its log and in ``VAR_DIR/local-executor.json``, which ``/readyz`` shows):

=============  ===============================================  ===========================
limit          with cgroups (v2 delegated, or v1 writable)       without
=============  ===============================================  ===========================
memory         the attempt's memory cgroup: over it, the kernel  not enforced (admission
               kills inside the attempt only (``oom_killed``,    counts it; the machine's
               "used more than its 512Mi")                       OOM killer picks anyone)
``/tmp``,      tmpfs of at most the memory limit, their pages    the run's ``tmp/`` and
``/dev/shm``   charged to the attempt's cgroup                   ``shm/`` folders on disk:
                                                                 they count against the disk
                                                                 allowance, not RAM
processes      the attempt's pids cgroup, and ``RLIMIT_NPROC``   ``RLIMIT_NPROC`` where it
               where it counts this run alone                    counts this run alone: as
                                                                 root (each run has its own
                                                                 uid), or in the sandbox's
                                                                 user namespace (Linux 5.14
                                                                 and later); else none
disk           the agent measures the folders every few          the same
               seconds and stops the attempt at once when they
               hold more than the allowance (``user_error``,
               "used 1.2 GiB of its 1 GiB disk allowance");
               ``RLIMIT_FSIZE`` caps each file at the allowance
=============  ===============================================  ===========================

The disk allowance is measured, not enforced by the filesystem (project quotas are rarely
set up): between two measurements a run can write what the disk takes in that time, and
``RLIMIT_FSIZE`` keeps each file within the allowance. What is counted is what the files
take on disk (allocated blocks: a sparse file counts what it holds), a file with several
names once. A run with more than ``MAX_ENTRIES`` files and folders is stopped too: walking
them would cost the agent more than the allowance is worth.
"""

from __future__ import annotations

import os
import platform
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from executors.local.agent.cgroups import Cgroups
from tau.quantity import QuantityError, parse_quantity

DISK_CHECK_SECONDS = 2.0
MAX_ENTRIES = 1_000_000
# RLIMIT_NPROC is counted per user namespace from Linux 5.14 on (the "ucounts" rework):
# inside the sandbox's own user namespace it then counts the run's processes only.
_NPROC_PER_NAMESPACE = (5, 14)


@dataclass(frozen=True)
class Allowances:
    """The settings: how many processes, how much disk, per run."""

    processes: int
    disk: int

    @classmethod
    def from_settings(cls) -> Allowances:
        try:
            disk = parse_quantity(settings.TAU_LOCAL_RUN_DISK)
        except QuantityError as exc:
            raise ImproperlyConfigured(f"TAU_LOCAL_RUN_DISK: {exc}") from None
        if disk < 2**20:
            raise ImproperlyConfigured("TAU_LOCAL_RUN_DISK must be at least 1Mi")
        return cls(processes=int(settings.TAU_LOCAL_RUN_PROCESSES), disk=int(disk))


@dataclass(frozen=True)
class AttemptLimits:
    """What one attempt gets, and how."""

    memory: int | None  # bytes, enforced by a memory cgroup; None: not enforced
    processes: int | None  # enforced by a pids cgroup; None: not by a cgroup
    disk: int
    # /tmp and /dev/shm: tmpfs of this many bytes (charged to the memory cgroup), or None:
    # the attempt's tmp/ and shm/ folders on disk.
    tmp_size: int | None
    # For the wrapper, applied to the workload only: name -> value (``resource.RLIMIT_<NAME>``).
    rlimits: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Enforcement:
    """What holds the limits on this machine."""

    allowances: Allowances
    cgroups: Cgroups
    # RLIMIT_NPROC counts this run's processes only (its own uid, or its own user namespace).
    nproc_per_run: bool

    def for_attempt(self, memory: Decimal | int | None) -> AttemptLimits:
        memory_limit = int(memory) if memory and self.cgroups.memory else None
        rlimits = {"fsize": self.allowances.disk}
        if self.nproc_per_run:
            rlimits["nproc"] = self.allowances.processes
        return AttemptLimits(
            memory=memory_limit,
            processes=self.allowances.processes if self.cgroups.pids else None,
            disk=self.allowances.disk,
            tmp_size=memory_limit,
            rlimits=rlimits,
        )

    def describe(self) -> dict[str, str]:
        """Which mechanism holds each limit, in words (the log and ``/readyz``)."""
        memory = self.cgroups.describe("memory")
        pids = self.cgroups.describe("pids")
        processes = f"{self.allowances.processes} per run"
        how = [f"{pids} pids"] if pids else []
        if self.nproc_per_run:
            how.append("RLIMIT_NPROC")
        return {
            "memory": (
                f"each run's memory limit from its spec ({memory} memory)"
                if memory
                else "not enforced (no memory cgroup): admission counts it"
            ),
            "tmp": (
                f"tmpfs of at most the run's memory, charged to it ({memory})"
                if memory
                else "the run's tmp/ and shm/ folders on disk, within its disk allowance"
            ),
            "processes": f"{processes} ({', '.join(how)})" if how else "not limited",
            "disk": (
                f"{bytes_text(self.allowances.disk)} per run (measured every "
                f"{DISK_CHECK_SECONDS:g} s; RLIMIT_FSIZE per file)"
            ),
            **({"cgroups": "; ".join(self.cgroups.reasons)} if self.cgroups.reasons else {}),
        }


def nproc_counts_one_run(*, sandboxed: bool, privileged: bool, release: str | None = None) -> bool:
    """Whether RLIMIT_NPROC, set for the workload, counts that run's processes alone: as root
    each run has a uid of its own; without root, only inside the sandbox's user namespace,
    and only where the kernel counts per namespace (else it would count every process of
    the portal's user)."""
    if privileged:
        return True
    if not sandboxed:
        return False
    return _kernel_version(release or platform.release()) >= _NPROC_PER_NAMESPACE


def _kernel_version(release: str) -> tuple[int, int]:
    numbers = []
    for part in release.split(".")[:2]:
        digits = "".join(character for character in part if character.isdigit())
        numbers.append(int(digits or 0))
    while len(numbers) < 2:
        numbers.append(0)
    return numbers[0], numbers[1]


# --- the disk allowance -----------------------------------------------------------------


@dataclass(frozen=True)
class DiskUsage:
    by_folder: Mapping[str, int]  # folder label -> bytes on disk
    entries: int
    too_many_entries: bool = False

    @property
    def total(self) -> int:
        return sum(self.by_folder.values())


def measure(folders: Mapping[str, Path], *, max_entries: int = MAX_ENTRIES) -> DiskUsage:
    """What ``folders`` (label -> folder) hold on disk. Nothing is followed: a symbolic link
    counts as itself, and each folder is walked through descriptors (``os.fwalk``), so a
    folder swapped for a link while it is walked is not entered."""
    used: dict[str, int] = {}
    seen_links: set[tuple[int, int]] = set()
    entries = 0
    for label, folder in folders.items():
        total = 0
        try:
            top = os.lstat(folder)
        except OSError:
            used[label] = 0
            continue
        if not stat.S_ISDIR(top.st_mode):
            used[label] = 0
            continue
        total += top.st_blocks * 512
        walk = os.fwalk(folder, follow_symlinks=False)
        for _, folder_names, file_names, folder_fd in walk:
            for name in (*folder_names, *file_names):
                entries += 1
                if entries > max_entries:
                    used[label] = total
                    return DiskUsage(used, entries - 1, too_many_entries=True)
                try:
                    info = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
                except OSError:
                    continue  # removed meanwhile
                if info.st_nlink > 1 and not stat.S_ISDIR(info.st_mode):
                    identity = (info.st_dev, info.st_ino)
                    if identity in seen_links:
                        continue
                    seen_links.add(identity)
                total += info.st_blocks * 512
        used[label] = total
    return DiskUsage(used, entries)


def overrun(usage: DiskUsage, allowance: int) -> str | None:
    """Why the attempt must stop (None while it is within its allowance)."""
    if usage.too_many_entries:
        return (
            f"Stopped: its folders hold more than {MAX_ENTRIES} files and folders, more than "
            "the local executor measures for its disk allowance."
        )
    if usage.total <= allowance:
        return None
    largest = sorted(usage.by_folder.items(), key=lambda item: -item[1])
    # The folders that matter: an empty one's few KiB would only hide them.
    where = ", ".join(
        f"{label} {bytes_text(size)}" for label, size in largest if size * 20 >= usage.total
    )
    return (
        f"Stopped: it used {bytes_text(usage.total)} of its {bytes_text(allowance)} disk "
        f"allowance ({where}). The allowance is this machine's TAU_LOCAL_RUN_DISK; keep data "
        "and outputs smaller, or ask an administrator for more."
    )


def bytes_text(size: int) -> str:
    """``1.2 GiB``, ``512 MiB``, ``300 bytes``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            value = size / scale
            return f"{value:.1f} {unit}".replace(".0 ", " ")
    return f"{size} bytes"
