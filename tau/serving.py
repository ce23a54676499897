"""The Ray Serve application every TauGrid endpoint runs: ``import_path: tau.serving:app``.

tau.yaml says what to serve (``serve.import_path``, the project's own Ray Serve application)
and how much of it (``serve.replicas`` or ``serve.autoscaling``, and ``compute`` per replica).
Ray Serve takes replicas and resources per *deployment*, by deployment name, and the name of
the project's deployment is known only once its code is imported. So the endpoint's Serve
config names this application builder instead, with the project's import path and the sizes
as ``args``, and the builder imports the project's application and gives its ingress
deployment those options: on a cluster (KubeRay's RayService) and on this machine (the local
executor) alike, so both size an endpoint the same way.

What ``serve.import_path`` may name:

* an application (``app = Model.bind()``): its ingress deployment gets the options;
* a deployment (``@serve.deployment class Model``) that takes no arguments: bound here;
* an application builder (``def build(args) -> Application``): called with ``args["args"]``.

Only the ingress deployment is sized: the other deployments of a composed application keep
what their code says (they are the project's to size).

**On this machine** the local executor runs each generation of an endpoint as
``python -m tau.serving`` (:func:`main`) in its sandbox: Ray on loopback with the endpoint's
CPUs and GPUs (one node, every port its own), Ray Serve's HTTP proxy on ``127.0.0.1`` and the
port the agent chose, and the application deployed from the same Serve config a cluster's
RayService carries (so a wrong import path fails with the same message of Ray Serve's). It
then writes what Ray Serve says of the application (its status and message, the replicas
running and wanted) as JSON lines to ``serve-status.jsonl`` whenever that changes, and the
endpoint's traffic over the last minute, from Ray Serve's own Prometheus metrics on the
node's metrics port, to ``serve-metrics.json`` every few seconds; the agent reads both
(``executors.local.agent.endpoints``). SIGTERM stops Ray Serve, then Ray.

Shipped with every workload (``runs.workload_sdk``); imports Ray only when called, and of
TauGrid only its sibling ``tau.ray_cluster`` (the SDK's: how Ray is kept on loopback).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: ``args`` keys this builder reads (and the only ones it accepts).
ARGS = ("import_path", "num_replicas", "autoscaling_config", "ray_actor_options", "args")


class ServeConfigError(ValueError):
    """The endpoint's import path does not name something Ray Serve can run."""


def import_target(import_path: str) -> Any:
    """The object ``module:attribute`` (or ``module.attribute``) names, imported from the
    project (its folder is the working directory, first on ``sys.path``)."""
    module_name, _, attribute = import_path.partition(":")
    if not attribute:
        module_name, _, attribute = import_path.rpartition(".")
    if not module_name or not attribute:
        raise ServeConfigError(f"serve.import_path {import_path!r} is not module:attribute")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise ServeConfigError(
            f"serve.import_path {import_path!r}: no module {error.name!r} in the project"
        ) from error
    target = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ServeConfigError(
                f"serve.import_path {import_path!r}: {module_name} has no {attribute!r}"
            ) from None
    return target


def _options(args: dict[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if args.get("autoscaling_config") is not None:
        options["autoscaling_config"] = dict(args["autoscaling_config"])
    elif args.get("num_replicas") is not None:
        options["num_replicas"] = int(args["num_replicas"])
    if args.get("ray_actor_options"):
        options["ray_actor_options"] = dict(args["ray_actor_options"])
    return options


def app(args: dict[str, Any]) -> Any:
    """Ray Serve's application builder: the project's application, sized as tau.yaml says."""
    from ray import serve  # type: ignore[import-not-found]

    unknown = sorted(set(args) - set(ARGS))
    if unknown:
        raise ServeConfigError(f"unknown arguments {unknown}; expected some of {list(ARGS)}")
    import_path = str(args.get("import_path") or "")
    target = import_target(import_path)
    options = _options(args)
    if isinstance(target, serve.Deployment):
        return target.options(**options).bind()
    if not isinstance(target, serve.Application) and callable(target):
        target = target(dict(args.get("args") or {}))
    if not isinstance(target, serve.Application):
        raise ServeConfigError(
            f"serve.import_path {import_path!r} names a {type(target).__name__}, not a Ray "
            "Serve application (`app = Model.bind()`), deployment or application builder"
        )
    ingress = getattr(target, "_bound_deployment", None)
    if not isinstance(ingress, serve.Deployment):
        raise ServeConfigError(
            "this version of Ray Serve does not let TauGrid size the application's ingress "
            f"deployment (Ray {getattr(sys.modules.get('ray'), '__version__', '?')})"
        )
    # The application was imported for this endpoint alone: sized in place, it keeps what
    # else Ray Serve attached to it.
    target._bound_deployment = ingress.options(**options)
    return target


#: What every Ray worker of an endpoint served on this machine runs first (Ray's
#: ``worker_process_setup_hook``, by import path): :func:`replicas_on_loopback`.
LOOPBACK_HOOK = "tau.serving.replicas_on_loopback"
#: Where Ray's workers read their setup hook (what ``runtime_env={"worker_process_setup_hook":
#: …}`` becomes): set in the environment Ray's node is started with, every worker of the node
#: inherits it. The hook in an application's ``runtime_env`` did not reach its replicas.
SETUP_HOOK_VARIABLE = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"


def replicas_on_loopback() -> None:
    """Keep a Ray Serve replica's inter-deployment gRPC server on loopback. Ray Serve (2.60)
    binds it on every interface (``[::]:0``), whatever the node's address, in every replica;
    on a Kubernetes pod that is the pod's own network, on this machine it would be the
    machine's. A worker process setup hook (:data:`LOOPBACK_HOOK`): the replica's module is
    imported here, before any replica starts in the worker, and its binding is given
    ``127.0.0.1`` for ``[::]`` (handles call replicas through Ray, not this server, unless
    ``RAY_SERVE_USE_GRPC_BY_DEFAULT`` says otherwise; on one machine both work)."""
    from ray.serve._private import replica  # type: ignore[import-not-found]

    bind = replica.add_port_to_grpc_server
    if getattr(bind, "on_loopback", False):
        return

    def on_loopback(server: Any, address: str) -> Any:
        if address.startswith("[::]:"):
            address = "127.0.0.1:" + address.removeprefix("[::]:")
        return bind(server, address)

    on_loopback.on_loopback = True  # type: ignore[attr-defined]
    replica.add_port_to_grpc_server = on_loopback


# --- Serving one endpoint generation on this machine (the local executor) ------------------

#: How often the runner asks Ray Serve for the application's status (seconds).
STATUS_SECONDS = 0.5
#: How often it reads Ray's Prometheus metrics, and the window its figures cover (seconds).
METRICS_SECONDS = 5.0
METRICS_WINDOW_SECONDS = 60.0
#: Ray exports what its processes measured this often (milliseconds; Ray's default is 10 s).
METRICS_REPORT_MILLISECONDS = "5000"
#: The files the runner writes into ``--status-dir`` (the agent reads them).
STATUS_FILE = "serve-status.jsonl"
METRICS_FILE = "serve-metrics.json"
#: The longest message of Ray Serve's written in a status line (a traceback can be long).
MESSAGE_LIMIT = 4000
#: The longest each step of a stop may take (Ray Serve, Ray, the node's processes).
STOP_STEP_SECONDS = 3.0
#: Ray Serve's own Prometheus metrics read for the endpoint's traffic (its HTTP proxy's view).
REQUESTS_METRIC = "ray_serve_num_http_requests_total"
ERRORS_METRIC = "ray_serve_num_http_error_requests_total"
LATENCY_METRIC = "ray_serve_http_request_latency_ms_bucket"


def say(message: str) -> None:
    print(f"[serving] {message}", flush=True)


#: SIGTERM or SIGINT came: set by :func:`_stop_on_signal`, which also raises
#: ``tau.ray_cluster.Stopped`` where the runner is. The flag outlives an exception that Ray's
#: code, running when the signal came, caught as its own.
STOP_REQUESTED = threading.Event()


def _stop_on_signal(signum: int, frame: Any) -> None:
    from tau.ray_cluster import Stopped

    STOP_REQUESTED.set()
    raise Stopped(signal.Signals(signum).name)


def stop_on_signals() -> None:
    signal.signal(signal.SIGTERM, _stop_on_signal)
    signal.signal(signal.SIGINT, _stop_on_signal)


def parse_runner_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tau.serving")
    parser.add_argument("--name", required=True, help="the Serve application's name")
    parser.add_argument("--port", type=int, required=True, help="Ray Serve's HTTP port")
    parser.add_argument("--status-dir", required=True, help="where the status files go")
    parser.add_argument("--cpus", type=float, required=True, help="CPUs of the Ray node")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs of the Ray node")
    parser.add_argument(
        "--application",
        required=True,
        type=json.loads,
        help='JSON: {"route_prefix": "/", "args": {...}} (args: this builder\'s)',
    )
    return parser.parse_args(list(argv))


def _word(value: Any) -> str:
    """An enum of Ray Serve's (a ``str`` subclass) as its plain value."""
    return str(getattr(value, "value", value))


def summarise_status(details: dict[str, Any], name: str) -> dict[str, Any]:
    """What the agent needs of Ray Serve's details (``get_serve_details``) for application
    ``name``: its status and message, the replicas of its ingress deployment running and
    wanted, and each deployment's status and message (Ray Serve's words, cut short)."""
    application = (details.get("applications") or {}).get(name)
    if not application:
        return {"application": "NOT_STARTED", "message": "", "running": 0, "target": 0}
    deployments = application.get("deployments") or {}
    topology = application.get("deployment_topology") or {}
    ingress = topology.get("ingress_deployment") or (
        next(iter(deployments)) if len(deployments) == 1 else None
    )
    summary: dict[str, Any] = {
        "application": _word(application.get("status") or "NOT_STARTED"),
        "message": str(application.get("message") or "")[-MESSAGE_LIMIT:],
        "deployments": {},
        "running": 0,
        "target": 0,
    }
    for deployment, info in sorted(deployments.items()):
        replicas = [_word(replica.get("state")) for replica in info.get("replicas") or []]
        running = replicas.count("RUNNING")
        target = int(info.get("target_num_replicas") or 0)
        summary["deployments"][deployment] = {
            "status": _word(info.get("status") or ""),
            "message": str(info.get("message") or "")[-MESSAGE_LIMIT:],
            "running": running,
            "target": target,
        }
        if deployment == ingress:
            summary["running"], summary["target"] = running, target
    return summary


def _labels(text: str) -> dict[str, str]:
    return {
        key: value.replace('\\"', '"').replace("\\\\", "\\")
        for key, value in re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', text)
    }


@dataclass(frozen=True)
class TrafficSample:
    """Ray Serve's counters for one application at one moment (monotonic seconds)."""

    time: float
    requests: float
    errors: float
    #: The latency histogram: upper bound (ms, ``inf`` last) -> requests at most that long.
    buckets: tuple[tuple[float, float], ...]


def read_sample(text: str, application: str, now: float) -> TrafficSample:
    """The application's counters in a Prometheus text export (every series of each metric
    whose ``application`` label is the endpoint's, added up)."""
    requests = errors = 0.0
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if not line.startswith("ray_serve_"):
            continue
        name, _, rest = line.partition("{")
        if name not in (REQUESTS_METRIC, ERRORS_METRIC, LATENCY_METRIC):
            continue
        labels_text, _, value_text = rest.rpartition("}")
        labels = _labels(labels_text)
        if labels.get("application") != application:
            continue
        try:
            value = float(value_text.split()[0])
        except (IndexError, ValueError):
            continue
        if name == REQUESTS_METRIC:
            requests += value
        elif name == ERRORS_METRIC:
            errors += value
        else:
            bound = float(labels.get("le", "inf").replace("+Inf", "inf"))
            buckets[bound] = buckets.get(bound, 0.0) + value
    return TrafficSample(now, requests, errors, tuple(sorted(buckets.items())))


def quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The ``q`` quantile of a cumulative histogram, interpolated within its bucket as
    Prometheus' ``histogram_quantile`` does; None without observations."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def traffic(samples: list[TrafficSample]) -> dict[str, Any]:
    """Requests per second, p50/p95 latency and error rate between the oldest and the newest
    sample (the window): None where there is no figure (no requests, or a window too short)."""
    figures: dict[str, Any] = {
        "requests_per_second": None,
        "latency_p50_ms": None,
        "latency_p95_ms": None,
        "error_rate": None,
        "window_seconds": 0,
    }
    if len(samples) < 2:
        return figures
    first, last = samples[0], samples[-1]
    seconds = last.time - first.time
    if seconds < 1:
        return figures
    requests = max(0.0, last.requests - first.requests)
    before = dict(first.buckets)
    window = [(bound, max(0.0, count - before.get(bound, 0.0))) for bound, count in last.buckets]
    figures.update(
        requests_per_second=round(requests / seconds, 3),
        window_seconds=round(seconds),
        latency_p50_ms=_rounded(quantile(window, 0.5)),
        latency_p95_ms=_rounded(quantile(window, 0.95)),
        error_rate=round(max(0.0, last.errors - first.errors) / requests, 4) if requests else None,
    )
    return figures


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


class StatusWriter:
    """The runner's reports: a JSON line in ``serve-status.jsonl`` each time what it says
    changes (the agent reads the last one), and ``serve-metrics.json`` rewritten whole."""

    def __init__(self, folder: str, port: int) -> None:
        self.folder = folder
        self.port = port
        self.last: dict[str, Any] | None = None
        os.makedirs(folder, exist_ok=True)

    def status(self, phase: str, **fields: Any) -> None:
        said = {"phase": phase, "port": self.port, **fields}
        if said == self.last:
            return
        self.last = said
        line = json.dumps({"time": time.time(), **said}, default=str)
        with open(f"{self.folder}/{STATUS_FILE}", "a", encoding="utf-8") as handle:
            handle.write(line + "\n")

    def metrics(self, figures: dict[str, Any]) -> None:
        temporary = f"{self.folder}/.{METRICS_FILE}.tmp"
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump({"time": time.time(), **figures}, handle)
        os.replace(temporary, f"{self.folder}/{METRICS_FILE}")


def serve_one(arguments: argparse.Namespace, writer: StatusWriter) -> int:
    """Ray on this machine's loopback (one node with the endpoint's CPUs and GPUs), Ray
    Serve's HTTP proxy on ``127.0.0.1:<port>``, the application deployed from the same Serve
    config a cluster's RayService carries (``tau.serving:app`` with the project's import path
    and sizes); then its status and traffic, reported until SIGTERM."""
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster  # type: ignore[import-not-found]
    from ray.serve.context import _get_global_client  # type: ignore[import-not-found]
    from ray.serve.schema import ServeDeploySchema  # type: ignore[import-not-found]

    from tau.ray_cluster import OBJECT_STORE_BYTES, node_ports

    started = time.monotonic()
    writer.status("starting", said="starting Ray")
    ports, _ = node_ports(0)
    os.environ[SETUP_HOOK_VARIABLE] = LOOPBACK_HOOK  # before the node: its workers inherit it
    cluster = Cluster(
        initialize_head=True,
        shutdown_at_exit=True,
        head_node_args={
            "num_cpus": arguments.cpus,
            "num_gpus": arguments.gpus,
            "include_dashboard": False,
            "object_store_memory": OBJECT_STORE_BYTES,
            **ports,
        },
    )
    try:
        ray.init(address=cluster.address, namespace="taugrid-serve")
        # Ray set its own SIGTERM handler (the node's, then the driver's): ours stops Serve first.
        stop_on_signals()
        say(f"Ray up at {cluster.address} ({time.monotonic() - started:.1f}s)")
        writer.status("starting", said="starting Ray Serve")
        http = {"host": "127.0.0.1", "port": arguments.port}
        serve.start(http_options=http)
        application = {
            "name": arguments.name,
            "route_prefix": arguments.application.get("route_prefix") or "/",
            "import_path": "tau.serving:app",
            "args": arguments.application.get("args") or {},
            # One line per request would fill the generation's capped log within hours;
            # Ray Serve's metrics count the requests (errors and the code's output stay).
            "logging_config": {"enable_access_log": False},
        }
        client = _get_global_client()
        client.deploy_apps(
            ServeDeploySchema.model_validate({"http_options": http, "applications": [application]})
        )
        say(f"deploying {application['args'].get('import_path')} at {application['route_prefix']}")
        # The reports come from a thread: calls to Ray block in C, where a signal waits for
        # them to return; the main thread only waits, and answers SIGTERM at once.
        ended: list[int] = []
        reporter = threading.Thread(
            target=lambda: ended.append(
                report(client, arguments, application, ports["metrics_export_port"], writer)
            ),
            name="serve-status",
            daemon=True,
        )
        reporter.start()
        while reporter.is_alive():
            reporter.join(STATUS_SECONDS)
        return ended[0] if ended else 1
    finally:
        # A second SIGTERM must not cut the stop short; the agent's SIGKILL ends a stop that hangs.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        writer.status("stopping", said="stopping Ray Serve")
        if not STOP_REQUESTED.is_set():
            # Ray answers still (the runner ends for another reason): Serve, then Ray, then
            # the node, each given its time.
            _within(STOP_STEP_SECONDS, serve.shutdown)
            _within(STOP_STEP_SECONDS, ray.shutdown)
            _within(STOP_STEP_SECONDS, cluster.shutdown)
        # After a SIGTERM to the generation's process group (the agent's stop), Ray's own
        # processes got it too and are ending by themselves: a call to them would wait.


def report(
    client: Any,
    arguments: argparse.Namespace,
    application: dict[str, Any],
    metrics_port: int,
    writer: StatusWriter,
) -> int:
    """Ray Serve's status of the application, written when it changes, and its traffic every
    ``METRICS_SECONDS``, until a stop is asked for (0) or Ray Serve stops answering (1)."""
    routes_url = f"http://127.0.0.1:{arguments.port}/-/routes"
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    samples: deque[TrafficSample] = deque()
    next_metrics = time.monotonic() + METRICS_SECONDS
    failed_reads = 0
    while not STOP_REQUESTED.is_set():
        try:
            summary = summarise_status(client.get_serve_details(), arguments.name)
            failed_reads = 0
        except Exception as exc:  # Ray going away: the node's processes died
            failed_reads += 1
            if failed_reads >= 20:
                say(f"Ray Serve does not answer any more: {type(exc).__name__}: {exc}")
                return 1
            time.sleep(STATUS_SECONDS)
            continue
        if STOP_REQUESTED.is_set():
            break
        phase = {
            "RUNNING": "running",
            "UNHEALTHY": "unhealthy",
            "DEPLOY_FAILED": "deploy_failed",
        }.get(summary["application"], "deploying")
        if phase == "running" and not _routes_ready(routes_url, application):
            phase = "deploying"  # deployed, but the proxy does not route to it yet
        if phase == "deploy_failed" and writer.last and writer.last.get("phase") != phase:
            say(f"Ray Serve could not deploy the application: {summary['message']}")
        writer.status(phase, **summary)
        now = time.monotonic()
        if now >= next_metrics:
            next_metrics = now + METRICS_SECONDS
            try:
                with urllib.request.urlopen(metrics_url, timeout=5) as answer:
                    text = answer.read().decode("utf-8", errors="replace")
                samples.append(read_sample(text, arguments.name, now))
                while samples and now - samples[0].time > METRICS_WINDOW_SECONDS:
                    samples.popleft()
                writer.metrics(traffic(list(samples)))
            except OSError:
                pass  # Ray's metrics agent starts late; the next read may answer
        time.sleep(STATUS_SECONDS)
    return 0


def _within(seconds: float, step: Any) -> None:
    """``step()`` in a thread of its own, given at most ``seconds``; what it raises is said."""

    def run() -> None:
        try:
            step()
        except Exception as exc:
            say(f"stopping: {getattr(step, '__name__', step)}: {type(exc).__name__}: {exc}")

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)


def _routes_ready(url: str, application: dict[str, Any]) -> bool:
    """Whether Ray Serve's HTTP proxy routes the application's prefix (``/-/routes``)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:  # noqa: S310 - our own port
            routes = json.loads(answer.read())
    except (OSError, ValueError):
        return False
    return (
        isinstance(routes, dict)
        and routes.get(application["route_prefix"]) == (application["name"])
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tau.serving --name N --port P --status-dir D --cpus C [--gpus G]
    --application JSON``: one generation of an endpoint on this machine, as the local
    executor starts it (docs/one-machine.md, *Endpoints*). Exit code 0 after SIGTERM, 1 when
    Ray Serve or Ray went away, 2 without Ray Serve in the environment."""
    from tau.ray_cluster import LOOPBACK_SETTING, Stopped, short_temp_root

    arguments = parse_runner_args(sys.argv[1:] if argv is None else argv)
    writer = StatusWriter(arguments.status_dir, arguments.port)
    # Before Ray is imported: read once, at import (tau.ray_cluster says why each).
    temp = tempfile.mkdtemp(prefix="ray-", dir=short_temp_root())
    os.environ.update(
        {
            LOOPBACK_SETTING: "0",
            "RAY_TMPDIR": temp,
            "TMPDIR": temp,
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_DISABLE_DOCKER_CPU_WARNING": "1",
            "RAY_metrics_report_interval_ms": METRICS_REPORT_MILLISECONDS,
        }
    )
    stop_on_signals()
    try:
        try:
            import ray.serve  # type: ignore[import-not-found]  # noqa: F401
        except ImportError:
            message = (
                "this endpoint's Python has no Ray Serve: add it to runtime.pip "
                "(for example ray[serve]==2.60.0)"
            )
            say(message)
            writer.status("exited", application="DEPLOY_FAILED", message=message)
            return 2
        try:
            return serve_one(arguments, writer)
        except Stopped as why:
            say(f"stopped ({why})")
            return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Not the interpreter's exit: threads Ray left behind (talking to processes that are gone)
    # would hold it up until the agent's SIGKILL.
    os._exit(code)
