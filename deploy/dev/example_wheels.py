#!/usr/bin/env python3
"""The wheels the examples' ``runtime.pip`` needs (``requirements/examples.txt``, torch among
them: about 2.5 GB with its CUDA libraries, which PyPI's Linux torch wheel depends on), with
everything they depend on, downloaded once into ``~/.cache/taugrid/example-wheels/``
(``TAUGRID_CACHE_DIR`` moves the cache). The tests that train the examples on the local
executor give its agent that folder as ``PIP_FIND_LINKS`` with ``PIP_NO_INDEX``: the runs'
environments are built from it without the network, as the rest of the suite's are.

A pin that PyPI publishes as source only (``SOURCE_ONLY``: deepspeed) is downloaded as
source and built into a wheel here, once, with the build's network at hand; the runs then
install that wheel offline like the others.

A lock keeps two callers from downloading at once; ``complete.json`` (the requirements'
SHA-256) is written last, so an interrupted or outdated download is done again. A minute or
two when cold, on a good connection; nothing when warm. Standard library only.

    python deploy/dev/example_wheels.py     # what make test runs
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "requirements" / "examples.txt"
MARKER = "complete.json"
#: Pins with no wheel on PyPI, and the environment their wheel is built in. deepspeed's
#: setup.py compiles no kernel with DS_BUILD_OPS=0 (its default on Linux, said here so that
#: no setting of the caller's changes it): a pure-Python wheel, not tied to this machine's
#: torch or CPU.
SOURCE_ONLY: dict[str, dict[str, str]] = {"deepspeed": {"DS_BUILD_OPS": "0"}}


def log(message: str) -> None:
    print(f"[example-wheels] {message}", file=sys.stderr, flush=True)


def wheel_dir() -> Path:
    cache = Path(os.environ.get("TAUGRID_CACHE_DIR") or Path.home() / ".cache" / "taugrid")
    return cache / "example-wheels"


def requirements_digest(path: Path = REQUIREMENTS) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def is_complete(folder: Path | None = None, path: Path = REQUIREMENTS) -> bool:
    marker = (folder or wheel_dir()) / MARKER
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(recorded, dict) and recorded.get("requirements") == requirements_digest(path)


def ensure_example_wheels(python: str = sys.executable) -> Path:
    """Download what is missing; return the folder."""
    folder = wheel_dir()
    if is_complete(folder):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    with (folder.parent / "example-wheels.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_complete(folder):
            return folder
        (folder / MARKER).unlink(missing_ok=True)
        log(f"downloading the examples' wheels ({REQUIREMENTS.name}) into {folder} (once)")
        started = time.monotonic()
        subprocess.run(  # noqa: S603 - pip, with our own pinned requirements file
            [
                python,
                "-m",
                "pip",
                "--disable-pip-version-check",
                "download",
                "--quiet",
                "--only-binary=:all:",
                *(f"--no-binary={name}" for name in SOURCE_ONLY),
                "--dest",
                str(folder),
                "--requirement",
                str(REQUIREMENTS),
            ],
            check=True,
        )
        build_source_distributions(folder, python)
        size = sum(path.stat().st_size for path in folder.glob("*.whl"))
        (folder / MARKER).write_text(json.dumps({"requirements": requirements_digest()}) + "\n")
        log(f"done in {time.monotonic() - started:.0f}s ({size / 2**30:.1f} GiB)")
    return folder


def build_source_distributions(folder: Path, python: str) -> None:
    """Build each ``SOURCE_ONLY`` source distribution in ``folder`` into a wheel beside it,
    then remove the source: the runs install wheels only, without the network."""
    for name, environment in SOURCE_ONLY.items():
        for source in sorted(folder.glob(f"{name}-*.tar.gz")):
            log(f"building a wheel of {source.name}")
            subprocess.run(  # noqa: S603 - pip, on a pinned download of ours
                [
                    python,
                    "-m",
                    "pip",
                    "--disable-pip-version-check",
                    "wheel",
                    "--quiet",
                    "--no-deps",
                    "--wheel-dir",
                    str(folder),
                    str(source),
                ],
                check=True,
                env={**os.environ, **environment},
            )
            source.unlink()


def main() -> int:
    try:
        ensure_example_wheels()
    except subprocess.CalledProcessError as error:
        log(f"pip download failed (exit {error.returncode}): see its output above")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
