"""``pip install <checkout>`` in a clean virtual environment gives ``tau`` without the server
(no Django, Celery or psycopg) and writes nothing into the checkout; the command validates
every example, ``python -m tau.evidence verify`` checks an evidence record there (accepts it,
refuses one changed byte), and — issue 15's first acceptance point, as written — ``tau`` logs
in to a live portal with a token from ``manage.py create_token`` and runs
``examples/cpu-quickstart`` with ``--watch`` to ``succeeded`` and exit 0."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import time
import venv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import tau
from tau.evidence.keys import keyring_document, public_key_bytes
from tests.evidence.test_portal_end_to_end import fetch
from tests.evidence_format.record import record, sample_parts
from tests.executors.local.agent_harness import Agent, local_quota
from tests.runs.processes import Portal, portal_processes, session_database_url

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Client:
    """A virtual environment with nothing but ``pip install <checkout>`` in it."""

    python: Path
    tau: str
    env: dict[str, str]
    #: What ``pip install`` left in the folder it installed from.
    written_into_checkout: list[str]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Client:
    # The checkout's packaging files and the client package, copied: what the build leaves
    # in the folder it builds can be seen (nothing, see the test below).
    folder = tmp_path_factory.mktemp("client")
    source = folder / "checkout"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "MANIFEST.in"):
        shutil.copy2(ROOT / name, source / name)
    for package in ("tau", "deploy/packaging"):
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    before = _files(source)
    environment = folder / "venv"
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
    return Client(
        python=python,
        tau=str(environment / "bin" / "tau"),
        env=env,
        written_into_checkout=sorted(_files(source) - before),
    )


def _files(folder: Path) -> set[str]:
    return {path.relative_to(folder).as_posix() for path in folder.rglob("*")}


@pytest.mark.slow
def test_installing_writes_nothing_into_the_checkout(client: Client) -> None:
    """``pip install .`` builds in place: setuptools' build/ and taugrid.egg-info were left
    in the clone (and a build/lib of an earlier build could bring deleted files back into
    the next wheel). The build backend (deploy/packaging/taugrid_build.py) builds elsewhere."""
    assert client.written_into_checkout == []


@pytest.mark.slow  # builds a venv and installs the client into it (15-17 s), then runs it
def test_the_client_installs_without_the_server(client: Client, tmp_path: Path) -> None:
    python, tau_command, env = client.python, client.tau, client.env

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60
        )

    for server_module in ("django", "celery", "psycopg", "rest_framework", "kubernetes"):
        absent = run(str(python), "-c", f"import {server_module}")
        assert absent.returncode == 1, f"{server_module} is installed with the client"
        assert "ModuleNotFoundError" in absent.stderr
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


@pytest.fixture
def portal(tmp_path: Path, settings: Any) -> Any:
    yield from portal_processes(tmp_path, settings.CELERY_BROKER_URL)


@pytest.mark.services
@pytest.mark.django_db(transaction=True)
def test_from_a_clean_install_to_a_succeeded_run(
    client: Client, world: Any, portal: Portal, tmp_path: Path
) -> None:
    local_quota(world.alpha)
    agent = Agent(tmp_path / "var", {"TAU_API_URL": portal.url}).start()
    try:
        portal.start()
        created = subprocess.run(
            [
                *(str(ROOT / ".venv" / "bin" / "python"), "manage.py", "create_token"),
                *("--name", "laptop", world.users["researcher"].username),
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**portal.env, "DATABASE_URL": session_database_url()},
            timeout=60,
        )
        assert created.returncode == 0, created.stderr
        token = created.stdout.strip().splitlines()[-1].strip()
        assert token.startswith("tau_"), created.stdout
        home = tmp_path / "home"
        env = {**client.env, "HOME": str(home), "XDG_CONFIG_HOME": str(home / "config")}
        env["NO_PROXY"] = "127.0.0.1,localhost"

        def tau_says(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [client.tau, *args],
                input=input,
                capture_output=True,
                text=True,
                env=env,
                cwd=ROOT,
                timeout=300,
            )

        login = tau_says("login", "--url", portal.url, "--token-stdin", input=token + "\n")
        assert login.returncode == 0, login.stdout + login.stderr
        watched = tau_says(
            "run", "--config", "examples/cpu-quickstart/tau.yaml", "--workspace", "alpha", "--watch"
        )
        assert watched.returncode == 0, watched.stdout + watched.stderr + agent.output()
        status = tau_says("run", "status", "cpu-quickstart", "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["state"] == "succeeded"
        django = subprocess.run(
            [str(client.python), "-c", "import django"], capture_output=True, env=env
        )
        assert django.returncode == 1

        # Issue 16's first acceptance point, in the same venv without Django: the run's
        # evidence (sealed by the Celery worker) downloads from the API and verifies offline;
        # one changed byte of its log inside the file is refused, named.
        name = json.loads(status.stdout)["name"]
        run_url = f"{portal.url}/api/v1/workspaces/alpha/runs/{name}/evidence/"
        deadline = time.monotonic() + 60
        answer, body = fetch(run_url, token)
        while answer == 409 and time.monotonic() < deadline:
            time.sleep(0.5)
            answer, body = fetch(run_url, token)
        assert answer == 200, body[:300]
        (tmp_path / "run.evidence.tar").write_bytes(body)
        answer, keys = fetch(f"{portal.url}/api/v1/evidence/keys/", None)
        assert answer == 200
        (tmp_path / "keys.json").write_bytes(keys)
        check = (str(client.python), "-m", "tau.evidence", "verify", "run.evidence.tar")
        offline = {"PATH": "/usr/bin:/bin", "HOME": str(home)}  # no proxy, no TAU_*, no Django

        def verify() -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*check, "--key", "keys.json"],
                capture_output=True,
                text=True,
                env=offline,
                cwd=tmp_path,
                timeout=60,
            )

        accepted = verify()
        assert accepted.returncode == 0, accepted.stdout + accepted.stderr
        with tarfile.open(tmp_path / "run.evidence.tar") as tar:
            log = tar.getmember("attempts/1/log.txt")
        changed = bytearray(body)
        changed[log.offset_data + 10] ^= 0x01
        (tmp_path / "run.evidence.tar").write_bytes(bytes(changed))
        refused = verify()
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "attempts/1/log.txt" in refused.stdout
    finally:
        agent.stop()
