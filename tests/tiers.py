"""The suite's tiers, by what a test costs (issue 31): every test gets exactly one of

- ``unit`` — no database, no process, no network;
- ``db`` — the database (PostgreSQL under ``make test``), nothing started;
- ``services`` — started processes: the portal's web server, Celery workers, the local agent,
  Prometheus, the S3 store (SeaweedFS) or a live test server;
- ``browser`` — a real Chromium;
- ``cluster`` — the real control plane (kube-apiserver, Kueue, KubeRay, KWOK);

from the markers and fixtures it already uses, so a new test is placed without anyone
remembering to. ``slow`` is set by hand on top of a tier, for a test that is costly in a
cheaper tier (it spawns a program, or waits out real time). ``make test-fast`` runs ``unit``
and ``db`` tests that are not ``slow``; ``make test`` runs everything and ends with the time
each tier took.

Each pass also ends with what its tests cost in CPU, by tier and the costliest tests: the
seconds of the test's process during its setup, call and teardown, and of every program it
started and waited for meanwhile (a portal, an agent, a training, a CLI call: counted whole
when it has ended). On two cores, with the lanes of ``make test`` side by side, CPU is what
the suite's time is made of (docs/tests.md): this says where it goes. Servers that outlive a
test (the control plane, PostgreSQL) are not in it.

Under pytest-xdist the modules are handed out longest first (``tests/durations.json``: each
module's seconds in a measured ``make test``), so that no long module starts last and keeps
one worker busy after the others have run out of work; a module not in the file counts as
a middling one. ``make test`` records each pass's modules in
``var/test-lanes/durations-<lane>.json``; ``python tests/tiers.py var/test-lanes/durations-*.json
> tests/durations.json`` makes them the new order.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
from collections import defaultdict
from collections.abc import Generator, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

TIERS = ("unit", "db", "services", "browser", "cluster")
#: Fixtures that start something (with what pulls them in, the tier of every test using them).
STARTS = {
    "cluster": {"kube_cluster"},
    "browser": {"browser"},
    "services": {
        "live_server",
        "portal",
        "agents",
        "start_agent",
        "prometheus",
        "dcgm_exporter",
        "s3_service",
    },
    "db": {"db", "transactional_db", "django_db_setup"},
}

_seconds: dict[str, float] = defaultdict(float)
_counts: dict[str, int] = defaultdict(int)
_cpu_by_tier: dict[str, float] = defaultdict(float)
_cpu_by_test: dict[str, float] = defaultdict(float)
_module_seconds: dict[str, float] = defaultdict(float)
#: Each module's seconds in a measured run: the order in which xdist hands them out.
DURATIONS = Path(__file__).with_name("durations.json")
#: Where a pass writes its own modules' seconds, if set (deploy/dev/test_lanes.py sets it).
RECORD_SETTING = "TAU_TEST_DURATIONS"
#: How many of the costliest tests each pass names.
COSTLIEST = 15
#: The CPU seconds counted for the phase of a test that has just run (setup, call, teardown).
_PHASE_CPU = pytest.StashKey[float]()


def tier_of(item: pytest.Item) -> str:
    marked = {mark.name for mark in item.iter_markers()}
    used = set(getattr(item, "fixturenames", ()))
    for tier in ("cluster", "browser", "services", "db"):
        if tier in marked or used & STARTS[tier]:
            return tier
    if "django_db" in marked:
        return "db"
    return "unit"


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def longest_first(items: Sequence[pytest.Item], seconds: Mapping[str, float]) -> list[pytest.Item]:
    """``items`` with their modules in order of ``seconds`` (longest first; a module not in
    it as the median of those that are), each module's tests in their own order. xdist's
    ``--dist loadscope`` hands modules (or classes) out in collection order: the longest
    first keeps a long one from starting when the rest are nearly done."""
    known = [
        seconds[module]
        for module in {module_of(item.nodeid) for item in items}
        if module in seconds
    ]
    middling = statistics.median(known) if known else 0.0
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(module_of(item.nodeid), len(first_seen))

    def key(item: pytest.Item) -> tuple[float, int]:
        module = module_of(item.nodeid)
        return (-seconds.get(module, middling), first_seen[module])

    return sorted(items, key=key)  # stable: a module's tests keep their order


def recorded_durations(path: Path | None = None) -> dict[str, float]:
    """The seconds recorded in ``path`` (:data:`DURATIONS`), none if it is missing or bad."""
    try:
        data = json.loads((path or DURATIONS).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item)
        # On the report too: under pytest-xdist the workers collect, the controller sums.
        item.user_properties.append(("tier", tier))
        if item.get_closest_marker(tier) is None:
            item.add_marker(getattr(pytest.mark, tier))
    # Under xdist the workers collect, each the same way, and the controller hands out what
    # they collected in that order.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items[:] = longest_first(items, recorded_durations())


def cpu_seconds() -> float:
    """CPU seconds, user and system, of this process and of every child it has waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _counted(item: pytest.Item) -> Iterator[None]:
    started = cpu_seconds()
    try:
        yield
    finally:  # a failing phase costs too
        item.stash[_PHASE_CPU] = cpu_seconds() - started


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _counted(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _counted(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    return (yield from _counted(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report: pytest.TestReport = yield
    # On the report: under pytest-xdist the workers measure, the controller sums.
    report.user_properties.append(("cpu", item.stash.get(_PHASE_CPU, 0.0)))
    item.stash[_PHASE_CPU] = 0.0
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    properties = dict(report.user_properties)
    tier = properties.get("tier")
    if not isinstance(tier, str):
        return
    _seconds[tier] += report.duration  # setup, call and teardown
    _module_seconds[module_of(report.nodeid)] += report.duration
    if report.when == "setup":
        _counts[tier] += 1
    cpu = properties.get("cpu")
    if isinstance(cpu, float):
        _cpu_by_tier[tier] += cpu
        _cpu_by_test[report.nodeid] += cpu


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get(RECORD_SETTING)
    if not target or os.environ.get("PYTEST_XDIST_WORKER") or not _module_seconds:
        return
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json_of(_module_seconds))
    partial.replace(path)


def json_of(seconds: Mapping[str, float]) -> str:
    return (
        json.dumps({module: round(seconds[module], 1) for module in sorted(seconds)}, indent=1)
        + "\n"
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _counts:
        return
    terminalreporter.section("time by tier")
    for tier in TIERS:
        if _counts.get(tier):
            terminalreporter.write_line(
                f"{tier:<9} {_counts[tier]:>5} tests  {_seconds[tier] / 60:6.1f} min"
                f"  (CPU {_cpu_by_tier[tier] / 60:.1f} min)"
            )
    costliest = sorted(_cpu_by_test.items(), key=lambda pair: -pair[1])[:COSTLIEST]
    if costliest:
        terminalreporter.section(
            f"costliest {len(costliest)} tests by CPU (theirs and their programs')"
        )
        for nodeid, cpu in costliest:
            terminalreporter.write_line(f"{cpu:8.1f}s  {nodeid}")


def main(paths: list[str]) -> int:
    """Merge the passes' records (``var/test-lanes/durations-*.json``) into one, printed."""
    merged: dict[str, float] = {}
    for path in paths:
        merged.update(recorded_durations(Path(path)))
    sys.stdout.write(json_of(merged))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
