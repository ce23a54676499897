"""The seccomp filter every sandboxed command runs under (bwrap's ``--seccomp FD``).

The mount namespace and the run's own uid keep a workload away from what it must not see;
this filter keeps it from the kernel interfaces that would let it rebuild what the sandbox
took away, or reach the host through the kernel itself. Without it, a workload could create
a user namespace of its own (``unshare -U -r``: uid 0 inside, with every capability over new
mount namespaces) and mount over what the sandbox showed it, and reach kernel features that
are the usual starting points of a local privilege escalation.

The filter is a deny list (everything else is allowed): a training job runs arbitrary
Python, CUDA, compilers and debuggers, and an allow list would break them in ways nobody can
predict. It is a classic BPF program built here from the table below, for the machine's own
architecture only:

* **Architecture.** A system call made through another ABI (32-bit ``int 0x80`` on x86_64,
  or x32, whose numbers carry bit 30) would be numbered differently and slip past the
  table: such a call kills the process (``SIGSYS``). 32-bit programs therefore cannot run in
  the sandbox. The filter exists for x86_64 and aarch64; on any other architecture
  ``filter_program`` refuses, and the agent runs no sandbox at all (it says so) rather
  than one without the filter.
* **Namespaces** (``EPERM``): ``unshare`` and ``clone`` with any ``CLONE_NEW*`` flag, and
  ``setns``. Nested user namespaces are what gave ``unshare -U -r -m`` uid 0 and a mount over
  ``/usr`` inside a run; the others need a capability the workload lacks, and are refused
  here too so that a kernel bug in one of them is not reachable. ``clone3`` passes its flags
  in memory a filter cannot read, so it answers ``ENOSYS``, as on a kernel older than 5.3:
  the C library then falls back to ``clone``, which is checked (threads and
  ``subprocess`` keep working). A sandbox inside a run (Chromium's, ``bwrap``) cannot
  start: run such programs with their sandbox switched off.
* **Mounts** (``EPERM``): ``mount``, ``umount2``, ``pivot_root``, ``chroot``; the newer mount
  API (``open_tree``, ``move_mount``, ``fsopen``, ``fsconfig``, ``fsmount``, ``fspick``,
  ``mount_setattr``) answers ``ENOSYS`` so that tools fall back to ``mount``, whose
  ``EPERM`` they report plainly.
* **Kernel keyrings** (``EPERM``): ``add_key``, ``keyctl``, ``request_key`` — keys are not
  namespaced, so they are shared with the host.
* **Kernel attack surface** a training job does not need: ``bpf``, ``perf_event_open``
  (``EPERM``), ``userfaultfd`` (``EPERM``; it makes kernel races easy to win), ``io_uring``
  (``io_uring_setup``/``_enter``/``_register`` answer ``ENOSYS``, as where it is switched
  off: libraries fall back to ordinary I/O), ``modify_ldt`` (x86, 16-bit segments),
  ``uselib``, ``lookup_dcookie``, ``vhangup``, ``personality`` with anything but the plain Linux
  personas (``READ_IMPLIES_EXEC``, ``MMAP_PAGE_ZERO`` and ``ADDR_NO_RANDOMIZE`` weaken
  exploit mitigations), and the ``TIOCSTI``/``TIOCLINUX`` terminal ioctls (typing into a
  terminal the run might share).
* **The host's own controls** (``EPERM``; most need a capability the workload lacks, denied
  all the same): ``kexec_load``, ``kexec_file_load``, ``init_module``, ``finit_module``,
  ``delete_module``, ``reboot``, ``swapon``, ``swapoff``, ``acct``, ``quotactl``,
  ``quotactl_fd``, ``syslog`` (the kernel log), ``iopl`` and ``ioperm`` (x86 I/O ports),
  ``open_by_handle_at`` and ``name_to_handle_at`` (opening files by handle skips the path,
  and with it the mount namespace: the "shocker" escape).

Allowed on purpose: ``ptrace`` and ``process_vm_readv``/``writev``. Debuggers and profilers
(gdb, py-spy, faulthandler's tools) need them, a workload can only trace its own processes
(each run has its own uid and pid namespace, and the wrapper makes itself non-dumpable), and
since Linux 4.8 a traced process cannot use ptrace to skip the filter. NUMA calls (``mbind``,
``set_mempolicy``, ``migrate_pages``, ``move_pages``) are allowed for the same reason: data
loaders and ``numactl`` use them on large machines.

The same choices, made independently, can be compared with Docker's default profile (an
allow list that denies these through missing capabilities) and Flatpak's deny list.
"""

from __future__ import annotations

import errno
import platform
import struct
import sys
from dataclasses import dataclass

# Linux's <linux/audit.h> values for the two architectures the filter is built for.
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_X32_SYSCALL_BIT = 0x40000000

# seccomp return values (<linux/seccomp.h>).
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000

# Classic BPF opcodes (<linux/bpf_common.h>).
_LOAD_WORD = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JUMP_EQUAL = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JUMP_AT_LEAST = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JUMP_ANY_BIT = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RETURN = 0x06  # BPF_RET | BPF_K

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6].
_NR_OFFSET = 0
_ARCH_OFFSET = 4
_ARGS_OFFSET = 16

CLONE_NEWTIME = 0x00000080
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
# In clone()'s flags the lowest byte is the exit signal, so CLONE_NEWTIME (0x80) cannot be
# asked for there (only through unshare and clone3).
CLONE_NAMESPACES = (
    CLONE_NEWNS
    | CLONE_NEWCGROUP
    | CLONE_NEWUTS
    | CLONE_NEWIPC
    | CLONE_NEWUSER
    | CLONE_NEWPID
    | CLONE_NEWNET
)
UNSHARE_NAMESPACES = CLONE_NAMESPACES | CLONE_NEWTIME

# personality(2): PER_LINUX, PER_LINUX32, UNAME26, UNAME26|PER_LINUX32, and the query.
ALLOWED_PERSONAS = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
TIOCSTI = 0x5412
TIOCLINUX = 0x541C

# System call numbers: x86_64's own table, and the generic table aarch64 uses.
_NUMBERS: dict[str, dict[str, int]] = {
    "x86_64": {
        "syslog": 103,
        "personality": 135,
        "uselib": 134,
        "vhangup": 153,
        "modify_ldt": 154,
        "pivot_root": 155,
        "chroot": 161,
        "acct": 163,
        "mount": 165,
        "umount2": 166,
        "swapon": 167,
        "swapoff": 168,
        "reboot": 169,
        "iopl": 172,
        "ioperm": 173,
        "init_module": 175,
        "delete_module": 176,
        "quotactl": 179,
        "lookup_dcookie": 212,
        "kexec_load": 246,
        "add_key": 248,
        "request_key": 249,
        "keyctl": 250,
        "unshare": 272,
        "perf_event_open": 298,
        "name_to_handle_at": 303,
        "open_by_handle_at": 304,
        "setns": 308,
        "finit_module": 313,
        "kexec_file_load": 320,
        "bpf": 321,
        "userfaultfd": 323,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "clone3": 435,
        "mount_setattr": 442,
        "quotactl_fd": 443,
        "clone": 56,
        "ioctl": 16,
    },
    "aarch64": {
        "lookup_dcookie": 18,
        "ioctl": 29,
        "umount2": 39,
        "mount": 40,
        "pivot_root": 41,
        "chroot": 51,
        "vhangup": 58,
        "quotactl": 60,
        "acct": 89,
        "personality": 92,
        "unshare": 97,
        "kexec_load": 104,
        "init_module": 105,
        "delete_module": 106,
        "syslog": 116,
        "reboot": 142,
        "add_key": 217,
        "request_key": 218,
        "keyctl": 219,
        "clone": 220,
        "swapon": 224,
        "swapoff": 225,
        "perf_event_open": 241,
        "name_to_handle_at": 264,
        "open_by_handle_at": 265,
        "setns": 268,
        "finit_module": 273,
        "bpf": 280,
        "userfaultfd": 282,
        "kexec_file_load": 294,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "clone3": 435,
        "mount_setattr": 442,
        "quotactl_fd": 443,
    },
}


@dataclass(frozen=True)
class Denied:
    """A system call the filter refuses: always, or when ``argument`` matches."""

    syscall: str
    answer: int  # the errno it gets
    why: str
    # (argument index, mask): refused when any of these bits is set in that argument.
    any_bit: tuple[int, int] | None = None
    # (argument index, values): refused unless the argument is one of these.
    unless_one_of: tuple[int, tuple[int, ...]] | None = None
    # (argument index, values): refused when the argument is one of these.
    when_one_of: tuple[int, tuple[int, ...]] | None = None


_NAMESPACE = "a namespace of its own would undo the sandbox (a user namespace gives uid 0)"
_MOUNT = "mounting would change what the sandbox shows"
_NEW_MOUNT_API = "the new mount API; ENOSYS so tools fall back to mount(2), which says EPERM"
_KEYS = "kernel keyrings are not namespaced: shared with the host"
_HOST = "controls the whole machine"
_SURFACE = "kernel attack surface a training job does not need"
_HANDLES = "opens files by handle, past the mount namespace"

DENIED: tuple[Denied, ...] = (
    Denied("unshare", errno.EPERM, _NAMESPACE, any_bit=(0, UNSHARE_NAMESPACES)),
    Denied("clone", errno.EPERM, _NAMESPACE, any_bit=(0, CLONE_NAMESPACES)),
    Denied("clone3", errno.ENOSYS, "its flags cannot be checked; libc falls back to clone"),
    Denied("setns", errno.EPERM, _NAMESPACE),
    Denied("mount", errno.EPERM, _MOUNT),
    Denied("umount2", errno.EPERM, _MOUNT),
    Denied("pivot_root", errno.EPERM, _MOUNT),
    Denied("chroot", errno.EPERM, _MOUNT),
    *(
        Denied(name, errno.ENOSYS, _NEW_MOUNT_API)
        for name in (
            "open_tree",
            "move_mount",
            "fsopen",
            "fsconfig",
            "fsmount",
            "fspick",
            "mount_setattr",
        )
    ),
    Denied("add_key", errno.EPERM, _KEYS),
    Denied("keyctl", errno.EPERM, _KEYS),
    Denied("request_key", errno.EPERM, _KEYS),
    Denied("bpf", errno.EPERM, _SURFACE),
    Denied("perf_event_open", errno.EPERM, _SURFACE),
    Denied("userfaultfd", errno.EPERM, "makes kernel races easy to win"),
    Denied("io_uring_setup", errno.ENOSYS, _SURFACE + "; libraries fall back to plain I/O"),
    Denied("io_uring_enter", errno.ENOSYS, _SURFACE),
    Denied("io_uring_register", errno.ENOSYS, _SURFACE),
    Denied("modify_ldt", errno.EPERM, "16-bit segments: " + _SURFACE),
    Denied("uselib", errno.EPERM, "obsolete"),
    Denied("lookup_dcookie", errno.EPERM, "obsolete profiling interface"),
    Denied("vhangup", errno.EPERM, "hangs up a terminal"),
    Denied(
        "personality",
        errno.EPERM,
        "only the plain Linux personas: the others switch off exploit mitigations",
        unless_one_of=(0, ALLOWED_PERSONAS),
    ),
    Denied(
        "ioctl",
        errno.EPERM,
        "TIOCSTI and TIOCLINUX type into a terminal",
        when_one_of=(1, (TIOCSTI, TIOCLINUX)),
    ),
    *(
        Denied(name, errno.EPERM, _HOST)
        for name in (
            "kexec_load",
            "kexec_file_load",
            "init_module",
            "finit_module",
            "delete_module",
            "reboot",
            "swapon",
            "swapoff",
            "acct",
            "quotactl",
            "quotactl_fd",
            "syslog",
            "iopl",
            "ioperm",
        )
    ),
    Denied("open_by_handle_at", errno.EPERM, _HANDLES),
    Denied("name_to_handle_at", errno.EPERM, _HANDLES),
)


class SeccompUnsupported(RuntimeError):
    """No filter can be built for this machine's architecture; the message says so."""


def machine() -> str:
    return platform.machine()


def number_of(syscall: str, architecture: str | None = None) -> int:
    """The number of a system call the filter knows, on this machine (or ``architecture``)."""
    return _NUMBERS[architecture or machine()][syscall]


def filter_program(architecture: str | None = None) -> bytes:
    """The filter as bwrap reads it from ``--seccomp FD``: an array of ``struct
    sock_filter`` in the machine's byte order. Raises SeccompUnsupported for an
    architecture it does not know (fail closed: no sandbox without the filter)."""
    architecture = architecture or machine()
    numbers = _NUMBERS.get(architecture)
    if numbers is None:
        known = " and ".join(sorted(_NUMBERS))
        raise SeccompUnsupported(
            f"no seccomp filter for this machine's architecture ({architecture}); "
            f"TauGrid builds one for {known}"
        )
    program: list[tuple[int, int, int, int]] = [
        (_LOAD_WORD, 0, 0, _ARCH_OFFSET),
        (_JUMP_EQUAL, 1, 0, AUDIT_ARCH[architecture]),
        (_RETURN, 0, 0, _RET_KILL_PROCESS),  # another ABI: other numbers
        (_LOAD_WORD, 0, 0, _NR_OFFSET),
    ]
    if architecture == "x86_64":
        program += [
            (_JUMP_AT_LEAST, 0, 2, _X32_SYSCALL_BIT),
            (_JUMP_EQUAL, 1, 0, 0xFFFFFFFF),  # -1: a tracer skipped the call
            (_RETURN, 0, 0, _RET_KILL_PROCESS),  # x32
        ]
    for rule in DENIED:
        number = numbers.get(rule.syscall)
        if number is not None:  # iopl, ioperm, modify_ldt, uselib: x86 only
            program += _rule(number, rule)
    program.append((_RETURN, 0, 0, _RET_ALLOW))
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


def _argument_offset(index: int) -> int:
    """Where the low 32 bits of argument ``index`` are (the flags and values checked here
    all live there: the kernel ignores the upper half of clone's and unshare's flags)."""
    return _ARGS_OFFSET + 8 * index + (4 if sys.byteorder == "big" else 0)


def _rule(number: int, rule: Denied) -> list[tuple[int, int, int, int]]:
    """The instructions of one rule. The accumulator holds the call's number on entry; a
    block whose number matched ends in a return, so the next block sees the number still."""
    deny = (_RETURN, 0, 0, _RET_ERRNO | rule.answer)
    allow = (_RETURN, 0, 0, _RET_ALLOW)
    body: list[tuple[int, int, int, int]]
    if rule.any_bit is not None:
        index, mask = rule.any_bit
        body = [(_LOAD_WORD, 0, 0, _argument_offset(index)), (_JUMP_ANY_BIT, 0, 1, mask)]
        body += [deny, allow]
    elif rule.unless_one_of is not None:
        index, values = rule.unless_one_of
        body = [(_LOAD_WORD, 0, 0, _argument_offset(index))]
        # From the i-th comparison, the allow at the end is len(values) - i further on.
        body += [(_JUMP_EQUAL, len(values) - i, 0, value) for i, value in enumerate(values)]
        body += [deny, allow]
    elif rule.when_one_of is not None:
        index, values = rule.when_one_of
        body = [(_LOAD_WORD, 0, 0, _argument_offset(index))]
        # From the i-th comparison, the deny is len(values) - 1 - i further on.
        body += [
            (_JUMP_EQUAL, len(values) - 1 - i, 1 if i == len(values) - 1 else 0, value)
            for i, value in enumerate(values)
        ]
        body += [deny, allow]
    else:
        body = [deny]
    return [(_JUMP_EQUAL, 0, len(body), number), *body]
