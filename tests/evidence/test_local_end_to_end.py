"""Evidence of runs the real local agent (``manage.py run_agent``) ran, on PostgreSQL: one run
per terminal state (succeeded with metrics, a checkpoint and an artifact; failed; cancelled
while running), each sealed by the request its ending wrote in the agent's own transaction,
its record's fields checked against what happened, and its export verified offline."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evidence import keys
from runs import lifecycle
from runs.models import Artifact, Checkpoint, MetricPoint, RunAttempt, RunEvent, RunState
from tau.evidence.keys import load_trusted_keys
from tau.evidence.verify import verify_file
from tests.evidence.helpers import download, manifest_of, member_names, seal_all
from tests.executors.local.agent_harness import (
    Agent,
    attempts,
    local_quota,
    spec,
    submit,
    wait_for_state,
)

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

NO_RETRIES = "resilience: {max_retries: 0}\n"
SUCCEEDING = """\
import json, os
out, ckpt = os.environ["TAU_OUTPUT_DIR"], os.environ["TAU_CHECKPOINT_DIR"]
with open(os.path.join(out, "metrics.jsonl"), "a") as metrics:
    for step in (1, 2, 3):
        metrics.write(json.dumps({"step": step, "loss": 1.0 / step}) + "\\n")
os.makedirs(os.path.join(ckpt, "step-3"))
with open(os.path.join(ckpt, "step-3", "weights.bin"), "wb") as weights:
    weights.write(b"w" * 100)
open(os.path.join(ckpt, "step-3", "COMPLETE"), "w").close()
with open(os.path.join(out, "result.json"), "w") as result:
    json.dump({"accuracy": 0.9}, result)
print("done", flush=True)
"""
FAILING = "import sys\nprint('giving up', flush=True)\nsys.exit(3)\n"
WAITING = "import time\nprint('waiting', flush=True)\ntime.sleep(300)\n"


@pytest.fixture
def agent(var_dir: Path) -> Iterator[Agent]:
    started = Agent(var_dir).start()
    yield started
    if started.process is not None and started.process.poll() is None:
        started.stop()


def test_every_terminal_state_is_sealed_and_verifies(
    world: Any, var_dir: Path, agent: Agent, tmp_path: Path
) -> None:
    local_quota(world.alpha)
    succeeding = submit(
        world,
        spec("good", extra=NO_RETRIES + "outputs:\n  artifacts: ['*.json']\n"),
        {"main.py": SUCCEEDING},
    )
    failing = submit(world, spec("bad", extra=NO_RETRIES), {"main.py": FAILING})
    cancelled = submit(world, spec("stopped", extra=NO_RETRIES), {"main.py": WAITING})
    wait_for_state(cancelled, RunState.RUNNING, timeout=60, agent=agent)
    lifecycle.cancel_run(run=cancelled, user=world.users["researcher"])
    for run, end in (
        (succeeding, RunState.SUCCEEDED),
        (failing, RunState.FAILED),
        (cancelled, RunState.CANCELLED),
    ):
        wait_for_state(run, {end}, timeout=90, agent=agent)
    trusted = load_trusted_keys(json.dumps(keys.keyring()).encode())
    for run, end in (
        (succeeding, RunState.SUCCEEDED),
        (failing, RunState.FAILED),
        (cancelled, RunState.CANCELLED),
    ):
        (record,) = seal_all(run)
        manifest = manifest_of(record)
        (attempt,) = attempts(run)
        terminal = RunEvent.objects.for_workspace(world.alpha).get(run=run, seq=record.terminal_seq)
        assert terminal.new_state == end == manifest["run"]["state"]
        assert manifest["run"]["submitter"] == "rob" == run.submitted_by_username
        assert manifest["run"]["attempts"] == 1
        assert manifest["spec"]["sha256"] == run.spec_hash
        assert manifest["bundle"]["files"][0]["path"] == "main.py"
        (entry,) = manifest["attempts"]
        assert entry["exit_code"] == attempt.exit_code
        assert entry["failure_class"] == (attempt.failure_class or None)
        assert entry["backend"] == "local"
        assert entry["log"] == "attempts/1/log.txt"
        log = Path(attempt.log_path).read_bytes()
        assert manifest["files"]["attempts/1/log.txt"] == {
            "sha256": hashlib.sha256(log).hexdigest(),
            "size": len(log),
        }
        assert manifest["environment"]["kind"] == "local-venv"
        assert manifest["events"]["count"] == record.terminal_seq
        exported = download(world.api_client_for("viewer"), run, tmp_path / f"{run.name}.tar")
        report = verify_file(exported, trusted)
        assert report.ok, report.problems
        assert member_names(exported)[:2] == ["manifest.json", "manifest.sig"]

    good = manifest_of(seal_all(succeeding)[0])
    assert (
        good["metrics"]["count"]
        == MetricPoint.objects.for_workspace(world.alpha).filter(run=succeeding).count()
        == 3
    )
    (checkpoint,) = Checkpoint.objects.for_workspace(world.alpha).filter(run=succeeding)
    assert good["checkpoints"] == [
        {"attempt": 1, "step": 3, "path": checkpoint.path, "size": checkpoint.size}
    ]
    (artifact,) = Artifact.objects.for_workspace(world.alpha).filter(run=succeeding)
    assert good["artifacts"] == [
        {
            "path": "result.json",
            "size": artifact.size,
            "sha256": artifact.sha256,
            "member": "artifacts/result.json",
        }
    ]
    bad = manifest_of(seal_all(failing)[0])
    assert bad["run"]["failure_class"] == "user_error"
    assert bad["attempts"][0]["exit_code"] == 3
    stopped = attempts(cancelled)[0]
    assert stopped.state == RunAttempt.State.CANCELLED
