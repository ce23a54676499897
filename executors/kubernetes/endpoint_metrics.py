"""An endpoint's traffic on a cluster, as its page and ``GET …/endpoints/{name}/metrics/`` show
it: Ray Serve's own metrics and its pods' GPU utilisation, read from the portal's Prometheus
(``TAU_PROMETHEUS_URL``), the one the GPU pages read.

Why the portal's Prometheus and not Ray itself: the portal cannot reach every Ray pod's
metrics port (8080) under a network policy, a Ray cluster's counters restart with each
upgrade's new cluster, and a rate needs the counters at two moments, which a platform's
Prometheus already keeps. The local backend's runner reads Ray Serve directly because on one
machine there is no Prometheus; both compute the same figures over the same minute
(``tau.serving``: requests per second, the error rate, p50/p95 latency).

How many questions: one instant query for the traffic and the endpoint's pods
(:meth:`telemetry.ray_serve.RayServeTelemetry.traffic`) and, for an endpoint with GPUs, one
for its pods' GPUs (``DcgmTelemetry.window_stats``, narrowed to the namespace and those pods,
as a run's GPU efficiency is). The answer is kept ``TAU_PROMETHEUS_CACHE_SECONDS`` in the
shared cache, failures included, so that everyone watching an endpoint costs Prometheus those
two queries, and a Prometheus that is down is waited on once, not by every viewer.

Never an exception to the page or the API: no ``TAU_PROMETHEUS_URL``, Prometheus down, a query
it refuses (a bad name override) or no series of the endpoint's pods (no scrape config for
them yet) each give the figures as None and a ``note`` that says why and what to configure.
The replicas ready and desired come from the endpoint's row, whatever Prometheus says.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final

from django.conf import settings
from django.utils import timezone

from portal.caching import hashed_key, through_cache
from serving.backends import EndpointMetrics
from tau.serving import METRICS_WINDOW_SECONDS
from tau.spec import spec_from_dict
from telemetry.dcgm import DcgmTelemetry, MetricNames
from telemetry.prometheus import (
    PrometheusClient,
    TelemetryError,
    TelemetryQueryError,
    TelemetryUnavailable,
)
from telemetry.ray_serve import RayServeTelemetry, ServeNames, ServeTraffic

if TYPE_CHECKING:
    from serving.models import Endpoint

logger = logging.getLogger(__name__)

#: The window the figures are over: the local backend's (``tau.serving``).
WINDOW_SECONDS: Final = int(METRICS_WINDOW_SECONDS)
#: How finely the GPUs' utilisation is sampled over the window (a usual scrape interval).
GPU_RESOLUTION_SECONDS: float = 15.0
SCRAPE_HINT: Final = (
    "Prometheus must scrape every Ray pod's metrics port (8080, named metrics) with its label "
    "taugrid.io/endpoint-id as a target label (docs/kubernetes.md, 'Endpoint metrics')"
)
NOT_CONFIGURED: Final = (
    "No figures: TAU_PROMETHEUS_URL is not set. Ray Serve's metrics of endpoints on a cluster "
    f"are read from the portal's Prometheus: set it. {SCRAPE_HINT}."
)
SOURCE: Final = (
    "From Ray Serve's own Prometheus metrics (its HTTP proxies' requests, errors and "
    "latency) over the last minute, read from the portal's Prometheus."
)


@dataclass(frozen=True)
class Measured:
    """What Prometheus said of one endpoint (kept in the cache as it is)."""

    traffic: ServeTraffic | None
    gpu_utilization: float | None
    note: str


def endpoint_metrics(endpoint: Endpoint) -> EndpointMetrics:
    """The endpoint's figures (module docstring)."""
    measured = _cached(endpoint)
    traffic = measured.traffic
    return EndpointMetrics(
        requests_per_second=traffic.requests_per_second if traffic else None,
        latency_p50_ms=traffic.latency_p50_ms if traffic else None,
        latency_p95_ms=traffic.latency_p95_ms if traffic else None,
        error_rate=traffic.error_rate if traffic else None,
        replicas_ready=endpoint.replicas_ready,
        replicas_desired=endpoint.replicas_desired,
        gpu_utilization=measured.gpu_utilization,
        window_seconds=WINDOW_SECONDS,
        note=measured.note,
    )


def _cached(endpoint: Endpoint) -> Measured:
    if not settings.TAU_PROMETHEUS_URL:
        return Measured(None, None, NOT_CONFIGURED)
    namespace = endpoint.workspace.namespace
    # One key per endpoint under this configuration (another Prometheus, other names).
    key = hashed_key(
        "serving:cluster-metrics",
        settings.TAU_PROMETHEUS_URL,
        settings.TAU_SERVE_METRICS,
        settings.TAU_SERVE_LABELS,
        settings.TAU_DCGM_METRICS,
        settings.TAU_DCGM_LABELS,
        endpoint.pk,
        endpoint.name,
        namespace,
    )
    return through_cache(
        key,
        Measured,
        lambda: measure(endpoint, namespace),
        seconds=settings.TAU_PROMETHEUS_CACHE_SECONDS,
    )


def _has_gpus(endpoint: Endpoint) -> bool:
    try:
        return spec_from_dict(endpoint.spec).compute.gpus > 0
    except Exception:  # an unreadable spec has no GPUs to ask about, and no page may fail on it
        return False


def measure(endpoint: Endpoint, namespace: str) -> Measured:
    """Ask Prometheus now (no cache): the traffic, then the GPUs of the pods it named."""
    try:
        client = PrometheusClient(
            settings.TAU_PROMETHEUS_URL,
            timeout=settings.TAU_PROMETHEUS_TIMEOUT_SECONDS,
            token=settings.TAU_PROMETHEUS_TOKEN,
        )
    except ValueError as error:
        return Measured(None, None, f"No figures: {error}.")
    with client:
        end = timezone.now()
        try:
            names = ServeNames.from_overrides(settings.TAU_SERVE_METRICS, settings.TAU_SERVE_LABELS)
            traffic = RayServeTelemetry(client, names).traffic(
                namespace=namespace,
                endpoint_id=endpoint.pk,
                application=endpoint.name,
                window_seconds=WINDOW_SECONDS,
                at=end,
            )
        except TelemetryUnavailable as error:
            logger.warning("endpoint %s: Ray Serve's metrics unavailable: %s", endpoint, error)
            return Measured(None, None, f"No figures: Prometheus is unavailable now: {error}.")
        except (TelemetryQueryError, ValueError) as error:
            logger.error("endpoint %s: Ray Serve's metrics query refused: %s", endpoint, error)
            return Measured(
                None,
                None,
                f"No figures: Prometheus refused TauGrid's query: {error}. Check "
                "TAU_SERVE_METRICS and TAU_SERVE_LABELS against the names Prometheus holds.",
            )
        if not traffic.pods:
            labels = names.labels
            return Measured(
                None,
                None,
                "No figures: Prometheus has no series of this endpoint's Ray pods in the last "
                f'minute ({labels.endpoint_id}="{endpoint.pk}", {labels.namespace}="{namespace}"). '
                f"They may have only just started; otherwise {SCRAPE_HINT}.",
            )
        if not _has_gpus(endpoint):
            return Measured(traffic, None, SOURCE)
        gpu, gpu_note = _gpu_utilization(client, namespace, traffic.pods, end)
        return Measured(traffic, gpu, f"{SOURCE} {gpu_note}".strip())


def _gpu_utilization(
    client: PrometheusClient, namespace: str, pods: tuple[str, ...], end: datetime
) -> tuple[float | None, str]:
    """The mean utilisation of the pods' GPUs over the window (each GPU's mean, averaged), and
    a note when there is none."""
    try:
        names = MetricNames.from_overrides(settings.TAU_DCGM_METRICS, settings.TAU_DCGM_LABELS)
        stats = DcgmTelemetry(client, names, scrape_interval=GPU_RESOLUTION_SECONDS).window_stats(
            "utilization",
            end - timedelta(seconds=WINDOW_SECONDS),
            end,
            namespace=namespace,
            pods=pods,
        )
    except (TelemetryError, ValueError) as error:
        logger.warning("endpoint pods' GPU utilisation not read: %s", error)
        return None, f"Its GPU utilisation could not be read: {error}."
    if not stats:
        return None, (
            "No GPU readings of its pods yet (dcgm-exporter's, with its pod mapping: docs/gpus.md)."
        )
    means = [found.mean for found in stats.values()]
    return round(sum(means) / len(means), 1), "GPU utilisation: the mean of its pods' GPUs."
