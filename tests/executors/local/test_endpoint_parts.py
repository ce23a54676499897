"""The parts of the local executor's endpoints that need no agent and no Ray (issue 34): the
runner's reading of Ray Serve's status and Prometheus metrics (``tau.serving``), the files
the backend and the agent share (``endpoint_files``), what an endpoint holds of the machine,
the Serve application it deploys (the same as a cluster's), the words of its states, and the
backend's answers from those files. The real thing is test_agent_endpoints.py."""

from __future__ import annotations

import json
import os
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from executors.kubernetes.render_endpoint import EndpointTarget, serve_config
from executors.local.agent import admission
from executors.local.agent.endpoint_files import (
    EndpointFolder,
    Handed,
    hand_over,
    handed,
    metrics_file,
    read_record,
    read_status,
    write_record,
)
from executors.local.agent.endpoints import (
    RAY_PROCESSES_MEMORY,
    deploy_failed_message,
    memory_limit,
    serve_application,
    unhealthy_words,
)
from executors.local.endpoints import LocalEndpoints
from serving.models import Endpoint
from tau import serving
from tau.spec import load_spec

#: deploy_problems judges this machine alone: any workspace gets the same answer.
NO_WORKSPACE: Any = None
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "serve-cpu" / "tau.yaml"

ENDPOINT = """\
schema_version: 1
name: chat
run: {workload_kind: rayservice}
serve:
  import_path: app:deployment
  replicas: 2
  route_prefix: /chat
compute: {cpus: 500m, memory: 1Gi}
"""

AUTOSCALING = ENDPOINT.replace(
    "  replicas: 2\n",
    "  autoscaling: {min_replicas: 1, max_replicas: 3, target_ongoing_requests: 2}\n",
)


# --- the runner (tau.serving) -------------------------------------------------------------

PROMETHEUS = """\
# HELP ray_serve_num_http_requests_total The number of HTTP requests processed.
# TYPE ray_serve_num_http_requests_total counter
ray_serve_num_http_requests_total{application="chat",method="POST",route="/chat"} {requests}
ray_serve_num_http_requests_total{application="other",method="POST",route="/"} 1000.0
ray_serve_num_http_error_requests_total{application="chat",error_code="500",method="POST"} {errors}
ray_serve_http_request_latency_ms_bucket{application="chat",le="10.0",method="POST"} {fast}
ray_serve_http_request_latency_ms_bucket{application="chat",le="100.0",method="POST"} {requests}
ray_serve_http_request_latency_ms_bucket{application="chat",le="+Inf",method="POST"} {requests}
ray_serve_http_request_latency_ms_bucket{application="other",le="10.0",method="POST"} 1000.0
"""


def export(requests: float, errors: float, fast: float) -> str:
    return (
        PROMETHEUS.replace("{requests}", str(requests))
        .replace("{errors}", str(errors))
        .replace("{fast}", str(fast))
    )


def test_the_runner_reads_its_applications_counters_only() -> None:
    sample = serving.read_sample(export(40, 2, 30), "chat", now=5.0)
    assert (sample.time, sample.requests, sample.errors) == (5.0, 40, 2)
    assert sample.buckets == ((10.0, 30.0), (100.0, 40.0), (float("inf"), 40.0))


def test_the_window_gives_rates_latency_quantiles_and_the_error_rate() -> None:
    first = serving.read_sample(export(40, 2, 30), "chat", now=0.0)
    last = serving.read_sample(export(140, 7, 80), "chat", now=50.0)
    figures = serving.traffic([first, last])
    assert figures["requests_per_second"] == 2.0
    assert figures["error_rate"] == 0.05
    assert figures["window_seconds"] == 50
    # 100 requests: 50 at most 10 ms, 50 more at most 100 ms (interpolated in the bucket).
    assert figures["latency_p50_ms"] == 10.0
    assert figures["latency_p95_ms"] == 91.0


def test_no_requests_no_latency_and_no_error_rate() -> None:
    quiet = [serving.read_sample(export(40, 2, 30), "chat", now=t) for t in (0.0, 30.0)]
    assert serving.traffic(quiet) == {
        "requests_per_second": 0.0,
        "latency_p50_ms": None,
        "latency_p95_ms": None,
        "error_rate": None,
        "window_seconds": 30,
    }
    assert serving.traffic(quiet[:1])["requests_per_second"] is None


def test_a_quantile_in_the_last_bucket_is_its_lower_bound() -> None:
    assert serving.quantile([(10.0, 1.0), (float("inf"), 10.0)], 0.95) == 10.0
    assert serving.quantile([], 0.5) is None


def test_ray_serves_details_are_summarised_by_the_ingress_deployment() -> None:
    details = {
        "applications": {
            "chat": {
                "status": "DEPLOYING",
                "message": "",
                "deployment_topology": {"ingress_deployment": "Front"},
                "deployments": {
                    "Front": {
                        "status": "UPDATING",
                        "message": "",
                        "target_num_replicas": 2,
                        "replicas": [{"state": "RUNNING"}, {"state": "STARTING"}],
                    },
                    "Model": {
                        "status": "HEALTHY",
                        "message": "",
                        "target_num_replicas": 4,
                        "replicas": [{"state": "RUNNING"}] * 4,
                    },
                },
            }
        }
    }
    summary = serving.summarise_status(details, "chat")
    assert (summary["application"], summary["running"], summary["target"]) == (
        "DEPLOYING",
        1,
        2,
    )
    assert summary["deployments"]["Model"] == {
        "status": "HEALTHY",
        "message": "",
        "running": 4,
        "target": 4,
    }
    assert serving.summarise_status({}, "chat")["application"] == "NOT_STARTED"


def test_the_runner_writes_a_status_line_only_when_it_changes(tmp_path: Path) -> None:
    writer = serving.StatusWriter(str(tmp_path), port=8123)
    writer.status("starting", said="starting Ray")
    writer.status("starting", said="starting Ray")
    writer.status("running", application="RUNNING", running=1, target=1)
    lines = [json.loads(line) for line in (tmp_path / serving.STATUS_FILE).read_text().splitlines()]
    assert [(line["phase"], line["port"]) for line in lines] == [
        ("starting", 8123),
        ("running", 8123),
    ]
    writer.metrics({"requests_per_second": 1.5})
    assert json.loads((tmp_path / serving.METRICS_FILE).read_text())["requests_per_second"] == 1.5


def test_the_runners_arguments() -> None:
    parsed = serving.parse_runner_args(
        [
            "--name",
            "chat",
            "--port",
            "8123",
            "--status-dir",
            "/tmp/x",
            "--cpus",
            "1.5",
            "--application",
            '{"route_prefix": "/", "args": {"import_path": "app:app"}}',
        ]
    )
    assert (parsed.name, parsed.port, parsed.cpus, parsed.gpus) == ("chat", 8123, 1.5, 0)
    assert parsed.application["args"] == {"import_path": "app:app"}


# --- what an endpoint holds, and what it deploys ------------------------------------------


def test_an_endpoint_holds_its_replicas_times_compute() -> None:
    assert admission.endpoint_demand(load_spec(ENDPOINT)) == {
        "cpu": Decimal("1.0"),
        "memory": Decimal(2 * 2**30),
        "nvidia.com/gpu": Decimal(0),
    }
    # Autoscaling holds room for its most replicas, as a cluster holds a worker for each.
    assert admission.endpoint_demand(load_spec(AUTOSCALING))["cpu"] == Decimal("1.5")
    assert memory_limit(load_spec(ENDPOINT)) == 2 * 2**30 + RAY_PROCESSES_MEMORY


def test_a_generation_runs_the_replicas_it_was_scaled_to() -> None:
    data = load_spec(ENDPOINT).to_dict()
    scaled = admission.endpoint_spec(data, 5)
    assert scaled.serve is not None
    assert scaled.serve.replicas == 5
    assert admission.endpoint_demand(scaled)["cpu"] == Decimal("2.5")
    autoscaled = admission.endpoint_spec(load_spec(AUTOSCALING).to_dict(), 1)
    assert autoscaled.serve is not None
    assert autoscaled.serve.replicas is None


@pytest.mark.parametrize("source", [ENDPOINT, AUTOSCALING, EXAMPLE.read_text()])
def test_the_application_is_the_one_a_cluster_deploys(source: str) -> None:
    """The same builder, import path and sizes as the RayService's Serve config."""
    spec = load_spec(source)
    target = EndpointTarget(
        endpoint_id=1,
        name="chat",
        workspace="alpha",
        namespace="ws-alpha",
        local_queue="alpha",
        generation=1,
        portal_url="https://portal.example",
        token_secret="chat-endpoint-token",
        bundle_sha256="0" * 64,
    )
    (cluster,) = serve_config(spec, target)["applications"]
    assert serve_application(spec) == {
        "route_prefix": cluster["route_prefix"],
        "args": cluster["args"],
    }
    assert cluster["import_path"] == "tau.serving:app"


def test_replicas_larger_than_the_machine_are_refused_up_front(settings: Any) -> None:
    settings.TAU_LOCAL_CPUS = 1
    settings.TAU_LOCAL_MEMORY = "8Gi"
    settings.TAU_LOCAL_GPUS = 0
    backend = LocalEndpoints()
    problems = backend.deploy_problems(load_spec(ENDPOINT.replace("500m", "2")), NO_WORKSPACE)
    assert problems == [
        (
            "compute.cpus",
            "The endpoint (2 replicas together) needs 4 CPUs at once, but this machine has 1 "
            "(TAU_LOCAL_CPUS); ask for at most 1 in total.",
        )
    ]
    gpus = load_spec(ENDPOINT.replace("memory: 1Gi", "memory: 1Gi, gpus: 1"))
    ((path, message),) = backend.deploy_problems(gpus, NO_WORKSPACE)
    assert path == "compute.gpus"
    assert message.endswith("endpoints that need GPUs must go to a cluster.")
    assert backend.deploy_problems(load_spec(ENDPOINT), NO_WORKSPACE) == []


# --- the words of its states ----------------------------------------------------------------


def test_a_failed_deployment_says_ray_serves_exception() -> None:
    message = (
        "Deploying app 'chat' failed with exception:\nTraceback (most recent call last):\n"
        '  File "x.py", line 1\n\x1b[36mray::build_serve_application()\x1b[39m\n'
        "tau.serving.ServeConfigError: serve.import_path 'app:nope': app has no 'nope'\n"
    )
    assert deploy_failed_message({"message": message}) == (
        "tau.serving.ServeConfigError: serve.import_path 'app:nope': app has no 'nope'"
    )
    assert deploy_failed_message({}) == "Ray Serve gave no message."


def test_an_unhealthy_application_says_ray_serves_words() -> None:
    status = {
        "message": "The deployment failed its health check.",
        "deployments": {
            "Model": {"status": "UNHEALTHY", "message": "replica died"},
            "Front": {"status": "HEALTHY", "message": "ignored"},
        },
    }
    assert unhealthy_words(status) == (
        "The deployment failed its health check.; Model: replica died"
    )
    assert unhealthy_words({}) == "Ray Serve reports the application unhealthy."


# --- the files the backend and the agent share -----------------------------------------------


def test_a_delivery_made_twice_or_late_changes_nothing(var_dir: Path) -> None:
    folder = EndpointFolder.of(7)
    assert handed(folder) == Handed(0, 0)
    assert hand_over(folder, deploy=2) == Handed(deploy=2, stop=0)
    assert hand_over(folder, deploy=2) == Handed(deploy=2, stop=0)
    assert hand_over(folder, deploy=1) == Handed(deploy=2, stop=0)  # an older generation's
    assert hand_over(folder, stop=2) == Handed(deploy=2, stop=2)
    assert handed(folder) == Handed(deploy=2, stop=2)


def test_the_newest_complete_status_line_is_read_once(tmp_path: Path) -> None:
    path = tmp_path / "serve-status.jsonl"
    assert read_status(path, tmp_path, 0) == (None, 0)
    path.write_text('{"phase": "starting"}\n{"phase": "deploying"}\n{"phase": "runn')
    line, offset = read_status(path, tmp_path, 0)
    assert line == {"phase": "deploying"}
    assert read_status(path, tmp_path, offset) == (None, offset)
    with path.open("a") as handle:
        handle.write('ing"}\n')
    line, offset = read_status(path, tmp_path, offset)
    assert line == {"phase": "running"}
    # A new file (a restart's) is read from its start.
    path.write_text('{"phase": "starting"}\n')
    assert read_status(path, tmp_path, offset)[0] == {"phase": "starting"}


def test_a_report_behind_a_link_is_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    write_record(secret, {"pid": 1})
    output = tmp_path / "output"
    output.mkdir()
    os.symlink(secret, output / "serve-metrics.json")
    assert read_record(output / "serve-metrics.json", output) is None
    os.symlink(secret, output / "serve-status.jsonl")
    assert read_status(output / "serve-status.jsonl", output, 0) == (None, 0)


# --- the backend's answers -------------------------------------------------------------------


def endpoint(url: str = "", prefix: str = "/") -> Endpoint:
    return Endpoint(
        pk=7,
        name="chat",
        url=url,
        spec={"serve": {"route_prefix": prefix}},
        replicas_ready=2,
        replicas_desired=2,
    )


def test_the_address_is_the_reported_one_with_the_route_prefix() -> None:
    backend = LocalEndpoints()
    assert backend.invoke_address(endpoint()) is None
    assert backend.invoke_address(endpoint("http://127.0.0.1:8123")) == "http://127.0.0.1:8123"
    assert (
        backend.invoke_address(endpoint("http://127.0.0.1:8123", "/chat"))
        == "http://127.0.0.1:8123/chat"
    )


def test_metrics_are_the_serving_generations_while_fresh(var_dir: Path) -> None:
    backend = LocalEndpoints()
    assert backend.metrics(endpoint()).requests_per_second is None
    folder = EndpointFolder.of(7)
    layout = folder.generation(2)
    layout.output.mkdir(parents=True)
    write_record(folder.serving, {"generation": 2, "port": 8123})
    figures = {
        "requests_per_second": 3.5,
        "latency_p50_ms": 4.0,
        "latency_p95_ms": 9.5,
        "error_rate": 0.0,
        "window_seconds": 60,
    }
    write_record(metrics_file(layout), {"time": time.time(), **figures})
    measured = backend.metrics(endpoint())
    assert (measured.requests_per_second, measured.latency_p95_ms, measured.error_rate) == (
        3.5,
        9.5,
        0.0,
    )
    assert (measured.replicas_ready, measured.replicas_desired, measured.window_seconds) == (
        2,
        2,
        60,
    )
    write_record(metrics_file(layout), {"time": time.time() - 120, **figures})
    assert backend.metrics(endpoint()).requests_per_second is None  # not its traffic now


def test_the_log_is_a_generations(var_dir: Path) -> None:
    backend = LocalEndpoints()
    assert backend.read_log(endpoint(), offset=None, tail_lines=10).note
    folder = EndpointFolder.of(7)
    for number in (1, 2):
        layout = folder.generation(number)
        layout.attempt_dir.mkdir(parents=True)
        layout.log.write_text(f"generation {number} says hello\n")
    newest = backend.read_log(endpoint(), offset=None, tail_lines=10)
    assert (newest.replica, newest.replicas) == ("generation-2", ("generation-2", "generation-1"))
    assert newest.text == "generation 2 says hello\n"
    write_record(folder.serving, {"generation": 1, "port": 8123})
    assert backend.read_log(endpoint(), offset=None, tail_lines=10).replica == "generation-1"
    asked = backend.read_log(endpoint(), offset=0, tail_lines=None, replica="generation-2")
    assert asked.text == "generation 2 says hello\n"
    assert backend.read_log(endpoint(), offset=0, tail_lines=None, replica="../x").replica
