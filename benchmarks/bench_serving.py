"""What the portal's endpoint proxy costs (issue 34): the same requests sent straight to an
endpoint's address and through ``POST /api/v1/workspaces/{ws}/endpoints/{name}/invoke/``.

Goals, at the same fixed concurrency (:data:`CONNECTIONS` connections): through the portal
≥ 70 % of the direct throughput, and its p95 at most 5 ms above the direct p95.

- The endpoint: ``examples/serve-cpu`` served by Ray Serve (:func:`ray_serve_upstream`: a
  Ray head of deploy/dev/ray_head.py's pinned Ray, the Serve config a RayService carries put
  through the dashboard as KubeRay puts it, one replica of one CPU); in smoke mode (the test
  suite) ``benchmarks/serving_upstream.py``, a threading HTTP/1.1 server on 127.0.0.1 that
  answers as the example does, since Ray's start would be most of a smoke run. The output
  says which. The endpoint is a row in state ``ready`` on the local backend whose ``url`` is
  that address, as the local agent reports a Ray Serve application's.
- The portal: gunicorn with the image's workers and threads (``deploy/Containerfile``'s
  command, read from it: 3 sync workers, as the Helm chart's web pods), the product's
  settings, PostgreSQL and Redis of ``deploy/dev/test_services.py``
  (``bench_runs.HttpBench``, which the other HTTP figures use).
- The client: wrk (a C load generator, so the client takes little of the cores the servers
  share) sending the same body, a review for the classifier, with a token that has the
  ``endpoints:invoke`` scope through the portal. Each round lasts :data:`ROUND_SECONDS`
  (wrk measures for a time, not a number of requests: a count would need it to stop itself,
  which it cannot, so the round is bounded in time and the count follows from the rate);
  wrk keeps its connections to the endpoint alive, gunicorn's sync workers close each one
  (in production a buffering proxy in front holds the client's).

Direct and proxied take turns, :data:`ROUNDS` times each after a warm-up; each side's round
with the highest throughput is kept (the machine is shared: a busy moment makes a round slow,
never fast). The same is measured with one connection, for the latency one caller alone
sees, without queueing behind the portal's workers (reported, not judged). Results go to
``var/bench/serving_proxy.json``; ``benchmarks/run.py`` prints the proxy's figures again last.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_runs import HttpBench
from benchmarks.harness import SMOKE, django_test_database, load_average, memory_gib, report, sized

HERE = Path(__file__).resolve().parent
NAME = "serving_proxy"
CONNECTIONS = int(os.environ.get("TAU_BENCH_SERVING_CONNECTIONS", "8"))
#: Seconds of each measured round (wrk runs for a time, not a number of requests), of the
#: warm-up of each side, and rounds each side.
ROUND_SECONDS = sized(5, 1)
WARMUP_SECONDS = sized(2, 1)
ROUNDS = sized(3, 1)
GOAL_RATIO = 0.70
GOAL_P95_ADDED_MS = 5.0
BODY = json.dumps({"text": "A wonderful, moving film, though its ending is weak."})
UPSTREAM = (
    "benchmarks/serving_upstream.py: a threading HTTP/1.1 server on 127.0.0.1 answering as "
    "examples/serve-cpu/app.py does (smoke mode: Ray Serve's start is not worth a smoke run)"
)
RAY_SERVE_UPSTREAM = (
    "Ray Serve 2.60 on a Ray head on 127.0.0.1 (deploy/dev/ray_head.py), serving "
    "examples/serve-cpu/app.py through tau.serving:app as an endpoint does, one replica of 1 CPU"
)
EXAMPLE = HERE.parent / "examples" / "serve-cpu"
SPEC = (HERE.parent / "examples" / "serve-cpu" / "tau.yaml").read_bytes()

WRK_SCRIPT = """
wrk.method = METHOD
if METHOD == "POST" then
  wrk.body = BODY
  wrk.headers["Content-Type"] = "application/json"
end
if AUTHORIZATION ~= "" then wrk.headers["Authorization"] = AUTHORIZATION end
other = 0
local threads = {}
setup = function(thread) table.insert(threads, thread) end
response = function(status, headers, body)
  if status ~= 200 then other = other + 1 end
end
done = function(summary, latency, requests)
  local unexpected = 0
  for _, thread in ipairs(threads) do unexpected = unexpected + thread:get("other") end
  io.write(string.format("RESULT %d %d %.1f %.1f %.1f %d %d\\n", summary.requests,
    summary.duration, latency:percentile(50), latency:percentile(95), latency:percentile(99),
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    unexpected))
end
"""


@contextmanager
def upstream_server() -> Iterator[str]:
    """benchmarks/serving_upstream.py in a process of its own; its address."""
    server = subprocess.Popen(
        [sys.executable, str(HERE / "serving_upstream.py")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        yield server.stdout.readline().strip()
    finally:
        server.terminate()
        server.wait(timeout=30)


@contextmanager
def ray_serve_upstream() -> Iterator[str]:
    """examples/serve-cpu served by a real Ray Serve, as a cluster's head pod serves it: a
    Ray head (deploy/dev/ray_head.py, its pinned Ray with Serve) whose environment has the
    workload SDK and the example's folder on PYTHONPATH and a small model at TAU_MODEL_DIR,
    Ray Serve's proxy on 127.0.0.1, and the Serve config a RayService carries (``tau.serving:
    app`` sizing the example's deployment: one replica, one CPU) put through the dashboard's
    Serve API, as KubeRay puts it. Its proxy's address."""
    from runs import workload_sdk
    from tau.serving import LOOPBACK_HOOK, SETUP_HOOK_VARIABLE

    ray_head = _load_script(HERE.parent / "deploy" / "dev" / "ray_head.py", "taugrid_ray_head")
    with tempfile.TemporaryDirectory(prefix="tg-bench-serve-") as scratch:
        model = Path(scratch) / "model"
        model.mkdir()
        weights = {"wonderful": 2.0, "moving": 1.0, "weak": -1.5, "film": 0.0}
        model_json = {"weights": list(weights.values()), "bias": 0.0}
        (model / "model.json").write_text(json.dumps(model_json))
        (model / "vocab.txt").write_text("\n".join(weights) + "\n")
        sdk = workload_sdk.materialise(Path(scratch) / "sdk")
        head = ray_head.start_head(
            Path(scratch) / "ray",
            env={
                "PYTHONPATH": f"{sdk}:{EXAMPLE}",
                "TAU_MODEL_DIR": str(model),
                SETUP_HOOK_VARIABLE: LOOPBACK_HOOK,
            },
            cwd=EXAMPLE,
        )
        try:
            (port,) = ray_head.free_ports(1)
            ray_head.start_serve(head, port)
            config = {
                "applications": [
                    {
                        "name": "serve-cpu",
                        "route_prefix": "/",
                        "import_path": "tau.serving:app",
                        "args": {
                            "import_path": "app:app",
                            "num_replicas": 1,
                            "ray_actor_options": {"num_cpus": 1},
                        },
                        "logging_config": {"enable_access_log": False},
                    }
                ]
            }
            request = urllib.request.Request(
                f"{head.dashboard_url}/api/serve/applications/",
                data=json.dumps(config).encode(),
                method="PUT",
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=60):
                pass
            deadline = time.monotonic() + 180
            while True:
                _, answer = ray_head.request_json(f"{head.dashboard_url}/api/serve/applications/")
                status = ((answer or {}).get("applications") or {}).get("serve-cpu") or {}
                if status.get("status") == "RUNNING":
                    break
                if status.get("status") == "DEPLOY_FAILED" or time.monotonic() > deadline:
                    raise RuntimeError(f"Ray Serve did not run the example: {status}")
                time.sleep(0.5)
            yield f"http://127.0.0.1:{port}"
        finally:
            ray_head.stop_head(head)


def _load_script(path: Path, name: str) -> Any:
    """A script of deploy/ by path (deploy/ is not a package)."""
    import importlib.util

    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load(
    wrk: str, url: str, *, seconds: int, connections: int, token: str = "", method: str = "POST"
) -> dict[str, Any]:
    """POSTs of :data:`BODY` (or GETs) to ``url`` over ``connections`` connections for
    ``seconds``."""
    script = (
        WRK_SCRIPT.replace("METHOD", json.dumps(method))
        .replace("BODY", json.dumps(BODY))
        .replace("AUTHORIZATION", json.dumps(f"Bearer {token}" if token else ""))
    )
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as lua:
        lua.write(script)
        lua.flush()
        command = [wrk, "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s"]
        output = subprocess.run(
            [*command, "-s", lua.name, url], capture_output=True, text=True, check=True
        ).stdout
    line = next(line for line in output.splitlines() if line.startswith("RESULT"))
    answered, duration_us, p50, p95, p99, errors, unexpected = line.split()[1:]
    return {
        "requests": int(answered),
        "errors": int(errors),
        "not_200": int(unexpected),
        "requests_per_second": round(int(answered) / (int(duration_us) / 1e6), 1),
        "median_ms": float(p50) / 1000,
        "p95_ms": float(p95) / 1000,
        "p99_ms": float(p99) / 1000,
    }


def post(url: str, token: str = "") -> bytes:
    request = urllib.request.Request(url, data=BODY.encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=30) as answer:
        body: bytes = answer.read()
        return body


#: (url, token, method) of each thing measured, by its label.
Targets = dict[str, tuple[str, str, str]]
DIRECT = "direct"
PROXIED = "through the portal"
#: For scale, not judged: the same portal's floor for a request with a token, a bare DRF
#: view (benchmarks/http_urls.py) with the API's authentication and permissions, no proxy.
FLOOR = "the portal's bare DRF view with the same token (GET, no proxy; for scale)"


def best_of(wrk: str, targets: Targets, *, connections: int) -> dict[str, Any]:
    """Each of ``targets`` measured ROUNDS times, taking turns; each one's round with the
    highest throughput, with every round's throughput."""
    rounds: dict[str, list[dict[str, Any]]] = {label: [] for label in targets}
    for _ in range(ROUNDS):
        for label, (url, token, method) in targets.items():
            rounds[label].append(
                load(
                    wrk,
                    url,
                    seconds=ROUND_SECONDS,
                    connections=connections,
                    token=token,
                    method=method,
                )
            )
    best: dict[str, Any] = {}
    for label, results in rounds.items():
        kept = max(results, key=lambda result: result["requests_per_second"])
        kept["rounds_per_second"] = " / ".join(f"{r['requests_per_second']:,.0f}" for r in results)
        assert kept["errors"] == 0, (label, kept)
        assert kept["not_200"] == 0, (label, kept)
        best[label] = kept
    return best


def compare(direct: dict[str, Any], proxied: dict[str, Any]) -> dict[str, Any]:
    return {
        "ratio": round(proxied["requests_per_second"] / direct["requests_per_second"], 4),
        "p95_added_ms": round(proxied["p95_ms"] - direct["p95_ms"], 3),
        "median_added_ms": round(proxied["median_ms"] - direct["median_ms"], 3),
    }


def image_web_workers() -> tuple[int, int]:
    """The workers and threads of the portal image's web command (deploy/Containerfile's
    ``CMD``, a JSON array over continued lines)."""
    text = (Path(__file__).resolve().parents[1] / "deploy" / "Containerfile").read_text()
    command = text[text.index("\nCMD [") + len("\nCMD ") :]
    argv = json.loads(command[: command.index("]") + 1].replace("\\\n", ""))
    threads = int(argv[argv.index("--threads") + 1]) if "--threads" in argv else 1
    return int(argv[argv.index("--workers") + 1]), threads


def measure_proxy(token: str, address: str, *, workers: int, threads: int) -> dict[str, Any]:
    with HttpBench(workers=workers, threads=threads) as http:
        if http.wrk is None:
            return {"skipped": "install Debian's wrk to measure the proxy over HTTP"}
        portal = f"http://127.0.0.1:{http.port}"
        targets: Targets = {
            DIRECT: (f"{address}/", "", "POST"),
            PROXIED: (
                f"{portal}/api/v1/workspaces/bench/endpoints/serve-cpu/invoke/",
                token,
                "POST",
            ),
        }
        # The same answer both ways, or there is nothing to compare.
        straight, through = post(targets[DIRECT][0]), post(targets[PROXIED][0], token)
        assert straight == through, (straight, through)
        assert b'"positive"' in straight, straight
        with_floor: Targets = {**targets, FLOOR: (f"{portal}/bench/bare-token/", token, "GET")}
        for url, with_token, method in with_floor.values():
            load(
                http.wrk,
                url,
                seconds=WARMUP_SECONDS,
                connections=CONNECTIONS,
                token=with_token,
                method=method,
            )
        loaded = best_of(http.wrk, with_floor, connections=CONNECTIONS)
        alone = best_of(http.wrk, targets, connections=1)
    proxy = compare(loaded[DIRECT], loaded[PROXIED])
    one = compare(alone[DIRECT], alone[PROXIED])
    proxy["p95_added_ms_one_connection"] = one["p95_added_ms"]
    proxy["median_added_ms_one_connection"] = one["median_added_ms"]
    proxy["floor_ratio"] = round(
        loaded[PROXIED]["requests_per_second"] / loaded[FLOOR]["requests_per_second"], 4
    )
    if not SMOKE:
        proxy["goal"] = f"ratio ≥ {GOAL_RATIO:.0%}, p95 added ≤ {GOAL_P95_ADDED_MS:.0f} ms"
        proxy["ratio_met"] = proxy["ratio"] >= GOAL_RATIO
        proxy["p95_met"] = proxy["p95_added_ms"] <= GOAL_P95_ADDED_MS
    return {
        **{f"{label}, {CONNECTIONS} connections": figures for label, figures in loaded.items()},
        **{f"{label}, 1 connection": figures for label, figures in alone.items()},
        "proxy": proxy,
    }


def print_proxy(results: dict[str, Any]) -> None:
    """The proxy's figures and its goals (``results``: this benchmark's)."""
    proxy = results.get("proxy")
    if proxy is None:
        print(f"\n  endpoint proxy: {results.get('skipped', 'not measured')}")
        return
    setup = results["setup"]
    print(
        f"\n  Endpoint proxy, {setup['cpus']} cores, {setup['memory_gib']} GiB, load average "
        f"{setup['load_average']}\n  the portal: {setup['portal']}\n  the endpoint: "
        f"{setup['endpoint']}\n  the client: {setup['client']}"
    )
    for label, figures in results.items():
        if label.startswith((DIRECT, PROXIED, FLOOR)):
            print(
                f"  {label}: {figures['requests_per_second']:,.0f}/s (rounds "
                f"{figures['rounds_per_second']}), p50 {figures['median_ms']:.2f} ms, "
                f"p95 {figures['p95_ms']:.2f} ms"
            )

    def verdict(met: bool | None) -> str:
        return "" if met is None else f"   goal: {'met' if met else 'NOT met'}"

    connections = setup["connections"]
    print(
        f"  through the portal / direct, {connections} connections: {proxy['ratio']:.1%} of "
        f"the throughput (goal ≥ {GOAL_RATIO:.0%}){verdict(proxy.get('ratio_met'))}"
    )
    print(
        f"  p95 added, {connections} connections: {proxy['p95_added_ms']:.2f} ms "
        f"(goal ≤ {GOAL_P95_ADDED_MS:.0f} ms){verdict(proxy.get('p95_met'))}"
    )
    print(
        f"  p95 added, 1 connection (one caller alone; not judged): "
        f"{proxy['p95_added_ms_one_connection']:.2f} ms (p50 added "
        f"{proxy['median_added_ms_one_connection']:.2f} ms)"
    )
    print(
        f"  through the portal / its bare DRF view with a token, {connections} connections: "
        f"{proxy['floor_ratio']:.1%} (for scale: what the proxy costs beyond any API request)"
    )


def main() -> None:
    with django_test_database():
        from django.contrib.auth import get_user_model

        from identity.tokens import issue_token
        from runs.submission import reading_of
        from serving.models import Endpoint, EndpointState
        from tau.spec import spec_hash
        from workspaces.models import Membership, Workspace

        user = get_user_model().objects.create_user(username="bench")
        workspace = Workspace.unscoped_objects.create(
            slug="bench", name="Bench", namespace="tau-bench", local_queue="bench"
        )
        Membership.objects.create(workspace=workspace, user=user, role="researcher")
        token = issue_token(user=user, name="bench", scopes=["endpoints:invoke"]).plaintext
        # The example's tau.yaml without its model (this database has no catalog).
        spec = reading_of(
            b"\n".join(line for line in SPEC.splitlines() if not line.strip().startswith(b"model:"))
        ).spec
        assert spec is not None
        # The endpoint the issue names, Ray Serve, in full runs; smoke runs take the stand-in.
        upstream, endpoint_words = (
            (upstream_server, UPSTREAM) if SMOKE else (ray_serve_upstream, RAY_SERVE_UPSTREAM)
        )
        with upstream() as address:
            Endpoint.objects.create(
                workspace=workspace,
                name="serve-cpu",
                spec=spec.to_dict(),
                spec_hash=spec_hash(spec),
                spec_source=SPEC.decode(),
                backend="local",
                state=EndpointState.READY,
                state_reason="Answering (the benchmark's endpoint).",
                replicas_desired=1,
                replicas_ready=1,
                url=address,
                created_by=user,
                created_by_username=user.get_username(),
            )
            workers, threads = image_web_workers()
            figures = measure_proxy(token, address, workers=workers, threads=threads)
            results: dict[str, Any] = {
                "setup": {
                    "cpus": os.cpu_count(),
                    "memory_gib": memory_gib(),
                    "load_average": load_average(),
                    "connections": CONNECTIONS,
                    "portal": f"gunicorn {workers} workers x {threads} threads (the image's)",
                    "endpoint": endpoint_words,
                    "client": f"wrk, 1 thread, {ROUND_SECONDS} s rounds, best of {ROUNDS}",
                },
                **figures,
            }
        report(NAME, results)
        print_proxy(results)


if __name__ == "__main__":
    main()
