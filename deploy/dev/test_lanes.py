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
- beside it, printed live: what ``--others-build`` builds for the tests that follow (the
  portal's image: seconds when warm), then every test that is neither a cluster nor a
  ``--fast`` one over ``--workers`` xdist workers, with ``TAU_TEST_LANE=others``.
- the ``--fast`` tests over every core (pytest-xdist, a database each, ``TAU_TEST_LANE=fast``:
  Redis databases of their own, tests/conftest.py), once, in whichever lane is free first.
  With warm caches that is the cluster lane (its output kept in var/test-lanes/fast.log and
  printed at the end), where the fast tests, which only compute, fill the cores while the
  last of the others mostly wait; on a new machine the control plane's build outlasts the
  others, and their lane runs them. No test builds anything itself.

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


class FastPass:
    """The fast tiers, run once, by whichever lane is free first (:meth:`claim`): warm, the
    cluster lane ends first and runs them beside the last of the others; cold, the control
    plane's build outlasts the others and their lane runs them."""

    def __init__(self, command: list[str]) -> None:
        self.command = command
        self.code: int | None = None
        self.took = 0.0
        self.ran_in = ""
        self._lock = threading.Lock()
        self._claimed = False

    def claim(self) -> bool:
        with self._lock:
            if self._claimed:
                return False
            self._claimed = True
            return True

    def run(self, lane: str, log: Path | None = None) -> None:
        """Run it (``log``: its output goes there, to be shown at the end; else live)."""
        started = time.monotonic()
        self.ran_in = lane
        if log is None:
            self.code = subprocess.run(  # noqa: S603 - the make target's own pytest
                self.command, cwd=ROOT, env=lane_environment("fast"), check=False
            ).returncode
        else:
            with log.open("wb") as output:
                self.code = subprocess.run(  # noqa: S603 - the make target's own pytest
                    self.command,
                    cwd=ROOT,
                    env=lane_environment("fast"),
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    check=False,
                ).returncode
        self.took = time.monotonic() - started


class ClusterLane(threading.Thread):
    """The cluster lane: the build (when there is one), then the cluster tier's pytest, then
    the fast tiers if the other lane has not taken them yet."""

    def __init__(self, build: list[str], pytest: list[str], fast: FastPass) -> None:
        super().__init__(name="cluster-lane", daemon=True)
        self.build = build
        self.pytest = pytest
        self.fast = fast
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
                    break
            else:
                self.code = 0
        finally:
            self.took = time.monotonic() - started
        if not self.stopping.is_set() and self.fast.claim():
            self.fast.run("cluster", LOGS / "fast.log")

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
    for old in ("cluster-build.log", "cluster.log", "fast.log"):
        (LOGS / old).unlink(missing_ok=True)
    started = time.monotonic()
    fast_pass = FastPass([*command, "-m", options.fast, "-n", "auto", "--dist", "loadscope"])
    cluster = ClusterLane(
        shlex.split(options.cluster_build),
        [*command, "-m", f"cluster and not {fast}", "-p", "no:cacheprovider"],
        fast_pass,
    )
    cluster.start()
    building = " after the control plane's build" if options.cluster_build else ""
    print(
        f"[test-lanes] the cluster tier runs beside this{building}; its output: "
        f"{(LOGS / 'cluster.log').relative_to(ROOT)}. The fast tiers run in whichever lane "
        "is free first.",
        flush=True,
    )
    built = 0
    try:
        if options.others_build:
            print(f"[test-lanes] building for the other tests: {options.others_build}", flush=True)
            built = subprocess.run(  # noqa: S603 - the make target's own build
                shlex.split(options.others_build), cwd=ROOT, check=False
            ).returncode
            if built:
                print(f"[test-lanes] that build failed (exit {built})", flush=True)
        others = subprocess.run(  # noqa: S603 - the make target's own pytest
            [
                *command,
                "-m",
                f"not cluster and not {fast}",
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
        if fast_pass.claim():
            print("[test-lanes] the fast tiers, in this lane:", flush=True)
            fast_pass.run("others")
        cluster.join()
    except KeyboardInterrupt:
        cluster.stop()
        raise
    if cluster.failed_in.endswith("build"):
        show(LOGS / "cluster-build.log")
    show(LOGS / "cluster.log")
    if fast_pass.ran_in == "cluster":
        show(LOGS / "fast.log")
    said = "" if not cluster.failed_in else f" in {cluster.failed_in}"
    build_said = f" (after its build failed: exit {built})" if built else ""
    print(
        f"\n[test-lanes] others: exit {others}{build_said} after {others_took / 60:.1f} min; "
        f"cluster: exit {cluster.code}{said} after {cluster.took / 60:.1f} min; "
        f"fast (in the {fast_pass.ran_in} lane): exit {fast_pass.code} in "
        f"{fast_pass.took / 60:.1f} min; all: {(time.monotonic() - started) / 60:.1f} min",
        flush=True,
    )
    codes = [
        outcome(fast_pass.code if fast_pass.code is not None else 1),
        built,
        outcome(others),
        outcome(cluster.code or 0),
    ]
    if cluster.code is None:
        codes.append(1)
    return next((code for code in codes if code), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
