#!/usr/bin/env python3
"""``make test``'s tests, in lanes, on the suite's PostgreSQL and Redis
(deploy/dev/test_services.py).

    python deploy/dev/test_lanes.py --fast "(unit or db) and not slow" \
        [--cluster-build "python deploy/cluster/controlplane.py build"] \
        [--others-build "python deploy/dev/oci_image.py build"] -- .venv/bin/pytest [ARGS]

- ``cluster``: first the control plane's build, if ``--cluster-build`` gives its command
  (cached: seconds when warm; on a new machine most of the time ``make test`` takes), then the
  cluster tier, one test after another in one pytest session: its tests share the one control
  plane, its nodes' GPUs and its cluster-wide objects. It runs with ``TAU_TEST_LANE=cluster``
  (test databases of its own, tests/conftest.py) and Redis database 1 (a cache and Celery
  queues of its own). Its output is kept in var/test-lanes/cluster-build.log and
  var/test-lanes/cluster.log, and printed once the other lane has ended.
- beside it, printed live: first the ``--fast`` tests over every core (pytest-xdist, a
  database each), then what ``--others-build`` builds for the tests that follow (the portal's
  image: seconds when warm), then every other test over ``--workers`` xdist workers, with
  ``TAU_TEST_LANE=others``. No test builds anything itself.

Most of the tests besides the fast ones wait (for a portal to start, a run to end, Kueue to
admit), and so does a cold build's download; so on a 2-core machine the lanes together take
little longer than the longer one alone. Exit status: 0 when every pass and build passed (a
pass may have nothing to run: pytest's 5), else the first failing one's. Standard library
only.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import threading
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


class ClusterLane(threading.Thread):
    """The cluster lane: the build (when there is one), then the cluster tier's pytest."""

    def __init__(self, build: list[str], pytest: list[str]) -> None:
        super().__init__(name="cluster-lane", daemon=True)
        self.build = build
        self.pytest = pytest
        self.code: int | None = None
        self.failed_in = ""
        self.took = 0.0
        self.process: subprocess.Popen[bytes] | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        started = time.monotonic()
        try:
            for step, command, log in (
                ("the control plane's build", self.build, LOGS / "cluster-build.log"),
                ("the cluster tier", self.pytest, LOGS / "cluster.log"),
            ):
                if not command or self.stopping.is_set():
                    continue
                with log.open("wb") as output:
                    self.process = subprocess.Popen(  # noqa: S603 - the make target's own
                        command,
                        cwd=ROOT,
                        env=lane_environment("cluster", 1),
                        stdout=output,
                        stderr=subprocess.STDOUT,
                    )
                    code = self.process.wait()
                if code if command is self.build else outcome(code):
                    self.code, self.failed_in = code, step
                    return
            self.code = 0
        finally:
            self.took = time.monotonic() - started

    def stop(self) -> None:
        self.stopping.set()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
        self.join()


def show(path: Path) -> None:
    if path.exists():
        print(f"\n[test-lanes] {path.relative_to(ROOT)}:\n", flush=True)
        sys.stdout.buffer.write(path.read_bytes())
        sys.stdout.flush()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--fast", required=True, help="marker expression of the tests run first, over every core"
    )
    parser.add_argument(
        "--cluster-build",
        default="",
        help="the command that builds the control plane (a shell line)",
    )
    parser.add_argument(
        "--others-build",
        default="",
        help="the command that builds what the other tests need, run after the fast pass",
    )
    parser.add_argument("--workers", default="2", help="pytest-xdist workers of the other lane")
    parser.add_argument("pytest", nargs=argparse.REMAINDER, help="-- PYTEST [ARGS...]")
    options = parser.parse_args(argv)
    command = options.pytest[1:] if options.pytest[:1] == ["--"] else options.pytest
    if not command:
        parser.error("give the pytest command after --")
    fast = f"({options.fast})"

    LOGS.mkdir(parents=True, exist_ok=True)
    for old in ("cluster-build.log", "cluster.log"):
        (LOGS / old).unlink(missing_ok=True)
    started = time.monotonic()
    cluster = ClusterLane(
        shlex.split(options.cluster_build),
        [*command, "-m", f"cluster and not {fast}", "-p", "no:cacheprovider"],
    )
    cluster.start()
    building = " after the control plane's build" if options.cluster_build else ""
    print(
        f"[test-lanes] the cluster tier runs beside this{building}; its output: "
        f"{(LOGS / 'cluster.log').relative_to(ROOT)}",
        flush=True,
    )
    passes: dict[str, int] = {}
    built = 0
    try:
        for name, selection, workers in (
            ("fast", options.fast, "auto"),
            ("others", f"not cluster and not {fast}", options.workers),
        ):
            if name == "others" and options.others_build:
                print(
                    f"[test-lanes] building for the other tests: {options.others_build}",
                    flush=True,
                )
                built = subprocess.run(  # noqa: S603 - the make target's own build
                    shlex.split(options.others_build), cwd=ROOT, check=False
                ).returncode
                if built:
                    print(f"[test-lanes] that build failed (exit {built})", flush=True)
            passes[name] = subprocess.run(  # noqa: S603 - the make target's own pytest
                [*command, "-m", selection, "-n", workers, "--dist", "loadscope"],
                cwd=ROOT,
                env=lane_environment(name),
                check=False,
            ).returncode
        others_took = time.monotonic() - started
        cluster.join()
    except KeyboardInterrupt:
        cluster.stop()
        raise
    if cluster.failed_in.endswith("build"):
        show(LOGS / "cluster-build.log")
    show(LOGS / "cluster.log")
    said = "" if not cluster.failed_in else f" in {cluster.failed_in}"
    build_said = f" (after its build failed: exit {built})" if built else ""
    print(
        f"\n[test-lanes] fast: exit {passes['fast']}; others: exit {passes['others']}"
        f"{build_said} after {others_took / 60:.1f} min; cluster: exit {cluster.code}{said} "
        f"after {cluster.took / 60:.1f} min",
        flush=True,
    )
    codes = [
        outcome(passes["fast"]),
        built,
        outcome(passes["others"]),
        outcome(cluster.code or 0),
    ]
    if cluster.code is None:
        codes.append(1)
    return next((code for code in codes if code), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
