"""Every benchmark of ``make bench`` runs in the suite, in smoke mode (``TAU_BENCH_SMOKE=1``:
tiny sizes, a few iterations, no goal judged; benchmarks/harness.py), so that a benchmark
that no longer runs fails ``make test`` instead of being found broken when someone wants its
figures (``bench_runs`` once crashed for months on a column added to ``runs_run``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.plugin import KubeCluster

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted(path.name for path in (ROOT / "benchmarks").glob("bench_*.py"))
#: The benchmark that needs the control plane; it reuses the suite's cluster.
ON_A_CLUSTER = "bench_kube.py"
#: What each benchmark reports as (var/bench/<name>.json).
REPORTS = {
    "bench_catalog.py": ["catalog"],
    "bench_declaration.py": ["declaration"],
    "bench_evidence.py": ["evidence_export"],
    "bench_faults.py": ["faults"],
    "bench_gpus.py": ["gpu_fleet"],
    "bench_kube.py": ["kube_control_plane"],
    "bench_runs.py": ["runs_at_scale"],
    "bench_serving.py": ["serving_proxy"],
    "bench_spec.py": [],  # prints only (tau.spec.bench, which installs without Django)
    "bench_spec_render.py": ["spec_render"],
    "bench_token_auth.py": ["token_auth"],
}


def run_smoke(script: str, results: Path, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "TAU_BENCH_SMOKE": "1",
        "TAU_BENCH_RESULTS": str(results),
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        **extra_env,
    }
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def check(script: str, outcome: subprocess.CompletedProcess[str], results: Path) -> None:
    said = (outcome.stdout + outcome.stderr)[-6000:]
    assert outcome.returncode == 0, f"{script} exited with {outcome.returncode}:\n{said}"
    assert "SKIPPED" not in outcome.stdout, said
    for name in REPORTS[script]:
        document = json.loads((results / f"{name}.json").read_text())
        assert document["smoke"] is True
        assert document["results"], f"{script} reported nothing"


def test_every_benchmark_is_known_here() -> None:
    assert set(BENCHMARKS) == set(REPORTS), "a new benchmark: say what it reports in REPORTS"


@pytest.mark.services
@pytest.mark.parametrize("script", [name for name in BENCHMARKS if name != ON_A_CLUSTER])
def test_benchmark_runs_in_smoke_mode(script: str, tmp_path: Path) -> None:
    check(script, run_smoke(script, tmp_path), tmp_path)


@pytest.mark.cluster
def test_the_kubernetes_benchmark_runs_in_smoke_mode(
    kube_cluster: KubeCluster, tmp_path: Path
) -> None:
    outcome = run_smoke(ON_A_CLUSTER, tmp_path, TAU_BENCH_CLUSTER_DIR=str(kube_cluster.state_dir))
    check(ON_A_CLUSTER, outcome, tmp_path)
