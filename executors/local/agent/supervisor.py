"""The local agent's main loop: admit queued local runs, start them, watch them, stop them,
and record how they ended; and, beside them, run this machine's endpoints (``endpoints``).

One process, one loop (every ``interval`` seconds), one database connection. Threads do only
what would block the loop: building an attempt's environment (``prepare``). Every state
change, and every record of what an attempt did (metrics, checkpoints, its token, where it
waits), goes through the run services (``runs.attempts``, ``runs.state``, ``runs.metric_points``,
``runs.checkpoints``, ``runs.run_tokens``).

Every attempt runs through the wrapper (``wrapper``: it keeps the capped log and records the
outcome, and outlives the agent if it must), inside a bubblewrap sandbox
(``sandbox``) when this machine can run one, and within its limits (``run_limits``): a
cgroup of its own where the machine gives the agent cgroups (``cgroups``), resource limits
set by the wrapper, and its disk allowance, measured here every few seconds (in a thread of
its own, so a run with many files never holds the loop up); a run over its allowance is
killed at once and fails as ``user_error``, saying how much it used where. Without a
sandbox, the agent runs the workloads of one workspace only (the first it takes, remembered
in ``VAR_DIR``) unless ``TAU_LOCAL_EXECUTOR_UNSANDBOXED=true`` says otherwise: code of two
workspaces must not meet on one machine unseparated by accident.

Multi-worker runs. A Job with ``compute.workers`` > 1 starts one process per worker, each in
a sandbox of its own (``prepare.local_workers``), with the rendezvous variables of
``tau.rendezvous`` (worker 0 on 127.0.0.1 and a free port), as a cluster starts one pod per
worker. They are admitted together (the run's demand is all of them) and share one cgroup and
one process group, worker 0's: whatever signals the attempt signals every worker, and a dead
agent's successor finds them all by worker 0's pid. The first worker to fail stops the others
(SIGTERM to the group, then the grace period) and its end is the attempt's; the attempt
succeeds when every worker has exited 0.

Recovery. What a dead agent left is found by pid and start time; the wrapper's outcome file
says whether the workload had ended, and how, while nobody watched: such an attempt is
closed with its real result, and only an attempt that was really cut short is started again
(at its old place in the queue).

Signals: SIGTERM or SIGINT stops admitting and stops every running attempt the way a cancel
does (SIGTERM to its process group, the grace period, SIGKILL), then closes those attempts
with class ``infrastructure`` ("agent stopped") so the retry policy brings them back when an
agent runs again — the same outcome as a crash of the agent, only tidier. A second signal
skips the grace period.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import fcntl
import logging
import math
import os
import signal
import socket
import subprocess
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from django.conf import settings
from django.db import DatabaseError, connection, connections, transaction
from django.utils import timezone

from catalog.runs import OutputsNotKept, StagedDataset, keep_outputs, staging_plan
from executors.local.agent import (
    admission,
    artifact_collection,
    cgroups,
    environments,
    outcomes,
    processes,
    run_limits,
)
from executors.local.agent import sandbox as sandboxing
from executors.local.agent.collect import (
    CheckpointScanner,
    FoundCheckpoint,
    MetricsReader,
    read_bounded,
)
from executors.local.agent.endpoints import EndpointSupervisor
from executors.local.agent.environments import launcher_environment
from executors.local.agent.outcomes import last_log_line as _last_log_line
from executors.local.agent.prepare import (
    AttemptLayout,
    PreparationFailed,
    PreparationPlan,
    Prepared,
    local_workers,
    make_directories,
    prepare,
    runs_root,
    venvs_root,
)
from executors.local.agent.processes import INSTALLATION_MARKER
from executors.local.agent.processes import child_exit_status as _exit_status
from runs import (
    attempts,
    checkpoints,
    observations,
    run_tokens,
    selectors,
    state,
    sweeps,
    trials,
    wording,
)
from runs import metric_points as metrics
from runs.attempts import AttemptOutcome, NoWaitingAttempt
from runs.checkpoint_paths import CheckpointPathRefused
from runs.metric_rules import MetricRow
from runs.models import (
    RUNNING_STATES,
    Backend,
    Checkpoint,
    EventKind,
    FailureClass,
    Run,
    RunAttempt,
    RunState,
)
from runs.policy import requested_totals
from runs.state import IllegalTransition
from tau import rendezvous
from tau.k8s_names import GPU_RESOURCE
from tau.quantity import parse_quantity
from tau.spec import Spec, spec_from_dict
from workspaces.models import WorkspaceQuota

logger = logging.getLogger("executors.local.agent")

COLLECT_SECONDS = 1.0  # how often metrics and checkpoints of a running attempt are read
LOG_SIZE_SAVE_SECONDS = 5.0  # how often a growing log's size is written to the database
SWEEP_SECONDS = 15.0  # how often runs and attempts nobody supervises are looked for
QUOTA_CACHE_SECONDS = 5.0
QUEUE_WINDOW = 1000  # queued runs looked at per pass (positions beyond are not written)
STOP_TIMEOUT_EXTRA_SECONDS = 15.0  # after the grace period, give up waiting on a stop
# The workload's outcome is written but its sandbox still lives this long: something it
# started holds it open, and is stopped like the leftovers of a process group.
OUTCOME_LINGER_SECONDS = 1.0
SINGLE_WORKSPACE_FILE = "local-executor-workspace.json"
UNSANDBOXED_REFUSAL = (
    "Not started: this machine cannot sandbox local runs, so the local executor runs the "
    "workloads of one other workspace only. An administrator can install bubblewrap (bwrap), "
    "or set TAU_LOCAL_EXECUTOR_UNSANDBOXED=true to run every workspace's code unsandboxed."
)
# Session-level PostgreSQL advisory lock: one agent per database.
ADVISORY_LOCK_KEY = zlib.crc32(b"taugrid local agent")
AGENT_STOPPED = "agent stopped"
AGENT_RESTARTED = "agent restarted"


_Row = TypeVar("_Row", bound=Mapping[str, Any])
_Result = TypeVar("_Result")


class AgentConflict(RuntimeError):
    """Another agent already runs for this installation."""


class Phase(enum.Enum):
    PREPARING = "preparing"  # directories, bundle, environment (in a worker thread)
    RUNNING = "running"  # the process group lives
    DRAINING = "draining"  # the main process has exited; stopping what it left behind
    FINISHING = "finishing"  # recording the outcome (retried until the database takes it)


class StopReason(enum.Enum):
    CANCEL = "cancel"
    DEADLINE = "deadline"
    SHUTDOWN = "shutdown"
    DISK = "disk"  # over its disk allowance: killed at once


@dataclass(eq=False)
class Worker:
    """One process of a multi-worker attempt (module docstring)."""

    rank: int
    process: subprocess.Popen[bytes]
    #: (exit code, signal) once it has ended; its record when the wrapper wrote one.
    status: tuple[int | None, int | None] | None = None
    outcome_seen_at: float | None = None

    @property
    def ended(self) -> bool:
        return self.status is not None

    @property
    def failed(self) -> bool:
        return self.status is not None and self.status != (0, None)


@dataclass(eq=False)
class Execution:
    """One attempt this agent is responsible for, from admission to its recorded end."""

    run: Run
    attempt: RunAttempt
    spec: Spec
    demand: dict[str, Decimal]
    layout: AttemptLayout
    gpus: tuple[int, ...]
    metrics: MetricsReader
    checkpoints: CheckpointScanner
    phase: Phase = Phase.PREPARING
    cancelled: threading.Event = field(default_factory=threading.Event)
    preparation: Future[Prepared] | None = None
    process: subprocess.Popen[bytes] | None = None  # worker 0's
    #: Every worker, worker 0 first, when it has more than one (module docstring).
    workers: list[Worker] = field(default_factory=list)
    #: The worker whose end is the attempt's: the first to fail.
    failed_rank: int | None = None
    running_recorded: bool = False
    deadline: float | None = None
    stop_reason: StopReason | None = None
    term_sent_at: float | None = None
    kill_sent: bool = False
    exit_code: int | None = None
    exit_signal: int | None = None
    outcome_seen_at: float | None = None
    outcome: AttemptOutcome | None = None
    next_collect: float = 0.0
    log_size_saved_at: float = 0.0
    #: A sweep's trial records as last kept (``runs.trials``).
    trials_seen: list[dict[str, Any]] | None = None
    limits: run_limits.AttemptLimits | None = None
    cgroup: cgroups.AttemptCgroup | None = None
    disk_measurement: Future[run_limits.DiskUsage] | None = None
    next_disk_check: float = 0.0
    #: Why it was stopped for its disk use (the message of its outcome).
    disk_overrun: str | None = None
    #: The dataset versions it reads, staged under TAU_DATA_DIR (``catalog.runs``).
    datasets: tuple[StagedDataset, ...] = ()
    #: Its outputs.dataset / outputs.model were made versions (once, if _finish is retried).
    outputs_kept: bool = False

    @property
    def run_id(self) -> int:
        return self.run.pk

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None


class Agent:
    def __init__(self, *, interval: float = 0.5, grace: float | None = None) -> None:
        self.interval = interval
        self.grace = float(settings.TAU_LOCAL_GRACE_SECONDS if grace is None else grace)
        self.capacity = admission.machine_capacity()
        self.runs_dir = runs_root()
        self.venvs_dir = venvs_root()
        self.sdk_root = Path(settings.VAR_DIR) / "workload-sdk"
        self.log_limit = int(settings.TAU_RUN_LOG_MAX_BYTES)
        self.free_gpus = list(range(int(settings.TAU_LOCAL_GPUS)))
        self.executions: dict[int, Execution] = {}  # by attempt id
        self.stopping = False
        self.hurry = False
        self._stop_deadline = math.inf
        self._wake = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="prepare")
        # Disk measurements walk the run's folders: never in the loop itself.
        self._meter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="disk")
        self.allowances = run_limits.Allowances.from_settings()
        self.cgroups = cgroups.Cgroups()
        self.enforcement = run_limits.Enforcement(
            allowances=self.allowances, cgroups=self.cgroups, nproc_per_run=False
        )
        self._specs: dict[int, Spec] = {}
        self._shares: dict[int, admission.WorkspaceShare] = {}
        self._shares_loaded_at = -math.inf
        self._last_sweep = -math.inf
        self._locked_connection: Any = None
        self._stop_logged = False
        self._recovered = False
        self._database_error_logged_at = -math.inf
        self.detection: sandboxing.Detection | None = None
        self.sandbox: sandboxing.Sandbox | None = None
        self.unsandboxed_allowed = bool(settings.TAU_LOCAL_EXECUTOR_UNSANDBOXED)
        self._single_workspace: int | None = None
        #: The endpoints of this machine, supervised beside the runs (``endpoints``).
        self.endpoints = EndpointSupervisor(self)

    # --- lifecycle ----------------------------------------------------------------------

    def serve(self) -> None:
        """Run until stopped by a signal (or ``request_stop``)."""
        with self._exclusive():
            self._install_signal_handlers()
            self.detect_sandbox()
            logger.info(
                "local agent started: %s CPUs, %s of memory, %s GPUs; runs in %s",
                admission.number_text("cpu", self.capacity["cpu"]),
                admission.number_text("memory", self.capacity["memory"]),
                admission.number_text(GPU_RESOURCE, self.capacity[GPU_RESOURCE]),
                self.runs_dir,
            )
            try:
                self._loop()
            finally:
                self._kill_everything()
                self.endpoints.close()  # what serves keeps serving: the next agent follows it
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._meter.shutdown(wait=False, cancel_futures=True)
                self.cgroups.close()
        logger.info("local agent stopped")

    def detect_sandbox(self) -> None:
        """Probe for bubblewrap once, say what was found (log, and the status file that
        ``/readyz`` shows), and remember the single workspace of an unsandboxed agent."""
        self.detection = sandboxing.detect(
            settings.TAU_LOCAL_SANDBOX, interpreter=environments.base_interpreter()
        )
        self.sandbox = self.detection.sandbox
        if self.sandbox is not None:
            logger.info("sandbox: %s", self.detection.reason)
        elif self.unsandboxed_allowed:
            logger.warning(
                "NO SANDBOX for local runs: %s. TAU_LOCAL_EXECUTOR_UNSANDBOXED=true: the "
                "workloads of every workspace run as this user, able to read and change "
                "whatever it can (var/, the database, each other's runs)",
                self.detection.reason,
            )
        else:
            logger.warning(
                "NO SANDBOX for local runs: %s. Only the workloads of one workspace will run "
                "(install bubblewrap, or set TAU_LOCAL_EXECUTOR_UNSANDBOXED=true to run every "
                "workspace's code unsandboxed)",
                self.detection.reason,
            )
            self._single_workspace = self._load_single_workspace()
        self.detect_limits()
        self._write_status()

    def detect_limits(self) -> None:
        """What holds each run's memory, processes and disk on this machine (cgroups, resource
        limits, the disk meter), said in the log and the status file."""
        self.cgroups = cgroups.detect(Path(settings.VAR_DIR))
        self.enforcement = run_limits.Enforcement(
            allowances=self.allowances,
            cgroups=self.cgroups,
            nproc_per_run=run_limits.nproc_counts_one_run(
                sandboxed=self.sandbox is not None,
                privileged=self.sandbox is not None and self.sandbox.privileged,
            ),
        )
        described = self.enforcement.describe()
        logger.info(
            "limits per run: memory: %s; /tmp: %s; processes: %s; disk: %s",
            described["memory"],
            described["tmp"],
            described["processes"],
            described["disk"],
        )
        if "cgroups" in described:
            logger.info("cgroups not used: %s", described["cgroups"])

    def _write_status(self) -> None:
        assert self.detection is not None
        status = self.detection.status(unsandboxed_allowed=self.unsandboxed_allowed)
        status["single_workspace"] = self._single_workspace
        status["limits"] = self.enforcement.describe()
        try:
            sandboxing.write_status(Path(settings.VAR_DIR) / sandboxing.STATUS_FILE, status)
        except OSError:
            logger.exception("could not write the local executor's status file")

    def _load_single_workspace(self) -> int | None:
        path = Path(settings.VAR_DIR) / SINGLE_WORKSPACE_FILE
        status = sandboxing.read_status(path)
        workspace = status.get("workspace_id") if status else None
        return workspace if isinstance(workspace, int) else None

    def _choose_single_workspace(self, workspace_id: int) -> None:
        self._single_workspace = workspace_id
        logger.warning(
            "no sandbox: from now on only workspace %s's runs are started (remembered in %s)",
            workspace_id,
            SINGLE_WORKSPACE_FILE,
        )
        sandboxing.write_status(
            Path(settings.VAR_DIR) / SINGLE_WORKSPACE_FILE, {"workspace_id": workspace_id}
        )
        self._write_status()

    def request_stop(self, *, hurry: bool = False, wake: bool = True) -> None:
        if not self.stopping:
            self.stopping = True
            self._stop_deadline = time.monotonic() + self.grace + STOP_TIMEOUT_EXTRA_SECONDS
        self.hurry = self.hurry or hurry
        if wake:
            self._wake.set()

    def _loop(self) -> None:
        while True:
            started = time.monotonic()
            try:
                self._hold_database_lock(wait=10.0)
                if not self._recovered:
                    self.recover()
                    self._recovered = True
                self.tick()
            except AgentConflict:
                raise
            except DatabaseError:
                # Reconnect on the next pass; say so once in a while, not on every pass.
                if time.monotonic() - self._database_error_logged_at > 30:
                    logger.exception("database error; retrying every %ss", self.interval)
                    self._database_error_logged_at = time.monotonic()
                connections.close_all()
            except Exception:
                logger.exception("unexpected error in the agent loop; continuing")
            if self.stopping and not self.executions:
                return
            if self.stopping and time.monotonic() > self._stop_deadline:
                logger.error(
                    "gave up waiting for %d attempt(s) to be recorded; the next start closes them",
                    len(self.executions),
                )
                return
            self._wake.wait(max(0.0, self.interval - (time.monotonic() - started)))
            self._wake.clear()

    def _install_signal_handlers(self) -> None:
        # Only flags here: a handler runs between two bytecodes of the loop, which may hold
        # the (non-reentrant) locks of the objects it would touch. The loop notices within
        # one interval.
        def handle(signum: int, frame: FrameType | None) -> None:
            self.request_stop(hurry=self.stopping, wake=False)

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """One agent per installation directory: a lock file under VAR_DIR."""
        path = Path(settings.VAR_DIR) / "agent.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a+b") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise AgentConflict(f"another local agent is running ({path} is locked)") from None
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _hold_database_lock(self, *, wait: float = 0.0) -> None:
        """On PostgreSQL, hold an advisory lock for as long as the connection lives, so a
        second agent (on another machine, against the same database) refuses to start. After
        a reconnect the lock is taken again."""
        if connection.vendor != "postgresql":
            return
        connection.ensure_connection()
        if connection.connection is self._locked_connection:
            return
        deadline = time.monotonic() + wait
        while True:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_lock(%s)", [ADVISORY_LOCK_KEY])
                row = cursor.fetchone()
            if row and row[0]:
                self._locked_connection = connection.connection
                return
            if time.monotonic() >= deadline:
                raise AgentConflict("another local agent is connected to this database")
            time.sleep(0.5)

    # --- one pass ----------------------------------------------------------------------

    def tick(self) -> None:
        now = time.monotonic()
        if self.stopping:
            if not self._stop_logged:
                logger.info(
                    "stopping: no new runs; stopping %d running attempt(s)", len(self.executions)
                )
                self._stop_logged = True
            self._stop_all(now)
        # A database outage must not stop the parts that need no database (deadlines, the
        # SIGKILL after a grace period, noticing exits): every execution gets its turn.
        errors: list[DatabaseError] = []
        try:
            self._notice_cancellations(now)
        except DatabaseError as exc:
            errors.append(exc)
        for execution in list(self.executions.values()):
            try:
                self._advance(execution, now)
            except DatabaseError as exc:
                errors.append(exc)
        try:
            self.endpoints.tick(now)
        except DatabaseError as exc:
            errors.append(exc)
        if errors:
            raise errors[0]
        if not self.stopping:
            if now - self._last_sweep >= SWEEP_SECONDS:
                # Anything executing that this agent does not supervise: a lost attempt.
                self.sweep()
            self.admit()

    # --- recovery -----------------------------------------------------------------------

    def recover(self) -> None:
        """At start: whatever a previous agent left is an orphan. An attempt whose workload
        had ended is closed with the result its wrapper recorded; one still running is
        stopped (its process group) and closed as ``infrastructure`` ("agent restarted"), so
        the retry policy applies; then runs executing without an attempt are put right."""
        self.sweep()

    def sweep(self) -> None:
        self._last_sweep = time.monotonic()
        mine = {execution.attempt.pk for execution in self.executions.values()}
        strays = (
            RunAttempt.objects.unscoped()
            .filter(
                run__backend=Backend.LOCAL,
                state__in=[RunAttempt.State.STARTING, RunAttempt.State.RUNNING],
            )
            .exclude(pk__in=mine)
            .select_related("run")
        )
        for attempt in strays:
            try:
                self._close_stray(attempt)
            except DatabaseError:
                raise
            except Exception:
                # One attempt that cannot be closed must not hold up every other run: it is
                # tried again at the next sweep.
                logger.exception(
                    "could not close %s attempt %d; trying again later",
                    attempt.run.name,
                    attempt.number,
                )
        executing = {execution.run_id for execution in self.executions.values()}
        stuck = (
            Run.objects.unscoped()
            .filter(backend=Backend.LOCAL, state__in=RUNNING_STATES)
            .exclude(pk__in=executing)
        )
        for run in stuck:
            if attempts.has_live_attempt(run):
                continue
            try:
                if run.state == RunState.CANCELLING:
                    state.transition(
                        run,
                        RunState.CANCELLED,
                        reason=wording.cancelled_reason(selectors.cancel_requested_by(run)),
                        kind=EventKind.CANCELLED,
                    )
                else:
                    attempts.requeue_stranded(
                        run=run,
                        reason="The local agent restarted before this run was started; it "
                        "waits to be started again.",
                    )
            except IllegalTransition:
                continue  # it moved on meanwhile
        self._remove_stale_cgroups()

    def _remove_stale_cgroups(self) -> None:
        """Cgroups of attempts this agent does not supervise (a crashed agent's, or one whose
        release found a process still dying): whatever is in them is killed, then removed."""
        live = {_cgroup_name(execution) for execution in self.executions.values()}
        for name in self.cgroups.remove_stale(keep=live):
            logger.info("removed the cgroup %s of an attempt that had ended", name)

    def _close_stray(self, attempt: RunAttempt) -> None:
        """Close an attempt nobody supervises, with its real result when it had one."""
        run = attempt.run
        layout = AttemptLayout.for_attempt(self.runs_dir, run.pk, attempt.number)
        if attempt.pid:
            # The recorded leader (pid and start time) names the group; its members carry the
            # run's and attempt's markers (an agent before the installation marker set only
            # those two, and what it started is still recognised).
            ids = attempt_ids(run.pk, attempt.number)
            groups = (
                [attempt.pid]
                if processes.orphaned_group(attempt.pid, attempt.process_start_ticks, ids)
                else []
            )
        else:
            # Started, but its pid never reached the database: find it by its markers,
            # this installation's only.
            markers = attempt_markers(run.pk, attempt.number)
            groups = sorted(
                {
                    info.process_group
                    for pid in processes.marked_processes(markers)
                    if (info := processes.read_process(pid)) is not None
                }
            )
        for group in groups:
            logger.warning(
                "stopping orphaned processes of %s attempt %d (process group %d)",
                run.name,
                attempt.number,
                group,
            )
            processes.stop_group(group, grace=self.grace)
        # Read only now: a workload that ended while we stopped it shows the stop in its
        # record (stop_signals), one that ended before shows a natural end.
        rank, recorded = _recovered_record(layout)
        workers = layout.workers_started()
        outcome = _of_worker(
            self._recovered_outcome(run, recorded, layout.worker_log(rank)),
            rank=rank,
            workers=workers,
        )
        logger.warning(
            "closing %s attempt %d: %s",
            run.name,
            attempt.number,
            outcome.message or ("succeeded" if outcome.succeeded else "failed"),
        )
        # It ran when it left a record of its own (the agent may have died between starting
        # it and recording that it runs).
        ran = recorded is not None and recorded.error is None and not outcome.interrupted
        observations.apply_observation(
            run_id=run.pk,
            attempt_number=attempt.number,
            observation=_observed_end(outcome, ran=ran),
        )
        # The agent that issued its tokens died before it could revoke them.
        run_tokens.revoke_run_tokens(run_id=run.pk)

    def _recovered_outcome(
        self, run: Run, recorded: outcomes.RecordedOutcome | None, log: Path
    ) -> AttemptOutcome:
        interrupted = AttemptOutcome(
            succeeded=False,
            failure_class=FailureClass.INFRASTRUCTURE,
            message=AGENT_RESTARTED,
            interrupted=True,
        )
        if recorded is None:
            return interrupted  # it died with the agent, or was stopped by us just now
        exit_code = _container_exit_code(recorded.exit_code, recorded.signal)
        if recorded.after_a_stop:
            # Stopped by the agent that died (a cancel, a deadline, a shutdown) or by us.
            if run.state == RunState.CANCELLING:
                return AttemptOutcome(
                    succeeded=False, cancelled=True, exit_code=exit_code, message="Cancelled."
                )
            limit = _max_runtime(run)
            if limit and recorded.duration is not None and recorded.duration >= limit:
                return AttemptOutcome(
                    succeeded=False,
                    exit_code=exit_code,
                    failure_class=FailureClass.DEADLINE_EXCEEDED,
                    message=f"Stopped after {_duration(limit)}, its run.max_runtime.",
                )
            return interrupted
        # It ended by itself while no agent watched: that is its result.
        return outcome_of_exit(
            exit_code=recorded.exit_code,
            signum=recorded.signal,
            error=recorded.error,
            log=log,
            recorded=True,
        )

    # --- admission ----------------------------------------------------------------------

    def admit(self) -> None:
        rows = list(
            Run.objects.unscoped()
            .filter(backend=Backend.LOCAL, state=RunState.QUEUED, cancel_requested_at__isnull=True)
            .order_by("-priority_value", "queued_at", "pk")
            .values("pk", "workspace_id", "not_before", "queue_position", "state_reason")[
                :QUEUE_WINDOW
            ]
        )
        if not rows:
            return
        self._forget_specs({row["pk"] for row in rows})
        now = timezone.now()
        ready = [row for row in rows if row["not_before"] is None or row["not_before"] <= now]
        for row in rows:
            if row["not_before"] is not None and row["not_before"] > now:
                # Waiting out a retry's backoff: not in line yet; the reason that
                # finish_attempt gave ("retrying in 30s") stays.
                self._note_waiting(row, None, row["state_reason"])
        ready = self._only_one_workspace_unsandboxed(ready)
        self._load_specs([row["pk"] for row in ready])
        candidates = [
            admission.Candidate(
                run_id=row["pk"],
                workspace_id=row["workspace_id"],
                demand=requested_totals(self._specs[row["pk"]]),
            )
            for row in ready
            if row["pk"] in self._specs
        ]
        if not candidates:
            return
        decisions = admission.plan_admission(
            candidates, capacity=self.capacity, usage=self.usage(), shares=self.quota_shares()
        )
        by_id = {row["pk"]: row for row in ready}
        for decision in decisions:
            row = by_id[decision.run_id]
            if decision.admit:
                self._start(decision.run_id)
            else:
                self._note_waiting(row, decision.position, decision.reason)

    def _only_one_workspace_unsandboxed(self, ready: list[_Row]) -> list[_Row]:
        """Without a sandbox (and without TAU_LOCAL_EXECUTOR_UNSANDBOXED=true), the runs of
        one workspace only (:meth:`may_run`). The others wait, saying why (without naming the
        other workspace)."""
        allowed = [row for row in ready if self.may_run(row["workspace_id"])]
        for row in ready:
            if row not in allowed:
                self._note_waiting(row, None, UNSANDBOXED_REFUSAL)
        return allowed

    def may_run(self, workspace_id: int) -> bool:
        """Whether this agent runs the workspace's code (runs and endpoints alike): any, in a
        sandbox or when TAU_LOCAL_EXECUTOR_UNSANDBOXED=true says so; else only the first
        workspace whose code it took, remembered across restarts."""
        if self.sandbox is not None or self.unsandboxed_allowed:
            return True
        if self._single_workspace is None:
            self._choose_single_workspace(workspace_id)
        return workspace_id == self._single_workspace

    def in_background(self, function: Callable[..., _Result], *args: Any) -> Future[_Result]:
        """``function(*args)`` in a preparation thread (building environments, unpacking)."""
        return self._pool.submit(function, *args)

    def measure_disk(self, folders: Mapping[str, Path]) -> Future[run_limits.DiskUsage]:
        """What ``folders`` hold on disk, measured in the disk thread (never in the loop)."""
        return self._meter.submit(run_limits.measure, folders)

    def _note_waiting(self, row: Mapping[str, Any], position: int | None, reason: str) -> None:
        if row["queue_position"] == position and row["state_reason"] == reason:
            return
        state.note_waiting(run_id=row["pk"], position=position, reason=reason)

    def _forget_specs(self, queued: set[int]) -> None:
        """Keep parsed specs only of runs still queued or executing."""
        keep = queued | {execution.run_id for execution in self.executions.values()}
        if len(self._specs) > len(keep):
            self._specs = {run_id: spec for run_id, spec in self._specs.items() if run_id in keep}

    def _load_specs(self, run_ids: list[int]) -> None:
        missing = [run_id for run_id in run_ids if run_id not in self._specs]
        if not missing:
            return
        for run_id, data in Run.objects.unscoped().filter(pk__in=missing).values_list("pk", "spec"):
            try:
                self._specs[run_id] = spec_from_dict(data)
            except Exception as exc:  # a stored spec the current schema refuses
                logger.warning("run %s has a spec that no longer validates: %s", run_id, exc)
                with contextlib.suppress(IllegalTransition, Run.DoesNotExist):
                    state.transition(
                        Run(pk=run_id),
                        RunState.FAILED,
                        reason=f"Its stored tau.yaml no longer validates: {exc}",
                        # Valid when it was accepted: the platform changed under it.
                        failure_class=FailureClass.INFRASTRUCTURE,
                    )

    def usage(self) -> admission.Usage:
        """What this machine's attempts and endpoints hold: runs and endpoints share the
        machine, and each workspace's quota on it, as on a cluster."""
        usage = admission.Usage()
        for execution in self.executions.values():
            usage.add(execution.run.workspace_id, execution.demand)
        self.endpoints.add_usage(usage)
        return usage

    def quota_shares(self) -> dict[int, admission.WorkspaceShare]:
        if time.monotonic() - self._shares_loaded_at < QUOTA_CACHE_SECONDS:
            return self._shares
        quotas: dict[int, dict[str, admission.Quota]] = {}
        cohorts: dict[int, int | None] = {}
        rows = (
            WorkspaceQuota.objects.unscoped()
            .filter(flavor__name=settings.TAU_LOCAL_FLAVOR)
            .values_list(
                "workspace_id", "workspace__cohort_id", "resource", "nominal", "borrowing_limit"
            )
        )
        for workspace_id, cohort_id, resource, nominal, borrowing_limit in rows:
            quotas.setdefault(workspace_id, {})[resource] = admission.Quota(
                nominal=Decimal(nominal),
                borrowing_limit=Decimal(borrowing_limit) if borrowing_limit is not None else None,
            )
            cohorts[workspace_id] = cohort_id
        self._shares = {
            workspace_id: admission.WorkspaceShare(quotas=rows_of, cohort=cohorts[workspace_id])
            for workspace_id, rows_of in quotas.items()
        }
        self._shares_loaded_at = time.monotonic()
        return self._shares

    # --- starting -----------------------------------------------------------------------

    def _start(self, run_id: int) -> None:
        try:
            run = (
                Run.objects.unscoped()
                .select_related("workspace", "submitted_by", "bundle")
                .get(pk=run_id)
            )
            attempt = attempts.admit_attempt(run=run)
        except NoWaitingAttempt:
            logger.exception("cannot start %s", run_id)
            return
        except (IllegalTransition, Run.DoesNotExist):
            return  # cancelled or changed since the queue was read
        spec = self._specs[run_id]
        layout = AttemptLayout.for_attempt(self.runs_dir, run.pk, attempt.number)
        demand = dict(requested_totals(spec))
        gpu_count = int(demand.get(GPU_RESOURCE, 0))
        gpus = tuple(self.free_gpus[:gpu_count])
        del self.free_gpus[:gpu_count]
        execution = Execution(
            run=run,
            attempt=attempt,
            spec=spec,
            demand=demand,
            layout=layout,
            gpus=gpus,
            metrics=MetricsReader(layout.output / spec.outputs.metrics_file, root=layout.output),
            checkpoints=CheckpointScanner(layout.checkpoints),
            limits=self.enforcement.for_attempt(_memory_limit(spec)),
            datasets=staging_plan(run) if spec.inputs.datasets or spec.inputs.models else (),
        )
        # From here on the attempt is this agent's: whatever fails is recorded as its end.
        self.executions[attempt.pk] = execution
        logger.info("admitted %s attempt %d", run.name, attempt.number)
        try:
            self._begin(execution)
        except Exception as exc:
            logger.exception("could not start %s attempt %d", run.name, attempt.number)
            self._fail(execution, FailureClass.INFRASTRUCTURE, f"Could not start it: {exc}")
        self._wake.set()  # look again soon: a cached environment is ready at once

    def _begin(self, execution: Execution) -> None:
        """Directories, log, and the preparation in a worker thread."""
        run, attempt, spec, layout = (
            execution.run,
            execution.attempt,
            execution.spec,
            execution.layout,
        )
        # Checkpoints of earlier attempts are known already (an optimisation only: a
        # checkpoint recorded twice is ignored by its unique path).
        execution.checkpoints.known.update(
            Checkpoint.objects.for_workspace(run.workspace_id)
            .filter(run=run)
            .values_list("path", flat=True)
        )
        attempts.note_placement(
            attempt=attempt,
            backend_name=f"local:{layout.attempt_dir.relative_to(self.runs_dir)}",
            log_path=str(layout.log),
        )
        uid = self.sandbox.run_uid(run.pk) if self.sandbox is not None else None
        make_directories(layout, uid=uid, workers=local_workers(spec))
        venv_ready = environments.is_ready(
            environments.environment_path(self.venvs_dir, spec.runtime.pip)
        )
        if spec.runtime.pip and not venv_ready:
            state.note_reason(
                run_id=run.pk,
                state=RunState.ADMITTED,
                reason=f"Installing its {len(spec.runtime.pip)} pip requirement(s); "
                "later runs with the same requirements reuse the environment.",
            )
        plan = PreparationPlan(
            layout=layout,
            spec=spec,
            bundle_sha256=run.bundle.sha256 if run.bundle is not None else None,
            venvs_dir=self.venvs_dir,
            platform_env=self._platform_env(execution),
            sandbox=self.sandbox,
            uid=uid,
            gpu_count=len(execution.gpus),
            log_limit=self.log_limit,
            sdk_root=self.sdk_root,
            limits=execution.limits,
            datasets=execution.datasets,
        )
        execution.preparation = self._pool.submit(prepare, plan, execution.cancelled)

    def _platform_env(self, execution: Execution) -> dict[str, str]:
        run = execution.run
        attempt = execution.attempt
        env = {
            "TAU_RUN_ID": str(run.pk),
            "TAU_RUN_NAME": run.name,
            "TAU_WORKSPACE": run.workspace.slug,
            "TAU_ATTEMPT": str(attempt.number),
            "TAU_OUTPUT_DIR": str(execution.layout.output),
            "TAU_CHECKPOINT_DIR": str(execution.layout.checkpoints),
            "TAU_API_URL": settings.TAU_API_URL,
            # Only the GPUs this run was given; none at all when it asked for none.
            "CUDA_VISIBLE_DEVICES": ",".join(str(index) for index in execution.gpus),
        }
        if attempt.resume_from_id is not None and attempt.resume_from is not None:
            env["TAU_RESUME_FROM"] = attempt.resume_from.path
        if attempt.retry_reason:
            env["TAU_RETRY_REASON"] = attempt.retry_reason
        if execution.datasets:
            env["TAU_DATA_DIR"] = str(execution.layout.data)
        env.update(sweeps.sweep_environment(execution.spec))
        return env

    def _spawn(self, execution: Execution, prepared: Prepared) -> None:
        env = dict(prepared.env)
        # A token that can only report on this run, for this attempt's lifetime. Its
        # plaintext goes into the workload's environment (through the wrapper) and nowhere
        # else: not the sandbox's, not a file, not a command line.
        token = run_tokens.issue_run_token(
            run=execution.run,
            attempt=execution.attempt,
            max_runtime_seconds=execution.spec.run.max_runtime,
        )
        if token is not None:
            env["TAU_RUN_TOKEN"] = token
        limits = execution.limits
        if self.cgroups.hierarchies and limits is not None:
            try:
                execution.cgroup = self.cgroups.create(
                    _cgroup_name(execution), memory=limits.memory, processes=limits.processes
                )
            except cgroups.CgroupFailed as exc:
                self._note(execution, str(exc))
                self._fail(execution, FailureClass.INFRASTRUCTURE, f"Could not start it: {exc}.")
                return
        count = len(prepared.commands)
        port = _free_port() if count > 1 else 0
        markers = attempt_markers(execution.run_id, execution.attempt.number)
        launched: list[Worker] = []
        for rank, worker_command in enumerate(prepared.commands):
            worker_env = env
            if count > 1:
                worker_env = self._worker_environment(execution, env, rank=rank, port=port)
            if execution.cgroup is not None:
                worker_command = execution.cgroup.enter_command(
                    worker_command, python=environments.base_interpreter()
                )
            # Worker 0 leads the attempt's process group; the others join it.
            group: dict[str, Any] = (
                {"start_new_session": True}
                if count == 1
                else {"process_group": launched[0].process.pid if launched else 0}
            )
            # The wrapper writes the log (capped): the agent only passes the open file.
            log = os.open(
                execution.layout.worker_log(rank), os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC
            )
            try:
                process = sandboxing.start(  # the researcher's command, no shell
                    worker_command,
                    environment=worker_env,  # for the workload only, through the wrapper
                    env=launcher_environment(markers),
                    cwd=prepared.cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    close_fds=True,
                    **group,  # its own process group: signalled as a whole
                )
            except OSError as exc:
                reason = exc.strerror or str(exc)
                who = f"worker {rank} of {count}: " if count > 1 else ""
                self._note(execution, f"could not start {who}{prepared.command[0]}: {reason}")
                if launched:
                    # The workers already started are stopped with the attempt's group.
                    execution.process = launched[0].process
                    execution.workers = launched
                    execution.failed_rank = rank
                    execution.stop_reason = StopReason.SHUTDOWN
                    execution.outcome = AttemptOutcome(
                        succeeded=False,
                        failure_class=FailureClass.INFRASTRUCTURE,
                        message=f"Could not start worker {rank} of {count}: {reason}.",
                    )
                    self._kill(execution)
                    execution.phase = Phase.DRAINING
                    return
                self._fail(
                    execution,
                    FailureClass.INFRASTRUCTURE,
                    f"Could not start {prepared.command[0]}: {reason}.",
                )
                return
            finally:
                os.close(log)
            launched.append(Worker(rank=rank, process=process))
        process = launched[0].process
        execution.workers = launched if count > 1 else []
        execution.process = process
        execution.phase = Phase.RUNNING
        started = time.monotonic()
        if execution.spec.run.max_runtime:
            execution.deadline = started + execution.spec.run.max_runtime
        execution.next_collect = started + COLLECT_SECONDS
        execution.next_disk_check = started + run_limits.DISK_CHECK_SECONDS
        execution.log_size_saved_at = started
        logger.info(
            "started %s attempt %d as pid %d",
            execution.run.name,
            execution.attempt.number,
            process.pid,
        )
        # attempt_running is recorded by the RUNNING phase, right after this in the same pass.

    def _worker_environment(
        self, execution: Execution, env: Mapping[str, str], *, rank: int, port: int
    ) -> dict[str, str]:
        """Worker ``rank``'s environment: the rendezvous table (``tau.rendezvous``), its own
        share of the run's GPUs and its own output folder."""
        spec = execution.spec
        per_worker = len(execution.gpus) // spec.compute.workers
        gpus = execution.gpus[rank * per_worker : (rank + 1) * per_worker]
        return {
            **env,
            **rendezvous.environment(
                workers=spec.compute.workers,
                rank=rank,
                master_addr=LOOPBACK,
                master_port=port,
                taken=spec.runtime.env_dict().keys(),
            ),
            "CUDA_VISIBLE_DEVICES": ",".join(str(index) for index in gpus),
            "TAU_OUTPUT_DIR": str(execution.layout.worker_output(rank)),
        }

    def _record_running(self, execution: Execution) -> None:
        assert execution.process is not None
        pid = execution.process.pid
        attempts.attempt_running(
            attempt=execution.attempt, pid=pid, start_ticks=processes.start_ticks(pid)
        )
        execution.running_recorded = True

    # --- supervising --------------------------------------------------------------------

    def _notice_cancellations(self, now: float) -> None:
        watched = {
            execution.run_id
            for execution in self.executions.values()
            if execution.stop_reason is None and execution.phase in {Phase.PREPARING, Phase.RUNNING}
        }
        if not watched:
            return
        cancelling = set(
            Run.objects.unscoped()
            .filter(pk__in=watched, state=RunState.CANCELLING)
            .values_list("pk", flat=True)
        )
        for execution in list(self.executions.values()):
            if execution.run_id in cancelling and execution.stop_reason is None:
                logger.info(
                    "cancelling %s attempt %d", execution.run.name, execution.attempt.number
                )
                self._stop(execution, StopReason.CANCEL, now)

    def _stop_all(self, now: float) -> None:
        for execution in self.executions.values():
            if execution.stop_reason is None:
                self._stop(execution, StopReason.SHUTDOWN, now)
            if (
                self.hurry
                and execution.phase in {Phase.RUNNING, Phase.DRAINING}
                and not execution.kill_sent
            ):
                self._kill(execution)

    def _stop(self, execution: Execution, reason: StopReason, now: float) -> None:
        if execution.phase not in {Phase.PREPARING, Phase.RUNNING}:
            return
        execution.stop_reason = reason
        execution.cancelled.set()
        if execution.phase == Phase.RUNNING and execution.pid is not None:
            processes.signal_group(execution.pid, signal.SIGTERM)
            execution.term_sent_at = now

    def _kill(self, execution: Execution) -> None:
        if execution.pid is not None:
            processes.signal_group(execution.pid, signal.SIGKILL)
            execution.kill_sent = True

    def _escalate(self, execution: Execution, now: float) -> None:
        """SIGKILL the group once the grace period after SIGTERM has passed."""
        if execution.term_sent_at is None or execution.kill_sent:
            return
        if self.hurry or now - execution.term_sent_at >= self.grace:
            self._kill(execution)

    def _advance(self, execution: Execution, now: float) -> None:
        try:
            self._advance_phases(execution, now)
        except DatabaseError:
            raise
        except Exception:
            logger.exception(
                "supervising %s attempt %d failed", execution.run.name, execution.attempt.number
            )
            if execution.phase == Phase.PREPARING:
                self._fail(
                    execution, FailureClass.INFRASTRUCTURE, "The local agent failed to start it."
                )

    def _advance_phases(self, execution: Execution, now: float) -> None:
        if execution.phase == Phase.PREPARING:
            self._advance_preparing(execution)
        if execution.phase == Phase.RUNNING:
            self._advance_running(execution, now)
        if execution.phase == Phase.DRAINING:
            self._advance_draining(execution, now)
        if execution.phase == Phase.FINISHING:
            self._finish(execution)

    def _advance_preparing(self, execution: Execution) -> None:
        preparation = execution.preparation
        if preparation is None or not preparation.done():
            return
        try:
            prepared = preparation.result()
        except PreparationFailed as exc:
            self._fail(execution, exc.failure_class, exc.message)
            return
        except environments.BuildCancelled:
            execution.outcome = self._stopped_outcome(execution, exit_code=None)
            execution.phase = Phase.FINISHING
            return
        except Exception as exc:
            logger.exception(
                "preparing %s attempt %d failed", execution.run.name, execution.attempt.number
            )
            self._note(execution, f"could not prepare the attempt: {exc}")
            self._fail(
                execution, FailureClass.INFRASTRUCTURE, f"Could not prepare the attempt: {exc}"
            )
            return
        if execution.stop_reason is not None:
            execution.outcome = self._stopped_outcome(execution, exit_code=None)
            execution.phase = Phase.FINISHING
            return
        if prepared.staged is not None:
            state.record_data_staged(
                execution.run,
                attempt=execution.attempt.number,
                files=prepared.staged.files,
                bytes=prepared.staged.bytes,
                seconds=prepared.staged.seconds,
            )
        self._spawn(execution, prepared)

    def _advance_running(self, execution: Execution, now: float) -> None:
        assert execution.process is not None
        pid = execution.process.pid
        if execution.workers:
            self._advance_workers(execution, now)
            return
        status = _exit_status(pid)
        if status is None and _ended_inside(execution, execution.layout.outcome, now):
            # The workload has ended (its outcome is written), but something it started keeps
            # its sandbox open: stop what is left, as for a group whose leader has exited.
            execution.phase = Phase.DRAINING
            processes.signal_group(pid, signal.SIGTERM)
            execution.term_sent_at = now
            return
        if status is None:
            self._while_running(execution, now)
            return
        execution.exit_code, execution.exit_signal = status
        execution.phase = Phase.DRAINING
        # The main process is gone (not yet reaped, so its pid still names the group).
        if execution.term_sent_at is None and processes.group_members(pid, exclude=pid):
            processes.signal_group(pid, signal.SIGTERM)
            execution.term_sent_at = now

    def _while_running(self, execution: Execution, now: float) -> None:
        """A pass over an attempt whose workload runs: its deadline, disk, stop and what
        it wrote."""
        deadline = execution.deadline
        if deadline is not None and now >= deadline and execution.stop_reason is None:
            logger.info(
                "%s attempt %d ran past its max_runtime",
                execution.run.name,
                execution.attempt.number,
            )
            self._stop(execution, StopReason.DEADLINE, now)
        self._check_disk(execution, now)
        self._escalate(execution, now)
        if not execution.running_recorded:
            self._record_running(execution)
        if now >= execution.next_collect:
            self._collect(execution, now)
            execution.next_collect = now + COLLECT_SECONDS

    def _advance_workers(self, execution: Execution, now: float) -> None:
        """A multi-worker attempt runs until every worker has ended, or one has failed."""
        assert execution.process is not None
        failed: list[Worker] = []
        for worker in execution.workers:
            if worker.ended:
                continue
            worker.status = _exit_status(worker.process.pid)
            outcome = execution.layout.worker_outcome(worker.rank)
            if worker.status is None and _ended_inside(worker, outcome, now):
                # Its workload has ended (the record says how), but something it started
                # keeps its sandbox open: it is stopped with the group below.
                recorded = outcomes.read_outcome(outcome)
                if recorded is not None:
                    worker.status = (recorded.exit_code, recorded.signal)
            if worker.failed:
                failed.append(worker)
        if failed and execution.failed_rank is None:
            # Several may have ended since the last pass (a worker killed, and a peer that
            # lost it): the first to end, by its wrapper's record, is the cause.
            execution.failed_rank = min(failed, key=partial(_ended_at, execution)).rank
        if execution.failed_rank is None and not all(w.ended for w in execution.workers):
            self._while_running(execution, now)
            return
        if execution.failed_rank is not None and execution.stop_reason is None:
            first = execution.workers[execution.failed_rank]
            logger.info(
                "%s attempt %d: worker %d of %d ended (%s); stopping the others",
                execution.run.name,
                execution.attempt.number,
                first.rank,
                len(execution.workers),
                first.status,
            )
        execution.phase = Phase.DRAINING
        pid = execution.process.pid
        if execution.term_sent_at is None and processes.group_members(pid, exclude=pid):
            processes.signal_group(pid, signal.SIGTERM)
            execution.term_sent_at = now

    def _check_disk(self, execution: Execution, now: float) -> None:
        """Start a measurement of the run's folders when one is due, and act on the last one:
        over the allowance, the attempt is killed at once (no grace period to write more)."""
        limits = execution.limits
        if limits is None or execution.stop_reason is not None:
            return
        measured = execution.disk_measurement
        if measured is not None:
            if not measured.done():
                return
            execution.disk_measurement = None
            try:
                why = run_limits.overrun(measured.result(), limits.disk)
            except Exception:
                logger.exception("measuring the disk use of %s failed", execution.run.name)
                why = None
            if why is not None:
                self._stop_for_disk(execution, why)
                return
        if now >= execution.next_disk_check:
            execution.disk_measurement = self._meter.submit(
                run_limits.measure, _written_folders(execution.layout)
            )
            execution.next_disk_check = now + run_limits.DISK_CHECK_SECONDS

    def _stop_for_disk(self, execution: Execution, why: str) -> None:
        logger.warning(
            "%s attempt %d: %s", execution.run.name, execution.attempt.number, why.lower()
        )
        self._note(execution, why)
        execution.disk_overrun = why
        execution.stop_reason = StopReason.DISK
        execution.cancelled.set()
        execution.term_sent_at = time.monotonic()
        self._kill(execution)

    def _advance_draining(self, execution: Execution, now: float) -> None:
        assert execution.process is not None
        pid = execution.process.pid
        if processes.group_members(pid, exclude=pid) or any(
            _exit_status(process.pid) is None for process in _processes(execution)
        ):
            self._escalate(execution, now)
            return
        for worker in execution.workers:
            worker.status = worker.status or _exit_status(worker.process.pid)
        # Reap: only now may the pids be reused (worker 0's, the group's id, last).
        for process in reversed(_processes(execution)):
            process.wait()
        execution.outcome = self._exit_outcome(execution)
        execution.phase = Phase.FINISHING

    # --- outcomes -----------------------------------------------------------------------

    def _exit_outcome(self, execution: Execution) -> AttemptOutcome:
        """How the attempt ended: the wrapper's record when there is one (it saw the
        workload's own exit; the sandbox around it only passes a number on), else the exit
        status of the process the agent started."""
        if execution.outcome is not None:
            return execution.outcome  # decided when it could not start every worker
        rank = _deciding_rank(execution)
        recorded = outcomes.read_outcome(execution.layout.worker_outcome(rank))
        if recorded is not None:
            code, signum = recorded.exit_code, recorded.signal
        elif execution.workers:
            code, signum = execution.workers[rank].status or (None, None)
        else:
            code, signum = execution.exit_code, execution.exit_signal
        if execution.stop_reason is not None:
            return self._stopped_outcome(execution, exit_code=_container_exit_code(code, signum))
        # A run that wrote past its allowance faster than it was measured, and ended.
        limits = execution.limits
        if limits is not None:
            why = run_limits.overrun(
                run_limits.measure(_written_folders(execution.layout)), limits.disk
            )
            if why is not None:
                self._note(execution, why)
                return AttemptOutcome(
                    succeeded=False,
                    exit_code=_container_exit_code(code, signum),
                    failure_class=FailureClass.USER_ERROR,
                    message=why.replace("Stopped: it used", "It used", 1),
                )
        succeeded = signum is None and code == 0 and recorded is not None
        if (
            not succeeded
            and execution.cgroup is not None
            and limits is not None
            and limits.memory is not None
            and execution.cgroup.oom_kills()
        ):
            # The kernel killed in its cgroup: the workload, or the wrapper or sandbox with it
            # (then only the sandbox's exit status is left, 137, and no record).
            return _over_memory(limits.memory, log=execution.layout.log)
        return _of_worker(
            outcome_of_exit(
                exit_code=code,
                signum=signum,
                error=recorded.error if recorded is not None else None,
                log=execution.layout.worker_log(rank),
                recorded=recorded is not None,
            ),
            rank=rank,
            workers=len(execution.workers),
        )

    def _stopped_outcome(self, execution: Execution, *, exit_code: int | None) -> AttemptOutcome:
        if execution.stop_reason == StopReason.CANCEL:
            return AttemptOutcome(
                succeeded=False, cancelled=True, exit_code=exit_code, message="Cancelled."
            )
        if execution.stop_reason == StopReason.DEADLINE:
            limit = execution.spec.run.max_runtime or 0
            return AttemptOutcome(
                succeeded=False,
                exit_code=exit_code,
                failure_class=FailureClass.DEADLINE_EXCEEDED,
                message=f"Stopped after {_duration(limit)}, its run.max_runtime.",
            )
        if execution.stop_reason == StopReason.DISK:
            # The run's own doing, like a program that fills the disk: not retried by default.
            return AttemptOutcome(
                succeeded=False,
                exit_code=exit_code,
                failure_class=FailureClass.USER_ERROR,
                message=execution.disk_overrun or "Stopped: over its disk allowance.",
            )
        return AttemptOutcome(
            succeeded=False,
            exit_code=exit_code,
            failure_class=FailureClass.INFRASTRUCTURE,
            message=AGENT_STOPPED,
            interrupted=True,
        )

    def _fail(self, execution: Execution, failure_class: str, message: str) -> None:
        execution.outcome = AttemptOutcome(
            succeeded=False, failure_class=failure_class, message=message
        )
        execution.phase = Phase.FINISHING

    def _finish(self, execution: Execution) -> None:
        """Collect what is left, then record the outcome (services decide retry or end).
        If the database refuses, the next pass tries again."""
        assert execution.outcome is not None
        if execution.process is not None:
            if not execution.running_recorded:
                self._record_running(execution)  # a process that ended at once
            self._collect(execution, time.monotonic(), final=True)
            # Before the outcome: a run that ends has its artifacts when its evidence is sealed.
            artifact_collection.collect_artifacts(
                run=execution.run, attempt=execution.attempt.number, output=execution.layout.output
            )
            if execution.outcome.succeeded:
                self._keep_outputs(execution)
        # Its processes are gone: so is its cgroup, before it is recorded as ended.
        self._release_cgroup(execution)
        with transaction.atomic():
            if execution.metrics.bad_lines:
                metrics.note_skipped_lines(
                    run=execution.run,
                    attempt=execution.attempt.number,
                    lines=execution.metrics.bad_lines,
                    first_problem=execution.metrics.first_problem,
                )
            applied = observations.apply_observation(
                run_id=execution.run_id,
                attempt_number=execution.attempt.number,
                observation=_observed_end(execution.outcome, ran=execution.running_recorded),
            )
            # With the outcome, not after it: no moment in which the attempt has ended and
            # its token still reports (if the database refuses, the next pass does both).
            run_tokens.revoke_run_tokens(run_id=execution.run_id, attempt=execution.attempt)
        logger.info(
            "%s attempt %d ended: %s",
            execution.run.name,
            execution.attempt.number,
            ", ".join(applied.actions) or "already recorded",
        )
        recorded = outcomes.read_outcome(execution.layout.outcome)
        if recorded is not None and recorded.log_dropped:
            logger.info(
                "%s attempt %d: %d bytes of output over the log cap were dropped",
                execution.run.name,
                execution.attempt.number,
                recorded.log_dropped,
            )
        self.free_gpus.extend(execution.gpus)
        self.free_gpus.sort()
        del self.executions[execution.attempt.pk]
        self._wake.set()  # its resources are free: admit at once

    def _keep_outputs(self, execution: Execution) -> None:
        """``outputs.dataset`` and ``outputs.model`` become versions; one that cannot fails
        the attempt (the run promised it), saying which and why."""
        spec = execution.spec
        if execution.outputs_kept or (spec.outputs.dataset is None and spec.outputs.model is None):
            return
        execution.outputs_kept = True
        try:
            made = keep_outputs(execution.run, spec, execution.layout.output)
        except OutputsNotKept as exc:
            self._note(execution, str(exc))
            execution.outcome = AttemptOutcome(
                succeeded=False,
                exit_code=execution.outcome.exit_code if execution.outcome else None,
                failure_class=FailureClass.USER_ERROR,
                message=str(exc),
            )
            return
        for version in made:
            self._note(
                execution,
                f"kept {version.asset.kind} {version.ref}: {version.files_count:,} files, "
                f"{version.bytes:,} bytes, {version.manifest_digest}",
            )

    def _release_cgroup(self, execution: Execution) -> None:
        if execution.cgroup is None or execution.cgroup.released:
            return  # none, or released on an earlier try of _finish
        if not execution.cgroup.release():
            # A process still dying holds it: the next sweep removes it.
            logger.info("the cgroup %s is still busy; removed later", execution.cgroup.name)

    # --- collecting ---------------------------------------------------------------------

    def _collect(self, execution: Execution, now: float, *, final: bool = False) -> None:
        attempt = execution.attempt
        rows: list[MetricRow] = []
        values = 0
        while True:
            before = execution.metrics.offset
            batch = execution.metrics.read(final=final)
            rows.extend(batch.rows)
            values += sum(len(row.values) for row in batch.rows)
            # While it runs, one chunk per pass; at the end, everything that is there.
            if not final or execution.metrics.offset == before or values >= 100_000:
                break
        found = execution.checkpoints.scan()
        log_size = _file_size(execution.layout.log, default=attempt.log_size)
        save_log_size = log_size != attempt.log_size and (
            final or now - execution.log_size_saved_at >= LOG_SIZE_SAVE_SECONDS
        )
        offset_changed = execution.metrics.offset != attempt.metrics_offset
        trial_records = None
        if execution.spec.execution.is_sweep:
            # The workload's file: read without following links, and only a regular file (a
            # FIFO there would hold the loop forever).
            trial_records = trials.parse_trials_file(
                read_bounded(
                    execution.layout.output / trials.TRIALS_FILE,
                    execution.layout.output,
                    limit=trials.MAX_TRIALS_FILE_BYTES,
                )
            )
            if trial_records == execution.trials_seen:
                trial_records = None
        if not (rows or found or offset_changed or save_log_size or trial_records):
            return
        try:
            with transaction.atomic():
                recorded = self._save_collected(execution, rows, found)
                if trial_records:
                    trials.record_trials(
                        run=execution.run, attempt=attempt.number, records=trial_records
                    )
                attempts.note_progress(
                    attempt_id=attempt.pk,
                    metrics_offset=execution.metrics.offset if offset_changed else None,
                    log_size=log_size if save_log_size else None,
                )
        except DatabaseError:
            # Nothing was kept: read the same lines again next time.
            execution.metrics.offset = attempt.metrics_offset
            raise
        if recorded is not None:
            execution.metrics.skipped(
                recorded.rows_skipped, recorded.problems[0] if recorded.problems else None
            )
        attempt.metrics_offset = execution.metrics.offset
        if trial_records:
            execution.trials_seen = trial_records
        if save_log_size:
            attempt.log_size = log_size
            execution.log_size_saved_at = now
        execution.checkpoints.known.update(checkpoint.path for checkpoint in found)

    def _save_collected(
        self, execution: Execution, rows: list[MetricRow], found: list[FoundCheckpoint]
    ) -> metrics.MetricsRecorded | None:
        """Metric points and checkpoints, through the services that keep them for every
        road they arrive by (the API's reports too)."""
        run, number = execution.run, execution.attempt.number
        recorded = (
            metrics.record_metrics(run=run, attempt=number, rows=rows, all_or_nothing=False)
            if rows
            else None
        )
        for checkpoint in found:
            try:
                checkpoints.record_checkpoint(
                    run=run,
                    attempt=number,
                    report=checkpoints.CheckpointReport(
                        step=checkpoint.step,
                        path=checkpoint.path,
                        size=checkpoint.size,
                        data={"kind": checkpoint.kind},
                    ),
                )
            except CheckpointPathRefused as exc:
                logger.warning(
                    "%s attempt %d: checkpoint %s not recorded: %s",
                    run.name,
                    number,
                    checkpoint.path,
                    exc,
                )
        return recorded

    # --- helpers ------------------------------------------------------------------------

    def _note(self, execution: Execution, message: str) -> None:
        """A line from the platform in the attempt's log."""
        with contextlib.suppress(OSError), open(execution.layout.log, "ab") as log:
            log.write(f"[taugrid] {message}\n".encode())

    def _kill_everything(self) -> None:
        """Last resort when the loop ends with attempts still alive (an error, or a stop
        that could not be recorded): leave no process behind. The next start closes their
        attempts."""
        for execution in self.executions.values():
            if execution.phase in {Phase.RUNNING, Phase.DRAINING} and execution.pid is not None:
                processes.signal_group(execution.pid, signal.SIGKILL)
            execution.cancelled.set()


LOOPBACK = "127.0.0.1"  # worker 0's address for the others (tau.rendezvous)


def _ended_at(execution: Execution, worker: Worker) -> tuple[float, int]:
    """When the worker's workload ended, by its wrapper's record (unknown: last), then its
    number."""
    recorded = outcomes.read_outcome(execution.layout.worker_outcome(worker.rank))
    ended = recorded.ended_at if recorded is not None else None
    return (ended if ended is not None else math.inf, worker.rank)


def _observed_end(outcome: AttemptOutcome, *, ran: bool) -> observations.Observation:
    """How an attempt this agent supervised ended, as the core's decision table reads it
    (``runs.observations``): the agent admitted it before it started anything, and an
    attempt stopped for its cancel is one whose processes were taken away."""
    return observations.Observation(
        state=observations.ObservedState.SUCCEEDED
        if outcome.succeeded
        else observations.ObservedState.FAILED,
        reason=outcome.message,
        failure_class=FailureClass(outcome.failure_class) if outcome.failure_class else None,
        exit_code=outcome.exit_code,
        ran=ran,
        admitted=True,
        deleted=outcome.cancelled,
        interrupted=outcome.interrupted,
    )


def _ended_inside(holder: Execution | Worker, outcome: Path, now: float) -> bool:
    """Whether the workload of ``holder`` (an attempt, or one worker of it) wrote its
    ``outcome`` at least OUTCOME_LINGER_SECONDS ago while something it started keeps its
    sandbox open; ``holder.outcome_seen_at`` remembers when the record was first seen."""
    if holder.outcome_seen_at is None:
        if not outcomes.outcome_written(outcome):
            return False
        holder.outcome_seen_at = now
    return now - holder.outcome_seen_at >= OUTCOME_LINGER_SECONDS


def _free_port() -> int:
    """A port nobody listens on now, for worker 0's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        port: int = probe.getsockname()[1]
        return port


def _processes(execution: Execution) -> list[subprocess.Popen[bytes]]:
    """What the agent started for the attempt, worker 0 first."""
    if execution.workers:
        return [worker.process for worker in execution.workers]
    return [execution.process] if execution.process is not None else []


def _deciding_rank(execution: Execution) -> int:
    """The worker whose end is the attempt's: the first to fail, else the first with no
    record of a success (a stop cut them all short), else worker 0."""
    if execution.failed_rank is not None:
        return execution.failed_rank
    for worker in execution.workers:
        recorded = outcomes.read_outcome(execution.layout.worker_outcome(worker.rank))
        if recorded is None or (recorded.exit_code, recorded.signal) != (0, None):
            return worker.rank
    return 0


def _recovered_record(layout: AttemptLayout) -> tuple[int, outcomes.RecordedOutcome | None]:
    """The worker whose record decides how a stray attempt ended, and that record: the first
    worker that failed by itself, else the first that has no record (it was cut short), else
    worker 0 (every worker succeeded, or was stopped)."""
    records = [
        outcomes.read_outcome(layout.worker_outcome(rank))
        for rank in range(layout.workers_started())
    ]
    for rank, recorded in enumerate(records):
        if recorded is not None and _failed_by_itself(recorded):
            return rank, recorded
    for rank, recorded in enumerate(records):
        if recorded is None:
            return rank, None
    return 0, records[0]


def _failed_by_itself(recorded: outcomes.RecordedOutcome) -> bool:
    if recorded.after_a_stop:
        return False
    return bool(recorded.error) or (recorded.exit_code, recorded.signal) != (0, None)


def _of_worker(outcome: AttemptOutcome, *, rank: int, workers: int) -> AttemptOutcome:
    """A multi-worker attempt that a worker's own end failed says which worker it was (a
    stop of the whole attempt, or the agent's end, is nobody's in particular)."""
    if outcome.succeeded or outcome.interrupted or outcome.cancelled or workers < 2:
        return outcome
    return dataclasses.replace(outcome, message=f"Worker {rank} of {workers}: {outcome.message}")


def attempt_ids(run_id: int, attempt: int) -> dict[str, str]:
    """The run's and the attempt's marker variables (every process of an attempt, the
    workload's included, carries them)."""
    return {"TAU_RUN_ID": str(run_id), "TAU_ATTEMPT": str(attempt)}


def attempt_markers(run_id: int, attempt: int, var_dir: Path | None = None) -> dict[str, str]:
    """The variables by which an attempt's processes are found again after the agent that
    started them is gone: the run, the attempt and this installation."""
    return {
        **attempt_ids(run_id, attempt),
        INSTALLATION_MARKER: cgroups.installation_key(
            Path(settings.VAR_DIR) if var_dir is None else var_dir
        ),
    }


def _cgroup_name(execution: Execution) -> str:
    return f"{cgroups.ATTEMPT_PREFIX}{execution.run_id}-attempt-{execution.attempt.number}"


def _memory_limit(spec: Spec) -> Decimal:
    """The memory a run may use: its memory limit (``compute.limits.memory``, else its
    request ``compute.memory``) times its workers, as its pods would get on Kubernetes.
    Without a limit in the spec, that is what the run was admitted with."""
    return parse_quantity(spec.compute.memory_limit) * spec.compute.workers


def _written_folders(layout: AttemptLayout) -> dict[str, Path]:
    """The folders a run writes, which its disk allowance covers, by the name it knows."""
    return {
        "work/": layout.work,
        "output/": layout.output,
        "tmp/": layout.tmp,
        "shm/": layout.shm,
        "checkpoints/": layout.checkpoints,
    }


def _over_memory(limit: int, *, log: Path) -> AttemptOutcome:
    last = _last_log_line(log)
    tail = f" Its last output: {last}" if last else ""
    return AttemptOutcome(
        succeeded=False,
        exit_code=128 + signal.SIGKILL,
        failure_class=FailureClass.OOM_KILLED,
        message=f"Used more than its {run_limits.bytes_text(limit)} of memory (its /tmp "
        "included), so the kernel stopped it; ask for more compute.memory." + tail,
    )


def _container_exit_code(code: int | None, signum: int | None) -> int | None:
    """Like a container's status: 128 + the signal's number when a signal ended it."""
    return code if signum is None else 128 + signum


def outcome_of_exit(
    *, exit_code: int | None, signum: int | None, error: str | None, log: Path, recorded: bool
) -> AttemptOutcome:
    """The outcome of a workload that ended by itself (nobody in TauGrid stopped it).
    ``recorded``: the wrapper saw the end; without its record the wrapper or the sandbox
    itself ended, which is the platform's failure, not the workload's."""
    status = _container_exit_code(exit_code, signum)
    if error:
        return AttemptOutcome(
            succeeded=False,
            exit_code=status,
            failure_class=FailureClass.INFRASTRUCTURE,
            message=f"Could not start {error}.",
        )
    if signum is None and exit_code == 0 and recorded:
        return AttemptOutcome(succeeded=True, exit_code=0)
    last = _last_log_line(log)
    tail = f" Its last output: {last}" if last else ""
    if signum == signal.SIGKILL:
        return AttemptOutcome(
            succeeded=False,
            exit_code=status,
            failure_class=FailureClass.OOM_KILLED,
            message="Killed by the kernel (SIGKILL, not sent by TauGrid), most likely "
            "because the machine ran out of memory." + tail,
        )
    if not recorded:
        how = (
            f"exited with code {exit_code}"
            if signum is None
            else f"was stopped by {processes.signal_name(signum)}"
        )
        return AttemptOutcome(
            succeeded=False,
            exit_code=status,
            failure_class=FailureClass.INFRASTRUCTURE,
            message=f"The sandbox or wrapper around the workload {how} without recording how "
            "the workload ended." + tail,
        )
    if signum is not None:
        return AttemptOutcome(
            succeeded=False,
            exit_code=status,
            failure_class=FailureClass.USER_ERROR,
            message=f"Stopped by {processes.signal_name(signum)}." + tail,
        )
    return AttemptOutcome(
        succeeded=False,
        exit_code=status,
        failure_class=FailureClass.USER_ERROR,
        message=f"Exited with code {exit_code}." + tail,
    )


def _max_runtime(run: Run) -> int | None:
    try:
        return spec_from_dict(run.spec).run.max_runtime
    except Exception:  # a stored spec the current schema refuses
        return None


def _file_size(path: Path, *, default: int) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return default


def _duration(seconds: int) -> str:
    if seconds % 3600 == 0 and seconds >= 3600:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0 and seconds >= 60:
        return f"{seconds // 60} min"
    return f"{seconds} s"
