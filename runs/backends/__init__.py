"""What the core asks of a backend: the one interface every backend implements.

The core talks to a backend through two idempotent instructions, made only by the delivery
of an outbox row (``runs.delivery.deliver``), outside any database transaction:

- ``submit(run, attempt)``: make sure the backend has the run's attempt ``attempt`` (create
  its Kubernetes objects, which carry the attempt's number; on this machine, put the run in
  the local agent's queue). A submission, a retry and a resume each hand over a new attempt.
  Called again for the same attempt, it changes nothing.
- ``cancel(run)``: make sure it stops. Called again, it changes nothing.

Everything after that (admission, start, progress, the end) comes back from the backend's
own supervisor (the local agent, or the Kubernetes watcher) through the run services.

And it answers what the core would otherwise read from one backend's files or objects:
what it could never do for a spec (``submission_problems``, before a run exists), what it
admits together for one (``pod_sets``: a RayJob's head too), an attempt's log (a piece to
follow, the whole to download), where a reported checkpoint is, whether it still exists and
where the portal reads its files (``checkpoint_files``: a checkpoint registered as a model
version), how much of each workspace's quota its runs use, where its queued runs stand
(``queue_positions``), what to warn a submitter of (``storage_warning``), what the sealed
record names as a run's environment and an attempt's objects, and what it adds to
``/readyz``. The core never imports a backend: pages, the API and evidence ask these
questions of ``registry.backend_named(run.backend)``.

Which backends an installation runs, and which one a run's instructions go to, is
``registry``'s (the classes are named by the ``TAU_BACKEND_CLASSES`` setting):
``executors.local.backend.LocalBackend`` for this machine, and
``executors.kubernetes.backend.KubernetesBackend`` for a cluster.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from runs.logs import LogChunk, WholeLog
from runs.models import Checkpoint, Run, RunAttempt

if TYPE_CHECKING:
    from tau.spec import Spec
    from workspaces.models import Workspace

#: How much a workspace uses, by (flavor name, resource): ``{("h100", "nvidia.com/gpu"): 4}``.
QuotaUse = dict[tuple[str, str], Decimal]


#: A run as the queue questions see it: a run, or a row of its values with at least ``id``,
#: ``name``, ``state``, ``backend`` and ``attempt_count`` (the API's list reads rows).
QueuedRun = Run | Mapping[str, Any]


@dataclass
class QueueReading:
    """Positions (1 = next) of queued runs, by run id, and whether the backend said them."""

    positions: dict[int, int] = field(default_factory=dict)
    #: The runs the reading is about: their positions are the ones above (none: not known).
    #: Runs outside it keep the position stored on them (the local agent stores its own).
    covered: set[int] = field(default_factory=set)
    #: Why the backend's own order could not be read ('' when it was): the positions are then
    #: TauGrid's estimate.
    unavailable: str = ""

    def position(self, run_id: int) -> int | None:
        return self.positions.get(run_id)

    def merge(self, other: QueueReading) -> None:
        self.positions.update(other.positions)
        self.covered |= other.covered
        if other.unavailable and not self.unavailable:
            self.unavailable = other.unavailable


@dataclass(frozen=True)
class PodSet:
    """A part of a run that is admitted as a whole (Kueue's pod set): ``who`` says it in a
    sentence ("the 2 worker(s) need"), ``requests`` what its pods ask for together."""

    who: str
    requests: dict[str, Decimal]


class BackendUnavailable(RuntimeError):
    """The run names a backend this installation does not run."""


class CheckpointUnreadable(RuntimeError):
    """The portal cannot read a checkpoint's files: they are gone, or the backend keeps them
    where the portal cannot reach. The message says why, and what to do instead."""


class RunBackend(Protocol):
    name: str
    #: Whether a script entry point must come in the project zip (no image to hold it).
    scripts_need_bundle: bool

    def submission_problems(self, spec: Spec, workspace: Workspace) -> list[tuple[str, str]]:
        """(tau.yaml path, message) for what this backend could never give a run of
        ``spec`` in ``workspace``, however idle it is: such a run is refused up front."""
        ...

    def pod_sets(self, spec: Spec) -> list[PodSet]:
        """What this backend admits together for a run of ``spec``, part by part, the
        workers first: the amounts quotas, budgets and accounting count. Asks nothing of
        the backend's machines."""
        ...

    def submit(self, run: Run, attempt: RunAttempt) -> None: ...

    def cancel(self, run: Run) -> None: ...

    def read_log(
        self,
        run: Run,
        attempt: RunAttempt,
        *,
        offset: int | None,
        tail_lines: int | None,
        pod: str | None = None,
    ) -> LogChunk:
        """A piece of the attempt's log: from byte ``offset`` on (to follow it), or its last
        ``tail_lines`` lines. Where an attempt has several logs (a cluster's pods), ``pod``
        chooses one (None: the one that says most: a RayJob's driver, a Job's first
        worker)."""
        ...

    def open_log(self, run: Run, attempt: RunAttempt, *, pod: str | None = None) -> WholeLog:
        """The attempt's whole log (of ``pod``, as for ``read_log``), to stream as a
        download."""
        ...

    def checkpoint_path(self, run: Run, path: str) -> str:
        """The path a workload reported a checkpoint at, as it is kept (absolute, inside the
        run's own checkpoint folder), or ``CheckpointPathRefused``."""
        ...

    def checkpoint_exists(self, run: Run, checkpoint: Checkpoint) -> bool:
        """Whether the run can still resume from ``checkpoint`` (workloads delete old ones)."""
        ...

    def checkpoint_files(self, run: Run, checkpoint: Checkpoint) -> Path:
        """Where the portal reads ``checkpoint``'s files now (a file, or a folder), inside
        the run's own checkpoint folder and reached through no symbolic link, or
        ``CheckpointUnreadable`` saying why not (gone, or out of the portal's reach)."""
        ...

    def quota_in_use(self, workspace_ids: Collection[int] | None) -> dict[int, QuotaUse]:
        """What this backend's runs hold now, per workspace (``None``: every workspace),
        against the workspaces' quota rows."""
        ...

    def queue_positions(self, workspace: Workspace, runs: list[QueuedRun]) -> QueueReading:
        """Where the workspace's queued runs of this backend (``runs``, all queued) stand
        now, when the backend keeps the order itself (Kueue) and no position is stored on
        them; at most one question to the backend, whatever their number."""
        ...

    def storage_warning(self, workspace: Workspace) -> str:
        """What to tell someone submitting to ``workspace`` about where their run's
        checkpoints are kept, or '' when nothing is wrong."""
        ...

    def environment(self, run: Run) -> dict[str, Any] | None:
        """The environment the run's code ran in, as the sealed record names it (its
        Python and packages), or None when the backend cannot say."""
        ...

    def attempt_objects(self, run: Run, attempt: RunAttempt) -> list[dict[str, Any]]:
        """What the backend made for ``attempt`` (``kind``, ``name``, ``namespace``), for the
        sealed record; empty when it made nothing."""
        ...

    def readiness_note(self) -> dict[str, Any] | None:
        """What this backend adds to ``/readyz`` (None: nothing to say)."""
        ...
