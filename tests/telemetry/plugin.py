"""pytest plugin: a real Prometheus scraping a replayed dcgm-exporter, for any test that needs
GPU telemetry (fixtures ``prometheus`` and ``dcgm_exporter``).

Why a plugin: the GPU pages, the API, the per-run efficiency and the adapter's own tests all
want the same Prometheus, and a session fixture must be defined once to be started once.
Registered from the root conftest (``pytest_plugins``).

``prometheus`` (session) starts Debian's ``prometheus`` (2.42; deploy/dev/test_tools.py
installs it) on 127.0.0.1 on a free port, with its own ``--storage.tsdb.path`` in a temporary
directory, ``--web.enable-lifecycle``, and a 1 s scrape and evaluation interval so a test sees
a change within a second or two. It scrapes the exporter of deploy/dev/dcgm_replay.py (a
thread of the test process, on 127.0.0.1), which replays the frames of tests/telemetry/data/
(synthesised, not recorded: that directory's README says so) for the hosts ``gpu-h100-1`` and
``gpu-h100-2``, the test cluster's KWOK GPU nodes, with 8 GPUs each. Prometheus is stopped and
its directory removed when the session ends. A Prometheus that does not start fails the test
with the end of its log; a missing binary fails too (never a skip: the telemetry tests would
otherwise pass by not running).

The object it gives: ``.url``, ``.exporter`` (the :class:`DcgmReplay`: ``set_hosts``,
``assign``/``unassign``, ``set_value``/``clear_override``, ``set_pattern``, ``frame``,
``served``, ``host_label``), ``.set_pod_targets()`` (more scrape targets, the pods of
endpoints' Ray clusters with the labels a PodMonitor gives them, through file-based service
discovery: none unless a test sets them), ``.stop()`` / ``.start()`` (down and back up on the
same port, with its data), ``.wait_for(expr, predicate, timeout)``, ``.client()`` / ``.telemetry()``
(the adapter pointed at it) and ``.queries_answered()`` (Prometheus' own count of the queries
it answered: how tests pin "one query per metric").

``dcgm_exporter`` (per test) resets the exporter to those two hosts, no pods, no pinned
values and the frame moving, before and after the test, and makes sure Prometheus runs: use it
in every test that changes what the exporter serves or stops Prometheus.
"""

from __future__ import annotations

import collections
import contextlib
import json
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from telemetry.dcgm import DcgmTelemetry, MetricNames
from telemetry.prometheus import InstantSample, PrometheusClient, TelemetryError
from tests.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
REPLAY_SCRIPT = REPO / "deploy" / "dev" / "dcgm_replay.py"
#: The test cluster's fake GPU nodes (deploy/cluster/nodes/gpu-h100.yaml).
HOSTS = ("gpu-h100-1", "gpu-h100-2")
GPUS_PER_HOST = 8
SCRAPE_SECONDS = 1
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
LOG_TAIL_LINES = 40

CONFIG = """\
# Written by tests/telemetry/plugin.py for one test session.
global:
  scrape_interval: {scrape}s
  scrape_timeout: {scrape}s
  evaluation_interval: {scrape}s
scrape_configs:
  - job_name: dcgm
    # The exporter's own namespace/pod/container labels are the GPUs' pods: keep them.
    honor_labels: true
    static_configs:
      - targets: ["127.0.0.1:{exporter_port}"]
  - job_name: ray-pods
    # Pods of endpoints' Ray clusters, as a Prometheus Operator PodMonitor finds them: each
    # target with its namespace, pod and podTargetLabels (set_pod_targets). None by default.
    file_sd_configs:
      - files: ["{pod_targets}"]
        refresh_interval: {scrape}s
"""


def load_replay() -> ModuleType:
    """Import deploy/dev/dcgm_replay.py by path (deploy/ is not a Python package)."""
    return load_script(REPLAY_SCRIPT, "taugrid_dcgm_replay")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    if not path.is_file():
        return "(no log)"
    with path.open(encoding="utf-8", errors="replace") as log:
        return "".join(collections.deque(log, maxlen=lines)) or "(empty log)"


@dataclass
class PrometheusServer:
    """A running Prometheus for tests and the exporter it scrapes."""

    binary: str
    directory: Path
    port: int
    # The replay module's DcgmReplay (loaded by path, hence Any).
    exporter: Any
    started_at: datetime = field(default_factory=lambda: datetime.now(tz=UTC))
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.directory / "prometheus.log"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pod_targets_path(self) -> Path:
        return self.directory / "pod-targets.json"

    def write_config(self) -> Path:
        config = self.directory / "prometheus.yml"
        if not self.pod_targets_path.exists():
            self.set_pod_targets([])
        config.write_text(
            CONFIG.format(
                scrape=SCRAPE_SECONDS,
                exporter_port=self.exporter.port,
                pod_targets=self.pod_targets_path,
            ),
            encoding="utf-8",
        )
        return config

    def set_pod_targets(self, targets: list[tuple[str, dict[str, str]]]) -> None:
        """Scrape exactly these targets in the ``ray-pods`` job: (address with path, e.g.
        ``127.0.0.1:8123/pods/p/metrics``, the target labels), as Kubernetes service
        discovery with a PodMonitor would give them. Prometheus reads the file again within a
        scrape interval; an empty list stops the job's scrapes (their series go stale)."""
        groups = []
        for address, target_labels in targets:
            host, _, path = address.partition("/")
            groups.append(
                {
                    "targets": [host],
                    "labels": {**target_labels, "__metrics_path__": f"/{path or 'metrics'}"},
                }
            )
        staged = self.pod_targets_path.with_suffix(".tmp")
        staged.write_text(json.dumps(groups), encoding="utf-8")
        staged.replace(self.pod_targets_path)  # whole or not at all, for the file watcher

    def start(self) -> None:
        """Start Prometheus (again) on the same port with the same data, and wait until it
        answers queries."""
        if self.running:
            return
        config = self.write_config()
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.directory / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--web.enable-lifecycle",
                    "--storage.tsdb.retention.time=2h",
                    "--log.level=info",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.directory,
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if self._process.poll() is not None:
                code = self._process.returncode
                self._process = None
                pytest.fail(
                    f"prometheus exited with code {code} while starting; the end of its log "
                    f"({self.log_path}):\n{log_tail(self.log_path)}",
                    pytrace=False,
                )
            try:
                ready = httpx.get(f"{self.url}/-/ready", timeout=1.0, trust_env=False)
                if ready.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(
                    f"prometheus did not become ready on {self.url} within "
                    f"{READY_TIMEOUT_S:.0f}s; the end of its log:\n{log_tail(self.log_path)}",
                    pytrace=False,
                )
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop Prometheus (``POST /-/quit``, then SIGTERM, then SIGKILL) and wait for it: its
        port refuses connections afterwards."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(f"{self.url}/-/quit", timeout=2.0, trust_env=False)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.terminate()
                try:
                    process.wait(timeout=STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self._process = None

    def client(self, *, timeout: float = 2.0) -> PrometheusClient:
        return PrometheusClient(self.url, timeout=timeout)

    def telemetry(self, names: MetricNames | None = None, *, timeout: float = 2.0) -> DcgmTelemetry:
        """The adapter pointed at this Prometheus, with its 1 s scrape interval."""
        return DcgmTelemetry(
            self.client(timeout=timeout), names, scrape_interval=float(SCRAPE_SECONDS)
        )

    def wait_for(
        self,
        expr: str,
        predicate: Callable[[list[InstantSample]], bool],
        timeout: float = 30.0,
    ) -> list[InstantSample]:
        """Poll the instant query ``expr`` until ``predicate`` holds for its answer (the
        scrape is periodic: a change the exporter serves shows a second or two later)."""
        deadline = time.monotonic() + timeout
        last: object = "(no answer yet)"
        with self.client() as client:
            while True:
                try:
                    samples = client.query(expr)
                    if predicate(samples):
                        return samples
                    last = [(dict(s.labels), s.value) for s in samples][:20]
                except TelemetryError as error:
                    last = error
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"timed out after {timeout:.0f}s waiting for {expr!r} to satisfy "
                        f"{getattr(predicate, '__name__', predicate)}; last answer: {last}",
                        pytrace=False,
                    )
                time.sleep(0.25)

    def wait_until_served(self, timeout: float = 30.0) -> None:
        """Wait until Prometheus holds what the exporter serves now, for every GPU (compared
        on utilisation and power, which every frame sets): for a test that pinned a frame,
        before it asks. A moving frame has no "now" to wait for: pin it first."""
        exporter = self.exporter
        if not exporter.frame_pinned:
            pytest.fail(
                "wait_until_served() needs a pinned frame (exporter.frame = N): moving frames "
                "change every second, faster than Prometheus can be compared with them",
                pytrace=False,
            )
        expected: dict[tuple[str, str], tuple[Any, Any]] = {}
        for host in exporter.hosts:
            for gpu in range(exporter.gpus(host)):
                served = exporter.served(host, gpu)
                expected[(host, str(gpu))] = (served["utilization"], served["power_w"])
        label = exporter.host_label

        def holds_the_served_values(samples: list[InstantSample]) -> bool:
            seen: dict[tuple[str, str], dict[str, float]] = {}
            for sample in samples:
                key = (sample.labels.get(label, ""), sample.labels.get("gpu", ""))
                seen.setdefault(key, {})[sample.labels.get("__name__", "")] = sample.value
            for key, (utilization, power) in expected.items():
                values = seen.get(key, {})
                if utilization is not None and values.get("DCGM_FI_DEV_GPU_UTIL") != float(
                    utilization
                ):
                    return False
                if power is not None and values.get("DCGM_FI_DEV_POWER_USAGE") != float(power):
                    return False
            return set(seen) == set(expected)

        self.wait_for(
            '{__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_POWER_USAGE"}',
            holds_the_served_values,
            timeout,
        )

    def queries_answered(self, handler: str = "/api/v1/query") -> int:
        """How many requests Prometheus has answered on ``handler`` (its own
        ``prometheus_http_requests_total``, read from its /metrics)."""
        text = httpx.get(f"{self.url}/metrics", timeout=5.0, trust_env=False).text
        total = 0.0
        for family in text_string_to_metric_families(text):
            if family.name != "prometheus_http_requests":
                continue
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels.get("handler") == handler:
                    total += sample.value
        return int(total)


@pytest.fixture(scope="session")
def prometheus() -> Iterator[PrometheusServer]:
    """A real Prometheus on 127.0.0.1 scraping the replayed dcgm-exporter, for the session."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail(
            "the `prometheus` server is not installed; `python deploy/dev/test_tools.py` "
            "installs Debian's package (apt-get install prometheus)",
            pytrace=False,
        )
    replay = load_replay()
    exporter = replay.DcgmReplay()
    exporter.set_hosts(HOSTS, gpus=GPUS_PER_HOST)
    exporter.start()
    directory = Path(tempfile.mkdtemp(prefix="taugrid-prometheus-"))
    server = PrometheusServer(
        binary=binary, directory=directory, port=free_port(), exporter=exporter
    )
    try:
        server.start()
        yield server
    finally:
        server.stop()
        exporter.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def dcgm_exporter(prometheus: PrometheusServer) -> Iterator[Any]:
    """The exporter, reset before and after the test (two hosts of 8 GPUs, no pods, nothing
    pinned, the frame moving, ``Hostname``), with Prometheus running."""
    prometheus.exporter.reset(HOSTS, gpus=GPUS_PER_HOST)
    prometheus.start()
    yield prometheus.exporter
    prometheus.exporter.reset(HOSTS, gpus=GPUS_PER_HOST)
    prometheus.start()
