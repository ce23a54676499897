"""The workload SDK inside a real local run: a project that does ``import tau`` (nothing
installs it; the platform puts it on the run's path, ``runs.workload_sdk``), submitted over
HTTP to gunicorn, run by the real agent in its sandbox, reporting with the run token the run
got. Its metrics and a checkpoint the collector could not have found (its name carries no
step) reach the run; the web process is stopped in the middle of the training, which goes
on, and the rows that waited arrive once it is back."""

from __future__ import annotations

import io
import json
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from identity import tokens
from runs.models import Checkpoint, MetricPoint, Run, RunAttempt
from tests.executors.local.agent_harness import Agent, local_quota
from tests.runs.processes import Portal, get_json, multipart_form, portal_processes, wait_for

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

STEPS = 60

SPEC = """\
schema_version: 1
name: sdk-in-a-run
run:
  entrypoint: train.py
  workload_kind: job
  max_runtime: 5m
compute:
  cpus: 1
  memory: 512Mi
"""

# No metrics_file in the spec: every point on the run comes through the SDK.
TRAIN = f"""\
import os, sys, time
from pathlib import Path

import tau

print("the SDK is", tau.__file__, flush=True)
assert tau.resume_from() is None
best = Path(os.environ["TAU_CHECKPOINT_DIR"]) / "best"
for step in range(1, {STEPS + 1}):
    tau.log_metrics(step, loss=1.0 / step, lr=0.01)
    if step == 10:
        best.mkdir(parents=True)
        (best / "COMPLETE").write_text("10")
        tau.checkpoint_saved(str(best), 10)
    time.sleep(0.25)
if not tau.flush(timeout=60):
    sys.exit("the metrics did not reach the portal")
print("trained", flush=True)
"""


@pytest.fixture
def portal(tmp_path: Path, settings: Any) -> Iterator[Portal]:
    yield from portal_processes(tmp_path, settings.CELERY_BROKER_URL)


def submit(portal: Portal, token: str) -> dict[str, Any]:
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.writestr("train.py", TRAIN)
    body, content_type = multipart_form(
        [("spec", "tau.yaml", SPEC.encode()), ("bundle", "project.zip", archive.getvalue())]
    )
    request = urllib.request.Request(
        f"{portal.url}/api/v1/workspaces/alpha/runs/",
        data=body,
        headers={"Authorization": f"Bearer {token}", "Content-Type": content_type},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 201
        return dict(json.loads(response.read()))


def test_a_run_reports_through_the_sdk_and_waits_out_a_portal_outage(
    world: Any, portal: Portal, tmp_path: Path
) -> None:
    local_quota(world.alpha)
    agent = Agent(tmp_path / "var", {"TAU_API_URL": portal.url}).start()
    try:
        portal.start()
        token = tokens.issue_token(user=world.users["researcher"], name="sdk").plaintext
        created = submit(portal, token)
        run = Run.objects.unscoped().get(name=created["name"])

        def points() -> int:
            return MetricPoint.objects.unscoped().filter(run=run, key="loss").count()

        wait_for(lambda: points() >= 5, timeout=120, what="the first metrics through the SDK")
        # The portal's processes go away while the training runs; the agent (which reaches
        # the database directly) does not notice, the workload's rows wait.
        portal.stop()
        stopped_at = points()
        time.sleep(3)
        assert points() == stopped_at  # nothing can arrive: no web process
        portal.start(worker=False, beat=False)

        deadline = time.monotonic() + 120
        state = ""
        while time.monotonic() < deadline and state not in {"succeeded", "failed", "cancelled"}:
            time.sleep(0.5)
            state = get_json(f"{portal.url}{created['url']}", token)["state"]
        assert state == "succeeded", agent.output()
    finally:
        agent.stop()

    (attempt,) = RunAttempt.objects.unscoped().filter(run=run)
    log = Path(attempt.log_path).read_text(errors="replace")
    sdk_dir = Path(agent.var_dir) / "workload-sdk"
    assert f"the SDK is {sdk_dir}/" in log, log  # the platform's copy, not an installed one
    assert "the portal cannot be reached" in log, log
    assert "the portal answers again" in log, log
    assert "trained" in log
    # Every row arrived, the ones that waited out the outage included, each once.
    losses = dict(
        MetricPoint.objects.unscoped().filter(run=run, key="loss").values_list("step", "value")
    )
    assert points() == STEPS
    assert losses == pytest.approx({step: 1.0 / step for step in range(1, STEPS + 1)})
    # The checkpoint the SDK registered: the collector does not count a folder named "best".
    (checkpoint,) = Checkpoint.objects.unscoped().filter(run=run)
    assert (checkpoint.step, Path(checkpoint.path).name) == (10, "best")
    assert checkpoint.complete
