"""Run every benchmark (make bench). Results print and go to var/bench/*.json; the HTTP
figures, as shares of the bare DRF view measured in the same run, are repeated last."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def main() -> int:
    from benchmarks.bench_runs import print_ratios
    from benchmarks.harness import RESULTS

    at_scale = RESULTS / "runs_at_scale.json"
    at_scale.unlink(missing_ok=True)  # never repeat an earlier run's figures
    failures = 0
    for script in sorted(HERE.glob("bench_*.py")):
        print(f"--- {script.name}", flush=True)
        failures += subprocess.call([sys.executable, str(script)]) != 0
    if at_scale.exists():
        print("\n--- HTTP, as shares of the bare DRF view (benchmarks/bench_runs.py)")
        print_ratios(json.loads(at_scale.read_text())["results"])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
