"""Python run in a new interpreter as a fresh installation starts the portal: its settings,
none of this test session's ``TAU_``, ``DJANGO_`` or ``DATABASE`` settings, a ``VAR_DIR`` of
its own. For what a process loads at start-up, which this process has long since loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def probe(code: str, var_dir: Path, *args: str) -> Any:
    """Run ``code`` with ``args``; the JSON its last line printed."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("TAU_", "DJANGO_", "DATABASE"))
    }
    env |= {"DJANGO_SETTINGS_MODULE": "portal.settings", "TAU_VAR_DIR": str(var_dir)}
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
