"""Where runs execute. The core talks to a backend through two idempotent calls, made only by
the delivery of an outbox row (``runs.services.deliver``):

- ``submit(run)``: make sure the backend knows the run (create its Kubernetes objects, or put
  it in the local agent's queue). Called again for the same run, it changes nothing.
- ``cancel(run)``: make sure it stops. Called again, it changes nothing.

Everything after that (admission, start, progress, the end) comes back from the backend's
own supervisor (the local agent, or the Kubernetes watcher) through ``runs.services``.
"""

from __future__ import annotations

from typing import Protocol

from runs.models import Backend, Run


class RunBackend(Protocol):
    name: str

    def submit(self, run: Run) -> None: ...

    def cancel(self, run: Run) -> None: ...


# The backends this version can execute runs on; submission refuses the others up front.
AVAILABLE_BACKENDS = frozenset({Backend.LOCAL.value})


class BackendUnavailable(RuntimeError):
    """The run names a backend this installation does not run."""


def backend_for_run(run: Run) -> RunBackend:
    if run.backend == Backend.LOCAL:
        from runs.backends.local import LocalBackend

        return LocalBackend()
    raise BackendUnavailable(f"the {run.backend} backend is not available in this installation")
