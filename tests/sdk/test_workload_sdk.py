"""The SDK as the platform ships it into runs (``runs.workload_sdk``): exactly the files of
the ``tau`` package that ``import tau`` needs, written once per content, read-only."""

from __future__ import annotations

import ast
import stat
import subprocess
import sys
from pathlib import Path

from runs import workload_sdk

REPO = Path(__file__).resolve().parents[2]


def test_tau_init_imports_nothing_but_the_sdk() -> None:
    """A run gets tau/__init__.py and tau/sdk.py only: an import of anything else in
    ``tau/__init__.py`` would break ``import tau`` in every workload."""
    tree = ast.parse((REPO / "tau" / "__init__.py").read_text(encoding="utf-8"))
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert imported <= {"tau.sdk", "__future__"}, imported
    for name in ("sdk.py", "sweep.py"):  # both run in the workload's own Python
        _imports_only_the_standard_library(REPO / "tau" / name)


def _imports_only_the_standard_library(path: Path) -> None:
    sdk = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(sdk):
        if isinstance(node, ast.ImportFrom) and node.module:
            assert not node.module.startswith("tau"), node.module
            assert node.module.split(".")[0] in sys.stdlib_module_names, node.module
        if isinstance(node, ast.Import):
            for alias in node.names:
                assert alias.name.split(".")[0] in sys.stdlib_module_names, alias.name


def test_materialise_writes_once_read_only_and_imports(tmp_path: Path) -> None:
    first = workload_sdk.materialise(tmp_path)
    assert first == workload_sdk.materialise(tmp_path)  # the same folder, not rewritten
    assert first.name == workload_sdk.digest()[:32]
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name]  # no staging left
    for name, content in workload_sdk.sources().items():
        path = first / name
        assert path.read_bytes() == content
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE((first / "tau").stat().st_mode) == 0o755
    ran = subprocess.run(
        [sys.executable, "-S", "-c", "import tau; print(tau.__file__, tau.__version__)"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(first)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split()[0] == str(first / "tau" / "__init__.py")


def test_the_runs_own_pythonpath_comes_after_the_sdk() -> None:
    assert workload_sdk.python_path("/sdk", None) == "/sdk"
    assert workload_sdk.python_path("/sdk", "") == "/sdk"
    assert workload_sdk.python_path("/sdk", "/a:/b") == "/sdk:/a:/b"
