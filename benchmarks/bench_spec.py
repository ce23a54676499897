"""tau.yaml parse + validate + normalise + hash (the article's example); target < 5 ms median."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import SMOKE, sized
from tau.spec.bench import main

if __name__ == "__main__":
    # A smoke run judges no budget (benchmarks/harness.py).
    budget = ["--budget-ms", "inf"] if SMOKE else []
    sys.exit(main(["--iterations", str(sized(2000, 5)), *budget]))
