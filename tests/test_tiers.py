"""The tiers of tests/tiers.py: each test lands in the tier of the costliest thing it uses
(a marker or a fixture, however deeply requested), and ``make test-fast`` selects by them."""

from __future__ import annotations

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
