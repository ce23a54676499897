"""An endpoint's figures on a cluster (executors/kubernetes/endpoint_metrics.py,
telemetry/ray_serve.py) against the suite's real Prometheus (tests/telemetry/plugin.py),
without a Kubernetes API: a small exporter on 127.0.0.1 serves each Ray pod's metrics text in
Ray Serve's own names and labels, and Prometheus scrapes it as a PodMonitor would, each pod a
target with ``namespace``, ``pod`` and ``taugrid_io_endpoint_id`` (file-based discovery).
The counters grow at known rates, so the figures are known: requests per second summed over
the pods, the error rate, p50/p95 from the latency buckets, and the GPU utilisation of the
pods' GPUs from the replayed dcgm-exporter. Other endpoints' pods, and the same id in another
namespace, are never counted. Two queries (one without GPUs), none when cached; no
``TAU_PROMETHEUS_URL``, Prometheus stopped, or no series of its pods each give a note, never
an exception, through the API as well."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from executors.kubernetes import endpoint_metrics
from executors.kubernetes import endpoints as kube_endpoints
from executors.kubernetes.apps import KubernetesExecutorConfig
from executors.kubernetes.backend import KubernetesBackend
from serving.models import Endpoint, EndpointState
from tau.serving import ERRORS_METRIC, LATENCY_METRIC, REQUESTS_METRIC
from telemetry.prometheus import PrometheusClient
from telemetry.ray_serve import RayServeTelemetry, ServeNames
from tests.serving.factories import ENDPOINT_SPEC, make_endpoint
from tests.telemetry.plugin import HOSTS, PrometheusServer

HOST = HOSTS[0]
#: Where the latency of each request falls, as fractions of all requests at most each bound
#: (ms): p50 is 10 + 10 * (0.5 - 0.2) / (0.6 - 0.2) = 17.5, p95 50 + 50 * 0.05 / 0.1 = 75.
SHAPE = ((5.0, 0.0), (10.0, 0.2), (20.0, 0.6), (50.0, 0.9), (100.0, 1.0), (1000.0, 1.0))
P50, P95 = 17.5, 75.0
#: A window short enough to be covered in a few seconds of scrapes (the product's is 60 s).
WINDOW = 4
GPU_SPEC = ENDPOINT_SPEC.replace(b"  cpus: 1\n", b"  cpus: 1\n  gpus: 2\n")


# --- A Ray pod's metrics, as Ray exports them on port 8080 ------------------------------------


@dataclass
class PodTraffic:
    """What one Ray pod's proxy counts: requests and errors per second from ``since``."""

    application: str
    requests_per_second: float
    errors_per_second: float
    since: float = field(default_factory=time.time)


class RayMetricsExporter:
    """Each pod's Ray metrics at ``/pods/<pod>/metrics`` on 127.0.0.1, counters growing with
    the clock; a thread of the test process."""

    def __init__(self) -> None:
        self.pods: dict[str, PodTraffic] = {}
        self._lock = threading.Lock()
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = self.path.strip("/").split("/")
                pod = parts[1] if len(parts) == 3 and parts[0] == "pods" else ""
                text = exporter.render(pod)
                body = (text or "not found\n").encode()
                self.send_response(200 if text else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._server.server_address[1]}"

    def serve(self, pod: str, traffic: PodTraffic) -> None:
        with self._lock:
            self.pods[pod] = traffic

    def render(self, pod: str) -> str:
        with self._lock:
            traffic = self.pods.get(pod)
        if traffic is None:
            return ""
        seconds = time.time() - traffic.since
        requests = traffic.requests_per_second * seconds
        errors = traffic.errors_per_second * seconds
        # Ray's own labels on every series it exports, then the metric's tags.
        ray = (
            'Component="core_worker",NodeAddress="10.244.1.7",'
            'SessionName="session_2026-12-07_09-00-00_000000_1",Version="2.49.0"'
        )
        app = f'application="{traffic.application}"'
        route = 'method="POST",route="/"'
        lines = [
            "# HELP ray_node_cpu_utilization Total CPU usage on a ray node",
            "# TYPE ray_node_cpu_utilization gauge",
            f'ray_node_cpu_utilization{{{ray},instance="{pod}"}} 12.5',
        ]
        if requests:  # Ray Serve makes its counters at the first request
            lines += [
                f"# HELP {REQUESTS_METRIC} The number of HTTP requests processed.",
                f"# TYPE {REQUESTS_METRIC} counter",
                f'{REQUESTS_METRIC}{{{ray},{app},{route},status_code="200"}} {requests - errors!r}',
                f'{REQUESTS_METRIC}{{{ray},{app},{route},status_code="500"}} {errors!r}',
                f"# HELP {ERRORS_METRIC} The number of non-200 HTTP responses.",
                f"# TYPE {ERRORS_METRIC} counter",
                f'{ERRORS_METRIC}{{{ray},{app},{route},error_code="500"}} {errors!r}',
                "# HELP ray_serve_http_request_latency_ms The end-to-end latency of HTTP "
                "requests (measured from the Serve HTTP proxy).",
                "# TYPE ray_serve_http_request_latency_ms histogram",
            ]
            for bound, fraction in (*SHAPE, (float("inf"), 1.0)):
                le = "+Inf" if bound == float("inf") else repr(bound)
                lines.append(
                    f'{LATENCY_METRIC}{{{ray},{app},{route},status_code="200",le="{le}"}} '
                    f"{requests * fraction!r}"
                )
        return "\n".join(lines) + "\n"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@dataclass
class RayPods:
    """The exporter and the targets Prometheus scrapes from it."""

    prometheus: PrometheusServer
    exporter: RayMetricsExporter
    targets: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    def add(self, pod: str, *, namespace: str, endpoint_id: int, traffic: PodTraffic) -> None:
        self.exporter.serve(pod, traffic)
        labels = {"namespace": namespace, "pod": pod, "taugrid_io_endpoint_id": str(endpoint_id)}
        self.targets.append((f"{self.exporter.address}/pods/{pod}/metrics", labels))
        self.prometheus.set_pod_targets(self.targets)

    def wait_scraped(self, seconds: float) -> None:
        """Until every target has been scraped for ``seconds`` (its ``up`` that long; known by
        all its labels: an earlier test's pod of the same name may still be in the window)."""
        keys = ("namespace", "pod", "taugrid_io_endpoint_id")
        wanted = {tuple(labels[key] for key in keys) for _, labels in self.targets}
        self.prometheus.wait_for(
            f'count_over_time(up{{job="ray-pods"}}[{int(seconds) + 1}s]) >= {int(seconds)}',
            lambda samples: {tuple(s.labels.get(key) for key in keys) for s in samples} >= wanted,
            timeout=30 + seconds,
        )


@pytest.fixture
def ray_pods(prometheus: PrometheusServer, dcgm_exporter: Any) -> Iterator[RayPods]:
    exporter = RayMetricsExporter()
    pods = RayPods(prometheus, exporter)
    try:
        yield pods
    finally:
        prometheus.set_pod_targets([])
        exporter.stop()


@pytest.fixture
def measured(settings: Any, prometheus: PrometheusServer, monkeypatch: Any) -> Iterator[None]:
    """The portal on Kubernetes with the suite's Prometheus, nothing cached, a short window."""
    settings.TAU_BACKEND = "kubernetes"
    settings.TAU_PROMETHEUS_URL = prometheus.url
    settings.TAU_PROMETHEUS_CACHE_SECONDS = 0
    monkeypatch.setattr(endpoint_metrics, "WINDOW_SECONDS", WINDOW)
    monkeypatch.setattr(endpoint_metrics, "GPU_RESOLUTION_SECONDS", 1.0)
    cache.clear()
    yield
    cache.clear()


def on_cluster(world: Any, **kwargs: Any) -> Endpoint:
    """An endpoint deployed (on the suite's fake backend), then made the Kubernetes backend's,
    serving one replica."""
    with override_settings(TAU_BACKEND="local"):
        endpoint = make_endpoint(world, **kwargs)
    Endpoint.objects.unscoped().filter(pk=endpoint.pk).update(
        backend="kubernetes", state=EndpointState.READY, replicas_ready=1
    )
    return Endpoint.objects.unscoped().select_related("workspace").get(pk=endpoint.pk)


def metrics_of(endpoint: Endpoint) -> Any:
    return KubernetesBackend().endpoints.metrics(endpoint)


# --- Against the real Prometheus ----------------------------------------------------------------


@pytest.mark.django_db
def test_the_figures_are_the_pods_traffic_and_their_gpus(
    world: Any, measured: None, ray_pods: RayPods, dcgm_exporter: Any, prometheus: PrometheusServer
) -> None:
    endpoint = on_cluster(world, spec=GPU_SPEC)
    other = on_cluster(world, name="other")
    namespace = endpoint.workspace.namespace
    # The head's proxy and a worker's; the worker holds the endpoint's two GPUs.
    head, worker = (
        f"{endpoint.name}-raycluster-x7k2p-head",
        f"{endpoint.name}-raycluster-x7k2p-worker-q9",
    )
    ray_pods.add(
        head, namespace=namespace, endpoint_id=endpoint.pk, traffic=PodTraffic("chat", 6.0, 0.3)
    )
    ray_pods.add(
        worker, namespace=namespace, endpoint_id=endpoint.pk, traffic=PodTraffic("chat", 4.0, 0.2)
    )
    # Neither another endpoint's pod nor the same id in another namespace counts.
    ray_pods.add(
        "other-head",
        namespace=namespace,
        endpoint_id=other.pk,
        traffic=PodTraffic("other", 50.0, 25.0),
    )
    ray_pods.add(
        "elsewhere-head",
        namespace="tau-beta",
        endpoint_id=endpoint.pk,
        traffic=PodTraffic("chat", 70.0, 70.0),
    )
    dcgm_exporter.set_value(HOST, 0, "utilization", 80)
    dcgm_exporter.set_value(HOST, 1, "utilization", 60)
    dcgm_exporter.set_value(HOST, 2, "utilization", 5)
    dcgm_exporter.assign(HOST, 0, namespace=namespace, pod=worker, container="ray-worker")
    dcgm_exporter.assign(HOST, 1, namespace=namespace, pod=worker, container="ray-worker")
    dcgm_exporter.assign(HOST, 2, namespace=namespace, pod="other-head", container="ray-head")
    prometheus.wait_for(
        'count(DCGM_FI_DEV_GPU_UTIL{pod!=""})', lambda samples: [s.value for s in samples] == [3]
    )
    ray_pods.wait_scraped(WINDOW + 2)

    before = prometheus.queries_answered()
    figures = metrics_of(endpoint)
    assert prometheus.queries_answered() - before == 2  # the traffic, then its pods' GPUs

    assert figures.requests_per_second == pytest.approx(10.0, rel=0.05)
    assert figures.error_rate == pytest.approx(0.05, abs=0.001)
    assert figures.latency_p50_ms == pytest.approx(P50, abs=0.05)
    assert figures.latency_p95_ms == pytest.approx(P95, abs=0.05)
    assert figures.gpu_utilization == 70.0
    assert (figures.replicas_ready, figures.replicas_desired) == (1, 1)
    assert figures.window_seconds == WINDOW
    assert figures.note.startswith("From Ray Serve's own Prometheus metrics")

    # An endpoint without GPUs asks one query, and its figures are its own pod's.
    before = prometheus.queries_answered()
    others = metrics_of(other)
    assert prometheus.queries_answered() - before == 1
    assert others.requests_per_second == pytest.approx(50.0, rel=0.05)
    assert others.error_rate == pytest.approx(0.5, abs=0.001)
    assert others.gpu_utilization is None


@pytest.mark.django_db
def test_answers_are_shared_for_the_cache_s_seconds(
    world: Any, measured: None, ray_pods: RayPods, prometheus: PrometheusServer, settings: Any
) -> None:
    settings.TAU_PROMETHEUS_CACHE_SECONDS = 30
    endpoint = on_cluster(world)
    ray_pods.add(
        "chat-head",
        namespace=endpoint.workspace.namespace,
        endpoint_id=endpoint.pk,
        traffic=PodTraffic("chat", 2.0, 0.0),
    )
    ray_pods.wait_scraped(WINDOW + 2)
    before = prometheus.queries_answered()
    first = metrics_of(endpoint)
    again = metrics_of(endpoint)
    assert prometheus.queries_answered() - before == 1
    assert again == first
    assert first.requests_per_second == pytest.approx(2.0, rel=0.05)
    assert first.error_rate == 0.0


@pytest.mark.django_db
def test_pods_scraped_before_any_request_serve_zero_and_no_latency(
    world: Any, measured: None, ray_pods: RayPods
) -> None:
    endpoint = on_cluster(world)
    ray_pods.add(
        "chat-head",
        namespace=endpoint.workspace.namespace,
        endpoint_id=endpoint.pk,
        traffic=PodTraffic("chat", 0.0, 0.0),
    )
    ray_pods.wait_scraped(1)
    figures = metrics_of(endpoint)
    assert figures.requests_per_second == 0.0
    assert (figures.error_rate, figures.latency_p50_ms, figures.latency_p95_ms) == (
        None,
        None,
        None,
    )
    assert figures.note.startswith("From Ray Serve's own Prometheus metrics")


@pytest.mark.django_db
def test_the_watcher_s_pass_records_the_traffic_for_the_pages_and_the_idle_count(
    world: Any, measured: None, ray_pods: RayPods, prometheus: PrometheusServer, settings: Any
) -> None:
    endpoint = on_cluster(world)
    assert (endpoint.requests_per_second, endpoint.last_request_at) == (None, None)
    ray_pods.add(
        "chat-head",
        namespace=endpoint.workspace.namespace,
        endpoint_id=endpoint.pk,
        traffic=PodTraffic("chat", 8.0, 0.0),
    )
    ray_pods.wait_scraped(WINDOW + 2)
    kube_endpoints._record_traffic(endpoint)
    endpoint.refresh_from_db()
    assert endpoint.requests_per_second == pytest.approx(8.0, rel=0.05)
    assert endpoint.error_rate == 0.0
    assert endpoint.metrics_at is not None
    # Requests sent straight to its address count: it is not idle.
    assert endpoint.last_request_at == endpoint.metrics_at
    # Recorded again only after TRAFFIC_RECORDED_EVERY: the next pass asks nothing.
    before = prometheus.queries_answered()
    kube_endpoints._record_traffic(endpoint)
    assert prometheus.queries_answered() == before
    # Without a Prometheus nothing is asked, and nothing recorded.
    settings.TAU_PROMETHEUS_URL = ""
    Endpoint.objects.unscoped().filter(pk=endpoint.pk).update(metrics_at=None)
    endpoint.refresh_from_db()
    kube_endpoints._record_traffic(endpoint)
    endpoint.refresh_from_db()
    assert endpoint.metrics_at is None


@pytest.mark.django_db
def test_no_series_of_its_pods_says_what_the_scrape_config_needs(
    world: Any, measured: None, ray_pods: RayPods
) -> None:
    endpoint = on_cluster(world)
    figures = metrics_of(endpoint)
    assert figures.requests_per_second is None
    assert figures.error_rate is None
    assert f'taugrid_io_endpoint_id="{endpoint.pk}"' in figures.note
    assert "docs/kubernetes.md, 'Endpoint metrics'" in figures.note
    assert (figures.replicas_ready, figures.replicas_desired) == (1, 1)


@pytest.mark.django_db
def test_prometheus_stopped_is_a_note_in_the_api_never_an_error(
    world: Any, measured: None, dcgm_exporter: Any, prometheus: PrometheusServer
) -> None:
    endpoint = on_cluster(world)
    prometheus.stop()
    response = world.api_client_for("viewer").get(
        f"/api/v1/workspaces/alpha/endpoints/{endpoint.name}/metrics/"
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["requests_per_second"] is None
    assert body["replicas_ready"] == 1
    assert "Prometheus is unavailable now" in body["note"]
    assert "connection refused" in body["note"]


@pytest.mark.django_db
def test_without_a_prometheus_the_note_says_what_to_configure(world: Any, settings: Any) -> None:
    settings.TAU_BACKEND = "kubernetes"
    settings.TAU_PROMETHEUS_URL = ""
    endpoint = on_cluster(world)
    body = (
        world.api_client_for("viewer")
        .get(f"/api/v1/workspaces/alpha/endpoints/{endpoint.name}/metrics/")
        .json()
    )
    assert body["requests_per_second"] is None
    assert body["gpu_utilization"] is None
    assert "TAU_PROMETHEUS_URL is not set" in body["note"]
    assert "taugrid.io/endpoint-id as a target label" in body["note"]


# --- The query and the names, without a server -------------------------------------------------


def test_the_one_query_names_the_namespace_and_the_endpoint_everywhere() -> None:
    telemetry = RayServeTelemetry(PrometheusClient("http://127.0.0.1:9"))
    expr = telemetry.expression('tau-"alpha"', 7, "chat", 60)
    selectors = expr.count("{")
    assert expr.count('namespace="tau-\\"alpha\\""') == selectors
    assert expr.count('taugrid_io_endpoint_id="7"') == selectors
    assert expr.count('application="chat"') == selectors - 1  # not on `up`
    assert f"histogram_quantile(0.95, sum by (le) (rate({LATENCY_METRIC}{{" in expr
    assert "group by (pod) (count_over_time(up{" in expr


def test_names_follow_the_settings_and_a_bad_one_stops_the_start(settings: Any) -> None:
    names = ServeNames.from_overrides(
        '{"requests": "serve_requests_total"}', '{"endpoint_id": "endpoint", "pod": "exported_pod"}'
    )
    expr = RayServeTelemetry(PrometheusClient("http://127.0.0.1:9"), names).expression(
        "ns", 3, "a", 60
    )
    assert 'serve_requests_total{namespace="ns", endpoint="3"' in expr
    assert "group by (exported_pod)" in expr
    for metrics, labels, words in (
        (
            '{"latency": "x"}',
            "",
            ["TAU_SERVE_METRICS", "'latency'", "requests, errors, latency_bucket"],
        ),
        (
            "",
            '{"endpoint_id": "taugrid.io/endpoint-id"}',
            ["TAU_SERVE_LABELS['endpoint_id']", "not a valid"],
        ),
        ("", "[1]", ["TAU_SERVE_LABELS", "JSON object"]),
    ):
        with pytest.raises(ValueError, match="TAU_SERVE_") as refused:
            ServeNames.from_overrides(metrics, labels)
        assert all(word in str(refused.value) for word in words), str(refused.value)
    settings.TAU_SERVE_LABELS = '{"endpoint": "x"}'
    import executors.kubernetes as package

    with pytest.raises(
        ImproperlyConfigured, match="TAU_SERVE_LABELS has an unknown key 'endpoint'"
    ):
        KubernetesExecutorConfig("executors.kubernetes", package).ready()
