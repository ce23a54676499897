"""The client library is loaded when TauGrid first talks to a cluster, not before: every
portal process imports ``kube`` (the Kueue sync, the backend registry), and on the embedded
default none of them ever calls it."""

from __future__ import annotations

from pathlib import Path

from tests.fresh_process import probe

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
    seen = probe(PROBE, tmp_path, str(tmp_path / "no-such-kubeconfig"))
    assert seen == {"before": [], "after": True}
