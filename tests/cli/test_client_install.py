"""``pip install <checkout>`` in a clean virtual environment gives ``tau`` without the server:
no Django, Celery or psycopg, and the command validates every example."""

from __future__ import annotations

import os
import shutil
import subprocess
import venv
from pathlib import Path

import tau

ROOT = Path(__file__).resolve().parents[2]


def test_the_client_installs_without_the_server(tmp_path: Path) -> None:
    # The checkout's packaging files and the client package, copied so that the build
    # (setuptools writes build/ and *.egg-info beside the sources) never touches the checkout.
    source = tmp_path / "checkout"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "tau", source / "tau", ignore=shutil.ignore_patterns("__pycache__"))
    environment = tmp_path / "venv"
    venv.create(environment, with_pip=True)
    python = environment / "bin" / "python"
    env = {key: value for key, value in os.environ.items() if not key.startswith("TAU_")}
    env.pop("PYTHONPATH", None)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(source)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60
        )

    for server_module in ("django", "celery", "psycopg", "rest_framework", "kubernetes"):
        absent = run(str(python), "-c", f"import {server_module}")
        assert absent.returncode == 1, f"{server_module} is installed with the client"
        assert "ModuleNotFoundError" in absent.stderr
    tau_command = str(environment / "bin" / "tau")
    version = run(tau_command, "version", "--short")
    assert (version.returncode, version.stdout.strip()) == (0, tau.__version__), version.stderr
    examples = sorted(str(path) for path in (ROOT / "examples").glob("*/tau.yaml"))
    assert len(examples) >= 4
    validated = run(tau_command, "run", "validate", *examples)
    assert validated.returncode == 0, validated.stdout + validated.stderr
    assert validated.stdout.count(": ok") == len(examples)
