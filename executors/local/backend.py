"""The embedded backend: runs execute as processes on this machine, supervised by the local
agent (``manage.py run_agent``), which admits queued runs within the machine's resources;
endpoints run here too (``endpoints``: ``executors.local.endpoints``).

Everything the core knows about this machine's files goes through here: the attempts' logs
(``var/runs/<run id>/attempt-<n>/run.log``), the run's checkpoint folder
(``var/runs/<run id>/checkpoints/``) and what the runs and endpoints executing here hold of
each workspace's quota on the ``TAU_LOCAL_FLAVOR`` flavor.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import sys
from collections.abc import Collection
from decimal import Decimal
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import IntegerField, Value

from executors.local.agent import admission, environments
from executors.local.agent.admission import FIELD_OF, unsupported_here
from executors.local.agent.health import local_executor_note
from executors.local.agent.prepare import AttemptLayout, runs_root, venvs_root
from executors.local.endpoints import LocalEndpoints
from runs.backends import CheckpointUnreadable, PodSet, QueuedRun, QueueReading, QuotaUse
from runs.checkpoint_paths import CheckpointPathRefused, parts_inside
from runs.logs import LogChunk, WholeLog, open_log_file, read_log_file
from runs.models import RUNNING_STATES, Backend, Checkpoint, Run, RunAttempt, RunState
from runs.policy import requested_totals, worker_pod_set
from runs.state import lock_run, transition
from serving.backends import EndpointBackend
from serving.models import LIVE_STATES, Endpoint
from tau.quantity import QuantityError
from tau.spec import Spec, spec_from_dict
from workspaces.models import Workspace


def checkpoint_dir(run: Run) -> Path:
    """The run's checkpoint folder on this machine: its attempts' ``TAU_CHECKPOINT_DIR``."""
    # The folder is the run's, shared by all its attempts: any attempt number names it.
    return AttemptLayout.for_attempt(runs_root(), run.pk, 1).checkpoints


def _checkpoint_folders(run: Run) -> list[PurePosixPath]:
    folder = checkpoint_dir(run)
    spelled = PurePosixPath(os.path.abspath(folder))
    resolved = PurePosixPath(os.path.realpath(runs_root()), *folder.parts[-2:])
    return [spelled, resolved] if resolved != spelled else [spelled]


def _checkpoint_on_disk(run: Run, parts: tuple[str, ...]) -> bool:
    """Whether the checkpoint ``parts`` names below the run's checkpoint folder exists, looking
    only below the portal's own runs folder and never following a link: a symbolic link on
    the way (the checkpoint folder itself included) could lead anywhere on this machine, so it
    is refused (CheckpointPathRefused), as the agent never records a link as a checkpoint."""
    current = Path(os.path.realpath(runs_root()))
    names = (str(run.pk), checkpoint_dir(run).name, *parts)
    for index, name in enumerate(names):
        current = current / name
        try:
            status = os.lstat(current)
        except (FileNotFoundError, NotADirectoryError):
            return False
        if stat.S_ISLNK(status.st_mode):
            raise CheckpointPathRefused(
                "A checkpoint path may not go through a symbolic link "
                f"({'/'.join(names[2 : index + 1]) or 'the checkpoint folder'} is one)."
            )
        if index < len(names) - 1 and not stat.S_ISDIR(status.st_mode):
            return False
    return True


def local_environment(run: Run) -> dict[str, Any] | None:
    """The run's virtual environment, as the local executor built it: its Python and its
    packages. None when it is not on this machine (any more)."""
    spec = spec_from_dict(run.spec)
    venv = environments.environment_path(venvs_root(), spec.runtime.pip)
    if not environments.is_ready(venv):
        return None
    packages = {
        (dist.metadata["Name"] or "", dist.version)
        for site in venv.glob("lib/python*/site-packages")
        for dist in metadata.distributions(path=[str(site)])
    }
    return {
        "kind": "local-venv",
        "python": _venv_python(venv),
        "packages": [
            {"name": name, "version": version} for name, version in sorted(packages) if name
        ],
    }


def _venv_python(venv: Path) -> str:
    """The Python version its ``pyvenv.cfg`` records (the base interpreter's otherwise)."""
    try:
        for line in (venv / "pyvenv.cfg").read_text(encoding="utf-8").splitlines():
            name, _, value = line.partition("=")
            if name.strip() in {"version", "version_info"}:
                return value.strip()
    except OSError:
        pass
    return ".".join(str(part) for part in sys.version_info[:3])


#: How the run page names the processes of a multi-worker attempt (like a cluster's pods).
WORKER_NAME = "worker-{rank}"


def _worker_log(attempt: RunAttempt, pod: str | None) -> tuple[Path | None, str, tuple[str, ...]]:
    """The log of the worker named ``pod`` (worker 0's when it names none of them), its
    name, and every worker's name; no names for a single-process attempt. Only the attempt's
    own files are ever opened: a name is looked up, never joined to a path."""
    if not attempt.log_path:
        return None, "", ()
    log = Path(attempt.log_path)
    layout = AttemptLayout(run_dir=log.parent.parent, attempt_dir=log.parent)
    count = layout.workers_started()
    if count < 2:
        return log, "", ()
    names = tuple(WORKER_NAME.format(rank=rank) for rank in range(count))
    rank = names.index(pod) if pod in names else 0
    return layout.worker_log(rank), names[rank], names


class LocalBackend:
    name = "local"
    #: A run starts in a folder holding its project zip and nothing else: a script entry
    #: point needs a zip that has it (a cluster run may find it in its image instead).
    scripts_need_bundle = True
    #: Endpoints run here too, as real Ray Serve applications (``executors.local.endpoints``).
    endpoints: EndpointBackend | None = LocalEndpoints()

    def submission_problems(self, spec: Spec, workspace: Workspace) -> list[tuple[str, str]]:
        """(tau.yaml path, message) for what this machine could never give the run, however
        idle it is: such a run is refused up front instead of waiting forever."""
        try:
            capacity = admission.machine_capacity()
        except (QuantityError, OSError, RuntimeError):
            # A broken TAU_LOCAL_MEMORY stops the agent, which says so at start.
            return unsupported_here(spec)
        never = admission.never_fits(requested_totals(spec), capacity)
        problems = [(FIELD_OF[resource], message) for resource, message in never.items()]
        return unsupported_here(spec) + problems

    def pod_sets(self, spec: Spec) -> list[PodSet]:
        """The workers alone: no submitter pod here, and a RayJob's Ray head (started by
        ``tau.ray_cluster`` with no CPUs for tasks) is not counted: its processes take a few
        hundred MB, and the default head's two CPUs would never fit a laptop beside the workers."""
        return [worker_pod_set(spec)]

    def submit(self, run: Run, attempt: RunAttempt) -> None:
        # The agent reads the queue: a run handed over is a queued run. A retried or resumed
        # run is queued already, and its waiting attempt is the one the agent starts.
        with transaction.atomic():
            locked = lock_run(run.pk)
            if locked.state == RunState.PENDING:
                transition(
                    locked, RunState.QUEUED, reason="Waiting for the local agent to admit it."
                )

    def cancel(self, run: Run) -> None:
        # The agent stops the process group of any run in state "cancelling"; a run that was
        # not executing has already been moved to "cancelled" by the cancel itself.
        return None

    def read_log(
        self,
        run: Run,
        attempt: RunAttempt,
        *,
        offset: int | None,
        tail_lines: int | None,
        pod: str | None = None,
    ) -> LogChunk:
        # One log per worker process: worker 0's is the attempt's (``prepare``).
        path, chosen, workers = _worker_log(attempt, pod)
        chunk = read_log_file(
            path,
            attempt=attempt.number,
            complete=attempt.finished_at is not None,
            offset=offset,
            tail_lines=tail_lines,
        )
        return dataclasses.replace(chunk, pod=chosen, pods=workers) if workers else chunk

    def open_log(self, run: Run, attempt: RunAttempt, *, pod: str | None = None) -> WholeLog:
        path, _, _ = _worker_log(attempt, pod)
        return open_log_file(path, attempt=attempt.number, live=attempt.finished_at is None)

    def checkpoint_path(self, run: Run, path: str) -> str:
        """On this machine the folder is ``var/runs/<run id>/checkpoints/``; the path may be
        given absolute or relative to it, and is kept absolute. Anything else (another run's
        folder, the portal's files, a path through a link) is refused: the run page would
        otherwise offer to resume from it and say whether it exists."""
        folders = _checkpoint_folders(run)
        parts = parts_inside(folders, path)
        _checkpoint_on_disk(run, parts)  # refuses a path through a link
        return str(PurePosixPath(folders[0], *parts))

    def checkpoint_exists(self, run: Run, checkpoint: Checkpoint) -> bool:
        """The workload may have deleted it (many keep only the newest few). Only a path
        inside the run's own checkpoint folder is ever looked at, and never through a link: a
        recorded path outside it (written before paths were checked) is not resumable, and
        whether such a file exists is never asked of the disk."""
        try:
            parts = parts_inside(_checkpoint_folders(run), checkpoint.path)
            if not PurePosixPath(checkpoint.path).is_absolute():
                return False  # the agent and the API keep absolute paths
            return _checkpoint_on_disk(run, parts)
        except CheckpointPathRefused:
            return False

    def checkpoint_files(self, run: Run, checkpoint: Checkpoint) -> Path:
        """The checkpoint as it is on this machine, reached from the portal's own runs folder
        with every name on the way looked at and no link followed (a link could lead anywhere
        on this machine): what the catalog reads to make a model version of it. A recorded
        path outside the run's checkpoint folder, or gone from it, is refused, saying so."""
        label = f"{run.name}'s checkpoint at step {checkpoint.step}"
        try:
            parts = parts_inside(_checkpoint_folders(run), checkpoint.path)
            if not PurePosixPath(checkpoint.path).is_absolute():
                raise CheckpointPathRefused(
                    "a recorded path is absolute (the agent and API keep them so)."
                )
            present = _checkpoint_on_disk(run, parts)
        except CheckpointPathRefused as exc:
            raise CheckpointUnreadable(
                f"{label} cannot be read ({checkpoint.path}): {exc}"
            ) from None
        if not present:
            raise CheckpointUnreadable(
                f"{label} is gone from this machine ({checkpoint.path}): the workload deleted "
                "it (many keep only the newest few). Name a checkpoint that is still there."
            )
        return Path(os.path.realpath(runs_root()), str(run.pk), checkpoint_dir(run).name, *parts)

    def quota_in_use(self, workspace_ids: Collection[int] | None) -> dict[int, QuotaUse]:
        """Local runs and endpoints use the machine's flavor (``TAU_LOCAL_FLAVOR``): what the
        admitted, running and stopping runs asked for, and what the live endpoints hold
        (replicas times ``compute``; an update's two generations counted once), per
        workspace, in one query."""
        runs = Run.objects.unscoped().filter(backend=Backend.LOCAL, state__in=RUNNING_STATES)
        endpoints = Endpoint.objects.unscoped().filter(
            backend=Backend.LOCAL, state__in=LIVE_STATES, deleted_at__isnull=True
        )
        if workspace_ids is not None:
            runs = runs.filter(workspace_id__in=list(workspace_ids))
            endpoints = endpoints.filter(workspace_id__in=list(workspace_ids))
        # A run's row says 0 replicas; an endpoint's, the replicas it was scaled to.
        rows = runs.values_list(
            "workspace_id", "spec", Value(0, output_field=IntegerField())
        ).union(endpoints.values_list("workspace_id", "spec", "replicas_desired"), all=True)
        used: dict[int, QuotaUse] = {}
        flavor = settings.TAU_LOCAL_FLAVOR
        for workspace_id, data, replicas in rows:
            amounts = (
                admission.endpoint_demand(admission.endpoint_spec(data, replicas))
                if replicas
                else requested_totals(spec_from_dict(data))
            )
            line = used.setdefault(workspace_id, {})
            for resource, amount in amounts.items():
                key = (flavor, resource)
                line[key] = line.get(key, Decimal(0)) + amount
        return used

    # -- what pages, the API and evidence ask -------------------------------------------

    def queue_positions(self, workspace: Workspace, runs: list[QueuedRun]) -> QueueReading:
        # The agent orders its queue itself and stores each run's position on it.
        return QueueReading()

    def storage_warning(self, workspace: Workspace) -> str:
        return ""  # checkpoints stay on this machine's disk between attempts

    def environment(self, run: Run) -> dict[str, Any] | None:
        return local_environment(run)

    def attempt_objects(self, run: Run, attempt: RunAttempt) -> list[dict[str, Any]]:
        if not attempt.backend_name:
            return []
        return [{"kind": "process", "name": attempt.backend_name, "namespace": None}]

    def readiness_note(self) -> dict[str, Any] | None:
        return local_executor_note()
