"""The tiers of tests/tiers.py: each test lands in the tier of the costliest thing it uses
(a marker or a fixture, however deeply requested), and ``make test-fast`` selects by them."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = """
import pytest

@pytest.fixture
def db(): return None

@pytest.fixture(scope="session")
def browser(): return None

@pytest.fixture(scope="session")
def kube_cluster(): return None

@pytest.fixture
def page(browser): return None

@pytest.fixture
def through_the_cluster(kube_cluster): return None
"""

TESTS = """
import pytest

def test_plain(): pass
def test_database(db): pass
@pytest.mark.django_db
def test_marked_database(): pass
def test_page(page): pass
def test_deep_cluster(through_the_cluster, db): pass
@pytest.mark.services
def test_marked_services(db): pass
@pytest.mark.slow
def test_slow_database(db): pass
"""


def selected(pytester: pytest.Pytester, expression: str) -> list[str]:
    result = pytester.runpytest(
        "-p", "no:django", "-p", "tests.tiers", "--collect-only", "-q", "-m", expression
    )
    return sorted(
        line.split("::")[1] for line in result.outlines if line.startswith("test_sample.py::")
    )


def test_each_test_is_in_the_tier_of_the_costliest_thing_it_uses(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_sample=TESTS)
    pytester.makeini(
        "[pytest]\nmarkers =\n    unit\n    db\n    slow\n    services\n    browser\n    cluster\n"
        "    django_db\n"
    )
    assert selected(pytester, "unit") == ["test_plain"]
    assert selected(pytester, "db") == [
        "test_database",
        "test_marked_database",
        "test_slow_database",
    ]
    assert selected(pytester, "browser") == ["test_page"]
    assert selected(pytester, "cluster") == ["test_deep_cluster"]
    assert selected(pytester, "services") == ["test_marked_services"]
    # What make test-fast runs.
    assert selected(pytester, "(unit or db) and not slow") == [
        "test_database",
        "test_marked_database",
        "test_plain",
    ]


COSTS = """
import subprocess, sys, time

BUSY = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.6: pass"

def test_idle(): time.sleep(0.3)
def test_busy_in_a_child(): subprocess.run([sys.executable, "-c", BUSY], check=True)
def test_busy_itself():
    started = time.process_time()
    while time.process_time() - started < 0.3: pass
"""


@pytest.mark.slow  # starts pytest
@pytest.mark.parametrize("workers", [[], ["-p", "xdist", "-n", "2"]], ids=["alone", "xdist"])
def test_each_pass_names_its_costliest_tests_by_cpu_their_programs_included(
    pytester: pytest.Pytester, workers: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test's own CPU and its programs' count (a child's whole life once it has ended);
    time spent waiting does not; under pytest-xdist the controller adds up what the workers
    measured."""
    pytester.makepyfile(test_costs=COSTS)
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))  # tests.tiers
    result = pytester.runpytest_subprocess("-p", "no:django", "-p", "tests.tiers", *workers)
    result.assert_outcomes(passed=3)
    title = next(n for n, line in enumerate(result.outlines) if "costliest 3 tests by CPU" in line)
    lines = result.outlines[title + 1 : title + 4]
    named = [line.split()[1].split("::")[1] for line in lines]
    seconds = [float(line.split()[0].rstrip("s")) for line in lines]
    assert named == ["test_busy_in_a_child", "test_busy_itself", "test_idle"], lines
    assert seconds[0] >= 0.6, lines
    assert seconds[1] >= 0.3, lines
    assert seconds[2] < 0.2, lines
    (unit,) = [line for line in result.outlines if line.startswith("unit ")]
    assert unit.split()[:2] == ["unit", "3"], unit
    assert "(CPU 0.0 min)" in unit, unit  # 1 s in all, in minutes
