#!/usr/bin/env python3
"""The wheels the examples' ``runtime.pip`` needs (``requirements/examples.txt``, torch among
them: about 2.5 GB with its CUDA libraries, which PyPI's Linux torch wheel depends on), with
everything they depend on, downloaded once into ``~/.cache/taugrid/example-wheels/``
(``TAUGRID_CACHE_DIR`` moves the cache). The tests that train the examples on the local
executor give its agent that folder as ``PIP_FIND_LINKS`` with ``PIP_NO_INDEX``: the runs'
environments are built from it without the network, as the rest of the suite's are.

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
                "--dest",
                str(folder),
                "--requirement",
                str(REQUIREMENTS),
            ],
            check=True,
        )
        size = sum(path.stat().st_size for path in folder.glob("*.whl"))
        (folder / MARKER).write_text(json.dumps({"requirements": requirements_digest()}) + "\n")
        log(f"done in {time.monotonic() - started:.0f}s ({size / 2**30:.1f} GiB)")
    return folder


def main() -> int:
    try:
        ensure_example_wheels()
    except subprocess.CalledProcessError as error:
        log(f"pip download failed (exit {error.returncode}): see its output above")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
