"""Multi-worker runs on the local executor (issue 32): a Job with ``compute.workers: N`` starts
N processes, each in a sandbox of its own, with the rendezvous variables of ``tau.rendezvous``
(the same names a cluster's pods get), talking over loopback; they are admitted together, the
first to fail stops the others and its end is the attempt's, and every worker's log can be
read. A real agent process (``manage.py run_agent``) runs them, against the test PostgreSQL.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from evidence import keys
from executors.local.agent import processes
from executors.local.agent.supervisor import attempt_markers
from executors.local.backend import LocalBackend
from runs.models import (
    Artifact,
    Checkpoint,
    FailureClass,
    MetricPoint,
    Run,
    RunAttempt,
    RunState,
)
from tau import rendezvous
from tau.evidence.keys import load_trusted_keys
from tau.evidence.verify import verify_file
from tests.evidence.helpers import download, manifest_of, member_names, seal_all
from tests.executors.local.agent_harness import (
    GRACE_SECONDS,
    ROOT,
    attempt_dir,
    attempts,
    how_it_ended,
    local_quota,
    submit,
    wait_for_state,
    wait_until,
)
from tests.runs.factories import zip_directory
from tests.scripts import load_script

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = ROOT / "examples"

#: Worker 0 waits for every other worker to connect to MASTER_ADDR:MASTER_PORT and say its
#: rank; each says what it was told (the rendezvous table, its output folder, its pid
#: namespace) in its log and its output folder. ``FAIL_RANK`` makes that worker exit 3 before
#: it connects: worker 0 would then wait for it forever. ``HOLD_FIRST_ATTEMPT`` keeps every
#: worker of the first attempt running once they have met.
MEETING = """\
    import json, os, socket, sys, time
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    names = NAMES + ["TAU_OUTPUT_DIR", "CUDA_VISIBLE_DEVICES"]
    told = {name: os.environ.get(name) for name in names}
    told["pid_namespace"] = os.readlink("/proc/self/ns/pid")
    with open(os.path.join(os.environ["TAU_OUTPUT_DIR"], "told.json"), "w") as handle:
        json.dump(told, handle)
    print(f"rank {rank} of {world} told {json.dumps(told, sort_keys=True)}", flush=True)
    if os.environ.get("FAIL_RANK") == str(rank):
        print(f"rank {rank} gives up", flush=True)
        sys.exit(3)
    address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    if rank == 0:
        server = socket.create_server(address)
        met = []
        while len(met) < world - 1:
            connection, _ = server.accept()
            met.append(int(connection.recv(16)))
        print(f"rank 0 met ranks {sorted(met)}", flush=True)
        metrics = os.path.join(os.environ["TAU_OUTPUT_DIR"], "metrics.jsonl")
        with open(metrics, "a") as handle:
            handle.write(json.dumps({"step": 1, "world": world}) + "\\n")
    else:
        deadline = time.monotonic() + 60
        while True:
            try:
                connection = socket.create_connection(address, timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        connection.sendall(str(rank).encode())
        print(f"rank {rank} reached rank 0", flush=True)
    if os.environ.get("HOLD_FIRST_ATTEMPT") and os.environ["TAU_ATTEMPT"] == "1":
        time.sleep(300)
    """.replace("NAMES", repr(list(rendezvous.NAMES)))


def workers_spec(name: str, workers: int, *, env: str = "", retries: int = 0) -> bytes:
    return textwrap.dedent(
        f"""\
        schema_version: 1
        name: {name}
        run:
          entrypoint: main.py
          workload_kind: job
        compute:
          cpus: 250m
          memory: 64Mi
          workers: {workers}
        runtime:
          env: {{{env}}}
        resilience:
          max_retries: {retries}
        """
    ).encode()


def told(var_dir: Path, run: Run, rank: int) -> dict[str, Any]:
    output = attempt_dir(var_dir, run, 1) / "output"
    folder = output if rank == 0 else output / f"worker-{rank}"
    result: dict[str, Any] = json.loads((folder / "told.json").read_text())
    return result


def test_three_workers_meet_over_loopback_with_the_rendezvous_table(
    world: Any, var_dir: Path, start_agent: Any
) -> None:
    local_quota(world.alpha)
    run = submit(world, workers_spec("meet", 3), {"main.py": MEETING})
    agent = start_agent()
    wait_for_state(run, {RunState.SUCCEEDED, RunState.FAILED}, timeout=60, agent=agent)
    assert run.state == RunState.SUCCEEDED, how_it_ended(run, agent)
    (attempt,) = attempts(run)
    assert attempt.exit_code == 0

    # Each worker was told the table, with its own rank; worker 0 on loopback.
    seen = [told(var_dir, run, rank) for rank in range(3)]
    port = seen[0]["MASTER_PORT"]
    for rank, values in enumerate(seen):
        assert {name: values[name] for name in rendezvous.NAMES} == {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "WORLD_SIZE": "3",
            "RANK": str(rank),
            "LOCAL_RANK": "0",
            "PET_NNODES": "3",
            "PET_NODE_RANK": str(rank),
            "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": port,
        }
        assert values["TAU_OUTPUT_DIR"].endswith("output" if rank == 0 else f"worker-{rank}")
        assert values["CUDA_VISIBLE_DEVICES"] == ""  # it asked for no GPU
    assert int(port) > 0

    # Each in a sandbox of its own (a pid namespace each, none of them this machine's).
    namespaces = {values["pid_namespace"] for values in seen}
    assert len(namespaces) == 3
    assert os.readlink("/proc/self/ns/pid") not in namespaces

    # Every worker's log, worker 0's being the attempt's; the run page can pick each.
    backend = LocalBackend()
    first = backend.read_log(run, attempt, offset=0, tail_lines=None)
    assert first.pods == ("worker-0", "worker-1", "worker-2")
    assert first.pod == "worker-0"
    assert "rank 0 met ranks [1, 2]" in first.text
    for rank in (1, 2):
        chunk = backend.read_log(run, attempt, offset=0, tail_lines=None, pod=f"worker-{rank}")
        assert chunk.pod == f"worker-{rank}"
        assert f"rank {rank} reached rank 0" in chunk.text
        assert "rank 0 met" not in chunk.text
    # A name that is not a worker's reads worker 0's, never a path.
    other = backend.read_log(run, attempt, offset=0, tail_lines=None, pod="../../secret")
    assert other.pod == "worker-0"

    # The run's metrics are worker 0's.
    points = MetricPoint.objects.for_workspace(world.alpha).filter(run=run, key="world")
    assert list(points.values_list("step", "value")) == [(1, 3.0)]


def test_a_failing_worker_stops_the_others_and_fails_the_attempt(
    world: Any, var_dir: Path, start_agent: Any
) -> None:
    local_quota(world.alpha)
    run = submit(world, workers_spec("fall", 2, env="FAIL_RANK: '1'"), {"main.py": MEETING})
    agent = start_agent()
    wait_for_state(run, RunState.RUNNING, timeout=30, agent=agent)
    # Worker 0 waits for worker 1 forever: only the agent ends it.
    wait_for_state(run, RunState.FAILED, timeout=GRACE_SECONDS + 30, agent=agent)
    (attempt,) = attempts(run)
    assert attempt.state == RunAttempt.State.FAILED
    assert attempt.failure_class == FailureClass.USER_ERROR
    assert attempt.exit_code == 3
    assert attempt.failure_message.startswith("Worker 1 of 2: Exited with code 3."), (
        attempt.failure_message
    )
    assert "rank 1 gives up" in attempt.failure_message  # its last output, from its own log
    # Worker 0 had started (it said so), and was stopped with the attempt's process group.
    assert told(var_dir, run, 0)["RANK"] == "0"
    assert "rank 0 of 2 told" in Path(attempt.log_path).read_text()
    markers = attempt_markers(run.pk, 1)
    assert processes.marked_processes(markers) == []


def test_workers_a_dead_agent_left_are_stopped_and_the_attempt_run_again(
    world: Any, var_dir: Path, start_agent: Any
) -> None:
    local_quota(world.alpha)
    source = workers_spec("orphans", 2, env="HOLD_FIRST_ATTEMPT: '1'")
    run = submit(world, source, {"main.py": MEETING})
    markers = attempt_markers(run.pk, 1)
    log = attempt_dir(var_dir, run, 1) / "run.log"
    first = start_agent()
    wait_until(
        lambda: log.exists() and "rank 0 met ranks [1]" in log.read_text(),
        timeout=30,
        what="the workers to meet",
        agent=first,
    )
    first.kill()
    assert processes.marked_processes(markers)  # nobody supervises them now

    # The next agent finds them all by worker 0's process group, stops them, and starts the
    # attempt again (an agent's crash is not the run's failure: no retry is used up).
    second = start_agent()
    wait_for_state(run, {RunState.SUCCEEDED, RunState.FAILED}, timeout=60, agent=second)
    assert run.state == RunState.SUCCEEDED, how_it_ended(run, second)
    assert processes.marked_processes(markers) == []
    crashed, again = attempts(run)
    assert crashed.failure_class == FailureClass.INFRASTRUCTURE
    assert crashed.failure_message == "agent restarted"
    assert again.state == RunAttempt.State.SUCCEEDED
    assert "rank 0 met ranks [1]" in Path(again.log_path).read_text()


# --- the examples, trained for real ------------------------------------------------------

#: The runs' environments of the example tests, shared by every test session of this machine
#: (``TAU_LOCAL_VENVS_DIR``): torch is installed once (about 2.5 GB), like the control plane's
#: builds, outside the repository.
RUN_VENVS = (
    Path(os.environ.get("TAUGRID_CACHE_DIR") or Path.home() / ".cache" / "taugrid") / "run-venvs"
)
EXAMPLE_WHEELS_SCRIPT = ROOT / "deploy" / "dev" / "example_wheels.py"
example_wheels = load_script(EXAMPLE_WHEELS_SCRIPT, "taugrid_example_wheels")
#: The first run of a session on a new machine installs torch (minutes); then seconds.
FIRST_INSTALL_SECONDS = 900


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ddp", "fsdp"])
def test_a_distributed_example_trains_on_two_workers_and_resumes_after_one_is_killed(
    world: Any, var_dir: Path, tmp_path: Path, start_agent: Any, name: str
) -> None:
    """examples/ddp (DistributedDataParallel) and examples/fsdp (FullyShardedDataParallel),
    as written but for one worker killed on the first attempt."""
    local_quota(world.alpha)
    example = EXAMPLES / name
    source = (example / "tau.yaml").read_text()
    killed_at = source.replace(
        "args: [--steps, 300, --checkpoint-every, 50]",
        "args: [--steps, 300, --checkpoint-every, 50, --kill-at-step, 120]",
    )
    assert killed_at != source
    run = submit(world, killed_at.encode(), bundle=zip_directory(example))
    # Its torch comes from the wheels make test downloaded (deploy/dev/example_wheels.py).
    wheels = example_wheels.wheel_dir()
    assert example_wheels.is_complete(wheels), f"run {EXAMPLE_WHEELS_SCRIPT} first"
    agent = start_agent(TAU_LOCAL_VENVS_DIR=str(RUN_VENVS), PIP_FIND_LINKS=str(wheels))
    wait_for_state(
        run, {RunState.SUCCEEDED, RunState.FAILED}, timeout=FIRST_INSTALL_SECONDS, agent=agent
    )
    assert run.state == RunState.SUCCEEDED, how_it_ended(run, agent)

    # Worker 1 killed itself at step 120 (SIGKILL, as a lost node): its end is the attempt's,
    # worker 0 (which lost its peer) was stopped or failed with it.
    killed, resumed = attempts(run)
    assert killed.failure_class == FailureClass.OOM_KILLED, killed.failure_message
    assert killed.failure_message.startswith("Worker 1 of 2: Killed by the kernel (SIGKILL")
    assert "rank 1: killed at step 120" in killed.failure_message
    # The retry started both workers again from the newest checkpoint, step 100.
    assert resumed.retry_reason == FailureClass.OOM_KILLED
    assert resumed.resume_from is not None
    assert resumed.resume_from.step == 100
    backend = LocalBackend()
    for rank in (0, 1):
        log = backend.read_log(run, resumed, offset=0, tail_lines=None, pod=f"worker-{rank}")
        assert f"rank {rank}: resumed from step 100" in log.text
        assert f"rank {rank} of 2: gloo, steps 101..300" in log.text
    assert "done: step 300, 2 workers" in Path(resumed.log_path).read_text()

    # Worker 0's metrics: the loss of every worker averaged, falling; the retry's from 110.
    points = MetricPoint.objects.for_workspace(world.alpha).filter(run=run, key="loss")
    first = dict(points.filter(attempt=1).values_list("step", "value"))
    second = dict(points.filter(attempt=2).values_list("step", "value"))
    assert sorted(first) == list(range(10, 120, 10))
    assert sorted(second) == list(range(110, 310, 10))
    assert second[300] < first[10] / 5, (first[10], second[300])
    # Its checkpoints, recorded as they were written; its model, kept as an artifact.
    steps = set(
        Checkpoint.objects.for_workspace(world.alpha).filter(run=run).values_list("step", flat=True)
    )
    assert steps == {50, 100, 150, 200, 250, 300}
    if name == "fsdp":  # sharded (torch.distributed.checkpoint): a shard per worker, no whole
        folder = Path(resumed.resume_from.path)
        assert {path.name for path in folder.iterdir()} == {
            *("__0_0.distcp", "__1_0.distcp", ".metadata", "step.json", "COMPLETE")
        }
    assert (
        Artifact.objects.for_workspace(world.alpha).filter(run=run, path="model/final.pt").exists()
    )

    # One sealed record of it all, exported through the API and verified offline: both
    # attempts' logs (worker 0's), the metrics, the model.
    (record,) = seal_all(run)
    manifest = manifest_of(record)
    assert manifest["run"]["state"] == RunState.SUCCEEDED
    assert manifest["metrics"]["count"] == len(first) + len(second)
    exported = download(world.api_client_for("viewer"), run, tmp_path / "evidence.tar")
    report = verify_file(exported, load_trusted_keys(json.dumps(keys.keyring()).encode()))
    assert report.ok, report.problems
    members = set(member_names(exported))
    assert {"attempts/1/log.txt", "attempts/2/log.txt", "artifacts/model/final.pt"} <= members


@pytest.mark.slow
def test_the_deepspeed_example_trains_with_zero_on_two_workers_and_resumes_from_its_checkpoint(
    world: Any, var_dir: Path, tmp_path: Path, start_agent: Any
) -> None:
    """examples/deepspeed (ZeRO stage 2, on CPUs over gloo), as written but for one worker
    killed on the first attempt: DeepSpeed's own checkpoints, one shard of the optimizer state
    per worker, are what the retry resumes from, and it computes what the first attempt did."""
    local_quota(world.alpha)
    example = EXAMPLES / "deepspeed"
    source = (example / "tau.yaml").read_text()
    killed_at = source.replace(
        "args: [--steps, 300, --checkpoint-every, 50]",
        "args: [--steps, 300, --checkpoint-every, 50, --kill-at-step, 120]",
    )
    assert killed_at != source
    run = submit(world, killed_at.encode(), bundle=zip_directory(example))
    # Its torch and deepspeed come from the wheels make test downloaded and built
    # (deploy/dev/example_wheels.py).
    wheels = example_wheels.wheel_dir()
    assert example_wheels.is_complete(wheels), f"run {EXAMPLE_WHEELS_SCRIPT} first"
    agent = start_agent(TAU_LOCAL_VENVS_DIR=str(RUN_VENVS), PIP_FIND_LINKS=str(wheels))
    wait_for_state(
        run, {RunState.SUCCEEDED, RunState.FAILED}, timeout=FIRST_INSTALL_SECONDS, agent=agent
    )
    assert run.state == RunState.SUCCEEDED, how_it_ended(run, agent)

    # Worker 1 killed itself at step 120 (SIGKILL, as a lost node): its end is the attempt's.
    killed, resumed = attempts(run)
    assert killed.failure_class == FailureClass.OOM_KILLED, killed.failure_message
    assert killed.failure_message.startswith("Worker 1 of 2: Killed by the kernel (SIGKILL")
    assert "rank 1: killed at step 120" in killed.failure_message
    # The retry started both workers again from the newest checkpoint, step 100: each loaded
    # the model and its own shard of the optimizer state (engine.load_checkpoint).
    assert resumed.retry_reason == FailureClass.OOM_KILLED
    assert resumed.resume_from is not None
    assert resumed.resume_from.step == 100
    backend = LocalBackend()
    for rank in (0, 1):
        log = backend.read_log(run, resumed, offset=0, tail_lines=None, pod=f"worker-{rank}")
        assert f"rank {rank}: resumed from step 100" in log.text
        assert f"rank {rank} of 2: gloo, steps 101..300" in log.text
    assert "done: step 300, 2 workers" in Path(resumed.log_path).read_text()

    # Worker 0's metrics: the loss of every worker averaged, falling; the retry's from 110,
    # where it computed exactly what the killed attempt had: the state came back whole.
    points = MetricPoint.objects.for_workspace(world.alpha).filter(run=run, key="loss")
    first = dict(points.filter(attempt=1).values_list("step", "value"))
    second = dict(points.filter(attempt=2).values_list("step", "value"))
    assert sorted(first) == list(range(10, 120, 10))
    assert sorted(second) == list(range(110, 310, 10))
    assert second[110] == first[110]
    assert second[300] < first[10] / 5, (first[10], second[300])
    # Its checkpoints, one row each although the agent found them and the workload reported
    # them (tau.checkpoint_saved): DeepSpeed's folders, renamed into place whole, nothing
    # half-written left beside them. Its model, kept as an artifact.
    checkpoints = Checkpoint.objects.for_workspace(world.alpha).filter(run=run)
    assert sorted(checkpoints.values_list("step", flat=True)) == [50, 100, 150, 200, 250, 300]
    newest = Path(checkpoints.get(step=300).path)
    assert sorted(path.name for path in newest.parent.iterdir()) == sorted(
        f"step-{step}" for step in range(50, 350, 50)
    )
    assert (newest / "latest").read_text() == "global_step300"
    assert {path.name for path in (newest / "global_step300").iterdir()} == {
        "mp_rank_00_model_states.pt",
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
    }
    assert (
        Artifact.objects.for_workspace(world.alpha).filter(run=run, path="model/final.pt").exists()
    )

    # One sealed record of it all, exported through the API and verified offline.
    (record,) = seal_all(run)
    manifest = manifest_of(record)
    assert manifest["run"]["state"] == RunState.SUCCEEDED
    assert manifest["metrics"]["count"] == len(first) + len(second)
    exported = download(world.api_client_for("viewer"), run, tmp_path / "evidence.tar")
    report = verify_file(exported, load_trusted_keys(json.dumps(keys.keyring()).encode()))
    assert report.ok, report.problems
    members = set(member_names(exported))
    assert {"attempts/1/log.txt", "attempts/2/log.txt", "artifacts/model/final.pt"} <= members
