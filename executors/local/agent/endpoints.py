"""The local agent's endpoints: every generation of every endpoint handed to this machine runs
as a real Ray Serve application on loopback, supervised beside the runs, with the same care.

One step of the agent's loop (:meth:`EndpointSupervisor.tick`), every pass:

1. **What should run.** The endpoints of the local backend that are live (``deploying``,
   ``ready``, ``updating``, ``unhealthy``; not deleted) say which generation each must run
   (``Endpoint.generation``); a generation starts only once the backend's ``deploy`` handed
   it over (``handed.json``), as a run starts only once it is queued. What runs of a stopped,
   failed or deleted endpoint, of a generation a ``stop`` named, or of a generation that a
   newer one has replaced, is stopped.
2. **Admission.** A generation holds ``compute`` times its replicas
   (``admission.endpoint_demand``) of this machine and of its workspace's quota on the
   local flavor, from the moment it is admitted until it has stopped; runs and endpoints
   are admitted against the same amounts (``Agent._usage``), as a cluster's Kueue admits
   training and serving against one quota. One that waits says why, in the run's words.
   A new generation starts *beside* the one that serves (an update or a scale drops no
   request); when this machine could hold the new one only without the old, the old one is
   stopped first, and the endpoint says so.
3. **Preparing** (a worker thread): the generation's folders
   (``endpoint_files``: an attempt's layout), the project zip unpacked, the pinned model
   version staged read-only at ``TAU_MODEL_DIR`` (as a run's datasets are: ``staging``),
   the virtual environment of ``runtime.pip`` (cached per requirements, as for runs), the
   workload SDK.
4. **Starting**: one process group per generation, in the sandbox (bubblewrap, a uid of the
   endpoint's own when the agent is root), through the wrapper that keeps its capped log, in a
   cgroup with replicas times ``compute.memory`` plus room for Ray's own processes where the
   machine gives cgroups: ``python -m tau.serving`` (the SDK's runner), which starts Ray on
   loopback with the generation's CPUs and GPUs and Ray Serve's HTTP proxy on 127.0.0.1 and a
   free port, deploys the application and writes Ray Serve's status as JSON lines.
5. **Following**: each pass reads the newest status line and tells the core
   (``serving.services.observe``, only when what it says changes): ``deploying`` while it
   installs and starts, ``ready`` (with ``http://127.0.0.1:<port>``, the address the portal's
   proxy forwards to) once Ray Serve runs the application and its proxy routes to it,
   ``unhealthy`` with Ray Serve's message, ``failed`` with Ray Serve's message when it could
   not deploy the application (a wrong import path: nothing retries it). Once a new
   generation has been reported ready, the one before it is stopped after ``DRAIN_SECONDS``
   (requests the proxy sent it just before finish). Its traffic (Ray Serve's metrics, read
   by the runner) is recorded every ``METRICS_RECORD_SECONDS``.
6. **Stopping**: SIGTERM to the process group (the runner stops Ray Serve, then Ray), at
   least ``STOP_GRACE_SECONDS``, then SIGKILL; its cgroup removed, its share of the machine
   freed.

Survival. A generation's processes are not the agent's to lose: they run in a session of
their own, and the agent records their leader (pid and start time, ``process.json``), so a
new agent finds them and keeps following them — stopping the agent (or the portal) leaves
endpoints serving. One whose process ended (while an agent watched or not) after it had
served is started again, and its state says "restarted by the agent after its process
ended"; one that ended before it ever served fails, with its last words (no retry loop).
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

from django.conf import settings

from catalog.runs import StagedDataset, staged_version
from executors.local.agent import (
    admission,
    cgroups,
    environments,
    outcomes,
    processes,
    run_limits,
    staging,
)
from executors.local.agent import sandbox as sandboxing
from executors.local.agent.endpoint_files import (
    EndpointFolder,
    endpoints_root,
    figure,
    handed,
    metrics_file,
    number,
    process_record,
    read_record,
    read_status,
    status_file,
    write_record,
)
from executors.local.agent.prepare import (
    AttemptLayout,
    PreparationFailed,
    PreparationPlan,
    child_environment,
    make_directories,
    wrapped_command,
)
from runs import bundles, workload_sdk
from runs.models import Backend
from serving.models import LIVE_STATES, Endpoint, EndpointState
from serving.services import observe, record_metrics, record_model_staged
from tau.k8s_names import GPU_RESOURCE
from tau.quantity import parse_quantity
from tau.ray_cluster import free_ports
from tau.spec import Spec

logger = logging.getLogger("executors.local.agent")

#: After a new generation is reported ready (the portal's proxy now sends requests there),
#: how long the one before keeps its port open for requests already sent to it.
DRAIN_SECONDS = 3.0
#: Ray Serve lets requests in flight finish when it stops: at least this long after SIGTERM.
STOP_GRACE_SECONDS = 5.0
#: Room for Ray's own processes in a generation's memory limit (its GCS, raylet and agents,
#: Serve's controller and HTTP proxy: about 1 GiB together, measured with Ray 2.60), which a
#: cluster gives the Ray head pod.
RAY_PROCESSES_MEMORY = 1536 * 2**20
#: How often the traffic the runners measured is written to the endpoints' rows.
METRICS_RECORD_SECONDS = 15.0
#: How often a generation's folders are measured against its disk allowance (an endpoint
#: writes little: its log, Ray's session files), and the first time after it starts.
DISK_CHECK_SECONDS = 30.0
#: Words the state reason carries when a generation had to be started again.
RESTARTED = "restarted by the agent after its process ended"
#: The application's address on this machine.
LOOPBACK = "127.0.0.1"
#: The most of Ray Serve's message kept in a reason (the full traceback is in the log).
MESSAGE_LIMIT = 600


class Phase(enum.Enum):
    PREPARING = "preparing"  # folders, project, model, environment (in a worker thread)
    RUNNING = "running"  # the process group lives
    STOPPING = "stopping"  # SIGTERM sent: waiting for the group to end


@dataclass(frozen=True)
class Wanted:
    """A live endpoint of this machine, as its row says it now."""

    pk: int
    name: str
    workspace_id: int
    generation: int
    state: str
    priority_value: int


@dataclass(frozen=True)
class Preparation:
    """What a generation's worker thread made ready."""

    venv: Path
    sdk_dir: Path
    staged: staging.Staged | None


@dataclass(frozen=True)
class GenerationPlan:
    """What the worker thread needs (read from the database by the loop beforehand)."""

    layout: AttemptLayout
    bundle_sha256: str | None
    pip: tuple[str, ...]
    model: StagedDataset | None
    venvs_dir: Path
    sdk_root: Path
    sandbox: sandboxing.Sandbox | None
    uid: int | None
    #: A first start makes the folders, unpacks the project and stages the model; a restart
    #: reuses them.
    fresh: bool


@dataclass(eq=False)
class Generation:
    """One generation of one endpoint that this agent is responsible for."""

    endpoint_id: int
    name: str
    workspace_id: int
    slug: str
    number: int
    spec: Spec
    demand: dict[str, Decimal]
    layout: AttemptLayout
    model: StagedDataset | None = None
    bundle_sha256: str | None = None
    uid: int | None = None
    gpus: tuple[int, ...] = ()
    phase: Phase = Phase.PREPARING
    fresh: bool = True
    cancelled: threading.Event = field(default_factory=threading.Event)
    preparation: Future[Preparation] | None = None
    #: The leader of its process group: our child (``process``), or a predecessor's (adopted).
    process: subprocess.Popen[bytes] | None = None
    pid: int | None = None
    start_ticks: int | None = None
    port: int = 0
    cgroup: cgroups.AttemptCgroup | None = None
    #: The runner's newest status line, and where the next one starts in its file.
    status: dict[str, Any] | None = None
    status_offset: int = 0
    #: This process has served the application (so it is started again if it ends).
    served: bool = False
    #: Why it was started again, said until it serves.
    restarted: str = ""
    #: When it became the generation that answers (monotonic).
    serving_since: float | None = None
    stop_reason: str | None = None
    term_sent_at: float | None = None
    kill_sent: bool = False
    #: Its disk allowance (TAU_LOCAL_RUN_DISK, as a run's), and the measurement under way.
    disk_allowance: int | None = None
    disk_measurement: Future[run_limits.DiskUsage] | None = None
    next_disk_check: float = 0.0

    @property
    def key(self) -> tuple[int, int]:
        return (self.endpoint_id, self.number)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def status_phase(self) -> str:
        return str((self.status or {}).get("phase") or "")

    @property
    def answering(self) -> bool:
        """Its Ray Serve runs the application and routes requests to it."""
        return self.phase == Phase.RUNNING and self.status_phase in {"running", "unhealthy"}


def endpoint_markers(endpoint_id: int, generation: int) -> dict[str, str]:
    """The variables by which a generation's processes are found again after the agent that
    started them is gone: the endpoint, the generation and this installation."""
    return {
        "TAU_ENDPOINT_ID": str(endpoint_id),
        "TAU_ENDPOINT_GENERATION": str(generation),
        processes.INSTALLATION_MARKER: cgroups.installation_key(Path(settings.VAR_DIR)),
    }


def serve_application(spec: Spec) -> dict[str, Any]:
    """The Serve application's route and the builder's ``args`` (``tau.serving:app``), as a
    cluster's RayService carries them (``executors.kubernetes.render_endpoint.serve_config``):
    each replica asks Ray for one replica's ``compute``."""
    serve = spec.serve
    assert serve is not None
    cpus = parse_quantity(spec.compute.cpus)
    actor: dict[str, Any] = {"num_cpus": int(cpus) if cpus == int(cpus) else float(cpus)}
    if spec.compute.gpus:
        actor["num_gpus"] = spec.compute.gpus
    args: dict[str, Any] = {"import_path": serve.import_path, "ray_actor_options": actor}
    if serve.autoscaling is not None:
        args["autoscaling_config"] = serve.autoscaling.to_dict()
    else:
        args["num_replicas"] = serve.replicas or 1
    return {"route_prefix": serve.route_prefix, "args": args}


def memory_limit(spec: Spec) -> Decimal:
    """A generation's memory: each replica's limit (``compute.limits.memory``, else
    ``compute.memory``) times its replicas, and room for Ray's own processes."""
    replicas = admission.endpoint_replicas(spec)
    return parse_quantity(spec.compute.memory_limit) * replicas + RAY_PROCESSES_MEMORY


def prepare_generation(plan: GenerationPlan, cancelled: threading.Event) -> Preparation:
    """The project, the model and the environment; raises PreparationFailed (the worker
    thread: filesystem only)."""
    layout = plan.layout
    staged = None
    with open(layout.log, "ab", buffering=0) as log:
        if plan.fresh:
            try:
                if plan.bundle_sha256:
                    bundles.unpack(plan.bundle_sha256, layout.work)
                else:
                    layout.work.mkdir()
            except (bundles.BundleRejected, OSError) as exc:
                log.write(f"[taugrid] could not unpack the project zip: {exc}\n".encode())
                raise PreparationFailed(
                    "infrastructure", f"Could not unpack the project zip: {exc}"
                ) from None
            layout.work.chmod(0o700)
            if plan.model is not None:
                try:
                    staged = staging.stage((plan.model,), layout.data)
                except (staging.StagingFailed, OSError) as exc:
                    log.write(f"[taugrid] could not stage the model: {exc}\n".encode())
                    raise PreparationFailed(
                        "infrastructure", f"Could not stage the model: {exc}"
                    ) from None
                said = f"staged {plan.model.ref} at $TAU_MODEL_DIR: {staged.said()}"
                log.write(f"[taugrid] {said}\n".encode())
            if plan.uid is not None:
                sandboxing.chown_tree(layout.work, plan.uid, plan.uid)
        try:
            venv = environments.ensure_environment(
                plan.venvs_dir, plan.pip, log=log, cancelled=cancelled, sandbox=plan.sandbox
            )
        except environments.EnvironmentFailed as exc:
            log.write(f"[taugrid] {exc}\n".encode())
            raise PreparationFailed(
                "infrastructure", f"Could not build the Python environment: {exc}."
            ) from None
        try:
            sdk_dir = workload_sdk.materialise(plan.sdk_root)
        except OSError as exc:
            log.write(f"[taugrid] could not write the workload SDK: {exc}\n".encode())
            raise PreparationFailed(
                "infrastructure", f"Could not write the workload SDK: {exc}"
            ) from None
    return Preparation(venv=venv, sdk_dir=sdk_dir, staged=staged)


class Host(Protocol):
    """What the supervisor borrows from the agent that runs it (``supervisor.Agent``): its
    sandbox, limits, settings, GPUs, preparation threads, and the admission of its runs."""

    grace: float
    stopping: bool
    hurry: bool
    capacity: dict[str, Decimal]
    free_gpus: list[int]
    venvs_dir: Path
    sdk_root: Path
    log_limit: int
    sandbox: sandboxing.Sandbox | None
    enforcement: run_limits.Enforcement
    cgroups: cgroups.Cgroups

    def usage(self) -> admission.Usage: ...

    def quota_shares(self) -> dict[int, admission.WorkspaceShare]: ...

    def may_run(self, workspace_id: int) -> bool: ...

    def in_background(
        self, function: Callable[..., Preparation], *args: Any
    ) -> Future[Preparation]: ...

    def measure_disk(self, folders: Mapping[str, Path]) -> Future[run_limits.DiskUsage]: ...


class EndpointSupervisor:
    """The agent's endpoints (module docstring). It borrows the agent's sandbox, limits,
    preparation threads, GPUs and settings (:class:`Host`); it owns its generations."""

    def __init__(self, agent: Host) -> None:
        self.agent = agent
        self.generations: dict[tuple[int, int], Generation] = {}
        #: What was last told the core about each endpoint (generation, what was said).
        self._said: dict[int, tuple[int, tuple[Any, ...]]] = {}
        #: Generations that failed here: never started again (their endpoint is failed).
        self._failed: set[tuple[int, int]] = set()
        #: Generations whose process ended after they served: started again (and why).
        self._pending_restarts: dict[tuple[int, int], str] = {}
        self._recovered = False
        self._metrics_recorded_at = -1e9

    @property
    def grace(self) -> float:
        return max(self.agent.grace, STOP_GRACE_SECONDS)

    # --- what the agent asks ------------------------------------------------------------

    def add_usage(self, usage: admission.Usage) -> None:
        """What this machine's generations hold, whatever their phase, added to ``usage``."""
        for generation in self.generations.values():
            usage.add(generation.workspace_id, generation.demand)

    def tick(self, now: float) -> None:
        if not self._recovered:
            self.recover()
            self._recovered = True
        wanted = self._wanted()
        for generation in list(self.generations.values()):
            self._advance(generation, now, wanted)
        self._retire(now, wanted)
        if not self.agent.stopping:
            self._admit(now, wanted)
        if now - self._metrics_recorded_at >= METRICS_RECORD_SECONDS:
            self._metrics_recorded_at = now
            self._record_traffic(wanted)

    def close(self) -> None:
        """The agent stops: generations being prepared or stopped are finished off (a
        preparation is cancelled, a stop becomes a SIGKILL); those that serve keep serving."""
        for generation in self.generations.values():
            generation.cancelled.set()
            if generation.phase == Phase.STOPPING and generation.pid is not None:
                processes.signal_group(generation.pid, signal.SIGKILL)

    # --- recovery -----------------------------------------------------------------------

    def recover(self) -> None:
        """At start: follow again every generation a previous agent left running (found by
        its pid and start time), and start again the ones whose process ended meanwhile
        (their endpoint says so); stray processes of a generation whose leader was never
        recorded are stopped."""
        root = endpoints_root()
        try:
            names = sorted(os.listdir(root))
        except OSError:
            return
        rows = {
            row["pk"]: row
            for row in Endpoint.objects.unscoped()
            .filter(pk__in=[int(name) for name in names if name.isdecimal()])
            .values("pk", "name", "workspace_id", "workspace__slug", "spec", "replicas_desired")
        }
        for name in names:
            if not name.isdecimal() or int(name) not in rows:
                continue
            row = rows[int(name)]
            folder = EndpointFolder.of(row["pk"], root)
            for number_ in folder.generations():
                with contextlib.suppress(Exception):
                    self._recover_generation(row, folder, number_)

    def _recover_generation(self, row: Mapping[str, Any], folder: EndpointFolder, n: int) -> None:
        layout = folder.generation(n)
        record = read_record(process_record(layout), layout.attempt_dir) or {}
        pid = number(record.get("pid"), low=1)
        ticks = number(record.get("start_ticks"), high=2**62)
        if pid is not None and processes.is_same_process(pid, ticks):
            generation = self._generation_of(
                endpoint_id=row["pk"],
                name=row["name"],
                workspace_id=row["workspace_id"],
                slug=row["workspace__slug"],
                n=n,
                spec=admission.endpoint_spec(
                    row["spec"],
                    number(record.get("replicas"), low=1) or row["replicas_desired"],
                ),
            )
            generation.phase = Phase.RUNNING
            generation.fresh = False
            generation.pid, generation.start_ticks = pid, ticks
            generation.port = number(record.get("port"), low=1, high=65535) or 0
            generation.served = record.get("served") is True
            generation.gpus = tuple(
                gpu for gpu in record.get("gpus") or [] if isinstance(gpu, int) and gpu >= 0
            )
            for gpu in generation.gpus:
                with contextlib.suppress(ValueError):
                    self.agent.free_gpus.remove(gpu)
            self.generations[generation.key] = generation
            self._read_status(generation)
            if generation.answering and generation.served:
                generation.serving_since = time.monotonic() - DRAIN_SECONDS
            logger.info(
                "following endpoint %s generation %d again (pid %d, port %d)",
                row["name"],
                n,
                pid,
                generation.port,
            )
            return
        # Nothing of it is recorded as running: stop what may be left of it unrecorded.
        for group in sorted(
            {
                info.process_group
                for stray in processes.marked_processes(endpoint_markers(row["pk"], n))
                if (info := processes.read_process(stray)) is not None
            }
        ):
            logger.warning("stopping stray processes of endpoint %s generation %d", row["name"], n)
            processes.stop_group(group, grace=self.grace)
        if record.get("served") is True:
            # It served until it ended while no agent watched: _admit starts it again (the
            # endpoint still wants it), saying why.
            self._pending_restarts[(row["pk"], n)] = (
                "Its process ended while no agent watched; " + RESTARTED + "."
            )

    # --- what should run ------------------------------------------------------------------

    def _wanted(self) -> dict[int, Wanted]:
        rows = (
            Endpoint.objects.unscoped()
            .filter(backend=Backend.LOCAL, state__in=LIVE_STATES, deleted_at__isnull=True)
            .values_list("pk", "name", "workspace_id", "generation", "state", "priority_value")
        )
        return {row[0]: Wanted(*row) for row in rows}

    def _retire(self, now: float, wanted: dict[int, Wanted]) -> None:
        """Stop what no longer should run: everything of an endpoint that is not live, what a
        ``stop`` named, a generation replaced by a newer one that answers (after the drain),
        and an older one that never answered once a newer one exists."""
        by_endpoint: dict[int, list[Generation]] = {}
        for generation in self.generations.values():
            by_endpoint.setdefault(generation.endpoint_id, []).append(generation)
        for endpoint_id, held in by_endpoint.items():
            row = wanted.get(endpoint_id)
            stop_named = handed(EndpointFolder.of(endpoint_id)).stop
            answering = [g for g in held if g.serving_since is not None and g.answering]
            newest_answering = max(answering, key=lambda g: g.number, default=None)
            for generation in held:
                if generation.stop_reason is not None:
                    continue
                if row is None:
                    self._stop(generation, "the endpoint is not live any more", now)
                elif generation.number <= stop_named:
                    self._stop(generation, f"a stop named generation {stop_named}", now)
                elif generation.number > row.generation:
                    self._stop(generation, "newer than the endpoint's generation", now)
                elif (
                    newest_answering is not None
                    and generation.number < newest_answering.number
                    and newest_answering.serving_since is not None
                    and now - newest_answering.serving_since >= DRAIN_SECONDS
                ):
                    self._stop(generation, f"generation {newest_answering.number} answers now", now)
                elif (
                    generation.number < row.generation
                    and not generation.answering
                    and generation.serving_since is None
                ):
                    self._stop(generation, f"generation {row.generation} replaces it", now)

    # --- admission ------------------------------------------------------------------------

    def _admit(self, now: float, wanted: dict[int, Wanted]) -> None:
        due = [
            row
            for row in sorted(wanted.values(), key=lambda row: (-row.priority_value, row.pk))
            if (row.pk, row.generation) not in self.generations
            and (row.pk, row.generation) not in self._failed
            and handed(EndpointFolder.of(row.pk)).deploy >= row.generation
        ]
        if not due:
            return
        due = self._only_one_workspace_unsandboxed(due)
        specs: dict[int, Spec] = {}
        for row in due:
            try:
                specs[row.pk] = self._spec_of(row)
            except Exception as exc:  # a stored spec the current schema refuses
                self._fail(row, f"Its stored tau.yaml no longer validates: {exc}")
        usage = self.agent.usage()
        candidates = [
            admission.Candidate(
                run_id=row.pk,
                workspace_id=row.workspace_id,
                demand=admission.endpoint_demand(specs[row.pk]),
            )
            for row in due
            if row.pk in specs
        ]
        decisions = admission.plan_admission(
            candidates,
            capacity=self.agent.capacity,
            usage=usage,
            shares=self.agent.quota_shares(),
        )
        by_pk = {row.pk: row for row in due}
        for decision in decisions:
            row = by_pk[decision.run_id]
            if decision.admit:
                self._start(row, specs[row.pk])
            elif not self._replace_if_it_fits(row, specs[row.pk], now):
                self._say(row, reason=self._waiting_words(row, decision.reason))

    def _only_one_workspace_unsandboxed(self, due: list[Wanted]) -> list[Wanted]:
        """Without a sandbox, the agent runs one workspace's code only, endpoints included
        (``Agent.may_run``); the others say why."""
        allowed = [row for row in due if self.agent.may_run(row.workspace_id)]
        for row in due:
            if row not in allowed:
                self._say(row, reason=UNSANDBOXED_ENDPOINT)
        return allowed

    def _replace_if_it_fits(self, row: Wanted, spec: Spec, now: float) -> bool:
        """When this machine could never hold the new generation beside the ones before it,
        even idle (a scale or an update of an endpoint as large as the machine, or as its
        workspace's quota), but could hold it alone, stop those first: the endpoint answers
        nothing until the new one does, and says so. (Waiting for a run to end is waiting.)"""
        older = [
            g
            for g in self.generations.values()
            if g.endpoint_id == row.pk and g.stop_reason is None
        ]
        if not older:
            return False
        beside_older = admission.Usage()
        for generation in older:
            beside_older.add(generation.workspace_id, generation.demand)
        demand = admission.endpoint_demand(spec)
        (decision,) = admission.plan_admission(
            [admission.Candidate(row.pk, row.workspace_id, demand)],
            capacity=self.agent.capacity,
            usage=beside_older,
            shares=self.agent.quota_shares(),
        )
        if decision.admit or admission.never_fits(demand, self.agent.capacity):
            return False
        before = ", ".join(str(g.number) for g in sorted(older, key=lambda g: g.number))
        for generation in older:
            self._stop(generation, f"no room beside generation {row.generation}", now)
        self._say(
            row,
            reason=f"This machine has no room for generation {row.generation} beside "
            f"generation {before}: that one stops first, so requests fail until generation "
            f"{row.generation} answers.",
        )
        return True

    def _waiting_words(self, row: Wanted, reason: str) -> str:
        said = reason.replace("The run needs", "It needs").replace("the run", "the endpoint")
        if row.generation > 1:
            return f"Generation {row.generation} waits: {said}"
        return said

    # --- starting ---------------------------------------------------------------------------

    def _spec_of(self, row: Wanted) -> Spec:
        data, replicas = (
            Endpoint.objects.unscoped().filter(pk=row.pk).values_list("spec", "replicas_desired")[0]
        )
        return admission.endpoint_spec(data, replicas)

    def _generation_of(
        self, *, endpoint_id: int, name: str, workspace_id: int, slug: str, n: int, spec: Spec
    ) -> Generation:
        sandbox = self.agent.sandbox
        return Generation(
            endpoint_id=endpoint_id,
            name=name,
            workspace_id=workspace_id,
            slug=slug,
            number=n,
            spec=spec,
            demand=admission.endpoint_demand(spec),
            layout=EndpointFolder.of(endpoint_id).generation(n),
            uid=sandbox.endpoint_uid(endpoint_id) if sandbox is not None else None,
        )

    def _start(self, row: Wanted, spec: Spec) -> None:
        """Admitted: read what the worker thread needs, then prepare it there. What cannot
        start fails the endpoint, saying why (it is not tried again at every pass)."""
        try:
            generation = self._generation_for(row, spec)
        except Exception as exc:
            logger.exception("could not start endpoint %s generation %d", row.name, row.generation)
            self._fail(row, f"Could not start it: {exc}")
            return
        gpu_count = int(generation.demand.get(GPU_RESOURCE, 0))
        generation.gpus = tuple(self.agent.free_gpus[:gpu_count])
        del self.agent.free_gpus[:gpu_count]
        self.generations[generation.key] = generation
        logger.info("starting endpoint %s generation %d", row.name, row.generation)
        try:
            self._prepare(generation)
        except Exception as exc:
            logger.exception("could not start endpoint %s generation %d", row.name, row.generation)
            self._forget(generation)
            self._fail(row, f"Could not start it: {exc}")
            return
        if generation.restarted and row.state in (EndpointState.READY, EndpointState.UPDATING):
            # Nothing answers until it serves again (the proxy answers 409 meanwhile).
            self._say(
                row,
                state=EndpointState.UNHEALTHY,
                reason=self._preparing_words(generation),
                replicas_ready=0,
            )
        else:
            self._say(row, reason=self._preparing_words(generation))

    def _generation_for(self, row: Wanted, spec: Spec) -> Generation:
        endpoint = (
            Endpoint.objects.unscoped()
            .select_related("workspace", "bundle", "model_version__asset__workspace")
            .get(pk=row.pk)
        )
        generation = self._generation_of(
            endpoint_id=row.pk,
            name=row.name,
            workspace_id=row.workspace_id,
            slug=endpoint.workspace.slug,
            n=row.generation,
            spec=spec,
        )
        generation.bundle_sha256 = endpoint.bundle.sha256 if endpoint.bundle is not None else None
        if endpoint.model_version is not None:
            generation.model = staged_version(endpoint.model_version, path="")
        generation.restarted = self._pending_restarts.pop(generation.key, "")
        generation.fresh = not (generation.restarted and generation.layout.work.is_dir())
        return generation

    def _prepare(self, generation: Generation) -> None:
        layout = generation.layout
        if generation.fresh:
            make_directories(layout, uid=generation.uid)
        else:
            layout.attempt_dir.mkdir(parents=True, exist_ok=True)
            for stale in (status_file(layout), metrics_file(layout), layout.outcome):
                with contextlib.suppress(OSError):
                    stale.unlink()
            # A fresh log (capped anew), the one before kept beside it.
            with contextlib.suppress(OSError):
                os.replace(layout.log, layout.log.with_name(f"{layout.log.name}.before-restart"))
            descriptor = os.open(layout.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(descriptor, "ab") as log:
                log.write(f"[taugrid] {generation.restarted}\n".encode())
        plan = GenerationPlan(
            layout=layout,
            bundle_sha256=generation.bundle_sha256,
            pip=tuple(generation.spec.runtime.pip),
            model=generation.model,
            venvs_dir=self.agent.venvs_dir,
            sdk_root=self.agent.sdk_root,
            sandbox=self.agent.sandbox,
            uid=generation.uid,
            fresh=generation.fresh,
        )
        generation.phase = Phase.PREPARING
        generation.preparation = self.agent.in_background(
            prepare_generation, plan, generation.cancelled
        )

    def _spawn(self, generation: Generation, prepared: Preparation) -> None:
        """The process group: the runner in the sandbox, through the wrapper, in its cgroup."""
        spec = generation.spec
        layout = generation.layout
        generation.port = free_ports(1)[0]
        generation.status, generation.status_offset = None, 0
        limits = self.agent.enforcement.for_attempt(memory_limit(spec))
        platform_env = {
            "TAU_ENDPOINT": generation.name,
            "TAU_ENDPOINT_ID": str(generation.endpoint_id),
            "TAU_ENDPOINT_GENERATION": str(generation.number),
            "TAU_WORKSPACE": generation.slug,
            "TAU_API_URL": settings.TAU_API_URL,
            "CUDA_VISIBLE_DEVICES": ",".join(str(index) for index in generation.gpus),
        }
        if generation.model is not None:
            platform_env["TAU_MODEL_DIR"] = str(layout.data)
        plan = PreparationPlan(
            layout=layout,
            spec=spec,
            bundle_sha256=generation.bundle_sha256,
            venvs_dir=self.agent.venvs_dir,
            platform_env=platform_env,
            sandbox=self.agent.sandbox,
            uid=generation.uid,
            gpu_count=len(generation.gpus),
            log_limit=self.agent.log_limit,
            sdk_root=self.agent.sdk_root,
            limits=limits,
            datasets=(generation.model,) if generation.model is not None else (),
        )
        replicas = admission.endpoint_replicas(spec)
        cpus = parse_quantity(spec.compute.cpus) * replicas
        runner = [
            str(prepared.venv / "bin" / "python"),
            "-m",
            "tau.serving",
            "--name",
            generation.name,
            "--port",
            str(generation.port),
            "--status-dir",
            str(layout.output),
            "--cpus",
            format(float(cpus), "g"),
            "--gpus",
            str(spec.compute.gpus * replicas),
            "--application",
            json.dumps(serve_application(spec)),
        ]
        command = wrapped_command(plan, runner, venv=prepared.venv, sdk_dir=prepared.sdk_dir)
        env = child_environment(
            venv=prepared.venv,
            layout=layout,
            spec_env=spec.runtime.env_dict(),
            platform_env=platform_env,
            sdk_dir=prepared.sdk_dir,
        )
        # The project on the path too: Ray Serve imports the application in its own workers.
        env["PYTHONPATH"] = workload_sdk.python_path(
            f"{prepared.sdk_dir}:{layout.work}", spec.runtime.env_dict().get("PYTHONPATH")
        )
        if self.agent.cgroups.hierarchies and limits.memory is not None:
            generation.cgroup = self.agent.cgroups.create(
                endpoint_cgroup(generation.endpoint_id, generation.number),
                memory=limits.memory,
                processes=limits.processes,
            )
            command = generation.cgroup.enter_command(
                command, python=environments.base_interpreter()
            )
        log = os.open(layout.log, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        try:
            process = sandboxing.start(
                command,
                environment=env,
                env=environments.launcher_environment(
                    endpoint_markers(generation.endpoint_id, generation.number)
                ),
                cwd=layout.work,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                close_fds=True,
                start_new_session=True,  # its own session: the agent's end is not its end
            )
        finally:
            os.close(log)
        generation.process = process
        generation.pid = process.pid
        generation.start_ticks = processes.start_ticks(process.pid)
        generation.phase = Phase.RUNNING
        generation.disk_allowance = limits.disk
        generation.next_disk_check = time.monotonic() + DISK_CHECK_SECONDS
        self._write_process_record(generation)
        logger.info(
            "started endpoint %s generation %d as pid %d on port %d",
            generation.name,
            generation.number,
            process.pid,
            generation.port,
        )

    def _write_process_record(self, generation: Generation) -> None:
        write_record(
            process_record(generation.layout),
            {
                "pid": generation.pid,
                "start_ticks": generation.start_ticks,
                "port": generation.port,
                "gpus": list(generation.gpus),
                "replicas": admission.endpoint_replicas(generation.spec),
                "served": generation.served,
            },
        )

    # --- following ----------------------------------------------------------------------

    def _advance(self, generation: Generation, now: float, wanted: dict[int, Wanted]) -> None:
        try:
            if generation.phase == Phase.PREPARING:
                self._advance_preparing(generation, wanted)
            elif generation.phase == Phase.RUNNING:
                self._advance_running(generation, now, wanted)
            if generation.phase == Phase.STOPPING:
                self._advance_stopping(generation, now)
        except Exception:
            logger.exception(
                "supervising endpoint %s generation %d failed", generation.name, generation.number
            )
            if generation.phase == Phase.PREPARING and generation.preparation is None:
                self._forget(generation)

    def _advance_preparing(self, generation: Generation, wanted: dict[int, Wanted]) -> None:
        preparation = generation.preparation
        if preparation is None or not preparation.done():
            return
        row = wanted.get(generation.endpoint_id)
        try:
            prepared = preparation.result()
        except environments.BuildCancelled:
            self._forget(generation)
            return
        except PreparationFailed as exc:
            self._forget(generation)
            if row is not None and row.generation == generation.number:
                self._fail(row, exc.message)
            return
        except Exception as exc:
            logger.exception("preparing endpoint %s failed", generation.name)
            self._forget(generation)
            if row is not None and row.generation == generation.number:
                self._fail(row, f"Could not prepare it: {exc}")
            return
        if generation.stop_reason is not None or row is None:
            self._forget(generation)
            return
        if prepared.staged is not None and row.generation == generation.number:
            # In its history, as a cluster's stager reports it (and a run's datasets are).
            record_model_staged(
                Endpoint(pk=row.pk),
                files=prepared.staged.files,
                bytes=prepared.staged.bytes,
                seconds=prepared.staged.seconds,
            )
        try:
            self._spawn(generation, prepared)
        except (OSError, cgroups.CgroupFailed) as exc:
            self._note(generation, f"could not start it: {exc}")
            self._forget(generation)
            self._fail(row, f"Could not start it: {exc}.")
            return
        self._say_progress(generation, row)

    def _advance_running(
        self, generation: Generation, now: float, wanted: dict[int, Wanted]
    ) -> None:
        if self._process_ended(generation):
            self._after_end(generation, wanted)
            return
        self._check_disk(generation, now, wanted)
        if not self._read_status(generation):
            return
        row = wanted.get(generation.endpoint_id)
        if row is None or generation.stop_reason is not None:
            return
        if generation.answering and not generation.served:
            generation.served = True
            self._write_process_record(generation)
        self._say_progress(generation, row)

    def _check_disk(self, generation: Generation, now: float, wanted: dict[int, Wanted]) -> None:
        """Its folders against its disk allowance, as a run's (``run_limits``): over it, the
        endpoint fails, saying how much it used where, and its processes are stopped."""
        if generation.stop_reason is not None:
            return
        measured = generation.disk_measurement
        if measured is not None:
            if not measured.done():
                return
            generation.disk_measurement = None
            try:
                why = run_limits.overrun(measured.result(), self._allowance(generation))
            except Exception:
                logger.exception("measuring the disk use of endpoint %s failed", generation.name)
                why = None
            if why is not None:
                self._note(generation, why)
                self._stop(generation, "over its disk allowance", now)
                row = wanted.get(generation.endpoint_id)
                if row is not None:
                    self._fail(row, why)
                return
        if now >= generation.next_disk_check:
            layout = generation.layout
            generation.disk_measurement = self.agent.measure_disk(
                {
                    "work/": layout.work,
                    "output/": layout.output,
                    "tmp/": layout.tmp,
                    "shm/": layout.shm,
                }
            )
            generation.next_disk_check = now + DISK_CHECK_SECONDS

    def _allowance(self, generation: Generation) -> int:
        if generation.disk_allowance is None:  # adopted from an agent before
            generation.disk_allowance = self.agent.enforcement.allowances.disk
        return generation.disk_allowance

    def _read_status(self, generation: Generation) -> bool:
        """Take in the runner's newest status line; True when there was one."""
        layout = generation.layout
        line, generation.status_offset = read_status(
            status_file(layout), layout.output, generation.status_offset
        )
        if line is None:
            return False
        generation.status = line
        return True

    def _process_ended(self, generation: Generation) -> bool:
        if generation.process is not None:
            return processes.child_exit_status(generation.process.pid) is not None
        assert generation.pid is not None
        return not processes.is_same_process(generation.pid, generation.start_ticks)

    def _after_end(self, generation: Generation, wanted: dict[int, Wanted]) -> None:
        """Its leader ended by itself (nobody here stopped it)."""
        pid = generation.pid
        assert pid is not None
        if processes.group_members(pid, exclude=pid):
            processes.signal_group(pid, signal.SIGKILL)  # leftovers (none, in a sandbox)
            return  # reaped on a later pass, once they are gone
        self._reap(generation)
        how = self._how_it_ended(generation)
        self._note(generation, f"its process ended: {how}")
        logger.warning(
            "endpoint %s generation %d: its process ended: %s",
            generation.name,
            generation.number,
            how,
        )
        row = wanted.get(generation.endpoint_id)
        served = generation.served
        if row is None or self._replaced(generation, row):
            self._forget(generation)
            return
        if generation.status_phase == "deploy_failed":
            self._forget(generation)
            self._fail(row, self._deploy_failed_words(generation))
            return
        if not served:
            self._forget(generation)
            self._fail(row, f"Its process ended before Ray Serve answered: {how}")
            return
        self._forget(generation)
        if generation.number != row.generation:
            return  # the newest generation, starting, replaces it
        # It served: start it again (its restart must serve again before another).
        said = f"Its process ended ({how}); {RESTARTED}."
        self._pending_restarts[generation.key] = said
        if row.state in (EndpointState.READY, EndpointState.UPDATING):
            self._say(row, state=EndpointState.UNHEALTHY, reason=said, replicas_ready=0)

    def _replaced(self, generation: Generation, row: Wanted) -> bool:
        """A newer generation took over (or will): this one is not started again."""
        return generation.number < row.generation and any(
            g.endpoint_id == generation.endpoint_id and g.number > generation.number
            for g in self.generations.values()
        )

    def _how_it_ended(self, generation: Generation) -> str:
        recorded = outcomes.read_outcome(generation.layout.outcome)
        last = outcomes.last_log_line(generation.layout.log)
        tail = f"; its last output: {last}" if last else ""
        if recorded is None:
            return "it left no record of how" + tail
        if recorded.signal is not None:
            return f"stopped by {processes.signal_name(recorded.signal)}" + tail
        return f"exit code {recorded.exit_code}" + tail

    # --- stopping ---------------------------------------------------------------------------

    def _stop(self, generation: Generation, why: str, now: float) -> None:
        if generation.stop_reason is not None:
            return
        generation.stop_reason = why
        generation.cancelled.set()
        logger.info(
            "stopping endpoint %s generation %d: %s", generation.name, generation.number, why
        )
        if generation.phase == Phase.RUNNING and generation.pid is not None:
            self._note(generation, f"stopping it: {why}")
            processes.signal_group(generation.pid, signal.SIGTERM)
            generation.term_sent_at = now
            generation.phase = Phase.STOPPING

    def _advance_stopping(self, generation: Generation, now: float) -> None:
        pid = generation.pid
        assert pid is not None
        leader_gone = self._process_ended(generation)
        if leader_gone and not processes.group_members(pid, exclude=pid):
            self._reap(generation)
            with contextlib.suppress(OSError):
                process_record(generation.layout).unlink()
            self._forget(generation)
            logger.info("stopped endpoint %s generation %d", generation.name, generation.number)
            return
        started = generation.term_sent_at if generation.term_sent_at is not None else now
        if not generation.kill_sent and (self.agent.hurry or now - started >= self.grace):
            processes.signal_group(pid, signal.SIGKILL)
            generation.kill_sent = True

    def _reap(self, generation: Generation) -> None:
        if generation.process is not None:
            with contextlib.suppress(ChildProcessError, subprocess.TimeoutExpired):
                generation.process.wait(timeout=1)

    def _forget(self, generation: Generation) -> None:
        """It holds nothing any more: its cgroup, its GPUs, its share of the machine."""
        generation.cancelled.set()
        if generation.cgroup is not None and not generation.cgroup.released:
            generation.cgroup.release()
        elif generation.process is None and generation.phase != Phase.PREPARING:
            # Adopted from an agent before: its cgroup, if it had one, is found by name.
            self._release_cgroup_by_name(generation)
        self.agent.free_gpus.extend(g for g in generation.gpus if g not in self.agent.free_gpus)
        generation.gpus = ()
        self.generations.pop(generation.key, None)

    def _release_cgroup_by_name(self, generation: Generation) -> None:
        name = endpoint_cgroup(generation.endpoint_id, generation.number)
        found = tuple(
            (hierarchy, hierarchy.base / name)
            for hierarchy in self.agent.cgroups.hierarchies
            if (hierarchy.base / name).is_dir()
        )
        if found:
            cgroups.AttemptCgroup(name=name, directories=found).release()

    # --- telling the core ---------------------------------------------------------------

    def _say_progress(self, generation: Generation, row: Wanted) -> None:
        """What the newest generation's runner says, in the endpoint's words (older ones are
        followed, not reported: the endpoint is its newest generation's)."""
        if generation.number != row.generation:
            return
        status = generation.status or {}
        phase = generation.status_phase
        running = number(status.get("running")) or 0
        target = number(status.get("target")) or 0
        if phase == "deploy_failed":
            self._fail(row, self._deploy_failed_words(generation))
            return
        if phase == "running" and generation.answering:
            restarted = f" ({RESTARTED})" if generation.restarted else ""
            self._say(
                row,
                state=EndpointState.READY,
                reason=f"Answering requests: {running} of {target} replicas running{restarted}.",
                replicas_ready=running,
                url=generation.url,
            )
            if generation.serving_since is None:
                generation.serving_since = time.monotonic()
                write_record(
                    EndpointFolder.of(generation.endpoint_id).serving,
                    {
                        "generation": generation.number,
                        "port": generation.port,
                        "url": generation.url,
                    },
                )
            return
        if phase == "unhealthy":
            self._say(
                row,
                state=EndpointState.UNHEALTHY,
                reason=unhealthy_words(status),
                replicas_ready=running,
            )
            return
        if phase == "deploying":
            words = (
                f"Ray Serve is deploying the application: {running} of {target} replicas running."
            )
        elif phase == "starting":
            words = "Starting Ray Serve on this machine (its own Ray, on loopback)."
        else:
            words = "Starting Ray Serve on this machine (its own Ray, on loopback)."
        self._say(row, reason=self._words(generation, words))

    def _preparing_words(self, generation: Generation) -> str:
        pip = generation.spec.runtime.pip
        ready = environments.is_ready(environments.environment_path(self.agent.venvs_dir, pip))
        if pip and not ready:
            return self._words(
                generation,
                f"Installing its environment ({len(pip)} pip requirement"
                f"{'s' if len(pip) != 1 else ''}; endpoints and runs with the same "
                "requirements reuse it), then starting Ray Serve.",
            )
        return self._words(
            generation, "Starting Ray Serve on this machine (its own Ray, on loopback)."
        )

    def _words(self, generation: Generation, words: str) -> str:
        """A progress reason: why it was started again, which generation (during a roll-out)
        and which one answers meanwhile."""
        meanwhile = self._meanwhile(generation)
        lead = f"Generation {generation.number}: " if meanwhile else ""
        restarted = f"{generation.restarted} " if generation.restarted else ""
        return f"{restarted}{lead}{words}{meanwhile}"

    def _meanwhile(self, generation: Generation) -> str:
        older = [
            g.number
            for g in self.generations.values()
            if g.endpoint_id == generation.endpoint_id
            and g.number < generation.number
            and g.answering
            and g.stop_reason is None
        ]
        return f" Generation {max(older)} answers meanwhile." if older else ""

    def _deploy_failed_words(self, generation: Generation) -> str:
        return "Ray Serve could not deploy the application: " + deploy_failed_message(
            generation.status or {}
        )

    def _fail(self, row: Wanted, reason: str) -> None:
        self._failed.add((row.pk, row.generation))
        self._say(row, state=EndpointState.FAILED, reason=reason, replicas_ready=0)

    def _say(
        self,
        row: Wanted,
        *,
        reason: str,
        state: EndpointState | None = None,
        replicas_ready: int | None = None,
        url: str | None = None,
    ) -> None:
        """Tell the core, once per change."""
        said = (state, reason, replicas_ready, url)
        if self._said.get(row.pk) == (row.generation, said):
            return
        observe(
            Endpoint(pk=row.pk),
            state=state,
            reason=reason,
            replicas_ready=replicas_ready,
            url=url,
            generation=row.generation,
        )
        self._said[row.pk] = (row.generation, said)

    def _note(self, generation: Generation, message: str) -> None:
        """A line from the platform in the generation's log."""
        with contextlib.suppress(OSError), open(generation.layout.log, "ab") as log:
            log.write(f"[taugrid] {message}\n".encode())

    def _record_traffic(self, wanted: dict[int, Wanted]) -> None:
        """What each answering generation's runner last measured, on its endpoint's row."""
        for generation in self.generations.values():
            row = wanted.get(generation.endpoint_id)
            if row is None or not generation.answering or generation.serving_since is None:
                continue
            layout = generation.layout
            data = read_record(metrics_file(layout), layout.output)
            if data is None:
                continue
            error_rate = figure(data.get("error_rate"))
            record_metrics(
                Endpoint(pk=row.pk, workspace_id=row.workspace_id),
                requests_per_second=figure(data.get("requests_per_second")),
                latency_p95_ms=figure(data.get("latency_p95_ms")),
                error_rate=min(error_rate, 1.0) if error_rate is not None else None,
            )


UNSANDBOXED_ENDPOINT = (
    "Not started: this machine cannot sandbox what it runs, so the local executor runs the "
    "code of one other workspace only. An administrator can install bubblewrap (bwrap), or "
    "set TAU_LOCAL_EXECUTOR_UNSANDBOXED=true to run every workspace's code unsandboxed."
)


def endpoint_cgroup(endpoint_id: int, generation: int) -> str:
    """A generation's cgroup: not an attempt's (``cgroups.ATTEMPT_PREFIX``), so the runs'
    sweep, which removes attempt cgroups nobody supervises, never touches it."""
    return f"endpoint-{endpoint_id}-generation-{generation}"


def deploy_failed_message(status: dict[str, Any]) -> str:
    """Ray Serve's message when it could not deploy the application: its last line, the
    exception (the traceback before it is in the log), ANSI colours removed."""
    message = str(status.get("message") or "")
    for deployment in (status.get("deployments") or {}).values():
        if isinstance(deployment, dict) and deployment.get("status") == "DEPLOY_FAILED":
            message = message or str(deployment.get("message") or "")
    lines = [_plain(line) for line in message.splitlines() if _plain(line)]
    said = lines[-1] if lines else "Ray Serve gave no message."
    return said if len(said) <= MESSAGE_LIMIT else said[: MESSAGE_LIMIT - 1] + "…"


def unhealthy_words(status: dict[str, Any]) -> str:
    """Ray Serve's own words when it says the application is unhealthy."""
    messages = [str(status.get("message") or "")]
    for name, deployment in sorted((status.get("deployments") or {}).items()):
        if isinstance(deployment, dict) and deployment.get("status") == "UNHEALTHY":
            messages.append(f"{name}: {deployment.get('message') or ''}")
    said = " ".join("; ".join(m for m in map(_plain, messages) if m).split())
    said = said or "Ray Serve reports the application unhealthy."
    return said if len(said) <= MESSAGE_LIMIT else said[: MESSAGE_LIMIT - 1] + "…"


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text).strip()
