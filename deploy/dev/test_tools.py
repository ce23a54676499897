#!/usr/bin/env python3
"""Install what the test suite drives besides Python packages: Debian's Chromium for the
browser tests, bubblewrap (the local executor's sandbox; its tests never skip), npm
packages (the test OpenID provider, axe-core), and a pinned Ray in its own cached venv (the
real Ray dashboard KubeRay's operator polls in tests/executors/kubernetes/test_kube_rayjob_ray.py;
deploy/dev/ray_head.py), a pinned schemathesis in its own cached venv (the outside client
of tests/test_api_contract.py; deploy/dev/schemathesis_venv.py), Prometheus, buildah with
debootstrap (the image make test builds for tests/deploy/test_image.py), wrk (the HTTP load of
the benchmarks, which the suite runs in smoke mode), and the wheels the examples' ``runtime.pip``
installs (torch; deploy/dev/example_wheels.py). Idempotent and quick when
everything is already there. Standard library only.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

# The sibling script that installs and runs the test services knows how to install packages.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from example_wheels import ensure_example_wheels
from ray_head import ensure_ray
from schemathesis_venv import ensure_schemathesis
from test_services import apt_install

ROOT = Path(__file__).resolve().parents[2]
# npm projects the tests use: the test OpenID provider, and axe-core for accessibility checks.
NPM_DIRS = [
    ROOT / "tests" / "identity" / "oidc_provider",
    ROOT / "tests" / "pages" / "browser_tools",
]


def log(message: str) -> None:
    print(f"[test-tools] {message}", file=sys.stderr, flush=True)


def ensure_chromium() -> None:
    if Path("/usr/bin/chromium").exists():
        return
    apt_install(["chromium", "chromium-driver", "fonts-dejavu-core"])


def ensure_bubblewrap() -> None:
    """The sandbox of local runs (executors/local/agent/sandbox.py): `make run` works without it
    (one workspace's runs, unsandboxed), the tests exercise it for real."""
    if shutil.which("bwrap") is None:
        apt_install(["bubblewrap"])


def ensure_node_packages() -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        apt_install(["nodejs", "npm"])
    for directory in NPM_DIRS:
        marker = directory / "node_modules" / ".package-lock.json"
        lock = directory / "package-lock.json"
        if marker.exists() and marker.stat().st_mtime >= lock.stat().st_mtime:
            continue
        log(f"installing npm packages in {directory.relative_to(ROOT)}")
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],  # noqa: S607
            cwd=directory,
            check=True,
        )


def ensure_prometheus() -> None:
    """Debian's Prometheus server and promtool: the GPU telemetry tests scrape a replayed
    dcgm-exporter with a real Prometheus, and the alert rules in deploy/ are checked."""
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        apt_install(["prometheus"])


def ensure_image_tools() -> None:
    """buildah and debootstrap: make test builds deploy/Containerfile (deploy/dev/oci_image.py)
    for tests/deploy/test_image.py."""
    missing = [tool for tool in ("buildah", "debootstrap") if shutil.which(tool) is None]
    if missing:
        apt_install(missing)


def ensure_wrk() -> None:
    if shutil.which("wrk") is None:
        apt_install(["wrk"])


def main() -> int:
    if "--bench" in sys.argv[1:]:
        ensure_wrk()  # the HTTP load generator of make bench
        ensure_prometheus()  # the GPU fleet benchmark's Prometheus
        ensure_ray()  # the endpoint proxy benchmark's Ray Serve
        return 0
    ensure_chromium()
    ensure_bubblewrap()
    ensure_node_packages()
    ensure_ray()
    ensure_schemathesis()
    ensure_prometheus()
    ensure_image_tools()
    ensure_wrk()  # tests/test_benchmarks.py runs make bench's benchmarks in smoke mode
    ensure_example_wheels()  # the examples trained in tests/executors/local/test_agent_workers.py
    return 0


if __name__ == "__main__":
    sys.exit(main())
