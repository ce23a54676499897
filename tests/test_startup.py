"""What every TauGrid process pays to start: ``django.setup()`` (a Celery worker, the local
agent, each ``manage.py`` command, a portal worker). The suite starts hundreds of them, and a
platform many more: what only a page or the API schema needs is not loaded there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Loaded on first use only. drf-spectacular's helpers bring django.test and Jinja2 with them
#: (about a third of the start-up: 0.93 → 0.63 s of CPU here without them); the OpenID
#: client, JWT and requests are for sign-ins and /readyz (another 0.1 s).
NOT_AT_STARTUP = ("drf_spectacular.plumbing", "django.test", "jinja2", "identity.oidc", "jwt")

PROBE = (
    "import json, sys, django; django.setup(); "
    f"print(json.dumps([name for name in {list(NOT_AT_STARTUP)!r} if name in sys.modules]))"
)


def test_start_up_does_not_load_what_only_the_api_schema_needs() -> None:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("PYTEST") and key != "DJANGO_SETTINGS_MODULE"
    }
    env["DJANGO_SETTINGS_MODULE"] = "portal.settings"
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
