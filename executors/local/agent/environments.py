"""The Python a local run gets: a virtual environment per set of requirements, built once.

Environments live in ``VAR_DIR/venvs/<key>/`` where the key is the SHA-256 of the base
interpreter and the normalised requirements, so runs with the same ``runtime.pip`` share one
(and an upgrade of the base Python gets fresh ones). Empty requirements still get their own
environment (without pip): a run never sees the portal's own packages.

A virtual environment is not relocatable (installed scripts name its path in their first
line), so it is built in place rather than in a temporary directory and renamed. What makes
it atomic instead is a marker file written last: a directory without the marker is an
interrupted build, removed and built again. An exclusive lock (``<key>.lock``) keeps two
attempts from building the same environment at once; the second waits and reuses it.

A cached environment is shared by every run with the same requirements, across workspaces,
so no run may change it: runs see it read-only (``sandbox``), and before each reuse it is
checked against a manifest written when it was built (``<key>.manifest.json``, next to it,
outside what any run sees): every file's SHA-256, mode and symlink target. A file whose
inode, size, modification and change times are as recorded is taken as unchanged (the change
time cannot be set back by anyone but root); any other is hashed again. A difference (a
``sitecustomize.py`` added, a module changed) is logged with what changed, and the
environment is built again.

With a sandbox, building runs in one too (``BUILD_UID`` when the agent is root): ``pip``
runs the setup code of the packages it builds, which is the researcher's choice of code, so
it sees the base Python, the environment being built, a private home with the agent's pip
configuration and certificates, and the network, and nothing of ``var/``. The finished
environment then belongs to the agent's user.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from executors.local.agent import sandbox as sandboxing

logger = logging.getLogger("executors.local.agent")

READY_MARKER = ".taugrid-ready"
MANIFEST_SUFFIX = ".manifest.json"
MANIFEST_VERSION = 1
_HASH_CHUNK = 1024 * 1024
BUILD_TIMEOUT_SECONDS = 30 * 60
# Passed to pip from the agent's own environment, so an installation's package index,
# proxy, certificates and pip configuration (found through HOME) apply to the runs'
# requirements too. Nothing else is. Requirements are the researcher's text and building an
# sdist runs its code, so whatever these hold (an index password in PIP_INDEX_URL, say)
# is visible to every researcher who can submit.
PIP_ENVIRONMENT_PREFIXES = ("PIP_",)
PIP_ENVIRONMENT_NAMES = (
    "HOME",
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
)
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"


class EnvironmentFailed(RuntimeError):
    """The environment could not be built; the log has the details."""


class BuildCancelled(RuntimeError):
    """The attempt was stopped while its environment was being built."""


def base_interpreter() -> str:
    """The Python the environments are made from: the one the portal's own virtual
    environment was made from (not the portal's environment itself)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def normalise_requirements(requirements: Sequence[str]) -> list[str]:
    return [line.strip() for line in requirements if line.strip()]


def environment_key(requirements: Sequence[str], interpreter: str | None = None) -> str:
    python = os.path.realpath(interpreter or base_interpreter())
    text = "\n".join(
        [f"python={python} {sys.version_info[:3]}", *normalise_requirements(requirements)]
    )
    return hashlib.sha256(text.encode()).hexdigest()


def environment_path(root: Path, requirements: Sequence[str]) -> Path:
    return root / environment_key(requirements)


def is_ready(path: Path) -> bool:
    return (path / READY_MARKER).exists()


def launcher_environment(markers: Mapping[str, str]) -> dict[str, str]:
    """The environment of what the agent starts (the sandbox, and the wrapper in it): fixed
    by the agent, nothing of the workload's (bwrap runs as root outside the sandbox), but for
    the ``markers`` (``supervisor.attempt_markers``, an endpoint generation's) by which a
    crashed agent's processes are found again."""
    return {"PATH": BASE_PATH, "LANG": "C.UTF-8", **markers}


def pip_environment(source: dict[str, str] | None = None) -> dict[str, str]:
    source = dict(os.environ) if source is None else source
    chosen = {
        name: value
        for name, value in source.items()
        if name.startswith(PIP_ENVIRONMENT_PREFIXES) or name in PIP_ENVIRONMENT_NAMES
    }
    return chosen


def manifest_path(path: Path) -> Path:
    return path.with_name(path.name + MANIFEST_SUFFIX)


def ensure_environment(
    root: Path,
    requirements: Sequence[str],
    *,
    log: IO[bytes],
    cancelled: threading.Event,
    sandbox: sandboxing.Sandbox | None = None,
) -> Path:
    """The path of a ready, unchanged environment for ``requirements`` (built now if needed).
    Output of the build goes to ``log``. Raises EnvironmentFailed or BuildCancelled."""
    wanted = normalise_requirements(requirements)
    root.mkdir(parents=True, exist_ok=True)
    path = environment_path(root, wanted)
    with open(root / f"{path.name}.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if is_ready(path):
                problem = verify_environment(path)
                if problem is None:
                    return path
                logger.warning(
                    "the cached Python environment %s changed since it was built (%s); "
                    "building it again",
                    path.name,
                    problem,
                )
                _note(
                    log,
                    f"the cached Python environment changed since it was built ({problem}); "
                    "building it again",
                )
                _discard(path)
            _build(path, wanted, log=log, cancelled=cancelled, sandbox=sandbox)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return path


# --- the manifest -----------------------------------------------------------------------


def _entries(path: Path) -> dict[str, os.stat_result]:
    found: dict[str, os.stat_result] = {}
    for folder, directories, files in os.walk(path):
        for name in (*directories, *files):
            full = os.path.join(folder, name)
            found[os.path.relpath(full, path)] = os.lstat(full)
    return found


def _file_digest(full: str) -> str:
    digest = hashlib.sha256()
    descriptor = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(descriptor, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _describe_entry(full: str, info: os.stat_result) -> dict[str, object]:
    entry: dict[str, object] = {"mode": info.st_mode, "uid": info.st_uid}
    if stat.S_ISLNK(info.st_mode):
        entry["target"] = os.readlink(full)
    elif stat.S_ISREG(info.st_mode):
        entry["size"] = info.st_size
        entry["sha256"] = _file_digest(full)
        entry["stat"] = [info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]
    return entry


def write_manifest(path: Path) -> None:
    """Record every file of a just-built environment (next to it, readable by the agent only)."""
    entries = {
        relative: _describe_entry(str(path / relative), info)
        for relative, info in _entries(path).items()
    }
    target = manifest_path(path)
    temporary = target.with_name(f".{target.name}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump({"version": MANIFEST_VERSION, "entries": entries}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, target)


def verify_environment(path: Path) -> str | None:
    """None if the environment is exactly as built, else what differs (for the log)."""
    try:
        manifest = json.loads(manifest_path(path).read_text(encoding="utf-8"))
        recorded: dict[str, dict[str, object]] = manifest["entries"]
        if manifest.get("version") != MANIFEST_VERSION or not isinstance(recorded, dict):
            return "its manifest is of another version"
    except (OSError, ValueError, KeyError, TypeError):
        return "it has no readable manifest"
    try:
        present = _entries(path)
    except OSError as exc:
        return f"it cannot be read: {exc}"
    added = sorted(set(present) - set(recorded))
    if added:
        return f"{added[0]} was added" + (f" (and {len(added) - 1} more)" if len(added) > 1 else "")
    removed = sorted(set(recorded) - set(present))
    if removed:
        return f"{removed[0]} was removed"
    for relative, info in present.items():
        entry = recorded[relative]
        if entry.get("mode") != info.st_mode or entry.get("uid") != info.st_uid:
            return f"the mode or owner of {relative} changed"
        full = str(path / relative)
        if stat.S_ISLNK(info.st_mode):
            if entry.get("target") != os.readlink(full):
                return f"the link {relative} points elsewhere"
        elif stat.S_ISREG(info.st_mode):
            signature = [info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]
            if entry.get("stat") == signature:
                continue
            if entry.get("size") != info.st_size or entry.get("sha256") != _file_digest(full):
                return f"{relative} was changed"
    return None


def _discard(path: Path) -> None:
    """Move a changed environment out of the way (a run may still have it mounted) and
    remove it."""
    aside = path.with_name(f"{path.name}.discarded-{time.time_ns()}")
    os.rename(path, aside)
    manifest_path(path).unlink(missing_ok=True)
    shutil.rmtree(aside, ignore_errors=True)


# --- building -----------------------------------------------------------------------------


def _build(
    path: Path,
    requirements: list[str],
    *,
    log: IO[bytes],
    cancelled: threading.Event,
    sandbox: sandboxing.Sandbox | None = None,
) -> None:
    if path.exists():
        shutil.rmtree(path)  # an interrupted build: never marked ready
    manifest_path(path).unlink(missing_ok=True)
    _note(log, f"creating a Python environment for {_describe(requirements)}")
    build_dir = path.with_name(f".build-{path.name}")
    shutil.rmtree(build_dir, ignore_errors=True)
    try:
        runner = _Runner(path, build_dir, sandbox=sandbox, log=log, cancelled=cancelled)
        create = [base_interpreter(), "-m", "venv"]
        if not requirements:
            create.append("--without-pip")
        runner.run([*create, str(path)])
        if requirements:
            requirements_file = path / "taugrid-requirements.txt"
            requirements_file.write_text("\n".join(requirements) + "\n", encoding="utf-8")
            _note(log, "installing: " + " ".join(requirements))
            runner.run(
                [
                    str(path / "bin" / "python"),
                    "-m",
                    "pip",
                    "install",
                    "--disable-pip-version-check",
                    "--no-input",
                    "--progress-bar",
                    "off",
                    "-r",
                    str(requirements_file),
                ],
                pip=True,
            )
        if sandbox is not None and sandbox.privileged:
            sandboxing.chown_tree(path, os.geteuid(), os.getegid())  # no run's uid owns it
        marker = path / f"{READY_MARKER}.tmp"
        marker.write_text("\n".join(requirements) + "\n", encoding="utf-8")
        os.replace(marker, path / READY_MARKER)
        write_manifest(path)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        manifest_path(path).unlink(missing_ok=True)
        raise
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)
    _note(log, "the environment is ready (kept for later runs with the same requirements)")


class _Runner:
    """Runs the build's commands: in a sandbox when there is one, else as the agent."""

    def __init__(
        self,
        path: Path,
        build_dir: Path,
        *,
        sandbox: sandboxing.Sandbox | None,
        log: IO[bytes],
        cancelled: threading.Event,
    ) -> None:
        self.path = path
        self.sandbox = sandbox
        self.log = log
        self.cancelled = cancelled
        self.home = build_dir / "home"
        self.tmp = build_dir / "tmp"
        self.build_dir = build_dir
        if sandbox is not None:
            path.mkdir(parents=True)
            self.home.mkdir(parents=True)
            self.tmp.mkdir()
            if sandbox.privileged:
                for folder in (path, build_dir, self.home, self.tmp):
                    os.chown(folder, sandboxing.BUILD_UID, sandboxing.BUILD_UID)

    def run(self, command: list[str], *, pip: bool = False) -> None:
        base = {"PATH": BASE_PATH, "LANG": "C.UTF-8"}
        if self.sandbox is None:
            env = {**base, "HOME": str(self.path.parent)}
            if pip:
                env.update(pip_environment())
            _run(command, log=self.log, env=env, cancelled=self.cancelled)
            return
        env = {**base, "HOME": str(self.home), "TMPDIR": str(self.tmp)}
        files: list[tuple[Path, str]] = []
        read_only: list[Path] = []
        if pip:
            chosen = pip_environment()
            for name, value in chosen.items():
                if name not in {"HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"}:
                    env[name] = value
            files, read_only = _pip_files(chosen, home=self.home)
        uid = sandboxing.BUILD_UID if self.sandbox.privileged else None
        files += sandboxing.identity_files(
            self.build_dir / "etc", uid=uid if uid is not None else os.getuid(), home=self.home
        )
        layout = sandboxing.Layout(
            command=command,
            cwd=self.tmp,
            read_only=read_only,
            writable=[self.path, self.build_dir],
            files=files,
            uid=uid,
            hostname="taugrid-build",
        )
        _run(
            self.sandbox.command(layout, python=base_interpreter()),
            log=self.log,
            env=env,
            cancelled=self.cancelled,
        )


def _pip_files(chosen: dict[str, str], *, home: Path) -> tuple[list[tuple[Path, str]], list[Path]]:
    """What pip reads besides its environment: its configuration and credentials from the
    agent's home (bound into the build's private home), and the files and folders the
    environment names (certificates, a configuration file, local package folders)."""
    files: list[tuple[Path, str]] = []
    agent_home = Path(chosen.get("HOME") or os.path.expanduser("~"))
    config_home = Path(chosen.get("XDG_CONFIG_HOME") or agent_home / ".config")
    for source, target in (
        (config_home / "pip", home / ".config" / "pip"),
        (agent_home / ".pip", home / ".pip"),
        (agent_home / ".netrc", home / ".netrc"),
    ):
        if source.exists():
            files.append((source, str(target)))
    named: list[str | None] = [
        chosen.get(name)
        for name in (
            "PIP_CONFIG_FILE",
            "PIP_CERT",
            "PIP_CLIENT_CERT",
            "SSL_CERT_FILE",
            "SSL_CERT_DIR",
            "REQUESTS_CA_BUNDLE",
        )
    ]
    for name in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        for word in (chosen.get(name) or "").split():
            local = word.removeprefix("file://")
            named.append(None if "://" in local else local)
    named += ["/etc/pip.conf", "/etc/xdg/pip"]
    read_only = [path.resolve() for path in sandboxing.existing(named) if path.is_absolute()]
    return files, sorted(set(read_only))


def _describe(requirements: list[str]) -> str:
    if not requirements:
        return "no extra requirements"
    return f"{len(requirements)} requirement{'s' if len(requirements) != 1 else ''}"


def _note(log: IO[bytes], message: str) -> None:
    log.write(f"[taugrid] {message}\n".encode())
    log.flush()


def _run(
    command: list[str], *, log: IO[bytes], env: dict[str, str], cancelled: threading.Event
) -> None:
    process = sandboxing.start(  # a fixed command, no shell; in the sandbox when there is one
        command,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    deadline = time.monotonic() + BUILD_TIMEOUT_SECONDS
    while True:
        try:
            code = process.wait(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            if cancelled.is_set() or time.monotonic() > deadline:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                if cancelled.is_set():
                    raise BuildCancelled("stopped while building the environment") from None
                minutes = BUILD_TIMEOUT_SECONDS // 60
                raise EnvironmentFailed(
                    f"building the environment took longer than {minutes} minutes"
                ) from None
    if code != 0:
        what = "pip install" if "pip" in command else "creating the virtual environment"
        raise EnvironmentFailed(f"{what} failed with exit code {code}; the log shows its output")
