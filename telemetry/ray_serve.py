"""Ray Serve's own Prometheus metrics as a platform's Prometheus holds them for an endpoint on
a cluster: the metric and label names, and the one query that gives its traffic.

Which series are an endpoint's
==============================

Every Ray pod exports Ray's metrics on its metrics port (8080, the container port KubeRay
names ``metrics``), Ray Serve's among them: its HTTP proxies count requests
(``ray_serve_num_http_requests_total``), error responses
(``ray_serve_num_http_error_requests_total``) and their latency
(``ray_serve_http_request_latency_ms_bucket``), labelled with Ray Serve's ``application``.
Nothing in those series says which endpoint, workspace or namespace they belong to: Ray does
not know. The platform's scrape config adds it, as *target* labels from the pod's labels:
every Ray pod TauGrid renders carries ``taugrid.io/endpoint-id`` (the endpoint's primary key:
unique in the portal, the same through every update, unlike its generation, which the pods
do not carry), and a Prometheus Operator PodMonitor with ``podTargetLabels:
[taugrid.io/endpoint-id]`` turns it into the label ``taugrid_io_endpoint_id`` on every series
of the pod, next to ``namespace`` and ``pod``, which it always adds (docs/kubernetes.md,
"Endpoint metrics", has the PodMonitor). A target label is also on the pod's ``up`` series,
which says which pods were scraped at all, Ray Serve traffic or not: that is how the GPU
utilisation finds the endpoint's pods, worker pods included.

The selector always names the namespace as well: an endpoint's id is unique, but a Prometheus
shared by several portals is not, and a workspace's question must never reach another
namespace's series (the rule :mod:`telemetry.dcgm` follows).

Names
=====

:class:`ServeNames` holds Ray's metric names and the labels a PodMonitor gives; the settings
``TAU_SERVE_METRICS`` and ``TAU_SERVE_LABELS`` (JSON objects) override them, e.g.
``{"endpoint_id": "endpoint"}`` for a scrape config that relabels the pod label to another
name, or ``{"namespace": "kubernetes_namespace"}`` for a plain ``kubernetes_sd_configs`` job
with ``labelmap``.

One query
=========

:meth:`RayServeTelemetry.traffic` asks everything in one instant query: each figure tagged
with a ``taugrid_figure`` label and unioned with ``or`` (as ``DcgmTelemetry.window_stats``
does), so a page costs Prometheus one round trip however many figures it shows:

- requests per second: ``sum(rate(requests[window]))`` over every proxy of the endpoint;
- the error rate: ``sum(rate(errors[window]))`` divided by the requests, here;
- latency p50 and p95: ``histogram_quantile`` over ``sum by (le)`` of the buckets' rates;
- the pods: ``group by (pod)`` of the ``up`` series seen in the window.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import Final

from tau.serving import ERRORS_METRIC, LATENCY_METRIC, REQUESTS_METRIC
from telemetry.dcgm import LABEL_NAME, METRIC_NAME, parse_overrides, selector
from telemetry.prometheus import PrometheusClient, quote

__all__ = [
    "FIGURE_TAG",
    "RayServeTelemetry",
    "ServeLabelNames",
    "ServeNames",
    "ServeTraffic",
]

#: The label each figure of the one query is tagged with.
FIGURE_TAG: Final = "taugrid_figure"
#: Ray Serve's metric fields, in the order the settings document them.
METRIC_FIELDS: Final = ("requests", "errors", "latency_bucket")


@dataclass(frozen=True)
class ServeLabelNames:
    """The labels that say whose a series is: the endpoint's id and namespace and the pod
    (target labels of the platform's scrape config), and Ray Serve's own application."""

    endpoint_id: str = "taugrid_io_endpoint_id"
    namespace: str = "namespace"
    pod: str = "pod"
    application: str = "application"


@dataclass(frozen=True)
class ServeNames:
    """Ray Serve's metrics (``tau.serving`` reads the same ones on this machine) and the
    labels of :class:`ServeLabelNames`."""

    requests: str = REQUESTS_METRIC
    errors: str = ERRORS_METRIC
    latency_bucket: str = LATENCY_METRIC
    labels: ServeLabelNames = field(default_factory=ServeLabelNames)

    @classmethod
    def from_overrides(cls, metrics_json: str, labels_json: str) -> ServeNames:
        """The defaults with ``TAU_SERVE_METRICS`` (``{"requests": "..."}``) and
        ``TAU_SERVE_LABELS`` (``{"endpoint_id": "endpoint"}``) applied; an empty string leaves
        the defaults. A ValueError names the setting and what is wrong (settings make it a
        startup error)."""
        metrics = parse_overrides("TAU_SERVE_METRICS", metrics_json, METRIC_FIELDS, METRIC_NAME)
        label_fields = tuple(f.name for f in fields(ServeLabelNames))
        labels = parse_overrides("TAU_SERVE_LABELS", labels_json, label_fields, LABEL_NAME)
        return replace(cls(), **metrics, labels=replace(ServeLabelNames(), **labels))


@dataclass(frozen=True)
class ServeTraffic:
    """An endpoint's traffic over the window. None where there is no figure: no requests (no
    error rate, no latency), or nothing of it in Prometheus at all (``pods`` empty)."""

    requests_per_second: float | None
    error_rate: float | None
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    #: Its pods Prometheus scraped in the window, sorted.
    pods: tuple[str, ...]


class RayServeTelemetry:
    """The question a cluster's endpoint page asks of Ray Serve's metrics (module docstring)."""

    def __init__(self, client: PrometheusClient, names: ServeNames | None = None) -> None:
        self.client = client
        self.names = names if names is not None else ServeNames()

    def traffic(
        self,
        *,
        namespace: str,
        endpoint_id: int | str,
        application: str,
        window_seconds: int = 60,
        at: datetime | None = None,
    ) -> ServeTraffic:
        """The endpoint's traffic over the ``window_seconds`` before ``at`` (now when None):
        one instant query. Requests per second and the error rate are 0 for pods that are
        scraped but have counted nothing (Ray Serve makes its counters at the first request)."""
        if not namespace:
            raise ValueError("namespace must be the endpoint's namespace, not empty")
        if window_seconds < 1:
            raise ValueError(f"window_seconds must be at least 1, not {window_seconds}")
        expr = self.expression(namespace, endpoint_id, application, window_seconds)
        samples = self.client.query(expr, at)
        figures: dict[str, float] = {}
        pods: set[str] = set()
        for sample in samples:
            figure = sample.labels.get(FIGURE_TAG)
            if figure == "pod":
                pod = sample.labels.get(self.names.labels.pod)
                if pod:
                    pods.add(pod)
            elif figure is not None:
                figures.setdefault(figure, sample.value)
        return self._traffic(figures, tuple(sorted(pods)))

    def expression(
        self, namespace: str, endpoint_id: int | str, application: str, window_seconds: int
    ) -> str:
        """The one query (module docstring)."""
        labels = self.names.labels
        ours = [
            f"{labels.namespace}={quote(namespace)}",
            f"{labels.endpoint_id}={quote(str(endpoint_id))}",
        ]
        served = [*ours, f"{labels.application}={quote(application)}"]
        window = f"[{window_seconds}s]"

        def rate(metric: str) -> str:
            return f"rate({selector(metric, served)}{window})"

        buckets = f"sum by (le) ({rate(self.names.latency_bucket)})"
        parts = {
            "requests": f"sum({rate(self.names.requests)})",
            "errors": f"sum({rate(self.names.errors)})",
            "p50": f"histogram_quantile(0.5, {buckets})",
            "p95": f"histogram_quantile(0.95, {buckets})",
            "pod": f"group by ({labels.pod}) (count_over_time({selector('up', ours)}{window}))",
        }
        return " or ".join(
            f'label_replace({expr}, "{FIGURE_TAG}", "{name}", "", "")'
            for name, expr in parts.items()
        )

    @staticmethod
    def _traffic(figures: Mapping[str, float], pods: tuple[str, ...]) -> ServeTraffic:
        requests = figures.get("requests")
        if requests is None and pods:
            requests = 0.0  # scraped, and no request counted yet
        errors = figures.get("errors", 0.0 if requests is not None else None)
        error_rate = None
        if requests and errors is not None:
            error_rate = round(min(max(errors / requests, 0.0), 1.0), 4)
        return ServeTraffic(
            requests_per_second=None if requests is None else round(requests, 3),
            error_rate=error_rate,
            latency_p50_ms=_rounded(figures.get("p50")) if requests else None,
            latency_p95_ms=_rounded(figures.get("p95")) if requests else None,
            pods=pods,
        )


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
