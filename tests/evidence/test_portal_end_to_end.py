"""Issue 16's first acceptance check, on the production-shaped parts: examples/cpu-quickstart
submitted over HTTP to gunicorn, run by the real local agent, its ending sealed by a real
Celery worker (the task published when the run ended, or beat's reconcile), its evidence
downloaded from the API and accepted by ``python -m tau.evidence verify`` with the published
keyring; one changed byte of its log inside the file makes the verifier refuse it."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from identity import tokens
from tests.executors.local.agent_harness import ROOT, Agent, local_quota
from tests.runs.processes import Portal, get_json, portal_processes, submit_example

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def portal(tmp_path: Path, settings: Any) -> Iterator[Portal]:
    yield from portal_processes(tmp_path, settings.CELERY_BROKER_URL)


def fetch(url: str, token: str | None = None) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers)) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def verify(path: Path, keyring: Path) -> subprocess.CompletedProcess[str]:
    """The verifier as a user runs it: its own process, no Django settings, no network."""
    return subprocess.run(
        [sys.executable, "-m", "tau.evidence", "verify", str(path), "--key", str(keyring)],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_cpu_example_is_sealed_by_the_worker_and_verifies_offline(
    world: Any, portal: Portal, tmp_path: Path
) -> None:
    local_quota(world.alpha)
    agent = Agent(tmp_path / "var", {"TAU_API_URL": portal.url}).start()
    try:
        portal.start()
        token = tokens.issue_token(user=world.users["researcher"], name="e2e").plaintext
        created = submit_example(portal.url, token, workspace="alpha")
        deadline = time.monotonic() + 180
        state = created["state"]
        while time.monotonic() < deadline and state not in {"succeeded", "failed", "cancelled"}:
            time.sleep(0.5)
            state = get_json(f"{portal.url}{created['url']}", token)["state"]
        assert state == "succeeded", agent.output()
    finally:
        agent.stop()
    evidence_url = f"{portal.url}{created['url']}evidence/"
    deadline = time.monotonic() + 60
    status, body = fetch(evidence_url, token)
    while status == 409 and time.monotonic() < deadline:
        time.sleep(0.5)
        status, body = fetch(evidence_url, token)
    assert status == 200, (body[:300], portal.log("worker")[-3000:])
    record = tmp_path / "run.evidence.tar"
    record.write_bytes(body)
    status, keys = fetch(f"{portal.url}/api/v1/evidence/keys/")
    assert status == 200
    keyring = tmp_path / "keys.json"
    keyring.write_bytes(keys)

    accepted = verify(record, keyring)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert "OK" in accepted.stdout

    with tarfile.open(record) as tar:
        log = tar.getmember("attempts/1/log.txt")
    data = bytearray(body)
    data[log.offset_data + 10] ^= 0x01
    tampered = tmp_path / "tampered.tar"
    tampered.write_bytes(bytes(data))
    refused = verify(tampered, keyring)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "attempts/1/log.txt" in refused.stdout + refused.stderr
