"""Shared set-up for benchmarks: Django against a throwaway test database, and timing helpers.

Benchmarks run under ``deploy/dev/test_services.py`` like the tests, so they measure the real
PostgreSQL and Redis, never a developer's data.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "var" / "bench"


@contextmanager
def django_test_database() -> Iterator[None]:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django

    django.setup()
    from django.db import connection
    from django.test.utils import setup_test_environment, teardown_test_environment

    setup_test_environment()
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


def report(name: str, results: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    document = {"benchmark": name, "machine": machine(), "results": results}
    (RESULTS / f"{name}.json").write_text(json.dumps(document, indent=2))
    print(f"\n== {name} ==")
    for key, value in results.items():
        if isinstance(value, dict):
            shown = ", ".join(
                f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in value.items()
            )
            print(f"  {key}: {shown}")
        else:
            print(f"  {key}: {value}")
