"""The local executor end to end: a real agent process (``manage.py run_agent``) running real
workloads as process groups, against the test PostgreSQL."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import transaction
from django.test import Client

from executors.local.agent import environments, processes
from executors.local.agent.environments import launcher_environment
from executors.local.agent.supervisor import UNSANDBOXED_REFUSAL, attempt_markers
from executors.local.agent.wrapper import truncation_marker
from identity.models import ApiToken
from portal.models import AuditEvent
from runs import lifecycle
from runs.checkpoints import newest_checkpoint
from runs.events import verify_event_chain
from runs.models import (
    Checkpoint,
    FailureClass,
    MetricPoint,
    Run,
    RunAttempt,
    RunState,
    RunTrial,
)
from runs.trials import trials_table
from tests.executors.local.agent_harness import (
    GRACE_SECONDS,
    LOG_CAP,
    ROOT,
    Agent,
    attempt_dir,
    attempts,
    host_pid,
    local_quota,
    process_alive,
    spec,
    state_of,
    submit,
    tokens_of,
    wait_for_state,
    wait_until,
)
from tests.runs.factories import zip_directory

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = ROOT / "examples"

# A workload that starts a grandchild which ignores SIGTERM, writes both pids, and sleeps.
# From attempt 2 on it says how it was started and exits at once.
TREE_WORKLOAD = """\
    import json, os, subprocess, sys, time
    attempt = int(os.environ["TAU_ATTEMPT"])
    if attempt > 1:
        print(f"attempt {attempt}, retry reason {os.environ.get('TAU_RETRY_REASON')}", flush=True)
        sys.exit(0)
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"])
    pids = os.path.join(os.environ["TAU_OUTPUT_DIR"], "pids.json")
    with open(pids + ".tmp", "w") as handle:
        json.dump({"main": os.getpid(), "grandchild": child.pid}, handle)
    os.rename(pids + ".tmp", pids)
    print("started", flush=True)
    time.sleep(300)
    """


def all_revoked(run: Run) -> bool:
    return all(token.revoked_at is not None for token in tokens_of(run))


def read_pids(var_dir: Path, run: Run, agent: Agent) -> dict[str, int]:
    """The pids the workload wrote (as its sandbox numbers them), as this machine knows them."""
    path = attempt_dir(var_dir, run, 1) / "output" / "pids.json"
    wait_until(path.exists, timeout=30, what="the workload's pid file", agent=agent)
    inside: dict[str, int] = json.loads(path.read_text())
    pids = {name: host_pid(run, 1, pid) for name, pid in inside.items()}
    assert all(pids.values()), (inside, pids)
    return {name: pid for name, pid in pids.items() if pid is not None}


NO_RETRIES = """\
    resilience:
      max_retries: 0
    """


def test_cpu_quickstart_runs_to_success(
    world: Any, var_dir: Path, start_agent: Any, live_server: Any
) -> None:
    local_quota(world.alpha)
    example = EXAMPLES / "cpu-quickstart"
    run = submit(world, (example / "tau.yaml").read_bytes(), bundle=zip_directory(example))
    # The example reports its metrics and checkpoints through the SDK, to this portal.
    agent = start_agent(TAU_API_URL=live_server.url)
    wait_for_state(run, {RunState.SUCCEEDED, RunState.FAILED}, timeout=120, agent=agent)
    assert run.state == RunState.SUCCEEDED, run.state_reason
    (attempt,) = attempts(run)
    assert attempt.state == RunAttempt.State.SUCCEEDED
    assert attempt.exit_code == 0
    assert attempt.pid
    assert attempt.process_start_ticks
    log = Path(attempt.log_path)
    assert log == attempt_dir(var_dir, run, 1) / "run.log"
    text = log.read_text()
    assert "step 1500: loss" in text
    assert "done: step 1500" in text
    assert attempt.log_size == log.stat().st_size
    metrics_file = attempt_dir(var_dir, run, 1) / "output" / "metrics.jsonl"
    assert attempt.metrics_offset == metrics_file.stat().st_size
    losses = MetricPoint.objects.for_workspace(world.alpha).filter(run=run, key="loss")
    assert losses.count() == 1500 // 25  # one row every 25 steps, none twice
    assert set(losses.values_list("attempt", flat=True)) == {1}
    assert (
        MetricPoint.objects.for_workspace(world.alpha).filter(run=run, key="val_accuracy").exists()
    )
    checkpoints = Checkpoint.objects.for_workspace(world.alpha).filter(run=run)
    newest = newest_checkpoint(run)
    assert newest is not None
    assert newest.step == 1500
    assert Path(newest.path) == var_dir / "runs" / str(run.pk) / "checkpoints" / "step-1500"
    assert all(checkpoint.complete and checkpoint.size for checkpoint in checkpoints)
    assert verify_event_chain(run)
    kinds = [event.new_state for event in run.events.all().order_by("seq") if event.new_state]
    assert kinds == ["pending", "queued", "admitted", "running", "succeeded"]
    # The run token existed only for the attempt: held by it, revoked at the end, both
    # audited with the run and attempt it was for.
    # (Revoked right after the attempt's end commits: the run can be seen ended just before.)
    wait_until(
        lambda: tokens_of(run)[0].revoked_at is not None,
        timeout=10,
        what="the run token's revocation",
        agent=agent,
    )
    (token,) = tokens_of(run)
    assert token.kind == ApiToken.Kind.RUN
    assert attempt.token_id == token.pk
    audited = AuditEvent.objects.for_workspace(world.alpha).filter(
        object_type="portal.apitoken", object_id=str(token.pk)
    )
    created = audited.get(action="token.create")
    assert created.after is not None
    assert (created.after["run"], created.after["attempt"]) == (run.name, 1)
    assert audited.filter(action="token.revoke").count() == 1


def test_a_config_written_for_the_reference_cli_runs_to_success(
    world: Any, var_dir: Path, start_agent: Any
) -> None:
    """A direct run config (the reference TauGrid CLI's dialect) runs here as written."""
    local_quota(world.alpha)
    direct = textwrap.dedent(
        """\
        name: direct-cpu
        engine: job
        entrypoint: main.py
        compute:
          cpu_request: 250m
          memory_request: 64Mi
        runtime:
          env:
            GREETING: from a direct config
        policy:
          namespace: ray
        experiment:
          project: Tau Local
          name: direct-smoke
        """
    ).encode()
    workload = """\
        import os
        print(os.environ["GREETING"], flush=True)
        """
    run = submit(world, direct, {"main.py": workload})
    agent = start_agent()
    wait_for_state(run, {RunState.SUCCEEDED, RunState.FAILED}, timeout=60, agent=agent)
    assert run.state == RunState.SUCCEEDED, run.state_reason
    (attempt,) = attempts(run)
    assert "from a direct config" in Path(attempt.log_path).read_text()
    assert run.spec["resilience"]["max_retries"] == 0  # the reference's default


def test_a_killed_agent_is_recovered_on_restart(
    world: Any, var_dir: Path, start_agent: Any
) -> None:
    local_quota(world.alpha)
    # No retries at all: the agent's own crash is not the workload's failure, so the run is
    # started again anyway, and uses none.
    run = submit(world, spec("crashy", extra=NO_RETRIES), {"main.py": TREE_WORKLOAD})
    first = start_agent()
    pids = read_pids(var_dir, run, first)
    wait_for_state(run, RunState.RUNNING, timeout=10, agent=first)
    first.kill()
    # Orphans now: nobody supervises them.
    assert process_alive(pids["main"])
    assert process_alive(pids["grandchild"])

    second = start_agent()
    wait_for_state(run, {RunState.SUCCEEDED, RunState.FAILED}, timeout=60, agent=second)
    assert not process_alive(pids["main"])
    assert not process_alive(pids["grandchild"])
    assert run.state == RunState.SUCCEEDED, run.state_reason
    crashed, retried = attempts(run)
    assert crashed.state == RunAttempt.State.FAILED
    assert crashed.failure_class == FailureClass.INFRASTRUCTURE
    assert crashed.failure_message == "agent restarted"
    assert retried.retry_reason == FailureClass.INFRASTRUCTURE
    assert "attempt 2, retry reason infrastructure" in Path(retried.log_path).read_text()
    assert verify_event_chain(run)
    # Both attempts' tokens are revoked: the crashed one's by the recovery, the retry's right
    # after its end commits (so the run can be seen ended a moment before).
    wait_until(
        lambda: (
            len(tokens_of(run)) == 2
            and all(token.revoked_at is not None for token in tokens_of(run))
        ),
        timeout=10,
        what="both attempts' run tokens revoked",
        agent=second,
    )


def test_cancel_stops_the_whole_process_tree(world: Any, var_dir: Path, start_agent: Any) -> None:
    local_quota(world.alpha)
    run = submit(world, spec("cancelme"), {"main.py": TREE_WORKLOAD})
    agent = start_agent()
    pids = read_pids(var_dir, run, agent)
    wait_for_state(run, RunState.RUNNING, timeout=10, agent=agent)
    lifecycle.cancel_run(run=run, user=world.users["researcher"])
    # The grandchild ignores SIGTERM: it takes the grace period and a SIGKILL.
    wait_for_state(run, RunState.CANCELLED, timeout=GRACE_SECONDS + 15, agent=agent)
    assert not process_alive(pids["main"])
    assert not process_alive(pids["grandchild"])
    (attempt,) = attempts(run)
    assert attempt.state == RunAttempt.State.CANCELLED
    assert verify_event_chain(run)


def test_a_retry_resumes_from_the_newest_checkpoint(
    world: Any, var_dir: Path, start_agent: Any, live_server: Any
) -> None:
    local_quota(world.alpha)
    example = EXAMPLES / "resume-from-checkpoint"
    source = (example / "tau.yaml").read_text()
    # The example, shorter: fail at step 175 on the first attempt, checkpoints every 50.
    source = source.replace(
        "args: [--steps, 1500, --checkpoint-every, 100, --fail-at-step, 750]",
        "args: [--steps, 300, --checkpoint-every, 50, --fail-at-step, 175]",
    ).replace("initial: 5s", "initial: 0s")
    assert "--fail-at-step, 175" in source
    assert "initial: 0s" in source
    run = submit(world, source.encode(), bundle=zip_directory(EXAMPLES / "cpu-quickstart"))
    agent = start_agent(TAU_API_URL=live_server.url)  # the SDK's reports go there
    wait_for_state(run, {RunState.SUCCEEDED, RunState.FAILED}, timeout=90, agent=agent)
    assert run.state == RunState.SUCCEEDED, run.state_reason
    failed, resumed = attempts(run)
    assert failed.failure_class == FailureClass.USER_ERROR
    assert "simulated failure at step 175" in failed.failure_message
    assert resumed.retry_reason == FailureClass.USER_ERROR
    assert resumed.resume_from is not None
    assert resumed.resume_from.step == 150
    assert resumed.resume_from.attempt == 1
    log = Path(resumed.log_path).read_text()
    assert "resumed from step 150" in log
    assert "resumed from" not in Path(failed.log_path).read_text()
    steps = MetricPoint.objects.for_workspace(world.alpha).filter(run=run, key="loss", attempt=2)
    assert min(steps.values_list("step", flat=True)) == 175
    assert verify_event_chain(run)


def test_max_runtime_is_enforced(world: Any, start_agent: Any) -> None:
    local_quota(world.alpha)
    source = spec("slow", extra="resilience: {max_retries: 0}\n").replace(
        b"  workload_kind: job\n", b"  workload_kind: job\n  max_runtime: 1s\n"
    )
    run = submit(world, source, {"main.py": "import time\ntime.sleep(300)\n"})
    agent = start_agent()
    wait_for_state(run, RunState.FAILED, timeout=GRACE_SECONDS + 20, agent=agent)
    assert run.failure_class == FailureClass.DEADLINE_EXCEEDED
    (attempt,) = attempts(run)
    assert attempt.failure_class == FailureClass.DEADLINE_EXCEEDED
    assert "max_runtime" in attempt.failure_message
    assert attempt.exit_code == 128 + signal.SIGTERM


def test_a_noisy_log_stops_at_the_cap(world: Any, start_agent: Any) -> None:
    local_quota(world.alpha)
    noisy = """\
        import sys
        line = "x" * 99 + "\\n"
        for _ in range(5000):  # 500 KB, far over the cap
            sys.stdout.write(line)
        print("the end")
        """
    run = submit(world, spec("noisy"), {"main.py": noisy})
    agent = start_agent()
    wait_for_state(run, {RunState.SUCCEEDED, RunState.FAILED}, timeout=30, agent=agent)
    assert run.state == RunState.SUCCEEDED
    (attempt,) = attempts(run)
    content = Path(attempt.log_path).read_bytes()
    marker = truncation_marker(LOG_CAP)
    assert content.endswith(marker)
    assert content.count(marker) == 1
    assert len(content) == LOG_CAP + len(marker) == attempt.log_size
    assert b"the end" not in content


def test_quota_admits_one_run_after_the_other(world: Any, start_agent: Any) -> None:
    local_quota(world.alpha, cpu="1")
    workload = {"main.py": "import time\ntime.sleep(2)\nprint('slept')\n"}
    first = submit(world, spec("first", cpus="1"), workload)
    second = submit(world, spec("second", cpus="1"), workload)
    agent = start_agent()
    wait_for_state(first, RunState.RUNNING, timeout=15, agent=agent)

    def waits_with_a_reason() -> bool:
        second.refresh_from_db()
        return second.queue_position == 1 and "Waiting for 1 CPU" in second.state_reason

    wait_until(waits_with_a_reason, timeout=5, what="a queue position and reason", agent=agent)
    assert second.state == RunState.QUEUED
    assert second.state_reason == "Waiting for 1 CPU: the workspace uses 1 of its 1."
    wait_for_state(second, RunState.SUCCEEDED, timeout=30, agent=agent)
    first.refresh_from_db()
    assert first.state == RunState.SUCCEEDED
    assert second.queue_position is None
    (first_attempt,) = attempts(first)
    (second_attempt,) = attempts(second)
    assert first_attempt.finished_at is not None
    assert second_attempt.started_at is not None
    assert second_attempt.started_at >= first_attempt.finished_at


def test_outcomes_by_exit_and_a_clean_environment(
    world: Any, var_dir: Path, start_agent: Any
) -> None:
    """Several small runs at once: exit codes, a kill by the kernel, a command that does not
    exist, and a workload that shows its environment (no portal secrets in it)."""
    local_quota(world.alpha)
    no_retry = "resilience: {max_retries: 0}\n"
    failing = submit(
        world,
        spec("failing", extra=no_retry),
        {"main.py": "import sys\nprint('giving up', file=sys.stderr)\nsys.exit(3)\n"},
    )
    oom = submit(
        world,
        spec("oom", extra=no_retry),
        {"main.py": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"},
    )
    missing = submit(world, spec("missing", "no-such-program-xyz --flag", extra=no_retry))
    dump = """\
        import json, os
        with open(os.path.join(os.environ["TAU_OUTPUT_DIR"], "env.json"), "w") as out:
            json.dump(dict(os.environ), out)
        """
    environment = submit(
        world,
        spec("environment").replace(
            b"  workload_kind: job\n", b"  workload_kind: job\n  args: [--flag, two words]\n"
        ),
        {"main.py": dump},
    )
    agent = start_agent(DJANGO_SECRET_CANARY="never-in-a-run")
    done: set[str] = {RunState.SUCCEEDED, RunState.FAILED}
    for run in (failing, oom, missing, environment):
        wait_for_state(run, done, timeout=30, agent=agent)

    assert failing.state == RunState.FAILED
    (attempt,) = attempts(failing)
    assert attempt.exit_code == 3
    assert attempt.failure_class == FailureClass.USER_ERROR
    assert attempt.failure_message == "Exited with code 3. Its last output: giving up"
    assert attempt.failure_hint

    (attempt,) = attempts(oom)
    assert attempt.failure_class == FailureClass.OOM_KILLED
    assert attempt.exit_code == 128 + signal.SIGKILL
    assert "most likely" in attempt.failure_message

    (attempt,) = attempts(missing)
    assert attempt.failure_class == FailureClass.INFRASTRUCTURE
    assert "no-such-program-xyz" in attempt.failure_message
    assert "no-such-program-xyz" in Path(attempt.log_path).read_text()

    assert environment.state == RunState.SUCCEEDED, environment.state_reason
    env = json.loads((attempt_dir(var_dir, environment, 1) / "output" / "env.json").read_text())
    for secret in (
        "DATABASE_URL",
        "TAU_SECRET_KEY",
        "TAU_TOKEN_PEPPERS",
        "CELERY_BROKER_URL",
        "DJANGO_SECRET_CANARY",
    ):
        assert secret not in env
    values = "\n".join(env.values())
    assert settings.SECRET_KEY not in values
    assert settings.TAU_TOKEN_PEPPERS.split(":", 1)[1] not in values
    assert env["TAU_RUN_ID"] == str(environment.pk)
    assert env["TAU_RUN_NAME"] == environment.name
    assert env["TAU_WORKSPACE"] == "alpha"
    assert env["TAU_ATTEMPT"] == "1"
    assert env["TAU_OUTPUT_DIR"] == str(attempt_dir(var_dir, environment, 1) / "output")
    assert env["TAU_CHECKPOINT_DIR"] == str(var_dir / "runs" / str(environment.pk) / "checkpoints")
    assert env["TAU_API_URL"] == "http://127.0.0.1:9"
    assert env["TAU_RUN_TOKEN"].startswith("tau_")
    assert "TAU_RESUME_FROM" not in env
    assert "TAU_RETRY_REASON" not in env
    assert env["HOME"] == str(attempt_dir(var_dir, environment, 1) / "work")
    assert env["PATH"].startswith(str(var_dir / "venvs"))
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    # The token's secret is in the child's environment only: the database has a hash.
    (token,) = tokens_of(environment)
    assert env["TAU_RUN_TOKEN"].split("_")[-1] not in token.secret_hash
    assert token.revoked_at is not None


def test_a_failed_pip_install_fails_the_attempt_as_infrastructure(
    world: Any, start_agent: Any
) -> None:
    local_quota(world.alpha)
    source = spec(
        "needs-pip",
        extra="""\
            runtime:
              pip: [taugrid-does-not-exist-xyz==0.0.1]
            resilience: {max_retries: 0}
            """,
    )
    run = submit(world, source, {"main.py": "print('never')\n"})
    agent = start_agent()
    wait_for_state(run, {RunState.SUCCEEDED, RunState.FAILED}, timeout=60, agent=agent)
    assert run.state == RunState.FAILED
    (attempt,) = attempts(run)
    assert attempt.failure_class == FailureClass.INFRASTRUCTURE
    assert "pip install failed" in attempt.failure_message
    log = Path(attempt.log_path).read_text()
    assert "taugrid-does-not-exist-xyz" in log
    assert "No matching distribution" in log
    assert "never" not in log


def test_stopping_the_agent_stops_its_runs_for_a_later_retry(
    world: Any, var_dir: Path, start_agent: Any
) -> None:
    local_quota(world.alpha)
    run = submit(world, spec("stopped", extra=NO_RETRIES), {"main.py": TREE_WORKLOAD})
    agent = start_agent()
    pids = read_pids(var_dir, run, agent)
    wait_for_state(run, RunState.RUNNING, timeout=10, agent=agent)
    assert agent.stop() == 0, agent.output()
    assert not process_alive(pids["main"])
    assert not process_alive(pids["grandchild"])
    run.refresh_from_db()
    # An interruption by the platform: back in the queue at once, and no retry used.
    assert run.state == RunState.QUEUED
    assert run.not_before is None
    attempt, following = attempts(run)
    assert attempt.failure_class == FailureClass.INFRASTRUCTURE
    assert attempt.failure_message == "agent stopped"
    assert attempt.counts_against_retries is False
    # Handed to the backend again at once, as the attempt that follows.
    assert (following.number, following.state) == (2, RunAttempt.State.WAITING)
    assert following.retry_reason == FailureClass.INFRASTRUCTURE


def test_runs_left_executing_without_an_attempt_are_put_right(world: Any, start_agent: Any) -> None:
    """A run admitted but never started (no attempt), and one being cancelled with nothing
    left to stop: the agent queues the first again and finishes the cancel of the second."""
    local_quota(world.alpha)
    lost = submit(world, spec("lost"), {"main.py": "print('ran after all')\n"})
    stopping = submit(world, spec("stopping"), {"main.py": "print('never')\n"})
    Run.objects.for_workspace(world.alpha).filter(pk=lost.pk).update(state=RunState.ADMITTED)
    Run.objects.for_workspace(world.alpha).filter(pk=stopping.pk).update(state=RunState.ADMITTED)
    with transaction.atomic():
        lifecycle.cancel_run(run=stopping, user=world.users["researcher"])
    assert state_of(stopping) == RunState.CANCELLING
    agent = start_agent()
    wait_for_state(stopping, RunState.CANCELLED, timeout=15, agent=agent)
    # The finished cancel still names who asked for it, not "stopping it" or nobody.
    assert stopping.state_reason == "Cancelled by rob."
    wait_for_state(lost, {RunState.SUCCEEDED, RunState.FAILED}, timeout=30, agent=agent)
    assert lost.state == RunState.SUCCEEDED
    (attempt,) = attempts(lost)  # the attempt it was handed over with, started after all
    assert "ran after all" in Path(attempt.log_path).read_text()
    # The other's attempt never started, and ended with the cancel.
    assert [attempt.state for attempt in attempts(stopping)] == [RunAttempt.State.CANCELLED]


def test_a_second_agent_refuses_to_start(var_dir: Path, start_agent: Any) -> None:
    first = start_agent()
    wait_until(
        lambda: "local agent started" in first.output(), timeout=20, what="start", agent=first
    )
    second = start_agent()
    assert second.process is not None
    assert second.process.wait(timeout=30) != 0
    assert "another local agent is running" in second.output()
    assert first.process is not None
    assert first.process.poll() is None


# --- isolation: every attempt in its own sandbox ------------------------------------------

# A workload of another workspace that tries what the attack of issue 11 did, and prints what
# it managed. Targets come in targets.json: {"read": {what: path}, "write": {what: path},
# "list": {what: [path, allowed entries]}, "victim_run": id}.
ATTACK = """\
    import json, os, sys
    targets = json.load(open("targets.json"))
    managed = []

    def tried(what, action):
        try:
            action()
        except OSError:  # not found, permission denied, read-only file system
            return
        managed.append(what)

    for what, path in targets["read"].items():
        tried(f"read {what}", lambda path=path: open(path, "rb").read(1))
    venv_site = os.path.join(sys.prefix, "lib", "python3.11", "site-packages")
    writes = {
        **targets["write"],
        "sitecustomize.py into the cached environment": os.path.join(venv_site, "sitecustomize.py"),
        "the cached environment's pyvenv.cfg": os.path.join(sys.prefix, "pyvenv.cfg"),
    }
    payload = "open('/dev/stderr', 'w').write('PWNED by another workspace\\\\n')\\n"
    for what, path in writes.items():
        tried(f"write {what}", lambda path=path: open(path, "a").write(payload))
    for what, (path, allowed) in targets["list"].items():
        allowed = [os.environ["TAU_RUN_ID"] if name == "$TAU_RUN_ID" else name for name in allowed]
        try:
            extra = sorted(set(os.listdir(path)) - set(allowed))
        except OSError:
            continue
        if extra:
            managed.append(f"saw {what}: {extra}")
    marker = f"TAU_RUN_ID={targets['victim_run']}".encode()
    for pid in [name for name in os.listdir("/proc") if name.isdigit()]:
        try:
            if marker in open(f"/proc/{pid}/environ", "rb").read():
                managed.append(f"the victim's environment (pid {pid})")
        except OSError:
            pass
    print("MANAGED " + json.dumps(managed), flush=True)
    """

# The victim: prints its run token (so its live log holds it) and waits to be released.
VICTIM = """\
    import os, time
    print("my token is " + os.environ["TAU_RUN_TOKEN"], flush=True)
    out = os.environ["TAU_OUTPUT_DIR"]
    open(os.path.join(out, "started"), "w").close()
    deadline = time.time() + 120
    while not os.path.exists(os.path.join(out, "release")) and time.time() < deadline:
        time.sleep(0.05)
    """

NEXT_RUN = """\
    import sys
    print("sitecustomize loaded:", "sitecustomize" in sys.modules, flush=True)
    """


def portal_secrets(var_dir: Path) -> dict[str, Path]:
    """The embedded default's secrets, where `make run` keeps them: written here the way the
    settings and bootstrap_demo write them."""
    from web.management.commands import bootstrap_demo

    paths = {}
    for name in ("secret_key", "token_pepper"):
        path = var_dir / name
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(descriptor, b"not-for-runs-" + name.encode())
        os.close(descriptor)
        paths[name] = path
    bootstrap_demo.load_or_create_passwords()
    paths["demo passwords"] = var_dir / "demo-credentials.json"
    database = var_dir / "taugrid.sqlite3"
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE secret (value TEXT)")
        connection.execute("INSERT INTO secret VALUES ('admin password hash')")
    paths["the database"] = database
    return paths


def test_a_run_cannot_reach_the_portal_or_another_workspace(
    world: Any, var_dir: Path, start_agent: Any
) -> None:
    """Acceptance 2 of issue 11: the original attack, from a run of workspace beta while a
    run of alpha is live; then alpha's next run is unaffected."""
    local_quota(world.alpha)
    local_quota(world.beta)
    secrets = portal_secrets(var_dir)
    assert oct(secrets["demo passwords"].stat().st_mode & 0o777) == "0o600"
    victim = submit(world, spec("victim"), {"main.py": VICTIM})
    agent = start_agent()
    started = attempt_dir(var_dir, victim, 1) / "output" / "started"
    wait_until(started.exists, timeout=30, what="the victim's start", agent=agent)
    victim_log = attempt_dir(var_dir, victim, 1) / "run.log"
    assert "my token is tau_" in victim_log.read_text()  # live, with its token
    home = Path(os.path.expanduser("~"))
    targets = {
        "read": {
            **{str(what): str(path) for what, path in secrets.items()},
            "another workspace's live log": str(victim_log),
            "the checkout": str(ROOT / "portal" / "settings.py"),
            "the portal's home": str(home / ".bashrc"),
            "another workspace's code bundle": str(
                next((var_dir / "bundles").rglob("*.zip"), var_dir / "bundles")
            ),
        },
        "write": {
            "the secret key": str(secrets["secret_key"]),
            "another workspace's checkpoints": str(
                var_dir / "runs" / str(victim.pk) / "checkpoints" / "planted"
            ),
        },
        "list": {
            # The workload SDK's read-only copy is mounted too (runs.workload_sdk).
            "var/": [str(var_dir), ["runs", "venvs", "workload-sdk"]],
            "var/runs/": [str(var_dir / "runs"), ["$TAU_RUN_ID"]],  # its own run only
            "the portal's home": [str(home), [".pyenv"]],
            "the checkout": [str(ROOT), []],
        },
        "victim_run": victim.pk,
    }
    attacker = submit(
        world,
        spec("attacker"),
        {"main.py": ATTACK, "targets.json": json.dumps(targets)},
        workspace=world.beta,
        user=world.users["outsider"],
    )
    wait_for_state(attacker, {RunState.SUCCEEDED, RunState.FAILED}, timeout=60, agent=agent)
    (attack,) = attempts(attacker)
    log = Path(attack.log_path).read_text()
    assert attacker.state == RunState.SUCCEEDED, log
    managed = json.loads(log.split("MANAGED ", 1)[1].splitlines()[0])
    assert managed == []
    # The secrets are as they were; nothing was planted.
    assert secrets["secret_key"].read_bytes() == b"not-for-runs-secret_key"
    assert not (var_dir / "runs" / str(victim.pk) / "checkpoints" / "planted").exists()

    (started.parent / "release").touch()
    wait_for_state(victim, RunState.SUCCEEDED, timeout=30, agent=agent)
    next_run = submit(world, spec("next"), {"main.py": NEXT_RUN})
    wait_for_state(next_run, {RunState.SUCCEEDED, RunState.FAILED}, timeout=60, agent=agent)
    (after,) = attempts(next_run)
    text = Path(after.log_path).read_text()
    assert next_run.state == RunState.SUCCEEDED, text
    assert "sitecustomize loaded: False" in text
    assert "PWNED" not in text
    venvs = [path for path in (var_dir / "venvs").iterdir() if path.is_dir()]
    assert len(venvs) == 1  # the three runs shared one cached environment
    assert not list(venvs[0].rglob("sitecustomize.py"))
    assert environments.verify_environment(venvs[0]) is None


def test_a_changed_cached_environment_is_built_again(
    world: Any, var_dir: Path, start_agent: Any
) -> None:
    """What a run without a sandbox (or anyone) changed in a cached environment never reaches
    the next run: the manifest check notices it and the environment is built again."""
    local_quota(world.alpha)
    first = submit(world, spec("first"), {"main.py": NEXT_RUN})
    agent = start_agent()
    wait_for_state(first, RunState.SUCCEEDED, timeout=60, agent=agent)
    (venv,) = [path for path in (var_dir / "venvs").iterdir() if path.is_dir()]
    planted = venv / "lib" / "python3.11" / "site-packages" / "sitecustomize.py"
    planted.write_text("print('PWNED by a planted sitecustomize')\n")
    second = submit(world, spec("second"), {"main.py": NEXT_RUN})
    wait_for_state(second, {RunState.SUCCEEDED, RunState.FAILED}, timeout=60, agent=agent)
    (attempt,) = attempts(second)
    text = Path(attempt.log_path).read_text()
    assert second.state == RunState.SUCCEEDED, text
    assert "PWNED" not in text
    assert "sitecustomize loaded: False" in text
    assert "sitecustomize.py was added" in text  # said in the attempt's log
    assert "sitecustomize.py was added" in agent.output()  # and in the agent's
    assert not planted.exists()


def test_without_a_sandbox_only_one_workspace_runs(
    world: Any, var_dir: Path, start_agent: Any
) -> None:
    local_quota(world.alpha)
    local_quota(world.beta)
    mine = submit(world, spec("mine"), {"main.py": "print('mine ran')\n"})
    theirs = submit(
        world,
        spec("theirs"),
        {"main.py": "print('theirs ran')\n"},
        workspace=world.beta,
        user=world.users["outsider"],
    )
    # No bwrap on its PATH: as on a machine without the package.
    agent = start_agent(PATH="/nonexistent")
    wait_for_state(mine, RunState.SUCCEEDED, timeout=60, agent=agent)

    def refused() -> bool:
        theirs.refresh_from_db()
        return theirs.state_reason == UNSANDBOXED_REFUSAL

    wait_until(refused, timeout=10, what="the refusal of the other workspace", agent=agent)
    assert theirs.state == RunState.QUEUED
    assert theirs.queue_position is None
    # Its attempt waits: never admitted.
    assert [attempt.state for attempt in attempts(theirs)] == [RunAttempt.State.WAITING]
    assert "NO SANDBOX for local runs: bwrap is not installed" in agent.output()
    ready = Client().get("/readyz").json()
    assert ready["local_executor"]["sandbox"] == "none"
    assert ready["local_executor"]["runs"] == "one workspace's only"
    assert "bwrap is not installed" in ready["local_executor"]["reason"]
    assert agent.stop() == 0

    # Remembered across restarts: another of alpha's runs, queued after theirs, runs; theirs
    # still waits (a fresh choice would take theirs, the first in the queue).
    again = submit(world, spec("again"), {"main.py": "print('again ran')\n"})
    agent = start_agent(TAU_LOCAL_SANDBOX="off")
    wait_for_state(again, RunState.SUCCEEDED, timeout=60, agent=agent)
    assert state_of(theirs) == RunState.QUEUED
    assert "switched off (TAU_LOCAL_SANDBOX=off)" in agent.output()
    assert agent.stop() == 0
    assert "local_executor" not in Client().get("/readyz").json()  # no agent, nothing to say

    # On purpose, every workspace's code unsandboxed.
    agent = start_agent(TAU_LOCAL_SANDBOX="off", TAU_LOCAL_EXECUTOR_UNSANDBOXED="true")
    wait_for_state(theirs, RunState.SUCCEEDED, timeout=60, agent=agent)
    ready = Client().get("/readyz").json()
    assert ready["local_executor"]["runs"].startswith("every workspace's, unsandboxed")
    (attempt,) = attempts(theirs)
    assert "theirs ran" in Path(attempt.log_path).read_text()


# --- recovery: finished work is never run again -------------------------------------------

# Counts its starts in a file of the run (the checkpoint folder outlives attempts), then waits
# until the test lets it finish, and exits with EXIT_CODE.
COUNTED = """\
    import os, sys, time
    with open(os.path.join(os.environ["TAU_CHECKPOINT_DIR"], "starts.txt"), "a") as starts:
        starts.write(f"attempt {os.environ['TAU_ATTEMPT']}\\n")
    out = os.environ["TAU_OUTPUT_DIR"]
    open(os.path.join(out, "started"), "w").close()
    deadline = time.time() + 120
    while not os.path.exists(os.path.join(out, "finish")) and time.time() < deadline:
        time.sleep(0.02)
    print("finishing with", os.environ["EXIT_CODE"], flush=True)
    open(os.path.join(out, "finished"), "w").close()
    sys.exit(int(os.environ["EXIT_CODE"]))
    """


def leader_gone(pid: int) -> bool:
    return not process_alive(pid)


def counted_spec(name: str, exit_code: int) -> bytes:
    return spec(
        name,
        extra=f"runtime:\n  env:\n    EXIT_CODE: '{exit_code}'\nresilience:\n  max_retries: 0\n",
    )


def test_work_finished_while_the_agent_was_down_is_not_run_again(
    world: Any, var_dir: Path, start_agent: Any
) -> None:
    """kill -9 of the agent right after its workloads exited, before it noticed: the next
    agent closes both attempts with their real exit codes and runs neither again."""
    local_quota(world.alpha)
    failing = submit(world, counted_spec("failing", 3), {"main.py": COUNTED})
    passing = submit(world, counted_spec("passing", 0), {"main.py": COUNTED})
    first = start_agent()
    runs = (failing, passing)
    for run in runs:
        started = attempt_dir(var_dir, run, 1) / "output" / "started"
        wait_until(started.exists, timeout=30, what=f"{run.name} started", agent=first)
        wait_for_state(run, RunState.RUNNING, timeout=10, agent=first)
    assert first.process is not None
    os.kill(first.process.pid, signal.SIGSTOP)  # it sees nothing from here on
    for run in runs:
        (attempt_dir(var_dir, run, 1) / "output" / "finish").touch()
    for run in runs:
        finished = attempt_dir(var_dir, run, 1) / "output" / "finished"
        wait_until(finished.exists, timeout=30, what=f"{run.name}'s end")
        leader = attempts(run)[0].pid
        assert leader is not None
        wait_until(partial(leader_gone, leader), timeout=10, what="the sandbox's exit")
    assert state_of(failing) == state_of(passing) == RunState.RUNNING  # nobody noticed
    first.kill()
    # As if the agent had died between starting the passing run and recording it running
    # (its pid never reached the database): the next agent closes it all the same.
    RunAttempt.objects.for_workspace(world.alpha).filter(run=passing).update(
        state=RunAttempt.State.STARTING, pid=None, process_start_ticks=None, started_at=None
    )
    Run.objects.for_workspace(world.alpha).filter(pk=passing.pk).update(state=RunState.ADMITTED)

    second = start_agent()
    for run in runs:
        wait_for_state(run, {RunState.SUCCEEDED, RunState.FAILED}, timeout=30, agent=second)
    assert failing.state == RunState.FAILED
    (attempt,) = attempts(failing)
    assert attempt.exit_code == 3
    assert attempt.failure_class == FailureClass.USER_ERROR
    assert attempt.failure_message == "Exited with code 3. Its last output: finishing with 3"
    assert passing.state == RunState.SUCCEEDED
    (attempt,) = attempts(passing)
    assert attempt.exit_code == 0
    for run in runs:
        starts = var_dir / "runs" / str(run.pk) / "checkpoints" / "starts.txt"
        assert starts.read_text() == "attempt 1\n"  # started once, never again
        assert verify_event_chain(run)
        # Revoked by the recovery right after it closes the attempt.
        wait_until(
            partial(all_revoked, run),
            timeout=10,
            what=f"{run.name}'s run token revoked",
            agent=second,
        )


WAITS_ON_FIRST_ATTEMPT = """\
    import os, time
    if os.environ["TAU_ATTEMPT"] == "1":
        time.sleep(300)
    """


def test_a_recovering_agent_stops_its_own_installations_stray_and_nobody_elses(
    world: Any, var_dir: Path, start_agent: Any, tmp_path: Path
) -> None:
    """A run's id and attempt number repeat across installations on one machine (two
    portals; the test databases of parallel test processes). An agent that looks for a stray
    attempt's processes by their markers (its pid never reached the database) stops its own
    installation's, and leaves another installation's attempt with the same ids running: one
    agent's recovery once stopped a parallel test's training run."""
    local_quota(world.alpha)
    run = submit(world, spec("stray"), {"main.py": WAITS_ON_FIRST_ATTEMPT})
    first = start_agent()
    wait_for_state(run, RunState.RUNNING, timeout=30, agent=first)
    first.kill()
    own = attempt_markers(run.pk, 1)
    assert processes.marked_processes(own)  # attempt 1 sleeps on, unsupervised
    # Another installation's attempt with the same ids, started as its agent starts one.
    elsewhere = attempt_markers(run.pk, 1, var_dir=tmp_path / "another-var")
    assert own != elsewhere
    foreign = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        env=launcher_environment(elsewhere),
        start_new_session=True,
    )
    try:
        RunAttempt.objects.for_workspace(world.alpha).filter(run=run).update(
            state=RunAttempt.State.STARTING, pid=None, process_start_ticks=None
        )
        second = start_agent()
        wait_for_state(run, {RunState.SUCCEEDED, RunState.FAILED}, timeout=60, agent=second)
        assert run.state == RunState.SUCCEEDED, run.state_reason
        stray, again = attempts(run)
        assert stray.failure_class == FailureClass.INFRASTRUCTURE
        assert again.state == RunAttempt.State.SUCCEEDED
        assert processes.marked_processes(own) == []
        assert foreign.poll() is None, "another installation's attempt was stopped"
        assert processes.marked_processes(elsewhere) == [foreign.pid]
    finally:
        foreign.kill()
        foreign.wait(timeout=10)


def test_a_run_cut_short_by_an_agent_crash_keeps_its_place_in_the_queue(
    world: Any, var_dir: Path, start_agent: Any
) -> None:
    local_quota(world.alpha, cpu="1")
    first = submit(world, spec("first", cpus="1"), {"main.py": WAITS_ON_FIRST_ATTEMPT})
    second = submit(world, spec("second", cpus="1"), {"main.py": "print('second')\n"})
    agent = start_agent()
    wait_for_state(first, RunState.RUNNING, timeout=30, agent=agent)
    assert state_of(second) == RunState.QUEUED  # behind first, for the quota
    agent.kill()
    agent = start_agent()
    for run in (first, second):
        wait_for_state(run, {RunState.SUCCEEDED, RunState.FAILED}, timeout=60, agent=agent)
    cut, again = attempts(first)
    assert cut.failure_message == "agent restarted"
    (only,) = attempts(second)
    # Back at its old place, ahead of the run queued after it.
    assert again.started_at is not None
    assert only.started_at is not None
    assert again.started_at < only.started_at
    assert first.queued_at is not None
    assert second.queued_at is not None
    assert first.queued_at < second.queued_at


# --- sweeps ----------------------------------------------------------------------------------

SWEEP_SCRIPT = """\
    import json, os, time
    config = json.loads(os.environ["TAU_TRIAL_CONFIG"])
    lr, batch = config["lr"], config["batch_size"]
    out = os.environ["TAU_OUTPUT_DIR"]
    print(f"trial {os.environ['TAU_TRIAL_ID']}: lr={lr} batch_size={batch}", flush=True)
    with open(os.path.join(out, "metrics.jsonl"), "a") as metrics:
        for step in (1, 2, 3):
            accuracy = 1 - abs(lr - 0.01) * 5 - abs(batch - 64) / 1000 - 0.1 / step
            metrics.write(json.dumps({"step": step, "acc": accuracy}) + "\\n")
            metrics.flush()
            time.sleep(0.3)
    """


def overlap(trials: list[RunTrial]) -> int:
    """The most trials that ran at the same moment."""
    moments = sorted(
        [(trial.started_at, 1) for trial in trials] + [(trial.finished_at, -1) for trial in trials]
    )
    running = most = 0
    for _moment, change in moments:
        running += change
        most = max(most, running)
    return most


def test_a_local_sweep_runs_every_trial_within_its_concurrency_and_marks_the_best(
    world: Any, var_dir: Path, start_agent: Any
) -> None:
    local_quota(world.alpha)
    sweep = spec(
        "grid",
        extra="""\
        execution:
          launcher: ray-tune
          metric: acc
          mode: max
          max_concurrent_trials: 2
          configs:
            lr: [0.1, 0.01]
            batch_size: [32, 64]
        """,
    ).replace(b"workload_kind: job", b"workload_kind: rayjob")
    run = submit(world, sweep, {"main.py": SWEEP_SCRIPT})
    agent = start_agent()
    wait_for_state(run, {RunState.SUCCEEDED, RunState.FAILED}, timeout=90, agent=agent)
    assert run.state == RunState.SUCCEEDED, run.state_reason
    trials = list(RunTrial.objects.for_workspace(world.alpha).filter(run=run).order_by("number"))
    # Every combination once, in grid order (batch_size, then lr), each succeeded.
    assert [(trial.number, trial.config) for trial in trials] == [
        (1, {"batch_size": 32, "lr": 0.1}),
        (2, {"batch_size": 32, "lr": 0.01}),
        (3, {"batch_size": 64, "lr": 0.1}),
        (4, {"batch_size": 64, "lr": 0.01}),
    ]
    assert {trial.state for trial in trials} == {RunTrial.State.SUCCEEDED}
    assert all(trial.started_at and trial.finished_at for trial in trials)
    assert overlap(trials) <= 2
    # Each trial's own log and metrics.
    output = attempt_dir(var_dir, run, 1) / "output"
    for trial in trials:
        log = (output / "trials" / f"trial-{trial.number}" / "log.txt").read_text()
        assert f"trial {trial.number}: lr={trial.config['lr']}" in log
    keys = set(
        MetricPoint.objects.for_workspace(world.alpha).filter(run=run).values_list("key", flat=True)
    )
    assert keys == {f"trial-{number}/acc" for number in (1, 2, 3, 4)}
    attempt_log = Path(attempts(run)[0].log_path).read_text()
    assert "[sweep] 4 trials, at most 2 at once, compared by acc (max)" in attempt_log
    assert "[sweep] all 4 trials succeeded" in attempt_log
    # The run page: the trials table, the best (lr 0.01, batch 64: trial 4) marked.
    html = Client()
    html.force_login(world.users["viewer"])
    page = html.get(f"/w/alpha/runs/{run.name}/").content.decode()
    table = page[page.index('id="trials-heading"') :]
    table = table[: table.index("</section>")]
    assert "A sweep of 4 trials, at most 2 at once" in table
    rows = re.findall(r"<tr( class=\"best\")?>\s*<th scope=\"row\">(\d+)", table)
    assert rows == [("", "1"), ("", "2"), ("", "3"), (' class="best"', "4")]
    assert '4 <span class="badge">best</span>' in table


TRAIN_FUNC_SCRIPT = """\
    def train_func(config):
        if config["x"] == 2:
            raise RuntimeError("x=2 is out of range")
        return {"score": config["x"] * 10, "step": 5}

    if __name__ == "__main__":
        raise SystemExit("a trial calls train_func: it never runs the script as __main__")
    """


def test_a_sweep_calls_train_func_and_fails_when_a_trial_fails(
    world: Any, var_dir: Path, start_agent: Any
) -> None:
    local_quota(world.alpha)
    sweep = spec(
        "funcs",
        extra="""\
        resilience:
          max_retries: 0
        execution:
          launcher: ray-tune
          metric: score
          mode: max
          configs:
            x: [1, 2, 3]
        """,
    ).replace(b"workload_kind: job", b"workload_kind: rayjob")
    run = submit(world, sweep, {"main.py": TRAIN_FUNC_SCRIPT})
    agent = start_agent()
    wait_for_state(run, {RunState.SUCCEEDED, RunState.FAILED}, timeout=90, agent=agent)
    assert run.state == RunState.FAILED
    trials = list(RunTrial.objects.for_workspace(world.alpha).filter(run=run).order_by("number"))
    assert [(trial.number, trial.state) for trial in trials] == [
        (1, RunTrial.State.SUCCEEDED),
        (2, RunTrial.State.FAILED),
        (3, RunTrial.State.SUCCEEDED),
    ]
    assert overlap(trials) == 1  # max_concurrent_trials defaults to 1
    (attempt,) = attempts(run)
    assert "1 of 3 trials failed: trial 2" in attempt.failure_message
    output = attempt_dir(var_dir, run, 1) / "output"
    assert "x=2 is out of range" in (output / "trials" / "trial-2" / "log.txt").read_text()
    points = dict(
        MetricPoint.objects.for_workspace(world.alpha).filter(run=run).values_list("key", "value")
    )
    assert points == {"trial-1/score": 10.0, "trial-3/score": 30.0}
    names, rows = trials_table(run, run.spec)
    assert names == ["x"]
    assert [(row.number, row.best, row.is_best) for row in rows] == [
        (1, 10.0, False),
        (2, None, False),
        (3, 30.0, True),
    ]


def test_the_sweep_example_runs_every_trial_and_the_best_learning_rate_wins(
    world: Any, var_dir: Path, start_agent: Any, live_server: Any
) -> None:
    """examples/sweep-learning-rate as written: four trials, two at a time, each reporting
    through the SDK to this portal; lr 0.1 has the lowest val_loss, 2.0 diverges."""
    local_quota(world.alpha)
    example = EXAMPLES / "sweep-learning-rate"
    run = submit(world, (example / "tau.yaml").read_bytes(), bundle=zip_directory(example))
    agent = start_agent(TAU_API_URL=live_server.url)
    wait_for_state(run, {RunState.SUCCEEDED, RunState.FAILED}, timeout=180, agent=agent)
    assert run.state == RunState.SUCCEEDED, run.state_reason
    trials = list(RunTrial.objects.for_workspace(world.alpha).filter(run=run).order_by("number"))
    assert [trial.config for trial in trials] == [
        {"learning_rate": rate, "steps": 30} for rate in (0.01, 0.1, 0.5, 2.0)
    ]
    assert {trial.state for trial in trials} == {RunTrial.State.SUCCEEDED}
    assert overlap(trials) <= 2
    keys = set(
        MetricPoint.objects.for_workspace(world.alpha).filter(run=run).values_list("key", flat=True)
    )
    assert {f"trial-{n}/val_loss" for n in (1, 2, 3, 4)} <= keys
    _, rows = trials_table(run, run.spec)
    (best,) = [row for row in rows if row.is_best]
    assert best.number == 2
    diverged = rows[3].best  # lr 2.0: the capped loss its train_func returned
    assert diverged is not None
    assert diverged >= 1e6
