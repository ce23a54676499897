"""make test's second pass (deploy/dev/test_lanes.py): the cluster tier in a lane of its own,
with its own test databases and Redis database, beside every other test over xdist workers;
nothing of the first pass in either, and the pass fails when either lane fails."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
lanes = load_script(ROOT / "deploy" / "dev" / "test_lanes.py", "taugrid_test_lanes")

#: Stands in for pytest: records how it was called, exits with the code asked for its lane.
FAKE_PYTEST = """
import json, os, sys
args = sys.argv[1:]
lane = "cluster" if "-n" not in args else "others"
with open(os.environ["CALLS"], "a") as calls:
    calls.write(json.dumps({"lane": lane, "args": args, "env": {
        key: os.environ.get(key) for key in ("TAU_TEST_LANE", "REDIS_URL", "CELERY_BROKER_URL")
    }}) + "\\n")
print(f"{lane} says hello")
sys.exit(int(os.environ.get(f"EXIT_{lane.upper()}", "0")))
"""


@pytest.fixture
def fake_pytest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    script = tmp_path / "fake_pytest.py"
    script.write_text(FAKE_PYTEST)
    monkeypatch.setenv("CALLS", str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("REDIS_URL", "redis://default:secret@127.0.0.1:6390/0")
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://default:secret@127.0.0.1:6390/0")
    monkeypatch.delenv("TAU_TEST_LANE", raising=False)
    monkeypatch.setattr(lanes, "LOGS", tmp_path / "lanes")
    monkeypatch.setattr(lanes, "ROOT", tmp_path)
    return [sys.executable, str(script)]


def calls(tmp_path: Path) -> dict[str, dict[str, Any]]:
    lines = (tmp_path / "calls.jsonl").read_text().splitlines()
    return {call["lane"]: call for call in map(json.loads, lines)}


@pytest.mark.slow
def test_the_cluster_tier_runs_in_its_own_lane_beside_the_others(
    fake_pytest: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = lanes.main(["--besides", "unit or db", "--", *fake_pytest, "tests/runs", "-x"])
    assert code == 0
    made = calls(tmp_path)
    cluster, others = made["cluster"], made["others"]
    # What each lane selects: the cluster tier there, everything else here, the first
    # pass's tests in neither; the arguments given are passed on to both.
    assert cluster["args"][:2] == ["tests/runs", "-x"]
    assert cluster["args"][cluster["args"].index("-m") + 1] == "cluster and not (unit or db)"
    assert others["args"][others["args"].index("-m") + 1] == "not cluster and not (unit or db)"
    assert others["args"][others["args"].index("-n") + 1] == "2"
    # The cluster lane's own test databases (tests/conftest.py) and Redis database.
    assert cluster["env"]["TAU_TEST_LANE"] == "cluster"
    assert cluster["env"]["REDIS_URL"] == "redis://default:secret@127.0.0.1:6390/1"
    assert cluster["env"]["CELERY_BROKER_URL"] == "redis://default:secret@127.0.0.1:6390/1"
    assert others["env"]["TAU_TEST_LANE"] == "others"
    assert others["env"]["REDIS_URL"] == "redis://default:secret@127.0.0.1:6390/0"
    # The cluster lane's output is kept, and shown after the other lane's.
    assert (tmp_path / "lanes" / "cluster.log").read_text() == "cluster says hello\n"
    shown = capsys.readouterr().out
    assert "cluster says hello" in shown


@pytest.mark.slow
@pytest.mark.parametrize(
    ("exits", "expected"),
    [
        ({"EXIT_CLUSTER": "1"}, 1),
        ({"EXIT_OTHERS": "2"}, 2),
        ({"EXIT_OTHERS": "5", "EXIT_CLUSTER": "5"}, 0),  # nothing selected in either: fine
        ({"EXIT_OTHERS": "5", "EXIT_CLUSTER": "1"}, 1),
    ],
)
def test_the_pass_fails_when_either_lane_fails(
    fake_pytest: list[str], monkeypatch: pytest.MonkeyPatch, exits: dict[str, str], expected: int
) -> None:
    for name, value in exits.items():
        monkeypatch.setenv(name, value)
    assert lanes.main(["--besides", "unit", "--", *fake_pytest]) == expected


def test_only_a_redis_url_gets_the_lanes_database() -> None:
    assert lanes.in_database("redis://:pw@127.0.0.1:1/0", 1) == "redis://:pw@127.0.0.1:1/1"
    assert lanes.in_database("rediss://h:6380", 1) == "rediss://h:6380/1"
    assert lanes.in_database("filesystem://", 1) == "filesystem://"


def test_each_xdist_worker_has_a_redis_database_of_its_own(settings: Any) -> None:
    """tests/conftest.py: the portal processes one worker's tests start take no task of
    another worker's (Celery's queues are per Redis database)."""
    from portal.celery import app
    from tests.conftest import worker_database

    broker = "redis://default:pw@127.0.0.1:6390/0"
    assert worker_database(broker, "gw0") == "redis://default:pw@127.0.0.1:6390/2"
    assert worker_database(broker, "gw1") == "redis://default:pw@127.0.0.1:6390/3"
    assert worker_database(broker, "gw14") == "redis://default:pw@127.0.0.1:6390/2"
    assert worker_database("filesystem://", "gw1") == "filesystem://"
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and settings.CELERY_BROKER_URL.startswith("redis"):  # so under make test
        number = int(settings.CELERY_BROKER_URL.rsplit("/", 1)[1])
        assert number == 2 + int(worker.removeprefix("gw")) % 14
        assert app.conf.broker_url == settings.CELERY_BROKER_URL
        assert settings.CACHES["default"]["LOCATION"] == settings.CELERY_BROKER_URL
