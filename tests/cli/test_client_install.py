"""``pip install <checkout>`` in a clean virtual environment gives ``tau`` without the server:
no Django, Celery or psycopg, the command validates every example, and ``python -m
tau.evidence verify`` checks an evidence record there (accepts it, refuses one changed byte)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import venv
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import tau
from tau.evidence.keys import keyring_document, public_key_bytes
from tests.evidence_format.record import record, sample_parts

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

    key = Ed25519PrivateKey.generate()
    evidence = record(sample_parts(), key)
    (tmp_path / "run.evidence.tar").write_bytes(evidence)
    keyring = keyring_document([(public_key_bytes(key), True)])
    (tmp_path / "keys.json").write_text(json.dumps(keyring))
    verify = (str(python), "-m", "tau.evidence", "verify", "run.evidence.tar", "--key", "keys.json")
    verified = run(*verify)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert ", a trusted key" in verified.stdout
    at = evidence.index(b"step 1 loss 2.5")
    (tmp_path / "run.evidence.tar").write_bytes(evidence[:at] + b"S" + evidence[at + 1 :])
    refused = run(*verify)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "attempts/1/log.txt: SHA-256 does not match" in refused.stdout
