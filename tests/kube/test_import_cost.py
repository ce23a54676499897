"""The client library is loaded when TauGrid first talks to a cluster, not before: every
portal process imports ``kube`` (the Kueue sync, the backend registry), and on the embedded
default none of them ever calls it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, os, sys
import django
django.setup()
import portal.celery, runs.tasks, web.urls, executors.kubernetes.tasks
from django.urls import get_resolver
get_resolver().url_patterns  # every view module
before = sorted(m for m in sys.modules if m.split(".")[0] == "kubernetes")
import kube
try:
    kube.new_api_client(sys.argv[1])
except kube.KubeConfigError:
    pass
print(json.dumps({"before": before, "after": "kubernetes" in sys.modules}))
"""


def test_the_kubernetes_client_library_loads_only_when_a_client_is_made(tmp_path: Path) -> None:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("TAU_", "DJANGO_", "DATABASE"))
    }
    env |= {"DJANGO_SETTINGS_MODULE": "portal.settings", "TAU_VAR_DIR": str(tmp_path)}
    missing = tmp_path / "no-such-kubeconfig"
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(missing)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"before": [], "after": True}
