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
"""

from __future__ import annotations

import resource
from collections import defaultdict
from collections.abc import Generator, Iterator

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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item)
        # On the report too: under pytest-xdist the workers collect, the controller sums.
        item.user_properties.append(("tier", tier))
        if item.get_closest_marker(tier) is None:
            item.add_marker(getattr(pytest.mark, tier))


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
    if report.when == "setup":
        _counts[tier] += 1
    cpu = properties.get("cpu")
    if isinstance(cpu, float):
        _cpu_by_tier[tier] += cpu
        _cpu_by_test[report.nodeid] += cpu


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
