"""Property tests: whatever the input, only SpecError, and every problem is located.

The same strategies and invariants drive ``python -m tau.spec.fuzz`` for minutes at a time;
here they run briefly so the normal suite stays fast.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tau.spec.fuzz import check_invariants, json_like_values, mutated_spec_texts, yamlish_texts

from .support import REPO

BRIEF = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@BRIEF
@given(st.binary(max_size=600))
def test_arbitrary_bytes(source: bytes) -> None:
    check_invariants(source)


@BRIEF
@given(st.text(max_size=600))
def test_arbitrary_text(source: str) -> None:
    check_invariants(source)


@BRIEF
@given(yamlish_texts())
def test_yaml_ish_text(source: str) -> None:
    check_invariants(source)


@BRIEF
@given(mutated_spec_texts())
def test_mutations_of_valid_specs(source: str) -> None:
    check_invariants(source)


@BRIEF
@given(json_like_values)
def test_arbitrary_documents_as_json(document: object) -> None:
    check_invariants(json.dumps(document))


@pytest.mark.slow
def test_the_fuzzer_runs_and_reports_success() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tau.spec.fuzz",
            "--seconds",
            "3",
            "--seed",
            "1",
            "--slow-seconds",
            "30",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no contract broken" in result.stdout


def test_the_spec_package_never_imports_django() -> None:
    code = (
        "import sys, tau.spec, tau.spec.cli, tau.spec.bench; "
        "tau.spec.load_spec(open('examples/cpu-quickstart/tau.yaml','rb').read()); "
        "sys.exit(any(name.split('.')[0] == 'django' for name in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, check=False, timeout=60)
    assert result.returncode == 0
    django_import = re.compile(r"^\s*(import|from)\s+django", re.MULTILINE)
    for path in (REPO / "tau" / "spec").glob("*.py"):
        assert not django_import.search(path.read_text("utf-8")), path
