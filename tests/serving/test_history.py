"""An endpoint's history as an export: what ``GET …/endpoints/{name}/evidence/`` answers
verifies offline (``python -m tau.evidence verify``), and any changed byte is found."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from serving import services
from serving.models import EndpointState
from tau.evidence import history
from tests.serving.factories import make_endpoint

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = "/api/v1/workspaces/alpha/endpoints/chat/evidence/"


def exported(world: Any) -> bytes:
    """The export of an endpoint that was deployed, became ready, scaled, updated,
    became unhealthy and ready again."""
    endpoint = make_endpoint(world)
    services.observe(endpoint, state="ready", replicas_ready=1, url="http://127.0.0.1:8000")
    services.scale_endpoint(endpoint=endpoint, user=world.users["researcher"], replicas=2)
    services.observe(endpoint, state="unhealthy", reason="replica 2 failed its health check")
    services.observe(endpoint, state="ready")
    response = world.api_client_for("viewer").get(EVIDENCE)
    assert response.status_code == 200
    assert response["Content-Type"] == "application/x-ndjson"
    assert response["Content-Disposition"] == 'attachment; filename="chat.history.jsonl"'
    return b"".join(response.streaming_content)


def problems(content: bytes) -> list[str]:
    return history.check_history(content.splitlines(keepends=True))[0]


def test_the_export_verifies(world: Any) -> None:
    content = exported(world)
    found, header = history.check_history(content.splitlines(keepends=True))
    assert found == []
    assert header["format"] == "taugrid-endpoint-history/1"
    assert header["workspace"] == "alpha"
    assert header["endpoint"]["name"] == "chat"
    assert header["endpoint"]["state"] == "ready"
    assert header["endpoint"]["generation"] == 2
    assert header["event_count"] == 5
    kinds = [json.loads(line)["kind"] for line in content.splitlines()[1:]]
    assert kinds == ["deployed", "state", "scaled", "state", "state"]


def test_every_changed_byte_is_found(world: Any) -> None:
    """Each byte of the export, changed in turn (to another that keeps it ASCII and, where
    it can, valid JSON), makes a problem: a sample of every line's bytes, all of them for
    the first event's."""
    content = exported(world)
    lines = content.splitlines(keepends=True)
    first_event = len(lines[0])
    positions = list(range(first_event, first_event + len(lines[1]) - 1))
    positions += list(range(0, len(content) - 1, 7))
    for position in positions:
        original = content[position]
        replacement = ord("1") if original != ord("1") else ord("2")
        if chr(original).isalpha():
            replacement = ord("x") if original != ord("x") else ord("y")
        changed = content[:position] + bytes([replacement]) + content[position + 1 :]
        assert problems(changed), f"byte {position} ({chr(original)!r}) changed, nothing found"


def test_a_dropped_or_reordered_event_is_found(world: Any) -> None:
    lines = exported(world).splitlines(keepends=True)
    dropped = b"".join(lines[:2] + lines[3:])
    assert any("prev_hash" in problem for problem in problems(dropped))
    swapped = b"".join([lines[0], lines[1], lines[3], lines[2], *lines[4:]])
    assert problems(swapped)
    cut = b"".join(lines[:-1])
    assert any("header: says 5 events" in problem for problem in problems(cut))


def test_a_header_that_says_otherwise_is_found(world: Any) -> None:
    from tau.evidence.chain import event_line

    lines = exported(world).splitlines(keepends=True)
    header = json.loads(lines[0])
    header["endpoint"]["state"] = "stopped"
    rewritten = b"".join([event_line(header), *lines[1:]])
    assert problems(rewritten) == ["header: state 'stopped', the events end 'ready'"]


def test_a_deleted_endpoints_history_says_so(world: Any) -> None:
    endpoint = make_endpoint(world, state=EndpointState.READY)
    from serving.history import history_export

    services.delete_endpoint(endpoint=endpoint, user=None)
    content = b"".join(history_export(endpoint))
    found, header = history.check_history(content.splitlines(keepends=True))
    assert found == []
    assert header["endpoint"]["deleted_at"] is not None
    # It is no longer reached by its name.
    assert world.api_client_for("viewer").get(EVIDENCE).status_code == 404


def test_the_offline_verifier_checks_it(world: Any, tmp_path: Path) -> None:
    path = tmp_path / "chat.history.jsonl"
    path.write_bytes(exported(world))

    def verify(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tau.evidence", "verify", str(path), *extra],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        )

    ok = verify()
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.startswith(f"OK {path} (taugrid-endpoint-history/1)")
    assert "5 events (chain)" in ok.stdout
    as_json = json.loads(verify("--json").stdout)
    assert as_json["ok"] is True
    assert as_json["endpoint"]["name"] == "chat"
    content = path.read_bytes()
    at = content.index(b"replica 2 failed")
    path.write_bytes(content[:at] + b"R" + content[at + 1 :])
    bad = verify()
    assert bad.returncode == 1
    assert bad.stdout.startswith(f"FAILED {path}")
    assert "hash does not match its content" in bad.stdout
