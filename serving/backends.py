"""What the serving core asks of a backend: the interface a backend implements to run
endpoints, and how the core finds it.

A backend that runs endpoints says so with an ``endpoints`` attribute on the object the run
registry names (``runs.backends.registry``, from ``TAU_BACKEND_CLASSES``): an
:class:`EndpointBackend`. It is an object of its own, not more methods on the run backend,
because the two ask different things of the same words (a run's log is an attempt's, an
endpoint's a replica's). A backend without it does not run endpoints yet: deploying is
refused up front (:class:`EndpointsUnavailable`), and nothing is created.

The core talks to it as to a run backend: two idempotent instructions, ``deploy`` and
``stop``, made only by the delivery of an outbox row (``serving.delivery``), outside any
database transaction. Both are generation-aware: ``deploy`` makes sure the backend runs the
endpoint as its generation ``endpoint.generation`` says (spec, model version, replicas), so
delivering it twice, or an older generation's after a newer one's, changes nothing; ``stop``
makes sure nothing of the endpoint runs. What happens next (admitted, ready, unhealthy, its
address, its replicas) comes back from the backend's supervisor through
``serving.services.observe``. And it answers what pages and the API ask: a piece of a
replica's log, the traffic it serves, and the address the portal's proxy forwards requests to.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Protocol

from runs.backends import BackendUnavailable
from runs.backends.registry import available_backend_names, backend_named

if TYPE_CHECKING:
    from serving.models import Endpoint
    from tau.spec import Spec
    from workspaces.models import Workspace


#: What a replica's name may be (a pod's, a Ray Serve replica's, ``generation-<n>``): what
#: the API and the endpoint page accept as ``?replica=`` before asking a backend.
REPLICA_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,252}")


@dataclass(frozen=True)
class EndpointLog:
    """A piece of one replica's log: from byte ``offset`` to ``next_offset`` of ``size``."""

    text: str
    offset: int
    next_offset: int
    size: int
    #: Which replica (a pod, a Ray Serve replica) this is the log of, and all of them.
    replica: str = ""
    replicas: tuple[str, ...] = ()
    #: Why there is no log (yet), in words, when the backend can say.
    note: str = ""


@dataclass(frozen=True)
class EndpointMetrics:
    """The traffic an endpoint serves, over the backend's last window (Ray Serve's own
    Prometheus metrics): None where the backend has no figure (no requests yet, say)."""

    requests_per_second: float | None
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    error_rate: float | None
    replicas_ready: int
    replicas_desired: int
    #: The mean GPU utilisation of its pods, 0 to 100 (None: no GPUs, or not measured).
    gpu_utilization: float | None = None
    #: The window the rates are over, in seconds.
    window_seconds: int = 60
    note: str = ""


class EndpointBackend(Protocol):
    """What a backend does for endpoints (module docstring)."""

    @property
    def preempts(self) -> bool:
        """Whether something on this backend may preempt a running endpoint to give its
        resources to other work (Kueue may, on Kubernetes): ``serving.preemption``."""
        ...

    def quota_held(self, spec: Spec, replicas: int) -> dict[str, Decimal]:
        """What an endpoint of ``spec`` running ``replicas`` replicas holds of its
        workspace's quota, per resource (Kubernetes: what Kueue reserves for its Ray
        cluster)."""
        ...

    def deploy_problems(self, spec: Spec, workspace: Workspace) -> list[tuple[str, str]]:
        """(tau.yaml path, message) for what this backend could never give an endpoint of
        ``spec`` in ``workspace`` (a replica larger than any machine, say): refused up front."""
        ...

    def deploy(self, endpoint: Endpoint) -> None:
        """Make sure the backend runs generation ``endpoint.generation`` of the endpoint.
        Called again for the same generation, or for an older one, it changes nothing."""
        ...

    def stop(self, endpoint: Endpoint) -> None:
        """Make sure nothing of the endpoint runs (its quota freed). Called again, nothing."""
        ...

    def read_log(
        self,
        endpoint: Endpoint,
        *,
        offset: int | None,
        tail_lines: int | None,
        replica: str | None = None,
    ) -> EndpointLog:
        """A piece of a replica's log (``replica`` None: the one that says most): from byte
        ``offset`` on, or its last ``tail_lines`` lines."""
        ...

    def metrics(self, endpoint: Endpoint) -> EndpointMetrics:
        """The endpoint's traffic now; asks the backend's metrics (one question)."""
        ...

    def invoke_address(self, endpoint: Endpoint) -> str | None:
        """The base URL the portal's proxy sends requests to (``http://host:port``, the
        route prefix included where it has one), or None while there is none."""
        ...


class EndpointsUnavailable(RuntimeError):
    """The backend named does not run endpoints in this installation (not yet, or not here):
    the message says so, for people."""


def endpoints_unavailable_message(name: str) -> str:
    return f"endpoints are not available on the {name} backend of this installation yet"


def endpoint_backend(name: str) -> EndpointBackend:
    """The endpoint side of the backend ``name``, or :class:`EndpointsUnavailable`: the
    installation does not run that backend, or the backend does not run endpoints yet."""
    if name not in available_backend_names():
        raise EndpointsUnavailable(endpoints_unavailable_message(name))
    try:
        backend = backend_named(name)
    except BackendUnavailable:
        raise EndpointsUnavailable(endpoints_unavailable_message(name)) from None
    endpoints: EndpointBackend | None = getattr(backend, "endpoints", None)
    if endpoints is None:
        raise EndpointsUnavailable(endpoints_unavailable_message(name))
    return endpoints


def backend_for_endpoint(endpoint: Endpoint) -> EndpointBackend:
    return endpoint_backend(endpoint.backend)
