"""Where runs execute. The core talks to a backend through two idempotent calls, made only by
the delivery of an outbox row (``runs.services.deliver``):

- ``submit(run)``: make sure the backend knows the run (create its Kubernetes objects, or put
  it in the local agent's queue). Called again for the same run, it changes nothing.
- ``cancel(run)``: make sure it stops. Called again, it changes nothing.

Everything after that (admission, start, progress, the end) comes back from the backend's
own supervisor (the local agent, or the Kubernetes watcher) through ``runs.services``.

Before a run exists, submission asks the backend what it could never do for a spec
(``submission_problems``: more than any of its machines has), so such a run is refused with
the reason instead of waiting forever.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from runs.models import Backend, Run

if TYPE_CHECKING:
    from tau.spec import Spec


class RunBackend(Protocol):
    name: str
    #: Whether a script entry point must come in the project zip (no image to hold it).
    scripts_need_bundle: bool

    def submission_problems(self, spec: Spec) -> list[tuple[str, str]]: ...

    def submit(self, run: Run) -> None: ...

    def cancel(self, run: Run) -> None: ...


# The backends this version can execute runs on; submission refuses the others up front.
AVAILABLE_BACKENDS = frozenset({Backend.LOCAL.value})


class BackendUnavailable(RuntimeError):
    """The run names a backend this installation does not run."""


def backend_named(name: str) -> RunBackend:
    if name == Backend.LOCAL:
        from runs.backends.local import LocalBackend

        return LocalBackend()
    raise BackendUnavailable(f"the {name} backend is not available in this installation")


def backend_for_run(run: Run) -> RunBackend:
    return backend_named(run.backend)
