"""A pipeline through a crash (issue 35, acceptance 2): the Celery worker that takes its steps
and the local agent that runs its stages (this backend's watcher) are both killed with
SIGKILL while a stage runs, then started again; the pipeline still ends ``succeeded``, each
stage has exactly one run, and the history started each stage once. Everything is real: the
web server, the worker and beat, the agent, PostgreSQL and Redis."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipelines.events import verify_event_chain
from pipelines.models import Pipeline, PipelineEvent, PipelineStage, StageRun
from runs.models import Run, RunState
from tests.executors.local.agent_harness import Agent, local_quota
from tests.pipelines.factories import make_pipeline, stage_spec
from tests.runs.factories import zip_bytes
from tests.runs.processes import Portal, portal_processes
from tests.runs.test_delivery import kill_worker

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

STAGES = ("first", "second", "third")
PIPELINE = """\
schema_version: 1
name: crashing
stages:
  first: {config: first/tau.yaml}
  second: {config: second/tau.yaml, needs: [first]}
  third: {config: third/tau.yaml, needs: [second]}
"""


@pytest.fixture
def portal(tmp_path: Path, settings: Any) -> Iterator[Portal]:
    yield from portal_processes(tmp_path, settings.CELERY_BROKER_URL)


def wait_for(what: str, check: Any, timeout: float, said: Any) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError(f"waited {timeout:.0f} s for {what}\n{said()}")


def test_killing_the_worker_and_the_agent_loses_no_stage_and_starts_none_twice(
    world: Any, portal: Portal, tmp_path: Path, settings: Any
) -> None:
    settings.VAR_DIR = tmp_path / "var"  # the portal's bundle store: submitted from here
    local_quota(world.alpha)
    files = {"pipeline.yaml": PIPELINE}
    for name in STAGES:
        files[f"{name}/tau.yaml"] = stage_spec(name, cpus="250m")
        files[f"{name}/main.py"] = f"import time\ntime.sleep(3)\nprint('{name} done')\n"
    agent = Agent(tmp_path / "var", {"TAU_API_URL": portal.url}).start()
    try:
        portal.start()
        # Its first step is the worker's (the task published when it was written).
        pipeline = make_pipeline(world, zip_bytes(files), started=False)

        def said() -> str:
            stages = list(
                PipelineStage.objects.unscoped()
                .filter(pipeline=pipeline)
                .values_list("name", "state", "reason")
            )
            return f"{stages}\n{portal.log('worker')[-3000:]}\n{agent.output()}"

        wait_for(
            "the first stage's run to run",
            lambda: Run.objects.unscoped().filter(spec_name="first", state=RunState.RUNNING),
            60,
            said,
        )
        kill_worker(portal)
        agent.kill()
        time.sleep(4)  # the first stage's process ends meanwhile: nobody is there to see it
        agent = Agent(tmp_path / "var", {"TAU_API_URL": portal.url}).start()
        portal.start(web=False, worker=True, beat=False)
        wait_for(
            "the pipeline to end",
            lambda: Pipeline.objects.unscoped().get(pk=pipeline.pk).state != "running",
            120,
            said,
        )
    finally:
        agent.stop()
    pipeline.refresh_from_db()
    assert pipeline.state == "succeeded", said()
    for name in STAGES:
        (run,) = Run.objects.unscoped().filter(spec_name=name)
        assert run.state == RunState.SUCCEEDED
    assert StageRun.objects.unscoped().filter(pipeline=pipeline).count() == 3
    started = PipelineEvent.objects.unscoped().filter(pipeline=pipeline, kind="stage_started")
    assert sorted(event.data["stage"] for event in started) == sorted(STAGES)
    assert verify_event_chain(pipeline)
