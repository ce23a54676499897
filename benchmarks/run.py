"""Run every benchmark (make bench), or those named (``benchmarks/run.py serving runs``: the
``bench_<name>.py`` files). Results print and go to var/bench/*.json; the HTTP figures, as
shares of the bare DRF view measured in the same run, and the endpoint proxy's share of the
direct throughput are repeated last."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def main(names: list[str]) -> int:
    from benchmarks.bench_runs import print_ratios
    from benchmarks.bench_serving import print_proxy
    from benchmarks.harness import RESULTS

    scripts = sorted(HERE.glob("bench_*.py"))
    unknown = [name for name in names if not (HERE / f"bench_{name}.py").is_file()]
    if unknown:
        known = ", ".join(script.stem.removeprefix("bench_") for script in scripts)
        print(f"no such benchmark: {', '.join(unknown)} (there are: {known})", file=sys.stderr)
        return 2
    if names:
        scripts = [HERE / f"bench_{name}.py" for name in names]
    at_scale = RESULTS / "runs_at_scale.json"
    proxy = RESULTS / "serving_proxy.json"
    for repeated in (at_scale, proxy):
        repeated.unlink(missing_ok=True)  # never repeat an earlier run's figures
    failures = 0
    for script in scripts:
        print(f"--- {script.name}", flush=True)
        failures += subprocess.call([sys.executable, str(script)]) != 0
    if at_scale.exists():
        print("\n--- HTTP, as shares of the bare DRF view (benchmarks/bench_runs.py)")
        print_ratios(json.loads(at_scale.read_text())["results"])
    if proxy.exists():
        print("\n--- The endpoint proxy, as a share of the direct throughput (bench_serving.py)")
        print_proxy(json.loads(proxy.read_text())["results"])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
