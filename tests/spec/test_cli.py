"""``python -m tau.spec``, run as users run it: a subprocess, exit codes and exact output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tau.spec.samples import ARTICLE_EXAMPLE

from .support import EXAMPLES, REPO

BROKEN = """\
schema_version: 1
name: demo
run:
  entrypoint: train.py
compute:
  wokers: 2
"""


def run_cli(*arguments: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tau.spec", *arguments],
        capture_output=True,
        text=True,
        input=stdin,
        cwd=REPO,
        timeout=60,
        check=False,
    )


def test_validate_exits_0_when_every_file_is_valid() -> None:
    result = run_cli("validate", *(str(path) for path in EXAMPLES))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert [line.partition(" (")[0] for line in lines] == [f"{path}: ok" for path in EXAMPLES]
    # Each says how it was read.
    assert all(line.endswith(")") and "TauGrid tau.yaml v1: " in line for line in lines), lines


def test_validate_prints_file_line_column_path_message_hint(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(ARTICLE_EXAMPLE)
    bad = tmp_path / "tau.yaml"
    bad.write_text(BROKEN)
    result = run_cli("validate", str(good), str(bad))
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"{good}: ok (TauGrid tau.yaml v1: 1 head + 1 worker, 1 GPU)",
        f"{bad}:6:3: compute.wokers: unknown key `wokers` (did you mean `workers`?)",
    ]


def test_validate_json_lists_every_problem(tmp_path: Path) -> None:
    bad = tmp_path / "tau.yaml"
    bad.write_text(BROKEN)
    result = run_cli("validate", "--json", str(bad))
    assert result.returncode == 1
    assert json.loads(result.stdout) == [
        {
            "file": str(bad),
            "line": 6,
            "column": 3,
            "path": "compute.wokers",
            "message": "unknown key `wokers`",
            "hint": "did you mean `workers`?",
            "severity": "error",
        }
    ]


def test_validate_json_is_an_empty_list_for_valid_files() -> None:
    result = run_cli("validate", "--json", str(EXAMPLES[0]))
    assert (result.returncode, json.loads(result.stdout)) == (0, [])


def test_an_unreadable_file_is_a_clear_error_and_exit_1(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    result = run_cli("validate", str(missing))
    assert result.returncode == 1
    assert result.stderr.strip() == f"{missing}: cannot read the file: No such file or directory"

    result = run_cli("validate", "--json", str(tmp_path))
    assert result.returncode == 1
    (record,) = json.loads(result.stdout)
    assert record["message"] == "cannot read the file: Is a directory"


def test_standard_input_is_read_for_a_dash() -> None:
    result = run_cli("validate", "-", stdin=BROKEN)
    assert result.returncode == 1
    assert result.stdout.startswith("<stdin>:6:3: compute.wokers:")


def test_usage_errors_exit_2() -> None:
    assert run_cli().returncode == 2
    assert run_cli("validate").returncode == 2
    assert run_cli("frobnicate").returncode == 2


def test_schema_prints_the_json_schema() -> None:
    result = run_cli("schema")
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_show_prints_the_normal_form_and_hash(tmp_path: Path) -> None:
    path = tmp_path / "tau.yaml"
    path.write_text(ARTICLE_EXAMPLE)
    result = run_cli("show", str(path))
    assert result.returncode == 0
    shown = json.loads(result.stdout)
    assert shown["spec"]["compute"]["memory"] == "64Gi"
    assert len(shown["spec_hash"]) == 64
