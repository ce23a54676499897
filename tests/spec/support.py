"""Small helpers shared by the spec tests (no Django, no database)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tau.spec import SpecProblem, validate

REPO = Path(__file__).resolve().parents[2]
#: Every example's tau.yaml and, where it has one, its GPU form (tau.gpu.yaml).
EXAMPLES = sorted(
    [*(REPO / "examples").glob("*/tau.yaml"), *(REPO / "examples").glob("*/tau.gpu.yaml")]
)

MINIMAL = """\
schema_version: 1
name: demo
run:
  entrypoint: train.py
"""


def spec(extra: str = "", *, run: str = "") -> str:
    """The minimal valid spec plus ``extra`` top-level YAML and ``run`` keys (dedented)."""
    text = MINIMAL + textwrap.indent(textwrap.dedent(run), "  ")
    return text + textwrap.dedent(extra)


def problems(text: str | bytes) -> list[SpecProblem]:
    return validate(text)


def only_problem(text: str | bytes) -> SpecProblem:
    found = validate(text)
    assert len(found) == 1, "\n".join(str(problem) for problem in found)
    return found[0]


def line_of(text: str, needle: str) -> int:
    """1-based line of the first line containing ``needle``."""
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} not in the text")
