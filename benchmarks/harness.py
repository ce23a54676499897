"""Shared set-up for benchmarks: Django against a throwaway test database, and timing helpers.

Benchmarks run under ``deploy/dev/test_services.py`` like the tests, so they measure the real
PostgreSQL and Redis, never a developer's data.

Smoke mode (``TAU_BENCH_SMOKE=1``): every benchmark runs end to end at tiny sizes with a few
iterations, and no goal is judged. ``make test`` runs them all that way
(tests/test_benchmarks.py), so a benchmark that no longer runs (a column added to a table it
writes, a URL renamed) fails the suite instead of being found broken the next time someone
wants a figure. A smoke run's figures mean nothing and say so.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: Tiny sizes, no goals judged (the module docstring).
SMOKE = os.environ.get("TAU_BENCH_SMOKE") == "1"
#: Where results go; smoke runs in the tests write to a folder of their own.
RESULTS = Path(
    os.environ.get("TAU_BENCH_RESULTS") or Path(__file__).resolve().parents[1] / "var" / "bench"
)


def sized(full: int, smoke: int) -> int:
    """``full`` for a real measurement, ``smoke`` in smoke mode."""
    return smoke if SMOKE else full


@contextmanager
def django_test_database() -> Iterator[None]:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django

    django.setup()
    from django.db import connection
    from django.test.utils import setup_test_environment, teardown_test_environment

    setup_test_environment()
    # A name of its own: the test suite runs the benchmarks (smoke mode) against the server
    # that holds the suite's own test database, which Django would otherwise clobber.
    connection.settings_dict.setdefault("TEST", {})["NAME"] = f"test_bench_{os.getpid()}"
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        yield
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)
        teardown_test_environment()


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))
    return ordered[index]


def measure(action: Callable[[], Any], *, iterations: int, warmup: int = 50) -> dict[str, float]:
    iterations, warmup = sized(iterations, 3), sized(warmup, 1)
    for _ in range(warmup):
        action()
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        action()
        samples.append(time.perf_counter() - start)
    return {
        "iterations": iterations,
        "median_ms": statistics.median(samples) * 1000,
        "p95_ms": percentile(samples, 0.95) * 1000,
        "p99_ms": percentile(samples, 0.99) * 1000,
    }


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "system": platform.platform(),
    }


def memory_gib() -> float:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    return 0.0


def load_average() -> str:
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "?"


def report(name: str, results: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    document = {"benchmark": name, "machine": machine(), "smoke": SMOKE, "results": results}
    (RESULTS / f"{name}.json").write_text(json.dumps(document, indent=2))
    print(f"\n== {name}{' (smoke run: tiny sizes, the figures mean nothing)' if SMOKE else ''} ==")
    for key, value in results.items():
        if isinstance(value, dict):
            shown = ", ".join(
                f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in value.items()
            )
            print(f"  {key}: {shown}")
        else:
            print(f"  {key}: {value}")
