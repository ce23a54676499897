#!/usr/bin/env python3
"""schemathesis, the outside client tests/test_api_contract.py checks the API contract with,
in a virtual environment of its own: pinned at :data:`SCHEMATHESIS_VERSION`, from PyPI, in
``~/.cache/taugrid/schemathesis-<version>/`` (``TAUGRID_CACHE_DIR`` moves the cache). Its pins
(hypothesis, jsonschema, werkzeug…) must not meet the project's own constraints, hence a venv
of its own, run as a subprocess. A lock keeps two callers from installing at once; the
``installed.json`` marker is written last, so a broken install is redone. About 20 s and
80 MB when cold. Standard library only.

    python deploy/dev/schemathesis_venv.py     # what deploy/dev/test_tools.py (make test) runs
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: schemathesis from PyPI, pinned; changing it changes the cache directory (a new venv).
SCHEMATHESIS_VERSION = "4.32.5"


def log(message: str) -> None:
    print(f"[schemathesis] {message}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    return Path(os.environ.get("TAUGRID_CACHE_DIR") or Path.home() / ".cache" / "taugrid")


def venv_dir(version: str = SCHEMATHESIS_VERSION) -> Path:
    return cache_dir() / f"schemathesis-{version}"


def executable(version: str = SCHEMATHESIS_VERSION) -> Path:
    return venv_dir(version) / "bin" / "schemathesis"


def is_installed(version: str = SCHEMATHESIS_VERSION) -> bool:
    marker = venv_dir(version) / "installed.json"
    return marker.exists() and executable(version).exists()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_schemathesis(version: str = SCHEMATHESIS_VERSION) -> Path:
    """Install ``schemathesis==version`` into its cached venv unless it is there; returns the
    ``schemathesis`` executable."""
    if is_installed(version):
        return executable(version)
    target = venv_dir(version)
    with _locked(cache_dir() / f".schemathesis-{version}.lock"):
        if is_installed(version):
            return executable(version)
        log(f"installing schemathesis=={version} into {target} (once; about 20 s)")
        shutil.rmtree(target, ignore_errors=True)
        started = time.monotonic()
        subprocess.run(  # noqa: S603 - this interpreter, fixed arguments
            [sys.executable, "-m", "venv", str(target)], check=True
        )
        subprocess.run(  # noqa: S603 - the venv's own pip, a pinned requirement
            [
                str(target / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                f"schemathesis=={version}",
            ],
            check=True,
        )
        (target / "installed.json").write_text(
            json.dumps({"schemathesis": version, "seconds": round(time.monotonic() - started, 1)})
            + "\n"
        )
        log(f"schemathesis {version} installed in {time.monotonic() - started:.0f}s")
    return executable(version)


if __name__ == "__main__":
    print(ensure_schemathesis())
