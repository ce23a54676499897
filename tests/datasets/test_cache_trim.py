"""The cache of an S3 store's files on this machine (``VAR_DIR/cache/blobs/``, issue 33):
``catalog.storage.trim_cache`` (hourly, ``catalog.tasks.trim_cache``) removes a copy only
once no staged run links it and it has not been fetched or staged for
``TAU_DATA_CACHE_SECONDS``; a copy in use stays however old it is."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

from catalog import storage


def cached(var: Path, content: bytes) -> Path:
    sha = hashlib.sha256(content).hexdigest()
    path = var / "cache" / "blobs" / "workspaces" / "1" / sha[:2] / sha
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    path.with_name(f"{sha}.checked").write_text("mark\n")
    return path


def test_only_copies_no_run_links_and_not_used_lately_are_removed(
    settings: Any, tmp_path: Path
) -> None:
    settings.VAR_DIR = tmp_path
    idle = cached(tmp_path, b"idle\n")
    in_use = cached(tmp_path, b"in use\n")
    staged = tmp_path / "attempt" / "data" / "in-use.txt"
    staged.parent.mkdir(parents=True)
    os.link(in_use, staged)  # what staging does
    fetching = idle.with_name(f".{idle.name}.0123abcd")  # a copy still on its way
    fetching.write_bytes(b"partial")
    later = time.time() + 7200

    assert storage.trim_cache(3600) == 0  # everything is recent
    assert storage.trim_cache(3600, now=later) == 1
    assert not idle.exists()
    assert not idle.with_name(f"{idle.name}.checked").exists()
    assert in_use.exists()  # linked by a run's data folder
    assert fetching.exists()

    staged.unlink()  # the run's folder is gone: the copy is idle from now
    assert storage.trim_cache(3600, now=later - 3700) == 0
    assert storage.trim_cache(3600, now=later) == 1
    assert not in_use.exists()


def test_no_cache_no_work(settings: Any, tmp_path: Path) -> None:
    settings.VAR_DIR = tmp_path / "nothing-here"
    assert storage.trim_cache(0) == 0
