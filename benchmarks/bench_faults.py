"""Faults, as make bench reports them: how the portal holds up when something misbehaves.

Slow webhooks (issue 30): a run's time from submitted to running, alone and while two slow
webhook receivers of another workspace hold the notifier's deliveries
(``benchmarks/fault_injection.py``, :func:`slow_webhooks_experiment`). Results go to
var/bench/faults.json. The longer fault-injection run (200 submissions under kill -9 and a
Redis outage) is ``benchmarks/fault_injection.py`` itself.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    os.environ.setdefault("TAU_LOG_LEVEL", "WARNING")
    from benchmarks.fault_injection import slow_webhooks_experiment
    from benchmarks.harness import SMOKE, django_test_database, report

    with django_test_database(), tempfile.TemporaryDirectory(prefix="taugrid-faults-") as name:
        slow_webhooks = slow_webhooks_experiment(
            var_dir=Path(name) / "var",
            baseline_runs=1 if SMOKE else 3,
            # Long enough to hold the receivers through the measurement; a smoke run only
            # needs the whole path to work.
            webhook_deadline_seconds=10 if SMOKE else 30,
        )
    report("faults", {"slow_webhooks": slow_webhooks})
    return 0


if __name__ == "__main__":
    sys.exit(main())
