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
"""

from __future__ import annotations

from collections import defaultdict

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


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tier = dict(report.user_properties).get("tier")
    if not isinstance(tier, str):
        return
    _seconds[tier] += report.duration  # setup, call and teardown
    if report.when == "setup":
        _counts[tier] += 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _counts:
        return
    terminalreporter.section("time by tier")
    for tier in TIERS:
        if _counts.get(tier):
            terminalreporter.write_line(
                f"{tier:<9} {_counts[tier]:>5} tests  {_seconds[tier] / 60:6.1f} min"
            )
