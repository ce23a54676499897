#!/usr/bin/env python3
"""The second pass of ``make test``: the tests that start processes, Chromium or the control
plane, in two lanes at once, on the suite's PostgreSQL and Redis (deploy/dev/test_services.py).

    python deploy/dev/test_lanes.py --besides "(unit or db) and not slow" -- .venv/bin/pytest [ARGS]

- ``cluster``: the cluster tier, one test after another in one pytest session: its tests
  share the one control plane, its nodes' GPUs and its cluster-wide objects. It runs with
  ``TAU_TEST_LANE=cluster`` (test databases of its own, tests/conftest.py) and Redis database
  1 (a cache and Celery queues of its own). Its output is kept in var/test-lanes/cluster.log
  and printed once the other lane has ended.
- ``others``: every other test, over pytest-xdist workers (a database each), printed live,
  with ``TAU_TEST_LANE=others``.

Most of these tests wait (for a portal to start, a run to end, Kueue to admit), so on a
2-core machine the two lanes together take little longer than the longer one alone. The tests
``--besides`` selects (the first pass's) are left out of both. Exit status: 0 when both lanes
passed or had nothing to run (pytest's 5), else the first failing lane's. Standard library
only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "var" / "test-lanes"
NOTHING_SELECTED = 5
#: The Redis URLs a lane gets a database of its own in.
REDIS_SETTINGS = ("REDIS_URL", "CELERY_BROKER_URL", "TAU_CACHE_URL")


def in_database(url: str, number: int) -> str:
    """``url`` (a Redis URL) pointing at database ``number``; any other URL unchanged."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        return url
    return urlunsplit(parts._replace(path=f"/{number}"))


def lane_environment(name: str, redis_database: int | None = None) -> dict[str, str]:
    """This environment for the lane ``name``, in its own Redis database if one is given."""
    env = dict(os.environ, TAU_TEST_LANE=name)
    for setting in REDIS_SETTINGS:
        if env.get(setting) and redis_database is not None:
            env[setting] = in_database(env[setting], redis_database)
    return env


def outcome(code: int) -> int:
    return 0 if code == NOTHING_SELECTED else code


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--besides", required=True, help="marker expression of the tests to leave out"
    )
    parser.add_argument("--workers", default="2", help="pytest-xdist workers of the other lane")
    parser.add_argument("pytest", nargs=argparse.REMAINDER, help="-- PYTEST [ARGS...]")
    options = parser.parse_args(argv)
    command = options.pytest[1:] if options.pytest[:1] == ["--"] else options.pytest
    if not command:
        parser.error("give the pytest command after --")
    besides = f"({options.besides})"

    LOGS.mkdir(parents=True, exist_ok=True)
    cluster_log_path = LOGS / "cluster.log"
    started = time.monotonic()
    with cluster_log_path.open("wb") as cluster_log:
        cluster = subprocess.Popen(  # noqa: S603 - the make target's own pytest
            [*command, "-m", f"cluster and not {besides}", "-p", "no:cacheprovider"],
            cwd=ROOT,
            env=lane_environment("cluster", 1),
            stdout=cluster_log,
            stderr=subprocess.STDOUT,
        )
        print(
            f"[test-lanes] the cluster tier runs beside this (pid {cluster.pid}); its output: "
            f"{cluster_log_path.relative_to(ROOT)}",
            flush=True,
        )
        try:
            others = subprocess.run(  # noqa: S603 - the make target's own pytest
                [
                    *command,
                    "-m",
                    f"not cluster and not {besides}",
                    "-n",
                    options.workers,
                    "--dist",
                    "loadscope",
                ],
                cwd=ROOT,
                env=lane_environment("others"),
                check=False,
            ).returncode
            others_took = time.monotonic() - started
            cluster_code = cluster.wait()
        except KeyboardInterrupt:
            cluster.terminate()
            cluster.wait()
            raise
    cluster_took = time.monotonic() - started
    print(
        f"\n[test-lanes] the cluster tier's lane ({cluster_log_path.relative_to(ROOT)}):\n",
        flush=True,
    )
    sys.stdout.buffer.write(cluster_log_path.read_bytes())
    print(
        f"\n[test-lanes] others: exit {others} after {others_took / 60:.1f} min; "
        f"cluster: exit {cluster_code} after {cluster_took / 60:.1f} min",
        flush=True,
    )
    return outcome(others) or outcome(cluster_code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
