"""``python -m tau.spec.bench``: how long parsing, checking, normalising and hashing take.

Submission validates every spec on the request path, so this must stay far below the 5 ms
median budget. Each iteration is the whole path the server takes: bytes in, ``Spec`` and
``spec_hash`` out. The default input is the article's example (the spec users copy first).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable, Sequence

from tau.spec import load_spec, spec_hash, validate
from tau.spec.samples import ARTICLE_EXAMPLE


def measure(work: Callable[[], object], iterations: int) -> list[float]:
    """Seconds per call, after a short warm-up; the collector is paused while timing."""
    for _ in range(min(50, iterations)):
        work()
    timings: list[float] = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(iterations):
            started = time.perf_counter()
            work()
            timings.append(time.perf_counter() - started)
    finally:
        gc.enable()
    return timings


def summary(timings: Sequence[float]) -> dict[str, float]:
    """Median, 99th percentile, mean and maximum, in milliseconds."""
    ordered = sorted(timings)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "median_ms": statistics.median(ordered) * 1000,
        "p99_ms": p99 * 1000,
        "mean_ms": statistics.fmean(ordered) * 1000,
        "max_ms": ordered[-1] * 1000,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tau.spec.bench", description=__doc__)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--file", help="a tau.yaml to time instead of the article's example")
    parser.add_argument(
        "--budget-ms",
        type=float,
        default=5.0,
        help="exit 1 if the median of the full path is above this (default 5)",
    )
    arguments = parser.parse_args(argv)
    if arguments.file:
        with open(arguments.file, "rb") as handle:
            source = handle.read()
    else:
        source = ARTICLE_EXAMPLE.encode("utf-8")
    if validate(source):
        print("the input is not a valid spec; validate it first", file=sys.stderr)
        return 1

    def full_path() -> None:
        spec_hash(load_spec(source))

    spec = load_spec(source)
    cases: list[tuple[str, Callable[[], object]]] = [
        ("parse+validate+normalise+hash", full_path),
        ("validate only", lambda: validate(source)),
        ("hash only", lambda: spec_hash(spec)),
    ]
    print(f"{arguments.iterations} iterations, Python {sys.version.split()[0]}")
    median_of_full_path = 0.0
    for label, work in cases:
        numbers = summary(measure(work, arguments.iterations))
        if work is full_path:
            median_of_full_path = numbers["median_ms"]
        print(
            f"{label:32} median {numbers['median_ms']:.3f} ms   p99 {numbers['p99_ms']:.3f} ms"
            f"   mean {numbers['mean_ms']:.3f} ms   max {numbers['max_ms']:.3f} ms"
        )
    if median_of_full_path > arguments.budget_ms:
        print(f"median above the {arguments.budget_ms} ms budget", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
