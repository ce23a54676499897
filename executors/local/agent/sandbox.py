"""The sandbox a local attempt runs in: bubblewrap (``bwrap``, Debian's ``bubblewrap``).

What a workload sees. A private mount namespace built from nothing: the system (``/usr``
and the few files of ``/etc`` that programs need to run and resolve names, all read-only),
the base Python the run's virtual environment was made from (read-only), that virtual
environment (read-only), and its own run's folders — ``work/``, ``output/``, ``tmp/``, the
run's ``checkpoints/`` and the wrapper's ``status/`` — at the same paths as on the host, so
``TAU_OUTPUT_DIR`` and the other variables mean the same inside and out. ``/tmp`` is its own
(see below), ``/proc`` belongs to a new pid namespace (it sees only its own processes),
``/dev`` is a minimal one (plus the NVIDIA devices when the run was given GPUs). Nothing else exists
for it: not ``var/`` (the secret key, the token pepper, the database, the demo passwords,
the broker's files, other runs, other runs' logs and tokens), not the checkout, not the
portal's home. The network is shared: requirements are installed before the run starts,
but workloads commonly download data sets and models.

Which user. The mount namespace is what isolates: a file that is not mounted cannot be
opened by any uid. The uid is the second wall, for whatever is mounted:

* When the agent runs as root, a user namespace alone would not do: bwrap's
  ``--unshare-user --uid 65534`` only renames root inside; outside, the process is still
  uid 0, so every root-owned file in a bind mount (a 0600 secret included) passes the owner
  check, and an escape would be root's. So bwrap runs privileged, without a user namespace,
  keeps no capability but CAP_SETUID and CAP_SETGID, and the wrapper (our own code) starts
  the workload as a real unprivileged uid of its own: ``RUN_UID_BASE + run id`` (modulo
  ``RUN_UID_SPAN``). Each run has its own uid, so two runs cannot signal, trace or write
  each other's processes and files even if a mount were shared, and a fork bomb counts
  against its own process limit; attempts of one run share the uid, so a retry can replace
  the checkpoints the earlier attempt wrote. The wrapper stays root in the sandbox to write
  the outcome file the workload cannot forge (``wrapper.py``). Requirements are installed
  in the same kind of sandbox as ``BUILD_UID``, and the finished environment is given back
  to root, so no run's uid can write it even through a writable mount.
* Without root, bwrap creates an unprivileged user namespace and the workload runs as the
  portal's own uid: the mount namespace is the whole isolation (``--disable-userns`` and
  the seccomp filter keep the workload from nesting namespaces of its own).

Whose environment. bwrap runs outside the sandbox (as root, when the agent is), so it must
never see a variable the run chose: ``runtime.env`` may name ``LD_PRELOAD=./evil.so``, and
the dynamic loader of a root process started in the run's folder would load the run's
library before any namespace exists. bwrap (and the wrapper inside) get a fixed environment
of the agent's; the workload's own reaches the wrapper through a memory file descriptor
(``ENVIRONMENT_FD``, made by ``start``), never a file or a command line (it holds the run
token), and only the workload is started with it.

The process group is the agent's handle: bwrap does not start a new session, so the
workload, the wrapper and bwrap's own pid 1 of the namespace are in the group the agent
signals; a SIGKILL to the group kills that pid 1, and with it everything left in the
namespace (even processes that left the group with ``setsid``).

No namespaces of its own, no kernel escape hatches. Every sandboxed command runs under a
seccomp filter (``seccomp``, bwrap's ``--seccomp``) that refuses new namespaces (a nested
user namespace would give the workload uid 0 and mounts of its own), mounts, kernel keyrings
and the other usual escape routes, in both modes; without root, ``--disable-userns`` says
the same to the kernel once more. A machine whose architecture the filter does not know
gets no sandbox (fail closed), with that reason.

``/tmp`` and ``/dev/shm`` are tmpfs of at most the run's memory when a memory cgroup holds
the run (their pages are charged to the run), else the run's own ``tmp/`` and ``shm/``
folders on disk, within its disk allowance (``run_limits``): never RAM that nobody is
charged for. ``/dev`` itself is read-only (without root its tmpfs would be the workload's).

``detect`` runs a probe at agent start (it also checks that the filter is in force: a user
namespace must be refused inside); the agent reports what it found in its log and in
``VAR_DIR/local-executor.json`` (shown by ``/readyz``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executors.local.agent import processes, seccomp

RUN_UID_BASE = 2_000_000_000
RUN_UID_SPAN = 100_000_000
BUILD_UID = RUN_UID_BASE - 1
# Endpoints' uids, below the runs' (and below BUILD_UID): an endpoint never shares a uid
# with a run, whatever their ids.
ENDPOINT_UID_BASE = 1_900_000_000
ENDPOINT_UID_SPAN = 99_000_000
WRAPPER = Path(__file__).resolve().with_name("wrapper.py")
WRAPPER_IN_SANDBOX = "/run/taugrid/wrapper.py"
PROBE_TIMEOUT_SECONDS = 20
PROBE_WORD = "taugrid-sandbox-probe"
STATUS_FILE = "local-executor.json"
# In a sandbox's command line, where the seccomp filter's descriptor goes (``start``, ``run``).
SECCOMP_FD = "{seccomp-fd}"
# Where the descriptor of the workload's environment goes (the wrapper reads it, ``start``).
ENVIRONMENT_FD = "{environment-fd}"
# The sandbox's own scratch folders (never the host's: see Layout.tmp_folder).
SANDBOX_TMP = "/tmp"  # noqa: S108
SANDBOX_SHM = "/dev/shm"  # noqa: S108

# Top-level names that are a symlink into /usr on merged-/usr systems, or folders of their own.
_SYSTEM_TOP = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# What programs need from /etc: name resolution, certificates, the dynamic loader, time zones.
_ETC = (
    "resolv.conf",
    "hosts",
    "host.conf",
    "nsswitch.conf",
    "gai.conf",
    "services",
    "protocols",
    "networks",
    "ssl/certs",
    "ssl/openssl.cnf",
    "ca-certificates",
    "ca-certificates.conf",
    "pki/tls/certs",
    "crypto-policies",
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "mime.types",
    "os-release",
    "debian_version",
    "fonts",
)


class SandboxUnavailable(RuntimeError):
    """No sandbox can run on this machine; the message says why."""


@dataclass(frozen=True)
class Detection:
    sandbox: Sandbox | None
    reason: str  # why there is none, or what there is

    def status(self, *, unsandboxed_allowed: bool) -> dict[str, object]:
        return {
            "sandbox": self.sandbox.describe() if self.sandbox else None,
            "reason": self.reason,
            "unsandboxed_allowed": unsandboxed_allowed,
            "pid": os.getpid(),
            "start_ticks": processes.start_ticks(os.getpid()),
        }


@dataclass(frozen=True)
class Layout:
    """What one sandboxed command sees besides the system."""

    command: list[str]
    cwd: Path
    read_only: Sequence[Path] = ()
    writable: Sequence[Path] = ()
    # Host file -> path in the sandbox (read-only), e.g. a generated /etc/passwd.
    files: Sequence[tuple[Path, str]] = ()
    devices: Sequence[Path] = ()
    outcome_dir: Path | None = None
    uid: int | None = None  # privileged sandboxes only: the uid the workload runs as
    log_limit: int | None = None  # the wrapper's cap on the log (its stdout)
    hostname: str = "taugrid-run"
    # /tmp and /dev/shm: host folders mounted there (on disk), else tmpfs of ``tmp_size``
    # bytes each (or of the kernel's default size when None: the agent's own commands).
    tmp_folder: Path | None = None
    shm_folder: Path | None = None
    tmp_size: int | None = None
    # The workload's resource limits, set by the wrapper: name -> value (RLIMIT_<NAME>).
    rlimits: Mapping[str, int] = field(default_factory=dict)
    # The wrapper reads the workload's environment from a descriptor (``start``'s
    # ``environment``) instead of passing on its own, which is then the launcher's.
    environment_from_descriptor: bool = False


@dataclass(frozen=True)
class Sandbox:
    bwrap: str
    version: str
    privileged: bool  # the agent is root: no user namespace, the workload gets its own uid
    python_roots: tuple[Path, ...] = field(default=())

    def describe(self) -> str:
        how = "its own uid per run" if self.privileged else "the portal's uid"
        return f"{self.version} ({how}; seccomp filter: no namespaces, mounts or keyrings)"

    def run_uid(self, run_id: int) -> int | None:
        if not self.privileged:
            return None
        return RUN_UID_BASE + run_id % RUN_UID_SPAN

    def endpoint_uid(self, endpoint_id: int) -> int | None:
        """An endpoint's own uid (every generation of it shares it), as a run has one."""
        if not self.privileged:
            return None
        return ENDPOINT_UID_BASE + endpoint_id % ENDPOINT_UID_SPAN

    def command(self, layout: Layout, *, python: str) -> list[str]:
        """The bwrap command line that runs ``layout.command`` through the wrapper."""
        args = [self.bwrap, *self._namespaces(layout), *_system_mounts()]
        made: set[str] = {"/", "/usr", "/etc", "/proc", "/dev", "/sys"}
        made.update(f"/{name}" for name in _SYSTEM_TOP)
        # RAM-backed only when charged to the run (``run_limits``): else its folders on disk.
        scratch_folders = ((layout.tmp_folder, SANDBOX_TMP), (layout.shm_folder, SANDBOX_SHM))
        scratch: list[tuple[str, Path | None, str]] = [
            ("--bind", folder, target) if folder is not None else ("--tmpfs", None, target)
            for folder, target in scratch_folders
        ]
        targets: list[tuple[str, Path | None, str]] = [
            *scratch,
            *(("--ro-bind", root, str(root)) for root in self.python_roots),
            *(("--ro-bind", path, str(path)) for path in layout.read_only),
            *(("--bind", path, str(path)) for path in layout.writable),
            *(("--ro-bind", source, target) for source, target in layout.files),
            ("--ro-bind", WRAPPER, WRAPPER_IN_SANDBOX),
            *(("--dev-bind", device, str(device)) for device in layout.devices),
        ]
        # Parents first; folders that only lead to a mount are created world-searchable
        # (bwrap would copy the host's mode, and /root is 0700).
        for option, source, target in sorted(targets, key=lambda item: item[2].count("/")):
            for parent in reversed(Path(target).parents):
                text = str(parent)
                if text not in made:
                    args += ["--perms", "0755", "--dir", text]
                    made.add(text)
            if source is None:
                size = [] if layout.tmp_size is None else ["--size", str(layout.tmp_size)]
                args += ["--perms", "1777", *size, option, target]
            else:
                args += [option, str(source), target]
            made.add(target)
        # /dev itself is a tmpfs the sandbox's user would own without root: read-only, so
        # that /dev/shm (sized above) is the only RAM a workload can write files into.
        args += ["--remount-ro", "/dev"]
        args += ["--seccomp", SECCOMP_FD]
        args += ["--chdir", "/", "--", python, "-I", "-S", WRAPPER_IN_SANDBOX]
        args += ["--cwd", str(layout.cwd)]
        if layout.outcome_dir is not None:
            args += ["--outcome", str(layout.outcome_dir)]
        if layout.uid is not None:
            args += ["--user", str(layout.uid), "--group", str(layout.uid)]
        if layout.log_limit is not None:
            args += ["--log-limit", str(layout.log_limit)]
        for name, value in sorted(layout.rlimits.items()):
            args += ["--rlimit", f"{name}={value}"]
        if layout.environment_from_descriptor:
            args += ["--environment-fd", ENVIRONMENT_FD]
        return [*args, "--", *layout.command]

    def _namespaces(self, layout: Layout) -> list[str]:
        common = [
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--hostname",
            layout.hostname,
        ]
        if self.privileged:
            caps = ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
            return [*common, *caps]
        return [*common, "--unshare-user", "--disable-userns"]


@contextlib.contextmanager
def _descriptors(
    command: Sequence[str], environment: Mapping[str, str] | None
) -> Iterator[tuple[list[str], tuple[int, ...]]]:
    """``command`` with descriptors in place of its placeholders — the seccomp filter for
    ``SECCOMP_FD``, the workload's ``environment`` (JSON) for ``ENVIRONMENT_FD`` — and the
    descriptors to pass on. Memory files: nothing on disk, nothing on a command line."""
    contents: dict[str, bytes] = {}
    if SECCOMP_FD in command:
        contents[SECCOMP_FD] = seccomp.filter_program()
    if ENVIRONMENT_FD in command:
        if environment is None:
            raise ValueError("this command reads the workload's environment: give it one")
        contents[ENVIRONMENT_FD] = json.dumps(dict(environment)).encode()
    made: dict[str, int] = {}
    try:
        for placeholder, data in contents.items():
            descriptor = os.memfd_create(f"taugrid-{placeholder.strip('{}')}", os.MFD_CLOEXEC)
            made[placeholder] = descriptor
            view = memoryview(data)
            while view:
                view = view[os.write(descriptor, view) :]
            os.lseek(descriptor, 0, os.SEEK_SET)
        yield [str(made[word]) if word in made else word for word in command], tuple(made.values())
    finally:
        for descriptor in made.values():
            os.close(descriptor)


def start(
    command: Sequence[str], *, environment: Mapping[str, str] | None = None, **options: Any
) -> subprocess.Popen[bytes]:
    """``subprocess.Popen`` for a command that may be a sandbox's: the filter's descriptor,
    and the workload's ``environment`` when the wrapper reads it from one, are made and
    passed here (the only way a sandboxed command should be started). ``env`` is then the
    environment of the launcher alone (bwrap, as root): never the workload's."""
    with _descriptors(command, environment) as (words, descriptors):
        passed = tuple(options.pop("pass_fds", ())) + descriptors
        return subprocess.Popen(words, pass_fds=passed, **options)  # noqa: S603 - our own


def run(
    command: Sequence[str], *, environment: Mapping[str, str] | None = None, **options: Any
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run`` for a command that may be a sandbox's (see ``start``)."""
    with _descriptors(command, environment) as (words, descriptors):
        passed = tuple(options.pop("pass_fds", ())) + descriptors
        return subprocess.run(words, pass_fds=passed, **options)  # noqa: S603


def _system_mounts() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in _SYSTEM_TOP:
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    made = {"/"}
    for name in _ETC:
        path = Path("/etc") / name
        if not path.exists():
            continue
        for parent in reversed(path.parents):
            if str(parent) not in made:
                args += ["--perms", "0755", "--dir", str(parent)]
                made.add(str(parent))
        args += ["--ro-bind", str(path), str(path)]
    args += ["--ro-bind", "/sys", "/sys", "--proc", "/proc", "--dev", "/dev"]
    return args


def python_roots(interpreter: str) -> tuple[Path, ...]:
    """The folders the base interpreter needs, when they are not under ``/usr``."""
    candidates = {
        Path(sys.base_prefix).resolve(),
        Path(sys.base_exec_prefix).resolve(),
        Path(os.path.realpath(interpreter)).parent.parent,
    }
    roots = sorted(
        path for path in candidates if path != Path("/") and not _under(path, Path("/usr"))
    )
    # Keep only the outermost of nested candidates.
    return tuple(
        path for path in roots if not any(other != path and _under(path, other) for other in roots)
    )


def _under(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def identity_files(directory: Path, *, uid: int, home: Path) -> list[tuple[Path, str]]:
    """A ``passwd`` and ``group`` naming only root, the run's user and nobody (some programs
    look their uid up), written into ``directory``; the host's user list stays hidden."""
    directory.mkdir(parents=True, exist_ok=True)
    passwd = directory / "passwd"
    group = directory / "group"
    passwd.write_text(
        "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
        f"run:x:{uid}:{uid}:TauGrid run:{home}:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        encoding="utf-8",
    )
    group.write_text(f"root:x:0:\nrun:x:{uid}:\nnogroup:x:65534:\n", encoding="utf-8")
    for path in (passwd, group):
        path.chmod(0o644)
    return [(passwd, "/etc/passwd"), (group, "/etc/group")]


def gpu_devices(count: int) -> list[Path]:
    """The NVIDIA device files a GPU run needs (CUDA_VISIBLE_DEVICES picks among them)."""
    if count <= 0:
        return []
    return sorted(Path("/dev").glob("nvidia*"))


def detect(mode: str, *, interpreter: str) -> Detection:
    """Whether bwrap is here and runs a probe the way a real attempt runs."""
    if mode == "off":
        return Detection(None, "switched off (TAU_LOCAL_SANDBOX=off)")
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return Detection(None, "bwrap is not installed (Debian package bubblewrap)")
    try:
        version = subprocess.run(  # noqa: S603 - a fixed command
            [bwrap, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Detection(None, f"bwrap does not run: {exc}")
    try:
        seccomp.filter_program()
    except seccomp.SeccompUnsupported as exc:
        return Detection(None, f"no sandbox without its seccomp filter: {exc}")
    sandbox = Sandbox(
        bwrap=bwrap,
        version=version or "bubblewrap",
        privileged=os.geteuid() == 0,
        python_roots=python_roots(interpreter),
    )
    try:
        probe(sandbox, interpreter=interpreter)
    except SandboxUnavailable as exc:
        return Detection(None, f"bwrap is installed but cannot run a sandbox here: {exc}")
    return Detection(sandbox, f"every run in its own sandbox: {sandbox.describe()}")


def probe(sandbox: Sandbox, *, interpreter: str) -> None:
    """Run a tiny workload exactly as an attempt runs (wrapper, uid, mounts, outcome)."""
    with tempfile.TemporaryDirectory(prefix="taugrid-sandbox-probe-") as name:
        root = Path(name)
        work, status = root / "work", root / "status"
        work.mkdir(mode=0o700)  # as a run's folder is
        status.mkdir(mode=0o700)
        uid = sandbox.run_uid(0)
        if uid is not None:
            os.chown(work, uid, uid)
        script = (
            "import ctypes, os, sys\n"
            f"open(os.path.join({str(work)!r}, 'written'), 'w').close()\n"
            # The filter must be in force: a user namespace is refused.
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            f"if libc.unshare({seccomp.CLONE_NEWUSER}) == 0:\n"
            "    sys.exit('a user namespace could be made: the seccomp filter is not in force')\n"
            f"print({PROBE_WORD!r}, os.getuid(), flush=True)\n"
        )
        command = sandbox.command(
            Layout(
                command=[interpreter, "-I", "-S", "-c", script],
                cwd=work,
                writable=[work, status],
                outcome_dir=status,
                uid=uid,
                files=identity_files(root / "etc", uid=uid or os.getuid(), home=work),
            ),
            python=interpreter,
        )
        try:
            result = run(
                command,
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT_SECONDS,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxUnavailable(str(exc)) from None
        said = f"{PROBE_WORD} {uid if uid is not None else os.getuid()}"
        if result.returncode != 0 or said not in result.stdout:
            detail = (result.stderr or result.stdout).strip().splitlines()
            raise SandboxUnavailable(
                f"the probe exited with {result.returncode}: {detail[-1] if detail else ''}"
            )
        if not (work / "written").exists() or not (status / "outcome.json").exists():
            raise SandboxUnavailable("the probe could not write its folders")


def write_status(path: Path, status: dict[str, object]) -> None:
    """What the agent found, for ``/readyz`` (atomic; readable by the portal only)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump(status, handle)
    os.replace(temporary, path)


def read_status(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def chown_tree(path: Path, uid: int, gid: int) -> None:
    """Give a folder and everything in it to ``uid`` (symlinks themselves, never followed)."""
    os.chown(path, uid, gid, follow_symlinks=False)
    for folder, directories, files in os.walk(path):
        for name in (*directories, *files):
            os.chown(os.path.join(folder, name), uid, gid, follow_symlinks=False)


def existing(paths: Iterable[str | None]) -> list[Path]:
    return [Path(path) for path in paths if path and Path(path).exists()]
