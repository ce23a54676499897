"""The cpu-quickstart program trains, writes metrics and checkpoints, fails on request and
resumes from its newest checkpoint, computing exactly what an uninterrupted run computes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .support import REPO

TRAIN = REPO / "examples" / "cpu-quickstart" / "train.py"
# Smaller than the example's defaults so the test takes about a second.
SMALL = [
    "--steps", "60", "--samples", "2000", "--features", "8", "--batch-size", "64",
    "--log-every", "10", "--checkpoint-every", "10",
]  # fmt: skip


def train(
    tmp: Path, *extra: str, env: dict[str, str] | None = None, name: str = "run"
) -> subprocess.CompletedProcess[str]:
    # Only the variables the platform would set: none leak in from whoever runs the tests.
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("TAU_") and key != "EXAMPLE_FAIL_AT_STEP"
    }
    environment["TAU_OUTPUT_DIR"] = str(tmp / name / "outputs")
    environment["TAU_CHECKPOINT_DIR"] = str(tmp / name / "checkpoints")
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, str(TRAIN), *SMALL, *extra],
        capture_output=True,
        text=True,
        env=environment,
        cwd=tmp,
        timeout=120,
        check=False,
    )


def metrics(tmp: Path, name: str = "run") -> list[dict[str, float]]:
    lines = (tmp / name / "outputs" / "metrics.jsonl").read_text("utf-8").splitlines()
    return [json.loads(line) for line in lines]


def checkpoints(tmp: Path, name: str = "run") -> list[Path]:
    root = tmp / name / "checkpoints"
    return sorted(root.glob("step-*"), key=lambda path: int(path.name.split("-")[1]))


def test_a_run_writes_metrics_rows_and_complete_checkpoints(tmp_path: Path) -> None:
    result = train(tmp_path)
    assert result.returncode == 0, result.stderr

    rows = metrics(tmp_path)
    assert [row["step"] for row in rows] == [10, 20, 30, 40, 50, 60]
    assert all({"loss", "val_loss", "val_accuracy"} <= set(row) for row in rows)
    assert rows[-1]["val_loss"] < rows[0]["val_loss"]

    kept = checkpoints(tmp_path)
    assert [path.name for path in kept] == ["step-40", "step-50", "step-60"]
    for path in kept:
        assert (path / "COMPLETE").is_file()
        assert json.loads((path / "state.json").read_text())["step"] == int(path.name[5:])
    assert not list((tmp_path / "run" / "checkpoints").glob(".step-*"))  # no temp dirs left
    assert (tmp_path / "run" / "outputs" / "model.json").is_file()


def test_the_same_seed_gives_the_same_numbers(tmp_path: Path) -> None:
    assert train(tmp_path, name="a").returncode == 0
    assert train(tmp_path, name="b").returncode == 0
    assert metrics(tmp_path, "a") == metrics(tmp_path, "b")


def test_fail_at_step_fails_the_first_attempt_and_the_resume_finishes_it(tmp_path: Path) -> None:
    failed = train(tmp_path, "--fail-at-step", "35")
    assert failed.returncode == 1
    assert "simulated failure at step 35" in failed.stderr
    newest = checkpoints(tmp_path)[-1]
    assert newest.name == "step-30"

    resumed = train(
        tmp_path,
        "--fail-at-step",
        "35",
        env={"TAU_RESUME_FROM": str(newest), "TAU_ATTEMPT": "2"},
    )
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines()[0] == "resumed from step 30"
    assert checkpoints(tmp_path)[-1].name == "step-60"

    # Batches are seeded by step, so the resumed run ends exactly where a clean one does.
    assert train(tmp_path, name="clean").returncode == 0
    assert metrics(tmp_path)[-1] == metrics(tmp_path, "clean")[-1]


def test_the_failure_can_be_requested_through_the_environment(tmp_path: Path) -> None:
    result = train(tmp_path, env={"EXAMPLE_FAIL_AT_STEP": "15"})
    assert result.returncode == 1
    later_attempt = train(
        tmp_path, name="second", env={"EXAMPLE_FAIL_AT_STEP": "15", "TAU_ATTEMPT": "2"}
    )
    assert later_attempt.returncode == 0
