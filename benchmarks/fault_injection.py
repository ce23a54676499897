"""Fault injection on the local backend (issue 11, acceptance 4): nothing lost, nothing
duplicated, and no finished attempt run again.

    deploy/dev/test_services.py run -- .venv/bin/python benchmarks/fault_injection.py
        [--submissions 200] [--agent-kills 2] [--worker-kills 2] [--redis-stop 10]

The real thing, on a throwaway test database: gunicorn, a Celery worker and Celery beat
(``tests.runs.processes.Portal``) on a Redis of the experiment's own, and the local agent
(``manage.py run_agent``), every attempt in its sandbox. Runs are submitted over HTTP with an
API token while faults are injected:

* the agent is killed with SIGKILL right after a workload has exited — 30 ms after the
  workload's last journal line, before the agent (0.2 s passes) is likely to notice — and
  started again;
* the Celery worker is killed with SIGKILL and started again;
* Redis is stopped for ``--redis-stop`` seconds, once.

Each workload appends ``start <attempt>`` to a journal in its run's checkpoint folder (which
outlives attempts), sleeps a little, appends ``end <attempt>`` and exits 0. At the end:

* lost: a submission answered 201 whose run is missing or did not finish;
* duplicated: runs in the workspace beyond those answered 201;
* finished attempts run again: runs whose journal has a ``start`` after an ``end``;
* every run's event chain is verified.

The exit status is 0 only when all three are 0. ``tests/runs/test_fault_injection.py`` runs
a small version (20 submissions, one agent kill) in the test suite.

Slow webhooks (issue 30, :func:`slow_webhooks_experiment`; ``make bench`` runs it and reports
it under *faults*, benchmarks/bench_faults.py): two receivers on 127.0.0.1 that
trickle their answer a byte a second are one workspace's webhooks; a run there fails, and
while the notifier holds both deliveries, a run is submitted in another workspace. Its time
from submitted to running is compared with the same time measured before, without them.
``tests/notifications/test_end_to_end.py`` asserts that it stays within its usual time.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import random
import re
import secrets
import signal
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# After a workload's last journal line, the time it takes to exit (and its wrapper to write
# the outcome) before the agent is killed: well under the agent's 0.2 s between passes.
EXIT_MARGIN_SECONDS = 0.03

WORKLOAD = """\
import os, time
journal = os.path.join(os.environ["TAU_CHECKPOINT_DIR"], "journal")
attempt = os.environ["TAU_ATTEMPT"]
with open(journal, "a") as out:
    out.write(f"start {attempt} {time.time()}\\n")
time.sleep(float(os.environ["WORK_SECONDS"]))
with open(journal, "a") as out:
    out.write(f"end {attempt} {time.time()}\\n")
print("done", flush=True)
"""

SPEC = """\
schema_version: 1
name: fault-{index}
run:
  entrypoint: main.py
  workload_kind: job
compute:
  cpus: 250m
  memory: 64Mi
runtime:
  env:
    WORK_SECONDS: '{seconds}'
resilience:
  max_retries: 0
"""


def _bundle() -> bytes:
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.writestr("main.py", WORKLOAD)
    return archive.getvalue()


def post_run(base: str, token: str, workspace: str, spec: str, bundle: bytes) -> dict[str, Any]:
    parts = [("spec", "tau.yaml", spec.encode()), ("bundle", "project.zip", bundle)]
    from tests.runs.processes import multipart_form

    body, content_type = multipart_form(parts)
    request = urllib.request.Request(
        f"{base}/api/v1/workspaces/{workspace}/runs/",
        data=body,
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": content_type,
        },
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        if response.status != 201:
            raise RuntimeError(f"answered {response.status}")
        return dict(json.loads(response.read()))


def journal_rerun(path: Path) -> bool:
    """Whether a run's journal shows a start after an end: finished work run again."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return False
    ended = False
    for line in lines:
        word = line.split(" ", 1)[0]
        if word == "end":
            ended = True
        elif word == "start" and ended:
            return True
    return False


class Submitter(threading.Thread):
    def __init__(self, base: str, token: str, workspace: str, count: int, pace: float) -> None:
        super().__init__(name="submitter", daemon=True)
        self.base, self.token, self.workspace = base, token, workspace
        self.count, self.pace = count, pace
        self.accepted: list[str] = []
        self.refused: list[str] = []
        self.latencies: list[float] = []
        self.done = threading.Event()

    def run(self) -> None:
        bundle = _bundle()
        chance = random.Random(11)  # noqa: S311 - work lengths, not secrets
        for index in range(self.count):
            spec = SPEC.format(index=index, seconds=round(chance.uniform(0.2, 1.5), 2))
            started = time.monotonic()
            try:
                answer = post_run(self.base, self.token, self.workspace, spec, bundle)
            except (OSError, RuntimeError, urllib.error.HTTPError) as exc:
                self.refused.append(f"{index}: {exc}")
            else:
                self.accepted.append(str(answer["name"]))
                self.latencies.append(time.monotonic() - started)
            time.sleep(max(0.0, self.pace - (time.monotonic() - started)))
        self.done.set()


def a_workload_just_ended(runs_dir: Path, since: float) -> bool:
    """Whether some workload wrote the ``end`` line of its journal after ``since`` (epoch
    seconds): it exits right after that line."""
    try:
        run_dirs = list(os.scandir(runs_dir))
    except FileNotFoundError:
        return False
    for run_dir in run_dirs:
        journal = os.path.join(run_dir.path, "checkpoints", "journal")
        try:
            if os.stat(journal).st_mtime <= since:
                continue
            with open(journal, "rb") as handle:
                if handle.read().splitlines()[-1].startswith(b"end "):
                    return True
        except (OSError, IndexError):
            continue
    return False


def experiment(
    *,
    var_dir: Path,
    submissions: int = 200,
    agent_kills: int = 2,
    worker_kills: int = 2,
    redis_stop_seconds: float = 10.0,
    pace: float = 0.15,
    finish_timeout: float = 600.0,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the experiment against the current (test) database; the figures."""
    from django.contrib.auth import get_user_model

    from identity.tokens import issue_token
    from runs.events import verify_event_chain
    from runs.models import Run, RunAttempt, RunState
    from tests.executors.local.agent_harness import Agent, local_quota
    from tests.runs.processes import Portal, PrivateRedis
    from workspaces.models import Membership, Role, Workspace

    var_dir.mkdir(parents=True, exist_ok=True)
    workspace = Workspace.unscoped_objects.create(
        slug="faults", name="Faults", namespace="tau-faults", local_queue="faults"
    )
    user = get_user_model().objects.create_user(username="injector", password=None)
    Membership.objects.create(workspace=workspace, user=user, role=Role.RESEARCHER)
    local_quota(workspace, cpu="2")
    token = issue_token(user=user, name="fault injection", workspace=workspace).plaintext

    redis = PrivateRedis(var_dir)
    redis.start()
    portal = Portal(broker_url=redis.url, var_dir=var_dir)
    agents: list[Agent] = []
    events: list[str] = []
    started = time.monotonic()

    def note(what: str) -> None:
        line = f"{time.monotonic() - started:7.1f}s  {what}"
        events.append(line)
        say(line)

    def start_agent() -> Agent:
        agent = Agent(var_dir, {"TAU_API_URL": portal.url}).start()
        agents.append(agent)
        return agent

    try:
        portal.start()
        agent = start_agent()
        note("portal, worker, beat and agent started")
        submitter = Submitter(portal.url, token, workspace.slug, submissions, pace)
        submitter.start()
        window = submissions * pace
        schedule: list[tuple[float, str]] = []
        for index in range(agent_kills):
            schedule.append((window * (0.25 + 0.5 * (index + 1) / (agent_kills + 1)), "agent"))
        for index in range(worker_kills):
            schedule.append((window * (0.15 + 0.5 * (index + 1) / (worker_kills + 1)), "worker"))
        if redis_stop_seconds > 0:
            schedule.append((window * 0.45, "redis"))
        schedule.sort()
        runs_dir = var_dir / "runs"
        for at, what in schedule:
            while time.monotonic() - started < at:
                time.sleep(0.05)
            if what == "agent":
                # Right after some workload has exited, before the agent (0.2 s passes)
                # notices.
                since = time.time()
                deadline = time.monotonic() + 30
                while not a_workload_just_ended(runs_dir, since) and time.monotonic() < deadline:
                    time.sleep(0.005)
                time.sleep(EXIT_MARGIN_SECONDS)
                agent.kill()
                note("agent killed (SIGKILL) right after a workload exited")
                time.sleep(0.5)
                agent = start_agent()
                note("agent started again")
            elif what == "worker":
                worker = portal.processes["worker"]
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
                note("Celery worker killed (SIGKILL)")
                time.sleep(1.0)
                portal.start(web=False, worker=True, beat=False)
                note("Celery worker started again")
            else:
                redis.stop()
                note(f"Redis stopped for {redis_stop_seconds:.0f}s")
                time.sleep(redis_stop_seconds)
                redis.start()
                note("Redis started again")
        submitter.join(timeout=window + 600)
        note(f"{len(submitter.accepted)} submissions accepted, {len(submitter.refused)} refused")
        accepted = set(submitter.accepted)
        terminal = {RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED}

        def unfinished() -> int:
            return (
                Run.objects.for_workspace(workspace)
                .filter(name__in=accepted)
                .exclude(state__in=terminal)
                .count()
            )

        deadline = time.monotonic() + finish_timeout
        while unfinished() and time.monotonic() < deadline:
            time.sleep(0.5)
        finished_at = time.monotonic()
        note("every accepted run finished" if not unfinished() else "gave up waiting")
    finally:
        for running in agents:
            if running.process is not None and running.process.poll() is None:
                running.stop()
        portal.stop()
        redis.stop()

    runs = list(Run.objects.for_workspace(workspace))
    by_name: dict[str, list[Any]] = {}
    for run in runs:
        by_name.setdefault(run.name, []).append(run)
    lost = sorted(
        name
        for name in accepted
        if not by_name.get(name) or any(run.state not in terminal for run in by_name[name])
    )
    # Runs nobody was answered 201 for, and names that exist twice.
    duplicated = len([run for run in runs if run.name not in accepted]) + sum(
        len(same) - 1 for same in by_name.values()
    )
    rerun = sorted(
        run.name
        for run in runs
        if journal_rerun(runs_dir / str(run.pk) / "checkpoints" / "journal")
    )
    attempts = list(RunAttempt.objects.for_workspace(workspace).select_related("run"))
    cut_short = [attempt for attempt in attempts if attempt.failure_message == "agent restarted"]
    requeue_waits = []
    for attempt in cut_short:
        following = next(
            (
                other
                for other in attempts
                if other.run_id == attempt.run_id and other.number == attempt.number + 1
            ),
            None,
        )
        if following is not None and following.started_at and attempt.finished_at:
            requeue_waits.append((following.started_at - attempt.finished_at).total_seconds())
    recovered = []
    for running in agents:
        recovered += re.findall(r"closing (\S+) attempt \d+: (.+)", running.output())
    real_results = [name for name, how in recovered if how.strip() != "agent restarted"]
    states: dict[str, int] = {}
    for run in runs:
        states[run.state] = states.get(run.state, 0) + 1
    broken_chains = [run.name for run in runs if not verify_event_chain(run)]
    return {
        "submissions": submissions,
        "accepted": len(accepted),
        "refused_by_http": len(submitter.refused),
        "lost": len(lost),
        "duplicated": duplicated,
        "finished_attempts_run_again": len(rerun),
        "runs_by_state": states,
        "attempts": len(attempts),
        "attempts_cut_short_by_a_kill": len(cut_short),
        "attempts_closed_with_their_real_result_after_a_restart": len(real_results),
        "requeued_wait_seconds_max": round(max(requeue_waits), 2) if requeue_waits else None,
        "requeued_wait_seconds_median": (
            round(statistics.median(requeue_waits), 2) if requeue_waits else None
        ),
        "broken_event_chains": len(broken_chains),
        "submission_p50_ms": round(statistics.median(submitter.latencies) * 1000, 1)
        if submitter.latencies
        else None,
        "seconds_to_all_finished": round(finished_at - started, 1),
        "faults": events,
        "lost_names": lost[:20],
        "rerun_names": rerun[:20],
    }


FAILING_WORKLOAD = """\
import sys
print("<!channel> something went wrong", flush=True)
sys.exit(3)
"""


def _bundle_of(main: str) -> bytes:
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.writestr("main.py", main)
    return archive.getvalue()


def slow_webhooks_experiment(
    *,
    var_dir: Path,
    receivers: int = 2,
    baseline_runs: int = 3,
    trickle_seconds: float = 1.0,
    webhook_deadline_seconds: int = 30,
    wait_timeout: float = 120.0,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Issue 30, acceptance 2: a run's time from submitted to running in one workspace,
    first alone (``baseline_runs`` runs after one to warm up: their median and longest),
    then while ``receivers`` slow webhook receivers of another workspace, told of a failed run
    there, each hold a delivery (their deadline, ``webhook_deadline_seconds``, outlasts the
    measurement, so they are held throughout). The figures, with how many receivers were
    held when the run started."""
    from django.contrib.auth import get_user_model

    from identity.tokens import issue_token
    from notifications.models import NotificationDelivery, Webhook
    from runs.models import Run, RunEvent, RunState
    from tests.executors.local.agent_harness import Agent, local_quota
    from tests.notifications.helpers import Trickler
    from tests.runs.processes import Portal, PrivateRedis
    from workspaces.models import Membership, Role, Workspace

    var_dir.mkdir(parents=True, exist_ok=True)
    user = get_user_model().objects.create_user(username="slow-hooks", password=None)
    tokens = {}
    workspaces = {}
    for slug in ("quiet", "noisy"):
        workspace = Workspace.unscoped_objects.create(
            slug=slug, name=slug.title(), namespace=f"tau-{slug}", local_queue=slug
        )
        Membership.objects.create(workspace=workspace, user=user, role=Role.RESEARCHER)
        local_quota(workspace, cpu="2")
        workspaces[slug] = workspace
        tokens[slug] = issue_token(user=user, name=slug, workspace=workspace).plaintext
    slow = [
        Trickler(interval=trickle_seconds, hold=webhook_deadline_seconds + 60)
        for _ in range(receivers)
    ]
    for receiver in slow:
        Webhook.objects.create(
            workspace=workspaces["noisy"],
            url=receiver.url,
            secret=secrets.token_hex(16),
            events=["run.failed"],
        )
    env = {
        "TAU_WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true",  # the receivers are on 127.0.0.1
        "TAU_WEBHOOK_TIMEOUT_SECONDS": str(webhook_deadline_seconds),
    }
    redis = PrivateRedis(var_dir)
    redis.start()
    portal = Portal(broker_url=redis.url, var_dir=var_dir, extra_env=env)
    # The agent records the failed run, and publishes its notifications to this broker.
    agent = Agent(var_dir, {"TAU_API_URL": portal.url, "CELERY_BROKER_URL": redis.url, **env})
    index = iter(range(10**6))

    def submit(slug: str, bundle: bytes) -> Run:
        spec = SPEC.format(index=next(index), seconds=0.5)
        answer = post_run(portal.url, tokens[slug], slug, spec, bundle)
        return Run.objects.for_workspace(workspaces[slug]).get(name=answer["name"])

    def wait(check: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + wait_timeout
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{what} did not happen within {wait_timeout:.0f}s\n"
                    f"worker: {portal.log('worker')[-1500:]}\nagent: {agent.output()[-1500:]}"
                )
            time.sleep(0.05)

    def state(run: Run) -> str:
        return str(Run.objects.for_workspace(run.workspace_id).get(pk=run.pk).state)

    def submitted_to_running(run: Run) -> float:
        wait(
            lambda: state(run) not in {RunState.PENDING, RunState.QUEUED, RunState.ADMITTED},
            f"run {run.name} running",
        )
        running = (
            RunEvent.objects.for_workspace(run.workspace_id)
            .filter(run=run, new_state=RunState.RUNNING)
            .order_by("seq")
            .values_list("time", flat=True)
            .first()
        )
        assert running is not None, f"run {run.name} never ran ({state(run)})"
        return (running - run.created_at).total_seconds()

    def finished(run: Run) -> bool:
        return state(run) in {RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED}

    quiet_bundle = _bundle()
    try:
        portal.start(notifier=True)
        agent.start()
        say("portal (web, worker, notifier, beat), agent and receivers started")
        # A first run while the agent and the workers warm up (the agent's first pass comes
        # once it has started, seconds later): not counted.
        warm_up = submit("quiet", quiet_bundle)
        submitted_to_running(warm_up)
        wait(functools.partial(finished, warm_up), "the warm-up run finishing")
        baseline: list[float] = []
        for _ in range(baseline_runs):
            run = submit("quiet", quiet_bundle)
            baseline.append(submitted_to_running(run))
            wait(functools.partial(finished, run), f"run {run.name} finished")
        say(f"alone: submitted to running in {statistics.median(baseline):.2f}s (median)")
        failing = submit("noisy", _bundle_of(FAILING_WORKLOAD))
        wait(lambda: state(failing) == RunState.FAILED, "the noisy run failing")
        wait(lambda: all(receiver.open_now for receiver in slow), "the receivers being held")
        say(f"{receivers} slow receivers hold a delivery each")
        run = submit("quiet", quiet_bundle)
        faulted = submitted_to_running(run)
        held_then = sum(1 for receiver in slow if receiver.open_now)
        say(f"with slow webhooks: submitted to running in {faulted:.2f}s ({held_then} held)")
        wait(lambda: all(receiver.held for receiver in slow), "the deadline cutting them off")
        attempts = NotificationDelivery.objects.for_workspace(workspaces["noisy"]).count()
    finally:
        agent.stop()
        portal.stop()
        redis.stop()
        for receiver in slow:
            receiver.stop()
    return {
        "slow_receivers": receivers,
        "trickle_seconds_per_byte": trickle_seconds,
        "webhook_deadline_seconds": webhook_deadline_seconds,
        "submitted_to_running_alone_seconds": round(statistics.median(baseline), 2),
        "submitted_to_running_alone_max_seconds": round(max(baseline), 2),
        "submitted_to_running_with_slow_webhooks_seconds": round(faulted, 2),
        "receivers_held_when_it_ran": held_then,
        "slow_delivery_held_seconds": [round(min(receiver.held), 1) for receiver in slow],
        "notification_deliveries": attempts,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--submissions", type=int, default=200)
    parser.add_argument("--agent-kills", type=int, default=2)
    parser.add_argument("--worker-kills", type=int, default=2)
    parser.add_argument("--redis-stop", type=float, default=10.0)
    arguments = parser.parse_args()
    os.environ.setdefault("TAU_LOG_LEVEL", "WARNING")
    from benchmarks.harness import django_test_database, report

    with django_test_database():
        import tempfile

        with tempfile.TemporaryDirectory(prefix="taugrid-faults-") as name:
            results = experiment(
                var_dir=Path(name) / "var",
                submissions=arguments.submissions,
                agent_kills=arguments.agent_kills,
                worker_kills=arguments.worker_kills,
                redis_stop_seconds=arguments.redis_stop,
            )
    report("fault_injection", results)
    clean = results["lost"] == results["duplicated"] == results["finished_attempts_run_again"] == 0
    return 0 if clean and results["broken_event_chains"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
