"""The backends this installation runs, by name: where each run's instructions and questions
go (``backend_for_run``).

The local backend is always there (runs submitted to it keep being followed and answered);
the Kubernetes backend is there when the installation runs it (``TAU_BACKEND=kubernetes``).
Submissions go to ``TAU_BACKEND``; a run keeps the backend it was submitted to.
"""

from __future__ import annotations

from django.conf import settings

from runs.backends import BackendUnavailable, RunBackend
from runs.backends.kubernetes import KubernetesBackend
from runs.backends.local import LocalBackend
from runs.models import Backend, Run


def available_backend_names() -> frozenset[str]:
    """The backends this installation can execute runs on; submission refuses the others."""
    if settings.TAU_BACKEND == Backend.KUBERNETES:
        return frozenset({Backend.LOCAL.value, Backend.KUBERNETES.value})
    return frozenset({Backend.LOCAL.value})


def backend_named(name: str) -> RunBackend:
    if name == Backend.LOCAL:
        return LocalBackend()
    if name == Backend.KUBERNETES and name in available_backend_names():
        return KubernetesBackend()
    raise BackendUnavailable(f"the {name} backend is not available in this installation")


def backend_for_run(run: Run) -> RunBackend:
    return backend_named(run.backend)


def available_backends() -> list[RunBackend]:
    return [backend_named(name) for name in sorted(available_backend_names())]
