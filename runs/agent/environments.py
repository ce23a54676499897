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
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

READY_MARKER = ".taugrid-ready"
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


def pip_environment(source: dict[str, str] | None = None) -> dict[str, str]:
    source = dict(os.environ) if source is None else source
    chosen = {
        name: value
        for name, value in source.items()
        if name.startswith(PIP_ENVIRONMENT_PREFIXES) or name in PIP_ENVIRONMENT_NAMES
    }
    return chosen


def ensure_environment(
    root: Path,
    requirements: Sequence[str],
    *,
    log: IO[bytes],
    cancelled: threading.Event,
) -> Path:
    """The path of a ready environment for ``requirements`` (built now if needed). Output of
    the build goes to ``log``. Raises EnvironmentFailed or BuildCancelled."""
    wanted = normalise_requirements(requirements)
    root.mkdir(parents=True, exist_ok=True)
    path = environment_path(root, wanted)
    if is_ready(path):
        return path
    with open(root / f"{path.name}.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if is_ready(path):  # built by someone else while we waited
                return path
            _build(path, wanted, log=log, cancelled=cancelled)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return path


def _build(
    path: Path,
    requirements: list[str],
    *,
    log: IO[bytes],
    cancelled: threading.Event,
) -> None:
    if path.exists():
        shutil.rmtree(path)  # an interrupted build: never marked ready
    _note(log, f"creating a Python environment for {_describe(requirements)}")
    create = [base_interpreter(), "-m", "venv"]
    if not requirements:
        create.append("--without-pip")
    env = {"PATH": BASE_PATH, "LANG": "C.UTF-8", "HOME": str(path.parent)}
    try:
        _run([*create, str(path)], log=log, env=env, cancelled=cancelled)
        if requirements:
            requirements_file = path / "taugrid-requirements.txt"
            requirements_file.write_text("\n".join(requirements) + "\n", encoding="utf-8")
            pip_env = {**env, **pip_environment()}
            _note(log, "installing: " + " ".join(requirements))
            _run(
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
                log=log,
                env=pip_env,
                cancelled=cancelled,
            )
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    marker = path / f"{READY_MARKER}.tmp"
    marker.write_text("\n".join(requirements) + "\n", encoding="utf-8")
    os.replace(marker, path / READY_MARKER)
    _note(log, "the environment is ready (kept for later runs with the same requirements)")


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
    process = subprocess.Popen(  # noqa: S603 - a fixed command, no shell
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
