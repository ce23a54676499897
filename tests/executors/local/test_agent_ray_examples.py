"""The Ray Train example trained for real on the local executor (issue 32): a real agent
(``manage.py run_agent``) runs examples/ray-train on the attempt's own Ray cluster
(tau.ray_cluster: a head and two worker nodes on loopback), with torch and Ray installed from
the wheels make test downloads (deploy/dev/example_wheels.py). A module of its own, so that
pytest-xdist (``--dist loadscope``) runs it beside the other example modules."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from evidence import keys
from executors.local.agent import processes
from runs.models import Artifact, Checkpoint, FailureClass, MetricPoint, RunAttempt, RunState
from tau.evidence.keys import load_trusted_keys
from tau.evidence.verify import verify_file
from tests.evidence.helpers import download, manifest_of, member_names, seal_all
from tests.executors.local.agent_harness import attempts, local_quota, submit, wait_for_state
from tests.executors.local.test_agent_examples import EXAMPLES, torch_agent
from tests.executors.local.test_agent_workers import FIRST_INSTALL_SECONDS
from tests.runs.factories import zip_directory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_the_ray_train_example_trains_on_two_ray_workers_and_resumes_after_one_is_killed(
    world: Any, tmp_path: Path, start_agent: Any, live_server: Any
) -> None:
    """examples/ray-train, as written but shorter and with one Ray Train worker killed on the
    first attempt: the attempt's Ray cluster (a head and two worker nodes on loopback,
    tau.ray_cluster) runs a TorchTrainer whose two workers sit on different nodes; the
    lost worker fails the trainer and the attempt, the retry resumes from the checkpoint
    Ray Train persisted and TauGrid recorded, and the run ends with its metrics, checkpoints,
    model and a sealed record. No Ray process outlives an attempt."""
    local_quota(world.alpha)
    example = EXAMPLES / "ray-train"
    source = (example / "tau.yaml").read_text()
    killed_at = source.replace(
        "args: [--workers, 2, --steps, 200, --checkpoint-every, 50]",
        "args: [--workers, 2, --steps, 100, --checkpoint-every, 50, --kill-at-step, 70]",
    ).replace(
        # Ray folds the workers' lines that differ only in numbers ("rank 0: …" and "rank 1:
        # …") into one, "[repeated 2x across cluster]"; the test reads each worker's.
        "    OMP_NUM_THREADS: 1\n",
        "    OMP_NUM_THREADS: 1\n    RAY_DEDUP_LOGS: '0'\n",
    )
    assert "--kill-at-step, 70" in killed_at
    assert "RAY_DEDUP_LOGS" in killed_at
    run = submit(world, killed_at.encode(), bundle=zip_directory(example))
    agent = torch_agent(start_agent, TAU_API_URL=live_server.url)  # the SDK reports there
    wait_for_state(
        run, {RunState.SUCCEEDED, RunState.FAILED}, timeout=FIRST_INSTALL_SECONDS, agent=agent
    )
    assert run.state == RunState.SUCCEEDED, run.state_reason

    killed, resumed = attempts(run)
    first_log = Path(killed.log_path).read_text()
    assert "[ray-cluster] 2 worker nodes (1 CPU, 0 GPU, 2.0 GiB each) and the head are up" in (
        first_log
    )
    assert "rank 1: killed at step 70 (first attempt only)" in first_log
    assert "[ray-cluster] the driver exited with code 1" in first_log
    assert killed.failure_class == FailureClass.USER_ERROR, killed.failure_message
    assert resumed.retry_reason == FailureClass.USER_ERROR
    assert resumed.state == RunAttempt.State.SUCCEEDED
    assert resumed.resume_from is not None
    assert resumed.resume_from.step == 50
    log = Path(resumed.log_path).read_text()
    # Each Ray Train worker on a worker node of its own, as on two pods.
    nodes = dict(re.findall(r"rank (\d) of 2 on node (\w+): gloo, steps 51\.\.100", log))
    assert set(nodes) == {"0", "1"}, log[-3000:]
    assert nodes["0"] != nodes["1"]
    # From Ray Train's own record of its checkpoints when it wrote one before the loss, else
    # from the one TauGrid hands over: step 50 either way.
    sources = r"\((TAU_RESUME_FROM|Ray Train's newest checkpoint)\)"
    for rank in (0, 1):
        assert re.search(rf"rank {rank}: resumed from step 50 {sources}", log), log[-3000:]
    assert "done: step 100, 2 workers" in log
    assert "[ray-cluster] the driver exited with code 0" in log

    # Rank 0's metrics (the mean loss of both workers), sent by the SDK in the background
    # and flushed at each checkpoint: the first attempt's reached the portal up to step 50
    # at least (60 may have been in the buffer when the attempt died); the retry's start at 60.
    points = MetricPoint.objects.for_workspace(world.alpha).filter(run=run, key="loss")
    first = dict(points.filter(attempt=1).values_list("step", "value"))
    second = dict(points.filter(attempt=2).values_list("step", "value"))
    everything = list(
        MetricPoint.objects.for_workspace(world.alpha)
        .filter(run=run)
        .values_list("attempt", "step", "key")
    )
    assert {10, 20, 30, 40, 50} <= set(first) <= {10, 20, 30, 40, 50, 60}, everything
    assert sorted(second) == [60, 70, 80, 90, 100], everything
    assert second[100] < first[10] / 5, (first, second)
    # Ray Train's checkpoints (rank 0's state, persisted by Ray), told to TauGrid as written.
    recorded = Checkpoint.objects.for_workspace(world.alpha).filter(run=run)
    assert sorted(recorded.values_list("step", flat=True)) == [50, 100]
    assert {Path(path).parts[-2:] for path in recorded.values_list("path", flat=True)} == {
        ("ray-train", "step-50"),
        ("ray-train", "step-100"),
    }
    assert (
        Artifact.objects.for_workspace(world.alpha).filter(run=run, path="model/final.pt").exists()
    )
    # The workload's own variables (Ray's processes have its environment); the name is
    # unique, an id is not across the test databases of parallel test processes.
    markers = {"TAU_RUN_ID": str(run.pk), "TAU_RUN_NAME": run.name}
    assert processes.marked_processes(markers) == []  # no raylet, GCS or worker left

    (record,) = seal_all(run)
    assert manifest_of(record)["run"]["state"] == RunState.SUCCEEDED
    exported = download(world.api_client_for("viewer"), run, tmp_path / "evidence.tar")
    report = verify_file(exported, load_trusted_keys(json.dumps(keys.keyring()).encode()))
    assert report.ok, report.problems
    assert {"attempts/1/log.txt", "attempts/2/log.txt", "artifacts/model/final.pt"} <= set(
        member_names(exported)
    )
