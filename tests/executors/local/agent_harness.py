"""The local agent as a real process against the test database, and small workloads for it."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Collection
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings

from executors.local.agent.processes import INSTALLATION_MARKER
from executors.local.agent.supervisor import attempt_ids, attempt_markers
from identity.models import ApiToken
from runs import delivery, submission
from runs.models import Delivery, Run, RunAttempt, RunState
from tests.runs.factories import zip_bytes
from tests.runs.processes import session_database_url
from workspaces.models import ResourceFlavor, Workspace, WorkspaceQuota

ROOT = Path(__file__).resolve().parents[3]
GRACE_SECONDS = 1
LOG_CAP = 2**16  # the smallest cap the settings allow


def wait_until(
    check: Callable[[], Any], *, timeout: float, what: str, agent: Agent | None = None
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.1)
    detail = f"\n--- agent output ---\n{agent.output()}" if agent is not None else ""
    raise AssertionError(f"{what} did not happen within {timeout}s{detail}")


def process_alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rpartition(b")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in {b"Z", b"X"}


def host_pid(run: Run, attempt: int, sandbox_pid: int) -> int | None:
    """The pid, as this machine sees it, of the attempt's process that its sandbox (a pid
    namespace of its own) calls ``sandbox_pid``; None if there is none (any more). Without
    a sandbox both are the same."""
    # The sandbox and the wrapper carry the agent's markers, the workload its own variables:
    # either way with something unique to this run (ids repeat across parallel test databases).
    markers = {f"{key}={value}".encode() for key, value in attempt_ids(run.pk, attempt).items()}
    installation = attempt_markers(run.pk, attempt)[INSTALLATION_MARKER]
    unique = {f"{INSTALLATION_MARKER}={installation}".encode(), f"TAU_RUN_NAME={run.name}".encode()}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                entries = set(handle.read().split(b"\0"))
            with open(f"/proc/{name}/status", "rb") as handle:
                status = handle.read().decode(errors="replace")
        except OSError:
            continue
        if not markers <= entries or not unique & entries:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:") and int(line.split()[-1]) == sandbox_pid:
                return int(name)
    return None


class Agent:
    """``manage.py run_agent`` in its own process, with this test's database and VAR_DIR."""

    def __init__(self, var_dir: Path, extra_env: dict[str, str] | None = None) -> None:
        self.var_dir = var_dir
        self.log_path = var_dir / f"agent-{time.monotonic_ns()}.log"
        inherited = {name: value for name, value in os.environ.items() if name != "PIP_FIND_LINKS"}
        env = {
            **inherited,
            "DATABASE_URL": session_database_url(),
            "TAU_VAR_DIR": str(var_dir),
            "TAU_BACKEND": "local",
            "TAU_LOCAL_EXECUTOR": "true",
            "TAU_LOCAL_CPUS": "2",
            "TAU_LOCAL_MEMORY": "4Gi",
            "TAU_LOCAL_GPUS": "0",
            "TAU_LOCAL_GRACE_SECONDS": str(GRACE_SECONDS),
            "TAU_RUN_LOG_MAX_BYTES": str(LOG_CAP),
            "TAU_API_URL": "http://127.0.0.1:9",
            # The same secrets as this process, so the tokens it issues verify here.
            "TAU_SECRET_KEY": settings.SECRET_KEY,
            "TAU_TOKEN_PEPPERS": settings.TAU_TOKEN_PEPPERS,
            # Requirements never reach the network in tests (a test may give a folder of
            # wheels as PIP_FIND_LINKS).
            "PIP_NO_INDEX": "1",
            **(extra_env or {}),
        }
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Agent:
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed when the process ends
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "run_agent", "--interval", "0.2"],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        return self

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM and wait; the exit status."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"the agent did not stop\n{self.output()}") from None

    def kill(self) -> None:
        """kill -9: the agent dies without cleaning up anything."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)


def local_quota(workspace: Workspace, *, cpu: str = "4", memory: int = 8 * 2**30) -> None:
    """The workspace's share of this machine: quota rows on the ``local`` flavor."""
    flavor, _ = ResourceFlavor.objects.get_or_create(name=settings.TAU_LOCAL_FLAVOR)
    for resource, amount in (("cpu", Decimal(cpu)), ("memory", Decimal(memory))):
        WorkspaceQuota.objects.update_or_create(
            workspace=workspace, flavor=flavor, resource=resource, defaults={"nominal": amount}
        )


def spec(name: str, entrypoint: str = "main.py", *, extra: str = "", cpus: str = "250m") -> bytes:
    """A small tau.yaml; ``extra`` adds top-level blocks (indented YAML text)."""
    text = f"""\
        schema_version: 1
        name: {name}
        run:
          entrypoint: {entrypoint}
          workload_kind: job
        compute:
          cpus: {cpus}
          memory: 64Mi
        """
    return (textwrap.dedent(text) + textwrap.dedent(extra)).encode()


def submit(
    world: Any,
    spec_source: bytes,
    files: dict[str, str] | None = None,
    *,
    bundle: bytes | None = None,
    workspace: Workspace | None = None,
    user: Any = None,
) -> Run:
    """Submit (by default as the researcher, to alpha) and hand the run to the local backend
    (what the Celery delivery task does)."""
    if bundle is None and files is not None:
        bundle = zip_bytes({name: textwrap.dedent(body) for name, body in files.items()})
    workspace = workspace or world.alpha
    run = submission.submit(
        workspace=workspace,
        user=user or world.users["researcher"],
        spec_source=spec_source,
        bundle=io.BytesIO(bundle) if bundle is not None else None,
    )
    handed = Delivery.objects.for_workspace(workspace).get(run=run, action=Delivery.Action.SUBMIT)
    assert delivery.deliver(handed.pk)
    run.refresh_from_db()
    assert run.state == RunState.QUEUED
    return run


def state_of(run: Run) -> str:
    run.refresh_from_db()
    return run.state


def wait_for_state(run: Run, states: Collection[str] | str, *, timeout: float, agent: Agent) -> Run:
    wanted = {states} if isinstance(states, str) else states
    wait_until(
        lambda: state_of(run) in wanted,
        timeout=timeout,
        what=f"{run.name} in {wanted}",
        agent=agent,
    )
    return run


def tokens_of(run: Run) -> list[ApiToken]:
    """The run tokens its attempts were issued (each attempt holds its own)."""
    held = RunAttempt.objects.for_workspace(run.workspace_id).filter(run=run)
    return list(ApiToken.objects.filter(pk__in=held.values("token_id")).order_by("pk"))


def attempts(run: Run) -> list[RunAttempt]:
    return list(
        RunAttempt.objects.for_workspace(run.workspace_id).filter(run=run).order_by("number")
    )


def attempt_dir(var_dir: Path, run: Run, number: int) -> Path:
    return var_dir / "runs" / str(run.pk) / f"attempt-{number}"


def how_it_ended(run: Run, agent: Agent) -> str:
    """For a failed assertion on a run's end: its state and reason, then, for each attempt,
    every worker's outcome record (``stop_signals`` says whether the wrapper too got the
    signal, that is, whether it came to the whole process group) and the tail of its log,
    and the agent's log: enough to tell who stopped what without rerunning under load."""
    run.refresh_from_db()
    lines = [f"{run.name}: {run.state}: {run.state_reason}"]
    for number in [attempt.number for attempt in attempts(run)]:
        folder = attempt_dir(agent.var_dir, run, number)
        for status in sorted(folder.glob("status*")):
            record = status / "outcome.json"
            text = record.read_text() if record.exists() else "(no outcome record)"
            lines.append(f"--- attempt {number} {status.name}: {text}")
        for log in sorted(folder.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-15:]
            lines.append(f"--- attempt {number} {log.name}:")
            lines.extend(tail)
    lines.append("--- agent ---")
    lines.append(agent.output())
    return "\n".join(lines)
