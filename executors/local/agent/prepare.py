"""Everything an attempt needs on disk before its process starts, and the command to start.

Layout, under ``VAR_DIR/runs/<run id>/`` (``runs_root()``)::

    checkpoints/          TAU_CHECKPOINT_DIR, shared by all attempts so a retry can resume
    attempt-<n>/
        run.log           stdout and stderr (and the environment build's output), capped
        work/             the code bundle unpacked (the working directory, and HOME)
        output/           TAU_OUTPUT_DIR (metrics file, artifacts)
        data/             TAU_DATA_DIR: the dataset versions it reads (staging), read-only
        tmp/              TMPDIR (and /tmp, unless a memory cgroup holds the run)
        shm/              /dev/shm, unless a memory cgroup holds the run
        status/           outcome.json, written by the wrapper when the workload ends
        sandbox/          the passwd and group files the sandbox shows

A multi-worker run (``compute.workers`` > 1, ``workload_kind: job``: :func:`local_workers`)
starts one process per worker, each in a sandbox of its own, as a cluster starts one pod per
worker. Worker 0 has the folders above; worker *r* > 0 has its own log ``worker-<r>.log``,
outcome folder ``status-<r>/`` and ``TAU_OUTPUT_DIR`` ``output/worker-<r>/`` (so the run's
metrics file and artifacts are worker 0's unless a workload writes them elsewhere), and
shares ``work/``, ``tmp/`` and ``checkpoints/`` with the others.

A RayJob whose ``runtime.pip`` installs Ray (:func:`runs_on_ray`) starts one process,
``tau.ray_cluster``, which starts a Ray head and ``compute.workers`` worker nodes on loopback
for the attempt and runs the entry point on them as its driver, as KubeRay starts a head pod,
worker pods and the driver for the rendered RayJob (docs/distributed.md).

Only ``work/``, ``output/``, ``tmp/``, ``checkpoints/`` (and ``status/``, for the wrapper) are
mounted into the attempt's sandbox (``tmp/`` is its ``/tmp`` too, unless a memory cgroup
holds the run: ``run_limits``); the log and everything else stay outside. When the agent
is root, the folders the workload writes belong to the run's own uid (``sandbox``), and
``status/`` to root.

This runs in a worker thread (building an environment can take minutes) and touches only
the filesystem; the database is the main loop's.
"""

from __future__ import annotations

import os
import shlex
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from django.conf import settings

from catalog.runs import StagedDataset
from executors.local.agent import environments, staging
from executors.local.agent import sandbox as sandboxing
from executors.local.agent.run_limits import AttemptLimits
from runs import bundles, workload_sdk
from tau.quantity import parse_quantity
from tau.spec import Spec

LOG_NAME = "run.log"
OUTCOME_NAME = "outcome.json"  # wrapper.OUTCOME_NAME (the wrapper imports nothing of ours)


class PreparationFailed(RuntimeError):
    """The attempt cannot start. ``failure_class`` says whose fault it is."""

    def __init__(self, failure_class: str, message: str) -> None:
        super().__init__(message)
        self.failure_class = failure_class
        self.message = message


def runs_root() -> Path:
    """Where local runs live: ``VAR_DIR/runs`` (derived when asked, so it follows VAR_DIR)."""
    return Path(settings.VAR_DIR) / "runs"


def venvs_root() -> Path:
    """Where the runs' environments live: ``TAU_LOCAL_VENVS_DIR``, else ``VAR_DIR/venvs``
    (derived when asked, so it follows VAR_DIR)."""
    configured = str(getattr(settings, "TAU_LOCAL_VENVS_DIR", "") or "")
    return Path(configured).resolve() if configured else Path(settings.VAR_DIR) / "venvs"


@dataclass(frozen=True)
class AttemptLayout:
    run_dir: Path
    attempt_dir: Path

    @classmethod
    def for_attempt(cls, runs_dir: Path, run_id: int, number: int) -> AttemptLayout:
        run_dir = runs_dir / str(run_id)
        return cls(run_dir=run_dir, attempt_dir=run_dir / f"attempt-{number}")

    @property
    def log(self) -> Path:
        return self.attempt_dir / LOG_NAME

    @property
    def work(self) -> Path:
        return self.attempt_dir / "work"

    @property
    def output(self) -> Path:
        return self.attempt_dir / "output"

    @property
    def tmp(self) -> Path:
        return self.attempt_dir / "tmp"

    @property
    def data(self) -> Path:
        """TAU_DATA_DIR: the run's datasets, staged (``staging``), read-only in the sandbox."""
        return self.attempt_dir / "data"

    @property
    def shm(self) -> Path:
        return self.attempt_dir / "shm"

    @property
    def status(self) -> Path:
        return self.attempt_dir / "status"

    @property
    def outcome(self) -> Path:
        return self.status / OUTCOME_NAME

    @property
    def sandbox_etc(self) -> Path:
        return self.attempt_dir / "sandbox"

    def worker_log(self, rank: int) -> Path:
        """Worker ``rank``'s log (worker 0's is the attempt's)."""
        return self.log if rank == 0 else self.attempt_dir / f"worker-{rank}.log"

    def worker_status(self, rank: int) -> Path:
        return self.status if rank == 0 else self.attempt_dir / f"status-{rank}"

    def worker_outcome(self, rank: int) -> Path:
        return self.worker_status(rank) / OUTCOME_NAME

    def worker_output(self, rank: int) -> Path:
        return self.output if rank == 0 else self.output / f"worker-{rank}"

    def workers_started(self) -> int:
        """How many workers the attempt's folders were made for (the folders say it after a
        restart of the agent, whatever the spec says now)."""
        rank = 1
        while self.worker_status(rank).is_dir():
            rank += 1
        return rank

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"


@dataclass(frozen=True)
class PreparationPlan:
    layout: AttemptLayout
    spec: Spec
    bundle_sha256: str | None
    venvs_dir: Path
    # TAU_* variables (everything but the token, which the main loop adds at start).
    platform_env: Mapping[str, str]
    sandbox: sandboxing.Sandbox | None = None
    uid: int | None = None  # the workload's own uid (a privileged sandbox only)
    gpu_count: int = 0
    log_limit: int | None = None  # TAU_RUN_LOG_MAX_BYTES, kept by the wrapper
    # Where the workload SDK is written (``runs.workload_sdk``); None = no SDK on the path.
    sdk_root: Path | None = None
    # Its /tmp and the workload's resource limits (``run_limits``); None = none (tests).
    limits: AttemptLimits | None = None
    # The dataset versions it reads (``catalog.runs.staging_plan``), staged under data/.
    datasets: tuple[StagedDataset, ...] = ()


@dataclass(frozen=True)
class Prepared:
    #: One per worker (:func:`local_workers`), each reading the workload's environment from
    #: ``sandbox.ENVIRONMENT_FD``.
    commands: tuple[list[str], ...]
    env: dict[str, str]  # the workload's environment: for the wrapper, never the launcher
    cwd: Path
    #: What staging its datasets took; None = it reads none.
    staged: staging.Staged | None = None

    @property
    def command(self) -> list[str]:
        """Worker 0's (a single-worker run's only) command."""
        return self.commands[0]


def runs_on_ray(spec: Spec) -> bool:
    """Whether an attempt of ``spec`` runs on a Ray cluster of its own here
    (``tau.ray_cluster``: a head and ``compute.workers`` worker nodes on loopback): a RayJob
    whose ``runtime.pip`` installs Ray. A RayJob without Ray in its environment runs its entry
    point as one process (a sweep's trials under ``tau.sweep``), as before there was a cluster
    here: its program does not use Ray, or has no Ray to use."""
    return spec.run.workload_kind == "rayjob" and spec.runtime.installs("ray")


def ray_cluster_options(spec: Spec) -> list[str]:
    """``tau.ray_cluster``'s options: one worker node per ``compute.workers``, each with one
    worker's CPUs, GPUs and memory (Ray's ``memory`` resource), as each worker pod has."""
    compute = spec.compute
    return [
        "--workers",
        str(compute.workers),
        "--cpus",
        format(float(parse_quantity(compute.cpus)), "g"),
        "--memory",
        str(int(parse_quantity(compute.memory))),
        "--gpus",
        str(compute.gpus),
    ]


def local_workers(spec: Spec) -> int:
    """How many processes an attempt of ``spec`` starts here: one per worker for a Job (as
    a cluster starts one pod per worker), else one — a RayJob's head and worker nodes
    (:func:`runs_on_ray`) and a sweep's trials run inside that one process's resources."""
    if spec.run.workload_kind == "job" and not spec.execution.is_sweep:
        return spec.compute.workers
    return 1


def make_directories(layout: AttemptLayout, *, uid: int | None = None, workers: int = 1) -> None:
    """The attempt's folders and an empty log (one per worker); an older folder of the same
    number (a database restored from a backup, say) is moved aside, never reused or deleted.
    ``uid``: the run's own user, who gets the folders the workload writes."""
    layout.run_dir.mkdir(parents=True, exist_ok=True)
    if layout.attempt_dir.exists():
        aside = layout.attempt_dir.with_name(f"{layout.attempt_dir.name}.old-{int(time.time())}")
        os.rename(layout.attempt_dir, aside)
    layout.attempt_dir.mkdir(mode=0o700)
    layout.output.mkdir(mode=0o700)
    layout.tmp.mkdir(mode=0o700)
    layout.shm.mkdir(mode=0o700)
    layout.status.mkdir(mode=0o700)
    layout.checkpoints.mkdir(mode=0o700, exist_ok=True)
    for rank in range(1, workers):
        layout.worker_status(rank).mkdir(mode=0o700)
        layout.worker_output(rank).mkdir(mode=0o700)
    for rank in range(workers):
        descriptor = os.open(layout.worker_log(rank), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(descriptor)
    if uid is not None:
        outputs = [layout.worker_output(rank) for rank in range(workers)]
        for folder in (*outputs, layout.tmp, layout.shm, layout.checkpoints):
            os.chown(folder, uid, uid, follow_symlinks=False)


def prepare(plan: PreparationPlan, cancelled: threading.Event) -> Prepared:
    """Unpack, link, build the environment, work out the command. Raises PreparationFailed."""
    layout = plan.layout
    spec = plan.spec
    with open(layout.log, "ab", buffering=0) as log:
        if plan.bundle_sha256:
            try:
                bundles.unpack(plan.bundle_sha256, layout.work)
            except (bundles.BundleRejected, OSError) as exc:
                log.write(f"[taugrid] could not unpack the code bundle: {exc}\n".encode())
                raise PreparationFailed(
                    "infrastructure", f"Could not unpack the code bundle: {exc}"
                ) from None
        else:
            layout.work.mkdir()
        layout.work.chmod(0o700)
        staged = None
        if plan.datasets:
            try:
                staged = staging.stage(plan.datasets, layout.data)
            except (staging.StagingFailed, OSError) as exc:
                log.write(f"[taugrid] could not stage its datasets: {exc}\n".encode())
                raise PreparationFailed(
                    "infrastructure", f"Could not stage its datasets: {exc}"
                ) from None
            refs = ", ".join(f"{item.ref} at $TAU_DATA_DIR/{item.path}" for item in plan.datasets)
            log.write(f"[taugrid] staged {refs}: {staged.said()}\n".encode())
        _link_checkpoint_dir(layout, spec.resilience.checkpoint_dir)
        if plan.uid is not None:
            sandboxing.chown_tree(layout.work, plan.uid, plan.uid)
        command = entrypoint_command(spec, layout.work)
        try:
            venv = environments.ensure_environment(
                plan.venvs_dir,
                spec.runtime.pip,
                log=log,
                cancelled=cancelled,
                sandbox=plan.sandbox,
            )
        except environments.EnvironmentFailed as exc:
            log.write(f"[taugrid] {exc}\n".encode())
            raise PreparationFailed(
                "infrastructure", f"Could not build the Python environment: {exc}."
            ) from None
        if spec.run.workload_kind == "rayjob" and not runs_on_ray(spec):
            log.write(
                b"[taugrid] runtime.pip installs no Ray, so this RayJob's entry point runs as one "
                b"process, without a Ray cluster (add ray[default], ray[train] or ray[tune] "
                b"to runtime.pip for a head and compute.workers worker nodes)\n"
            )
        sdk_dir = None
        if plan.sdk_root is not None:
            try:
                sdk_dir = workload_sdk.materialise(plan.sdk_root)
            except OSError as exc:
                log.write(f"[taugrid] could not write the workload SDK: {exc}\n".encode())
                raise PreparationFailed(
                    "infrastructure", f"Could not write the workload SDK: {exc}"
                ) from None
    python = venv / "bin" / "python"
    if command[0] == "python":
        command[0] = str(python)
    if runs_on_ray(spec):
        if sdk_dir is None:
            raise PreparationFailed(
                "infrastructure", "A RayJob needs the workload SDK, which this agent lacks."
            )
        # The driver, on a Ray cluster of the attempt's own (tau.ray_cluster, from the SDK):
        # the entry point, or tau.ray_tune around it, as the rendered RayJob runs it.
        if spec.execution.is_sweep:
            command = [str(python), "-m", "tau.ray_tune", "--", *command]
        command = [str(python), "-m", "tau.ray_cluster", *ray_cluster_options(spec), "--", *command]
    elif spec.execution.is_sweep:
        if sdk_dir is None:
            raise PreparationFailed(
                "infrastructure", "A sweep needs the workload SDK, which this agent lacks."
            )
        # The trials run under tau.sweep (from the SDK), inside this attempt's resources.
        command = [str(python), "-m", "tau.sweep", "--", *command]
    env = child_environment(
        venv=venv,
        layout=layout,
        spec_env=spec.runtime.env_dict(),
        platform_env=plan.platform_env,
        sdk_dir=sdk_dir,
    )
    return Prepared(
        commands=tuple(
            wrapped_command(plan, command, venv=venv, sdk_dir=sdk_dir, rank=rank)
            for rank in range(local_workers(spec))
        ),
        env=env,
        cwd=layout.work,
        staged=staged,
    )


def wrapped_command(
    plan: PreparationPlan,
    command: list[str],
    *,
    venv: Path,
    sdk_dir: Path | None = None,
    rank: int = 0,
) -> list[str]:
    """The command line the agent starts for worker ``rank``: the wrapper (which records the
    outcome in the worker's status folder) around the workload, inside a sandbox of its own
    when there is one. It is started by ``sandbox.start`` with the workload's environment as
    ``environment`` (the wrapper alone passes it on)."""
    layout = plan.layout
    status = layout.worker_status(rank)
    interpreter = environments.base_interpreter()
    rlimits = plan.limits.rlimits if plan.limits is not None else {}
    rlimit_words = [
        word for name, value in sorted(rlimits.items()) for word in ("--rlimit", f"{name}={value}")
    ]
    if plan.sandbox is None:
        return [
            interpreter,
            "-I",
            "-S",
            str(sandboxing.WRAPPER),
            "--outcome",
            str(status),
            "--cwd",
            str(layout.work),
            *(["--log-limit", str(plan.log_limit)] if plan.log_limit is not None else []),
            *rlimit_words,
            "--environment-fd",
            sandboxing.ENVIRONMENT_FD,
            "--",
            *command,
        ]
    uid = plan.uid if plan.uid is not None else os.getuid()
    tmp_size = plan.limits.tmp_size if plan.limits is not None else None
    return plan.sandbox.command(
        sandboxing.Layout(
            command=command,
            cwd=layout.work,
            read_only=[
                venv,
                *([sdk_dir] if sdk_dir is not None else []),
                *([layout.data] if plan.datasets else []),
            ],
            writable=[layout.work, layout.output, layout.tmp, layout.checkpoints, status],
            # /tmp and /dev/shm: RAM charged to the run's memory cgroup, or folders on disk.
            files=sandboxing.identity_files(layout.sandbox_etc, uid=uid, home=layout.work),
            devices=sandboxing.gpu_devices(plan.gpu_count),
            outcome_dir=status,
            uid=plan.uid,
            log_limit=plan.log_limit,
            tmp_folder=layout.tmp if tmp_size is None else None,
            shm_folder=layout.shm if tmp_size is None else None,
            tmp_size=tmp_size,
            rlimits=rlimits,
            environment_from_descriptor=True,
        ),
        python=interpreter,
    )


def entrypoint_command(spec: Spec, work: Path) -> list[str]:
    """``python <script.py> <args…>`` (the run's Python), ``bash <script.sh> <args…>``, or the
    entry point's words as a command line (no shell) followed by ``run.args``."""
    if spec.run.entrypoint is None:
        # An endpoint (rayservice) has none; submission never makes a run of one.
        raise PreparationFailed(
            "user_error", "run.entrypoint is unset: this tau.yaml describes an endpoint, not a run"
        )
    try:
        words = shlex.split(spec.run.entrypoint)
    except ValueError as exc:
        raise PreparationFailed("user_error", f"run.entrypoint cannot be read: {exc}") from None
    if not words:
        raise PreparationFailed("user_error", "run.entrypoint is empty")
    script = spec.run.script
    if script is not None:
        target = (work / script).resolve()
        if work.resolve() not in target.parents or not target.is_file():
            raise PreparationFailed(
                "user_error",
                f"run.entrypoint names {script}, which is not a file in the project.",
            )
        interpreter = "python" if script.endswith(".py") else "bash"
        return [interpreter, *words, *spec.run.args]
    return [*words, *spec.run.args]


def _link_checkpoint_dir(layout: AttemptLayout, relative: str | None) -> None:
    """When the spec names ``resilience.checkpoint_dir`` (relative to the project), make that
    path lead to the run's shared checkpoint folder, unless the project ships such a path."""
    if not relative:
        return
    parts = PurePosixPath(relative).parts
    if not parts or ".." in parts or PurePosixPath(relative).is_absolute():
        return
    link = layout.work.joinpath(*parts)
    if link.exists() or link.is_symlink():
        return
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(layout.checkpoints, link, target_is_directory=True)


def child_environment(
    *,
    venv: Path,
    layout: AttemptLayout,
    spec_env: Mapping[str, str],
    platform_env: Mapping[str, str],
    sdk_dir: Path | None = None,
) -> dict[str, str]:
    """A fresh environment, never the agent's own (which holds the portal's secrets): a
    minimal base, then the spec's ``runtime.env``, then the platform's TAU_* variables, and
    the workload SDK first on ``PYTHONPATH`` (after it, whatever ``runtime.env`` put there)."""
    env = {
        "PATH": f"{venv / 'bin'}:{environments.BASE_PATH}",
        "HOME": str(layout.work),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TMPDIR": str(layout.tmp),
        "VIRTUAL_ENV": str(venv),
        "PYTHONUNBUFFERED": "1",  # the log is read live
    }
    env.update(spec_env)
    env.update(platform_env)
    if sdk_dir is not None:
        env["PYTHONPATH"] = workload_sdk.python_path(str(sdk_dir), spec_env.get("PYTHONPATH"))
    return env
