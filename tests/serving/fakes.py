"""A backend that runs endpoints, for the serving core's tests: this machine's run backend
with an ``endpoints`` side that records what it is asked and answers from module state (the
address the proxy forwards to, a log, metrics). No executor implements endpoints yet; the
subject here is the core's side of the interface."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from executors.local.backend import LocalBackend
from executors.local.endpoints import LocalEndpoints
from serving.backends import EndpointLog, EndpointMetrics
from serving.models import Endpoint

#: What the fake was asked, in order: (action, endpoint name, generation).
CALLS: list[tuple[str, str, int]] = []


@dataclass
class Behaviour:
    """What the fake answers; tests change it (``reset()`` puts it back)."""

    address: str | None = None
    fail_with: Exception | None = None
    problems: list[tuple[str, str]] = field(default_factory=list)
    metrics_error: Exception | None = None
    #: Whether the fake backend preempts endpoints (as Kubernetes' does): serving.preemption.
    preempts: bool = False


BEHAVIOUR = Behaviour()


def reset() -> None:
    CALLS.clear()
    BEHAVIOUR.address = None
    BEHAVIOUR.fail_with = None
    BEHAVIOUR.problems = []
    BEHAVIOUR.metrics_error = None
    BEHAVIOUR.preempts = False


class FakeEndpoints:
    @property
    def preempts(self) -> bool:
        return BEHAVIOUR.preempts

    def quota_held(self, spec: Any, replicas: int) -> dict[str, Decimal]:
        """The local backend's: compute per replica times replicas."""
        return LocalEndpoints().quota_held(spec, replicas)

    def deploy_problems(self, spec: Any, workspace: Any) -> list[tuple[str, str]]:
        return list(BEHAVIOUR.problems)

    def deploy(self, endpoint: Endpoint) -> None:
        CALLS.append(("deploy", endpoint.name, endpoint.generation))
        if BEHAVIOUR.fail_with is not None:
            raise BEHAVIOUR.fail_with

    def stop(self, endpoint: Endpoint) -> None:
        CALLS.append(("stop", endpoint.name, endpoint.generation))
        if BEHAVIOUR.fail_with is not None:
            raise BEHAVIOUR.fail_with

    def read_log(
        self,
        endpoint: Endpoint,
        *,
        offset: int | None,
        tail_lines: int | None,
        replica: str | None = None,
    ) -> EndpointLog:
        text = "serving requests\n"
        return EndpointLog(
            text=text,
            offset=0,
            next_offset=len(text),
            size=len(text),
            replica=replica or "replica-0",
            replicas=("replica-0", "replica-1"),
        )

    def metrics(self, endpoint: Endpoint) -> EndpointMetrics:
        if BEHAVIOUR.metrics_error is not None:
            raise BEHAVIOUR.metrics_error
        return EndpointMetrics(
            requests_per_second=12.5,
            latency_p50_ms=8.0,
            latency_p95_ms=21.0,
            error_rate=0.0,
            replicas_ready=endpoint.replicas_ready,
            replicas_desired=endpoint.replicas_desired,
        )

    def invoke_address(self, endpoint: Endpoint) -> str | None:
        return BEHAVIOUR.address


class LocalWithEndpoints(LocalBackend):
    """This machine's run backend, running endpoints the fake way."""

    endpoints = FakeEndpoints()


class LocalWithoutEndpoints(LocalBackend):
    """This machine's run backend as one that runs no endpoints (yet)."""

    endpoints = None


PATH = "tests.serving.fakes.LocalWithEndpoints"


def backend_classes(settings: Any) -> dict[str, str]:
    """``TAU_BACKEND_CLASSES`` with the local backend running endpoints (the fake)."""
    return {**settings.TAU_BACKEND_CLASSES, "local": PATH}


def without_endpoints(settings: Any) -> dict[str, str]:
    """``TAU_BACKEND_CLASSES`` with a local backend that runs no endpoints."""
    return {**settings.TAU_BACKEND_CLASSES, "local": "tests.serving.fakes.LocalWithoutEndpoints"}
