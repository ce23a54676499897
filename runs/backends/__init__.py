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
what it could never do for a spec (``submission_problems``, before a run exists), an
attempt's log (a piece to follow, the whole to download), where a reported checkpoint is
and whether it still exists, and how much of each workspace's quota its runs use.

Which backends an installation runs, and which one a run's instructions go to, is
``registry``'s; ``local`` is this machine's.
"""

from __future__ import annotations

from collections.abc import Collection
from decimal import Decimal
from typing import TYPE_CHECKING, Protocol

from runs.logs import LogChunk, WholeLog
from runs.models import Checkpoint, Run, RunAttempt

if TYPE_CHECKING:
    from tau.spec import Spec

#: How much a workspace uses, by (flavor name, resource): ``{("h100", "nvidia.com/gpu"): 4}``.
QuotaUse = dict[tuple[str, str], Decimal]


class BackendUnavailable(RuntimeError):
    """The run names a backend this installation does not run."""


class RunBackend(Protocol):
    name: str
    #: Whether a script entry point must come in the project zip (no image to hold it).
    scripts_need_bundle: bool

    def submission_problems(self, spec: Spec) -> list[tuple[str, str]]:
        """(tau.yaml path, message) for what this backend could never give a run of
        ``spec``, however idle it is: such a run is refused up front."""
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

    def quota_in_use(self, workspace_ids: Collection[int] | None) -> dict[int, QuotaUse]:
        """What this backend's runs hold now, per workspace (``None``: every workspace),
        against the workspaces' quota rows."""
        ...
