"""The backends this installation runs, by name: where each run's instructions and questions
go (``backend_for_run``)."""

from __future__ import annotations

from runs.backends import BackendUnavailable, RunBackend
from runs.backends.local import LocalBackend
from runs.models import Backend, Run

# The backends this version can execute runs on; submission refuses the others up front.
AVAILABLE_BACKENDS = frozenset({Backend.LOCAL.value})


def backend_named(name: str) -> RunBackend:
    if name == Backend.LOCAL:
        return LocalBackend()
    raise BackendUnavailable(f"the {name} backend is not available in this installation")


def backend_for_run(run: Run) -> RunBackend:
    return backend_named(run.backend)


def available_backends() -> list[RunBackend]:
    return [backend_named(name) for name in sorted(AVAILABLE_BACKENDS)]
