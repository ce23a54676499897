"""The backends this installation runs, by name: where each run's instructions and questions
go (``backend_for_run``).

The local backend is always there (runs submitted to it keep being followed and answered);
the Kubernetes backend is there when the installation runs it (``TAU_BACKEND=kubernetes``).
Submissions go to ``TAU_BACKEND``; a run keeps the backend it was submitted to.

The classes are named by the ``TAU_BACKEND_CLASSES`` setting (a dotted path per backend name,
as Django names its ``EMAIL_BACKEND``): nothing in the core imports a backend, so a backend
can live in a package of its own above the core.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from runs.backends import BackendUnavailable, RunBackend
from runs.models import Backend, Run


@cache
def _backend_class(path: str) -> type[RunBackend]:
    try:
        cls: type[RunBackend] = import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(f"TAU_BACKEND_CLASSES names {path!r}: {exc}") from exc
    return cls


def available_backend_names() -> frozenset[str]:
    """The backends this installation can execute runs on; submission refuses the others."""
    if settings.TAU_BACKEND == Backend.KUBERNETES:
        return frozenset({Backend.LOCAL.value, Backend.KUBERNETES.value})
    return frozenset({Backend.LOCAL.value})


def _instance(name: str) -> RunBackend:
    return _backend_class(settings.TAU_BACKEND_CLASSES[name])()


def backend_named(name: str) -> RunBackend:
    if name not in available_backend_names():
        raise BackendUnavailable(f"the {name} backend is not available in this installation")
    return _instance(name)


def backend_for_run(run: Run) -> RunBackend:
    return backend_named(run.backend)


def readiness_note(name: str) -> dict[str, Any] | None:
    """What the backend ``name`` adds to ``/readyz`` (None: nothing)."""
    return _instance(name).readiness_note()


def describing(name: str) -> RunBackend:
    """The backend ``name``, only to describe what it makes of a run or a spec (the sealed
    record, made again at every export; what it admits for a spec, also for runs of the
    past): also where this installation no longer runs that backend, since the description
    must not change with the installation. Ask it nothing of its machines."""
    return _instance(name)


def describing_backend(run: Run) -> RunBackend:
    """The run's backend, to describe what it made of the run (:func:`describing`)."""
    return describing(run.backend)


def available_backends() -> list[RunBackend]:
    return [backend_named(name) for name in sorted(available_backend_names())]
