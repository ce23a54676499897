"""A pipeline as a researcher runs it: ``tau pipeline run --watch`` (a subprocess) against a
live portal (gunicorn, a Celery worker and beat, the local agent, on PostgreSQL and Redis).
Its stages run for real on this machine, one after the other and side by side, each step
taken by the worker when a stage's run ends; one gate passes on the metric a stage reported
and another does not, so the pipeline ends ``stopped`` with the value it read, and the stage
behind the closed gate never runs."""

from __future__ import annotations

import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from identity import tokens
from pipelines.events import verify_event_chain
from pipelines.models import Pipeline, PipelineStage
from runs.models import Run, RunState
from tests.cli.test_cli_end_to_end import Tau, _said
from tests.executors.local.agent_harness import Agent, local_quota
from tests.runs.processes import Portal, portal_processes

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

PIPELINE = """\
schema_version: 1
name: gated
stages:
  prepare: {config: prepare/tau.yaml}
  report: {config: report/tau.yaml, needs: [prepare]}
  evaluate: {config: evaluate/tau.yaml, needs: [prepare]}
  canary:
    config: canary/tau.yaml
    needs: [evaluate]
    when: "evaluate.metrics.accuracy >= 0.5"
  publish:
    config: publish/tau.yaml
    needs: [evaluate]
    when: "evaluate.metrics.accuracy >= 0.8"
"""


@pytest.fixture
def portal(tmp_path: Path, settings: Any) -> Iterator[Portal]:
    yield from portal_processes(tmp_path, settings.CELERY_BROKER_URL)


def write_pipeline(folder: Path) -> Path:
    (folder / "pipeline.yaml").parent.mkdir(parents=True, exist_ok=True)
    (folder / "pipeline.yaml").write_text(PIPELINE)
    for stage in ("prepare", "report", "evaluate", "canary", "publish"):
        (folder / stage).mkdir()
        (folder / stage / "tau.yaml").write_text(
            textwrap.dedent(
                f"""\
                schema_version: 1
                name: {stage}
                run:
                  entrypoint: main.py
                  workload_kind: job
                compute:
                  cpus: 250m
                  memory: 64Mi
                """
            )
        )
        body = f"print('{stage} done')\n"
        if stage == "evaluate":
            body = "import tau\n\ntau.log_metrics(1, accuracy=0.62)\n" + body
        (folder / stage / "main.py").write_text(body)
    return folder / "pipeline.yaml"


def test_a_pipeline_runs_its_stages_here_and_a_closed_gate_stops_it(
    world: Any, portal: Portal, tmp_path: Path
) -> None:
    local_quota(world.alpha)
    agent = Agent(tmp_path / "var", {"TAU_API_URL": portal.url}).start()
    tau = Tau(tmp_path / "home")
    config = write_pipeline(tmp_path / "gated")
    try:
        portal.start()
        token = tokens.issue_token(user=world.users["researcher"], name="cli").plaintext
        login = tau("login", "--url", portal.url, "--token-stdin", input=token + "\n")
        assert login.returncode == 0, _said(login)
        assert tau("pipeline", "validate", "-c", str(config)).returncode == 0
        done = tau("pipeline", "run", "-c", str(config), "--watch", timeout=240)
        assert done.returncode == 0, _said(done) + agent.output()
    finally:
        agent.stop()
    pipeline = Pipeline.objects.unscoped().get(spec_name="gated")
    assert pipeline.state == "stopped", (pipeline.state_reason, _said(done))
    assert "0.62" in pipeline.state_reason
    assert f"{pipeline.name} stopped" in done.stderr
    assert "publish: pending" in done.stderr  # said with the reason the gate held it
    rows = PipelineStage.objects.unscoped().filter(pipeline=pipeline).select_related("run")
    stages = {stage.name: stage for stage in rows}
    for name in ("prepare", "report", "evaluate", "canary"):
        run = stages[name].run
        assert run is not None, name
        assert (stages[name].state, run.state) == ("succeeded", RunState.SUCCEEDED), name
    assert stages["canary"].gate_decision == {"value": 0.62, "passed": True}
    assert stages["publish"].gate_decision == {"value": 0.62, "passed": False}
    assert stages["publish"].run is None
    assert not Run.objects.unscoped().filter(spec_name="publish").exists()
    # report and evaluate were started side by side after prepare, before either ended.
    report, evaluate = stages["report"], stages["evaluate"]
    assert report.started_at is not None
    assert evaluate.started_at is not None
    assert report.ended_at is not None
    assert evaluate.ended_at is not None
    assert max(report.started_at, evaluate.started_at) < min(report.ended_at, evaluate.ended_at)
    assert verify_event_chain(pipeline)

    status = tau.json("pipeline", "status", pipeline.name)
    assert status["state"] == "stopped"
    assert [stage["state"] for stage in status["stages"]] == [
        "succeeded",
        "succeeded",
        "succeeded",
        "succeeded",
        "pending",
    ]
    assert [row["name"] for row in tau.json("pipeline", "list")] == [pipeline.name]
    logs = tau("pipeline", "logs", pipeline.name, "evaluate")
    assert logs.returncode == 0, _said(logs)
    assert "evaluate done" in logs.stdout
    held = tau("pipeline", "logs", pipeline.name, "publish")
    assert held.returncode == 1, _said(held)
    assert f"publish of {pipeline.name} has not started: evaluate.metrics.accuracy" in held.stderr
    refused = tau("pipeline", "cancel", pipeline.name)
    assert refused.returncode == 1
    assert "already stopped" in refused.stderr

    # Resumed as it is, the gate reads the same value and says the same: nothing runs again.
    resumed = tau("pipeline", "resume", pipeline.name)
    assert resumed.returncode == 0, _said(resumed)
    assert f"Resumed {pipeline.name}: it is stopped." in resumed.stdout
    assert Run.objects.unscoped().count() == 4
    unknown = tau("pipeline", "resume", pipeline.name, "--rerun", "nope")
    assert unknown.returncode == 2, _said(unknown)
    assert "no stage 'nope'" in unknown.stderr

    # Its record, once the worker has sealed each stage's run: downloaded and checked
    # offline, every stage's record in full, against the portal's keys.
    deadline = time.monotonic() + 60
    while True:
        pulled = tau("pipeline", "evidence", pipeline.name, "--verify", cwd=tmp_path)
        if pulled.returncode == 0 or time.monotonic() > deadline:
            break
        assert "being sealed" in pulled.stderr, _said(pulled)
        time.sleep(1)
    assert pulled.returncode == 0, _said(pulled)
    assert f"OK {pipeline.name}.pipeline.tar (taugrid-pipeline-record/1)" in pulled.stdout
    assert "a trusted key" in pulled.stdout
    assert "4 stage records" in pulled.stdout
