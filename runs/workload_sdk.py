"""The workload SDK (``import tau``) as TauGrid puts it on every run's Python path.

A workload's image or virtual environment has no reason to contain TauGrid: the platform
brings the SDK along, so ``import tau`` works in any run whose Python is 3.10 or newer, on
every backend, with the SDK of the portal that runs it:

* **local executor**: the files are written once per content under
  ``VAR_DIR/workload-sdk/<digest>/`` (read-only, never changed in place), mounted read-only
  into the sandbox, and put first on the run's ``PYTHONPATH``;
* **Kubernetes**: the bundle fetcher (the init container,
  ``executors.kubernetes.render.FETCH_SCRIPT``) writes them next to the code, from an argument of
  its own (:func:`packed`) — a few KiB, so no download and nothing to trust but the pod spec; a
  Job's container mounts them at ``/tau/sdk`` with ``PYTHONPATH``, a RayJob ships them to its driver
  and workers as a Ray ``py_modules`` entry. (A run without a code bundle has its code, and its SDK
  if it wants one, in its image.)

What is shipped is the ``tau`` package's ``__init__`` and ``sdk`` modules, nothing else:
``tau/__init__.py`` may import nothing but ``tau.sdk`` (a test keeps it so). A project
that has its own top-level ``tau`` module shadows this one, as the script's folder comes
first on ``sys.path``.

No Django here: the renderer imports this module too.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import tempfile
import zlib
from functools import cache
from pathlib import Path
from typing import Final

import tau

#: The files shipped, relative to the folder put on the path.
FILES: Final = (
    "tau/__init__.py",
    "tau/sdk.py",
    "tau/sweep.py",
    "tau/ray_tune.py",
    "tau/ray_cluster.py",
    "tau/serving.py",
)
_SOURCE_ROOT = Path(tau.__file__).resolve().parent.parent


@cache
def sources() -> dict[str, bytes]:
    """The shipped files' contents, read once from the installed ``tau`` package."""
    return {name: (_SOURCE_ROOT / name).read_bytes() for name in FILES}


@cache
def digest() -> str:
    """SHA-256 over the shipped files (names and contents): names this SDK's version."""
    sha256 = hashlib.sha256()
    for name, content in sorted(sources().items()):
        sha256.update(f"{name}\0{len(content)}\0".encode())
        sha256.update(content)
    return sha256.hexdigest()


@cache
def packed() -> str:
    """The files as one printable argument: base64 of zlib-compressed JSON ``{name: text}``.
    The base64 alphabet has no ``$``, which the kubelet would expand in a container's args.
    Made once per process, as :func:`sources` are read once (every render of a Kubernetes
    run carries it; compressing it again each time cost 5 ms)."""
    document = json.dumps({name: content.decode() for name, content in sources().items()})
    return base64.b64encode(zlib.compress(document.encode(), 9)).decode("ascii")


def materialise(root: Path) -> Path:
    """Write the files under ``root/<digest>/`` unless they are there already, and return
    that folder (what goes on ``PYTHONPATH``). Written to a temporary folder and renamed into
    place, so a run never sees half an SDK; files 0644 and folders 0755, readable by every
    run's uid, writable by none."""
    target = root / digest()[:32]
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".sdk-", dir=root))
    try:
        for name, content in sources().items():
            path = staging.joinpath(*name.split("/"))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
            path.chmod(0o644)
        for folder, _, _ in os.walk(staging):
            os.chmod(folder, 0o755)  # noqa: S103 - readable by every run, writable by none
        try:
            os.rename(staging, target)
        except OSError:
            if not target.is_dir():  # not another process's rename of the same content
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def python_path(sdk_dir: str, existing: str | None) -> str:
    """``PYTHONPATH`` with the SDK first, keeping what the run's own ``runtime.env`` set."""
    return f"{sdk_dir}:{existing}" if existing else sdk_dir
