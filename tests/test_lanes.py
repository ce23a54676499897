"""make test's lanes (deploy/dev/test_lanes.py): the control plane's build and then the cluster
tier in a lane of their own, with their own test databases and Redis database; beside them the
fast tiers over every core, then every other test over xdist workers; no test in two passes,
and the run fails when any pass (or the build) fails."""

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

#: Stands in for pytest and for the build: records how it was called and when, and exits with
#: the code asked for its pass.
FAKE = """
import json, os, sys, time
args = sys.argv[1:]
name = args[0] if args[:1] in (["build"], ["image"]) else os.environ.get("TAU_TEST_LANE", "?")
started = time.time()
time.sleep(float(os.environ.get(f"{name.upper()}_SECONDS", "0")))
with open(os.environ["CALLS"], "a") as calls:
    calls.write(json.dumps({"pass": name, "args": args, "started": started, "ended": time.time(),
        "env": {key: os.environ.get(key) for key in ("REDIS_URL", "CELERY_BROKER_URL")}}) + "\\n")
print(f"{name} says hello")
sys.exit(int(os.environ.get(f"EXIT_{name.upper()}", "0")))
"""


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    script = tmp_path / "fake.py"
    script.write_text(FAKE)
    monkeypatch.setenv("CALLS", str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("REDIS_URL", "redis://default:secret@127.0.0.1:6390/0")
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://default:secret@127.0.0.1:6390/0")
    monkeypatch.delenv("TAU_TEST_LANE", raising=False)
    monkeypatch.setattr(lanes, "LOGS", tmp_path / "lanes")
    monkeypatch.setattr(lanes, "ROOT", tmp_path)
    return [sys.executable, str(script)]


def calls(tmp_path: Path) -> dict[str, dict[str, Any]]:
    lines = (tmp_path / "calls.jsonl").read_text().splitlines()
    return {call["pass"]: call for call in map(json.loads, lines)}


def run_lanes(fake: list[str], *pytest_args: str) -> int:
    build, image = " ".join([*fake, "build"]), " ".join([*fake, "image"])
    code: int = lanes.main(
        [
            "--fast",
            "unit or db",
            "--cluster-build",
            build,
            "--others-build",
            image,
            "--",
            *fake,
            *pytest_args,
        ]
    )
    return code


def selection(call: dict[str, Any]) -> str:
    return str(call["args"][call["args"].index("-m") + 1])


@pytest.mark.slow
def test_the_cluster_tier_runs_after_the_build_beside_the_others(
    fake: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("BUILD_SECONDS", "2")
    assert run_lanes(fake, "tests/runs", "-x") == 0
    made = calls(tmp_path)
    build, cluster, fast, others = made["build"], made["cluster"], made["fast"], made["others"]
    image = made["image"]
    # What each pass selects: the fast tiers first, the cluster tier in its lane, everything
    # else after the fast ones; the arguments given are passed on to every pass.
    for call in (cluster, fast, others):
        assert call["args"][:2] == ["tests/runs", "-x"]
    assert selection(fast) == "unit or db"
    assert fast["args"][fast["args"].index("-n") + 1] == "auto"
    assert selection(cluster) == "cluster and not (unit or db)"
    assert "-n" not in cluster["args"]  # one test after another
    assert selection(others) == "not cluster and not (unit or db)"
    assert others["args"][others["args"].index("-n") + 1] == "2"
    # The build, then the cluster tier. The other tests did not wait for the build; what
    # they need was built before them (no test builds); and the fast tiers, run once, by
    # the lane free first: this one, the build still going on.
    assert build["ended"] <= cluster["started"]
    assert image["ended"] <= others["started"]
    assert others["started"] < build["ended"]
    assert others["ended"] <= fast["started"] < build["ended"]
    shown = capsys.readouterr().out
    assert "the fast tiers, in this lane" in shown
    # The cluster lane's own Redis database (its test databases: TAU_TEST_LANE, conftest.py).
    assert cluster["env"]["REDIS_URL"] == "redis://default:secret@127.0.0.1:6390/1"
    assert cluster["env"]["CELERY_BROKER_URL"] == "redis://default:secret@127.0.0.1:6390/1"
    assert others["env"]["REDIS_URL"] == "redis://default:secret@127.0.0.1:6390/0"
    assert fast["env"]["REDIS_URL"] == "redis://default:secret@127.0.0.1:6390/0"
    # The cluster lane's output is kept, and shown after the others' (the build's, which
    # passed, only in its file).
    assert (tmp_path / "lanes" / "cluster.log").read_text() == "cluster says hello\n"
    assert (tmp_path / "lanes" / "cluster-build.log").read_text() == "build says hello\n"
    assert "cluster says hello" in shown
    assert "build says hello" not in shown


@pytest.mark.slow
def test_warm_the_cluster_lane_runs_the_fast_tiers_once_beside_the_last_of_the_others(
    fake: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With the control plane built, the cluster tier ends before the others: its lane runs
    the fast tiers while the others go on, and keeps their output to show it at the end."""
    monkeypatch.setenv("OTHERS_SECONDS", "3")
    assert run_lanes(fake) == 0
    lines = (tmp_path / "calls.jsonl").read_text().splitlines()
    assert [json.loads(line)["pass"] for line in lines].count("fast") == 1
    made = calls(tmp_path)
    cluster, fast, others = made["cluster"], made["fast"], made["others"]
    assert cluster["ended"] <= fast["started"] < others["ended"]
    assert (tmp_path / "lanes" / "fast.log").read_text() == "fast says hello\n"
    shown = capsys.readouterr().out
    assert "the fast tiers, in this lane" not in shown
    assert "fast says hello" in shown  # from its log, after the others' output
    assert "fast (in the cluster lane): exit 0" in shown


@pytest.mark.slow
@pytest.mark.parametrize(
    ("exits", "expected"),
    [
        ({"EXIT_CLUSTER": "1"}, 1),
        ({"EXIT_OTHERS": "2"}, 2),
        ({"EXIT_FAST": "3"}, 3),
        ({"EXIT_BUILD": "4"}, 4),
        ({"EXIT_IMAGE": "6"}, 6),
        ({"EXIT_OTHERS": "5", "EXIT_CLUSTER": "5", "EXIT_FAST": "5"}, 0),  # nothing selected
        ({"EXIT_OTHERS": "5", "EXIT_CLUSTER": "1"}, 1),
    ],
)
def test_the_run_fails_when_any_pass_fails(
    fake: list[str], monkeypatch: pytest.MonkeyPatch, exits: dict[str, str], expected: int
) -> None:
    for name, value in exits.items():
        monkeypatch.setenv(name, value)
    assert run_lanes(fake) == expected


@pytest.mark.slow
def test_a_failed_build_is_shown_and_no_cluster_test_runs(
    fake: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("EXIT_BUILD", "1")
    assert run_lanes(fake) == 1
    assert set(calls(tmp_path)) == {"build", "fast", "image", "others"}
    shown = capsys.readouterr().out
    assert "build says hello" in shown
    assert "cluster: exit 1 in the control plane's build" in shown


@pytest.mark.slow
def test_a_failed_build_for_the_others_fails_the_run_and_they_still_run(
    fake: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("EXIT_IMAGE", "1")
    assert run_lanes(fake) == 1
    # The tests that need what it builds fail, saying so; the rest are still worth running.
    assert set(calls(tmp_path)) == {"build", "fast", "image", "cluster", "others"}
    shown = capsys.readouterr().out
    assert "that build failed (exit 1)" in shown
    assert "others: exit 0 (after its build failed: exit 1)" in shown


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
    assert worker_database(broker, "gw0", "others") == "redis://default:pw@127.0.0.1:6390/2"
    assert worker_database(broker, "gw1", "others") == "redis://default:pw@127.0.0.1:6390/3"
    assert worker_database(broker, "gw7", "others") == "redis://default:pw@127.0.0.1:6390/2"
    # The fast lane may run beside the others: its workers have the other half.
    assert worker_database(broker, "gw0", "fast") == "redis://default:pw@127.0.0.1:6390/9"
    assert worker_database(broker, "gw1", "fast") == "redis://default:pw@127.0.0.1:6390/10"
    assert worker_database(broker, "gw7", "fast") == "redis://default:pw@127.0.0.1:6390/9"
    assert worker_database("filesystem://", "gw1", "others") == "filesystem://"
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and settings.CELERY_BROKER_URL.startswith("redis"):  # so under make test
        number = int(settings.CELERY_BROKER_URL.rsplit("/", 1)[1])
        first = 9 if os.environ.get("TAU_TEST_LANE") == "fast" else 2
        assert number == first + int(worker.removeprefix("gw")) % 7
        assert app.conf.broker_url == settings.CELERY_BROKER_URL
        assert settings.CACHES["default"]["LOCATION"] == settings.CELERY_BROKER_URL
