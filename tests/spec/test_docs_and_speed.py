"""The reference documents every field, and the spec benchmark keeps working."""

from __future__ import annotations

import pytest

from tau.spec.bench import main as bench_main
from tau.spec.samples import ARTICLE_EXAMPLE
from tau.spec.schema import field_paths

from .support import REPO


def test_the_reference_documents_every_field() -> None:
    reference = (REPO / "docs" / "tau-yaml.md").read_text("utf-8")
    missing = [path for path in field_paths() if f"`{path}`" not in reference]
    assert missing == []


def test_the_reference_quotes_the_article_example() -> None:
    reference = (REPO / "docs" / "tau-yaml.md").read_text("utf-8")
    assert ARTICLE_EXAMPLE in reference


def test_the_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """Speed is measured by `make bench`, never asserted here; this only keeps the benchmark
    itself working (an infinite budget cannot fail on a slow machine)."""
    assert bench_main(["--iterations", "20", "--budget-ms", "inf"]) == 0
    assert "parse+validate+normalise+hash" in capsys.readouterr().out
