"""Endpoints on this machine: the local backend's side of ``serving.backends.EndpointBackend``
(``LocalBackend.endpoints``).

The agent (``manage.py run_agent``) does the work (``executors.local.agent.endpoints``): it
runs each generation of an endpoint as a real Ray Serve application on this machine's
loopback, in its sandbox. What the core asks here is answered from the endpoint's files
(``executors.local.agent.endpoint_files``):

* ``deploy`` records that the agent must run generation N (``handed.json``), as ``submit``
  hands a run to the agent's queue: the agent starts a generation only once it was handed
  over. The number only grows, so a delivery made twice, or an older generation's after a
  newer one's, changes nothing. ``stop`` records that nothing of generation N or older may
  run; the agent stops what runs of it.
* ``deploy_problems``: what this machine could never give: replicas times ``compute`` larger
  than the machine (the rule admission applies to runs), GPUs where there are none.
* ``read_log``: a generation's log (Ray's and its replicas' output: one Ray per generation).
* ``metrics``: what the generation's runner last measured from Ray Serve's own Prometheus
  metrics (``tau.serving``).
* ``invoke_address``: the address the agent reported (``Endpoint.url``) and the route prefix.
"""

from __future__ import annotations

import time
from decimal import Decimal
from typing import TYPE_CHECKING

from executors.local.agent import admission
from executors.local.agent.endpoint_files import (
    EndpointFolder,
    figure,
    generation_name,
    generation_of,
    hand_over,
    metrics_file,
    number,
    read_record,
)
from runs.logs import read_log_file
from serving.backends import EndpointLog, EndpointMetrics
from serving.models import EndpointState
from serving.services import observe
from tau.k8s_names import GPU_RESOURCE
from tau.quantity import QuantityError, parse_quantity

if TYPE_CHECKING:
    from pathlib import Path

    from serving.models import Endpoint
    from tau.spec import Spec
    from workspaces.models import Workspace

#: The runner rewrites its figures every few seconds: older ones are not the endpoint's now.
METRICS_FRESH_SECONDS = 30.0
METRICS_NOTE = (
    "From Ray Serve's own Prometheus metrics (its HTTP proxy's requests, errors and latency), "
    "read on this machine every 5 s over the last minute; Ray exports them every 5 s, so the "
    "newest requests may be missing."
)


class LocalEndpoints:
    """This machine's endpoints (module docstring)."""

    #: Nothing on this machine takes an endpoint's resources for other work.
    preempts = False

    def quota_held(self, spec: Spec, replicas: int) -> dict[str, Decimal]:
        """Compute per replica times ``replicas``, as the agent admits them."""
        compute = spec.compute
        return {
            "cpu": parse_quantity(compute.cpus) * replicas,
            "memory": parse_quantity(compute.memory) * replicas,
            GPU_RESOURCE: Decimal(compute.gpus * replicas),
        }

    def deploy_problems(self, spec: Spec, workspace: Workspace) -> list[tuple[str, str]]:
        """Replicas times compute must fit this machine, however idle it is; GPUs only where
        there are some. (What a cluster could never give is the core's policy's.)"""
        try:
            capacity = admission.machine_capacity()
        except (QuantityError, OSError, RuntimeError):
            return admission.unsupported_here(
                spec
            )  # a broken setting stops the agent, which says so
        replicas = admission.endpoint_replicas(spec)
        never = admission.never_fits(
            admission.endpoint_demand(spec),
            capacity,
            subject=f"The endpoint ({replicas} replica{'s' if replicas != 1 else ''} together)",
            kind="endpoints",
        )
        return admission.unsupported_here(spec) + [
            (admission.FIELD_OF[resource], message) for resource, message in never.items()
        ]

    def deploy(self, endpoint: Endpoint) -> None:
        folder = EndpointFolder.of(endpoint.pk)
        if endpoint.state == EndpointState.DEPLOYING:
            # Said before the agent can see the instruction, so its own words come after.
            observe(
                endpoint,
                reason=f"Handed to the local agent, which starts generation "
                f"{endpoint.generation} when this machine has room for it.",
                generation=endpoint.generation,
            )
        hand_over(folder, deploy=endpoint.generation)

    def stop(self, endpoint: Endpoint) -> None:
        hand_over(EndpointFolder.of(endpoint.pk), stop=endpoint.generation)

    def read_log(
        self,
        endpoint: Endpoint,
        *,
        offset: int | None,
        tail_lines: int | None,
        replica: str | None = None,
    ) -> EndpointLog:
        """One generation's log (``generation-<n>``): the one that serves, or the newest,
        unless ``replica`` names another. Every replica of a generation writes into it,
        each line led by Ray's ``(ServeReplica:<app>:<deployment> pid=…)``."""
        folder = EndpointFolder.of(endpoint.pk)
        numbers = folder.generations()
        names = tuple(generation_name(n) for n in reversed(numbers))
        chosen = generation_of(replica) if replica else None
        if chosen not in numbers:
            chosen = _serving_generation(folder) or (numbers[-1] if numbers else None)
        if chosen is None:
            return EndpointLog(
                text="",
                offset=0,
                next_offset=0,
                size=0,
                replicas=names,
                note="The local agent has not started it yet.",
            )
        layout = folder.generation(chosen)
        chunk = read_log_file(
            layout.log,
            attempt=chosen,
            complete=False,
            offset=offset,
            tail_lines=tail_lines,
        )
        return EndpointLog(
            text=chunk.text,
            offset=chunk.offset,
            next_offset=chunk.next_offset,
            size=chunk.size,
            replica=generation_name(chosen),
            replicas=names,
            note=chunk.note,
        )

    def metrics(self, endpoint: Endpoint) -> EndpointMetrics:
        folder = EndpointFolder.of(endpoint.pk)
        chosen = _serving_generation(folder)
        data = None
        if chosen is not None:
            layout = folder.generation(chosen)
            data = read_record(metrics_file(layout), layout.output)
        when = figure(data.get("time")) if data else None
        if data is None or when is None or time.time() - when > METRICS_FRESH_SECONDS:
            return EndpointMetrics(
                requests_per_second=None,
                latency_p50_ms=None,
                latency_p95_ms=None,
                error_rate=None,
                replicas_ready=endpoint.replicas_ready,
                replicas_desired=endpoint.replicas_desired,
                note="No figures yet: Ray Serve's metrics are read once it serves. " + METRICS_NOTE,
            )
        error_rate = figure(data.get("error_rate"))
        return EndpointMetrics(
            requests_per_second=figure(data.get("requests_per_second")),
            latency_p50_ms=figure(data.get("latency_p50_ms")),
            latency_p95_ms=figure(data.get("latency_p95_ms")),
            error_rate=min(error_rate, 1.0) if error_rate is not None else None,
            replicas_ready=endpoint.replicas_ready,
            replicas_desired=endpoint.replicas_desired,
            window_seconds=number(data.get("window_seconds"), high=3600) or 60,
            note=METRICS_NOTE,
        )

    def invoke_address(self, endpoint: Endpoint) -> str | None:
        """The address the agent reported once the serving generation was ready (its Ray
        Serve's HTTP proxy on 127.0.0.1), with the route prefix."""
        if not endpoint.url:
            return None
        prefix = str((endpoint.spec.get("serve") or {}).get("route_prefix") or "/")
        return endpoint.url.rstrip("/") + (prefix if prefix != "/" else "")


def _serving_generation(folder: EndpointFolder) -> int | None:
    """The generation the agent last said answers requests (``serving.json``)."""
    data = read_record(folder.serving)
    return number(data.get("generation"), low=1) if data else None


def log_path(endpoint_id: int, generation: int) -> Path:
    """Generation ``generation``'s log (the tests and the agent's notes)."""
    return EndpointFolder.of(endpoint_id).generation(generation).log
