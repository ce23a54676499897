"""Runs at scale, on PostgreSQL: pages and API with 100 workspaces x 10,000 runs.

Targets (issues 6 and 7), on this machine:
- submission through the API: ≥ 100 runs/s, p95 < 100 ms (handing to the backend excluded:
  the run and its outbox row are written and the Celery task is published, nothing more);
- the runs list endpoint with 100,000+ runs in the database: p95 < 50 ms;
- page server time p95 < 50 ms with 100 workspaces x 10,000 runs.

Times are server time in this process (Django's test client through the whole middleware,
authentication and view stack, no network), p95 over repeated requests after a warm-up.

Over HTTP (wrk against gunicorn on loopback; the client shares the two cores), every figure is
a share of a bare DRF view measured in the same run on the same server, client and settings
(``benchmarks/http_urls.py``: no authentication, the project's whole middleware stack), since
absolute numbers drift between machines and with load while the ratio holds much better.
Goals (issue 12): a submission ≥ 6 % of the bare view with p95 < 100 ms; the runs list with a
token ≥ 35 %. The bare view with token authentication is shown too, for what a token costs.

The rows are written with one INSERT … SELECT generate_series.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import SMOKE, django_test_database, measure, report, sized

# At least 8: the pages measured are ws-7's, submissions go to ws-3 and ws-5.
WORKSPACES = sized(100, 8)
# Smaller for a quick look (TAU_BENCH_RUNS_PER_WORKSPACE=100); the targets are for 10,000.
RUNS_PER_WORKSPACE = int(os.environ.get("TAU_BENCH_RUNS_PER_WORKSPACE") or sized(10_000, 30))
HTTP_WORKERS = int(os.environ.get("TAU_BENCH_HTTP_WORKERS", "3"))
HTTP_THREADS = int(os.environ.get("TAU_BENCH_HTTP_THREADS", "1"))
HTTP_CLIENTS = int(os.environ.get("TAU_BENCH_HTTP_CLIENTS", "4"))
SPEC = b"""schema_version: 1
name: bench
run:
  entrypoint: echo bench
  workload_kind: job
compute:
  cpus: 1
  memory: 1Gi
"""


def populate(user_id: int) -> None:
    from django.db import connection

    from runs.models import Run
    from runs.submission import check_spec
    from workspaces.models import Membership, Workspace

    workspaces = Workspace.unscoped_objects.bulk_create(
        [
            Workspace(
                slug=f"ws-{i}",
                name=f"Workspace {i}",
                namespace=f"tau-ws-{i}",
                local_queue=f"ws-{i}",
            )
            for i in range(WORKSPACES)
        ]
    )
    Membership.objects.bulk_create(
        [Membership(workspace=ws, user_id=user_id, role="researcher") for ws in workspaces]
    )
    spec = check_spec(SPEC, workspace=workspaces[0]).spec
    states = ["succeeded", "failed", "cancelled", "succeeded", "succeeded"]
    started = time.perf_counter()
    template = Run(
        name="bench",
        spec_name="bench",
        spec=spec.to_dict(),
        spec_hash="0" * 64,
        spec_source=SPEC.decode(),
        submitted_by_id=user_id,
        submitted_by_username="bench",
        backend="local",
        state_reason="Finished.",
        attempt_count=1,
    )
    # One row per (workspace, g): these columns vary, every other one is the template's value,
    # so a column added to Run later is filled the way the model fills it.
    varying = {
        "workspace_id": "w.id",
        "name": "'bench-' || lpad(to_hex(g), 6, '0')",
        "state": "(%s::text[])[1 + g %% 5]",
        "created_at": "now() - (g || ' seconds')::interval",
        "updated_at": "now()",
        "queued_at": "now() - (g || ' seconds')::interval",
        "finished_at": "now() - (g || ' seconds')::interval",
    }
    columns, expressions, params = [], [], []
    for field in Run._meta.concrete_fields:
        if field.primary_key:
            continue
        columns.append(field.column)
        if field.column in varying:
            expressions.append(varying[field.column])
            if field.column == "state":
                params.append(states)
        else:
            expressions.append("%s")
            params.append(field.get_db_prep_save(getattr(template, field.attname), connection))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO runs_run ({', '.join(columns)}) "  # noqa: S608 - model column names
            f"SELECT {', '.join(expressions)} "
            "FROM workspaces_workspace w CROSS JOIN generate_series(1, %s) AS g "
            "WHERE w.slug LIKE 'ws-%%'",
            [*params, RUNS_PER_WORKSPACE],
        )
        cursor.execute("ANALYZE runs_run")
    took = time.perf_counter() - started
    print(f"  wrote {WORKSPACES * RUNS_PER_WORKSPACE:,} runs in {took:.1f} s", flush=True)


WRK_SCRIPT = """
wrk.method = METHOD
wrk.body = BODY
wrk.headers["Content-Type"] = CONTENT_TYPE
if AUTHORIZATION ~= "" then wrk.headers["Authorization"] = AUTHORIZATION end
-- Each thread counts in its own Lua state; done() runs in another and sums their counts.
other = 0
local threads = {}
setup = function(thread) table.insert(threads, thread) end
response = function(status, headers, body)
  if status ~= EXPECTED then other = other + 1 end
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

#: What each HTTP figure is a share of: the bare DRF view (benchmarks/http_urls.py), no
#: authentication, through the same gunicorn, middleware, settings and wrk.
BASELINE = "http: bare DRF view (no authentication)"
#: Goals of issue 12, as shares of the baseline (and the submission's p95).
GOALS = {
    "http: submit a run": {"min_ratio": 0.06, "max_p95_ms": 100.0},
    "http: runs list": {"min_ratio": 0.35},
}


class HttpBench:
    """Throughput the way scripts see it: gunicorn (HTTP_WORKERS sync workers; threads only
    add GIL contention for this CPU-bound work) on loopback, HTTP_CLIENTS connections at once
    from wrk (a C load generator, so the client takes little of the two cores). One server
    for every route measured, started with ``benchmarks.http_settings`` (the product's
    settings plus the bare views' URLs). Each measurement is bounded: a 2 s warm-up, then
    ``seconds`` measured."""

    def __init__(
        self,
        *,
        seconds: int = sized(10, 1),
        workers: int = HTTP_WORKERS,
        threads: int = HTTP_THREADS,
    ) -> None:
        self.seconds = seconds
        self.workers = workers
        self.threads = threads
        self.wrk = shutil.which("wrk")
        self.server: subprocess.Popen[bytes] | None = None
        self.port = 0

    def __enter__(self) -> HttpBench:
        from django.conf import settings
        from django.db import connection

        if self.wrk is None:
            return self
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        db = connection.settings_dict
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "benchmarks.http_settings",
            "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            "TAU_SECRET_KEY": settings.SECRET_KEY,
            "TAU_TOKEN_PEPPERS": settings.TAU_TOKEN_PEPPERS,
            # As in production: keep database connections (a new PostgreSQL connection per
            # request costs a SCRAM handshake, several milliseconds).
            "TAU_DB_CONN_MAX_AGE": "60",
            # What is measured is a submission's cost, not the limiter's answer: past 30 a
            # minute per token the portal answers 429 (counted as not_201 when it did).
            "TAU_SUBMISSIONS_PER_MINUTE": str(10**9),
            "TAU_SUBMISSIONS_PER_MINUTE_PER_USER": str(10**9),
        }
        gunicorn = str(Path(sys.executable).parent / "gunicorn")
        command = [gunicorn, "portal.wsgi:application", "--bind", f"127.0.0.1:{self.port}"]
        command += ["--workers", str(self.workers), "--threads", str(self.threads)]
        command += ["--forwarded-allow-ips", "", "--log-level", "warning"]
        self.server = subprocess.Popen(
            command, cwd=Path(__file__).resolve().parents[1], env=env, start_new_session=True
        )
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            os.killpg(self.server.pid, signal.SIGTERM)
            self.server.wait(timeout=30)

    def load(
        self,
        path: str,
        *,
        method: str = "GET",
        body: str = "",
        content_type: str = "application/json",
        token: str = "",
        expected: int = 200,
    ) -> dict[str, Any]:
        if self.wrk is None:
            return {"skipped": "install Debian's wrk to measure HTTP throughput"}
        script = (
            WRK_SCRIPT.replace("METHOD", json.dumps(method))
            .replace("BODY", json.dumps(body))
            .replace("CONTENT_TYPE", json.dumps(content_type))
            .replace("AUTHORIZATION", json.dumps(f"Bearer {token}" if token else ""))
            .replace("EXPECTED", str(expected))
        )
        url = f"http://127.0.0.1:{self.port}{path}"
        with tempfile.NamedTemporaryFile("w", suffix=".lua") as lua:
            lua.write(script)
            lua.flush()
            for seconds in (sized(2, 1), self.seconds):  # warm-up, then the measurement
                command = [self.wrk, "-t1", f"-c{HTTP_CLIENTS}", f"-d{seconds}s", "-s", lua.name]
                output = subprocess.run(
                    [*command, url], capture_output=True, text=True, check=True
                ).stdout
        line = next(line for line in output.splitlines() if line.startswith("RESULT"))
        requests_done, duration_us, p50, p95, p99, errors, unexpected = line.split()[1:]
        return {
            "requests": int(requests_done),
            "errors": int(errors),
            f"not_{expected}": int(unexpected),
            "requests_per_second": round(int(requests_done) / (int(duration_us) / 1e6), 1),
            "median_ms": float(p50) / 1000,
            "p95_ms": float(p95) / 1000,
            "p99_ms": float(p99) / 1000,
        }


def http_figures(token: str) -> dict[str, Any]:
    """Every HTTP figure and its share of the bare view, measured in one run. The baseline
    is measured first and last; the figures are shares of the mean of the two (the spread
    between them says how steady the machine was)."""
    body = (
        '--taugridbench\r\nContent-Disposition: form-data; name="spec"; filename="tau.yaml"\r\n'
        "Content-Type: application/x-yaml\r\n\r\n" + SPEC.decode() + "\r\n--taugridbench--\r\n"
    )
    results: dict[str, Any] = {}
    with HttpBench() as http:
        first = http.load("/bench/bare/")
        if "skipped" in first:
            return {BASELINE: first}
        results["http: bare DRF view with token authentication"] = http.load(
            "/bench/bare-token/", token=token
        )
        results["http: runs list"] = http.load("/api/v1/workspaces/ws-7/runs/", token=token)
        results["http: submit a run"] = http.load(
            "/api/v1/workspaces/ws-5/runs/",
            method="POST",
            body=body,
            content_type="multipart/form-data; boundary=taugridbench",
            token=token,
            expected=201,
        )
        last = http.load("/bench/bare/")
    baseline = (first["requests_per_second"] + last["requests_per_second"]) / 2
    spread = abs(first["requests_per_second"] - last["requests_per_second"]) / baseline
    figures: dict[str, Any] = {
        BASELINE: {
            "requests_per_second": round(baseline, 1),
            "first": first["requests_per_second"],
            "last": last["requests_per_second"],
            "spread": round(spread, 3),
            "p95_ms": max(first["p95_ms"], last["p95_ms"]),
            "server": f"gunicorn {HTTP_WORKERS} workers x {HTTP_THREADS} threads",
            "clients": HTTP_CLIENTS,
        }
    }
    for label, result in results.items():
        result["ratio"] = round(result["requests_per_second"] / baseline, 4)
        goal = None if SMOKE else GOALS.get(label)
        if goal is not None:
            met = result["ratio"] >= goal["min_ratio"]
            if "max_p95_ms" in goal:
                met = met and result["p95_ms"] < goal["max_p95_ms"]
            result["goal"] = ", ".join(
                [f"ratio ≥ {goal['min_ratio']:.0%}"]
                + ([f"p95 < {goal['max_p95_ms']:.0f} ms"] if "max_p95_ms" in goal else [])
            )
            result["met"] = met
        figures[label] = result
    return figures


def print_ratios(figures: dict[str, Any]) -> None:
    """The HTTP figures as shares of the baseline (``figures``: this benchmark's results)."""
    baseline = figures.get(BASELINE)
    if baseline is None or "skipped" in baseline:
        print(f"\n  HTTP: {baseline['skipped'] if baseline else 'not measured'}")
        return
    print(
        f"\n  HTTP baseline, bare DRF view without authentication: "
        f"{baseline['requests_per_second']:,.0f} requests/s (first {baseline['first']:,.0f}, "
        f"last {baseline['last']:,.0f}; {baseline['clients']} clients, {baseline['server']})"
    )
    for label, result in figures.items():
        if label == BASELINE or not label.startswith("http:"):
            continue
        verdict = ""
        if "goal" in result:
            verdict = f"   goal {result['goal']}: {'met' if result['met'] else 'NOT met'}"
        print(
            f"  {label}: {result['requests_per_second']:,.1f}/s = {result['ratio']:.1%} of the "
            f"baseline, p95 {result['p95_ms']:.1f} ms{verdict}"
        )


def main() -> None:
    with django_test_database():
        from django.contrib.auth import get_user_model
        from django.core.files.uploadedfile import SimpleUploadedFile
        from django.test import Client, override_settings
        from rest_framework.test import APIClient

        from identity.tokens import issue_token
        from runs.models import Run

        user = get_user_model().objects.create_user(username="bench")
        populate(user.pk)
        newest = Run.objects.unscoped().filter(workspace__slug="ws-7").order_by("-created_at")
        run_name = newest.values_list("name", flat=True)[0]
        browser = Client()
        browser.force_login(user)
        api = APIClient()
        token_plaintext = issue_token(user=user, name="bench").plaintext
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {token_plaintext}")
        second_page = browser.get("/w/ws-7/runs/").context["next_query"]

        def get(client: Client, url: str) -> None:
            response = client.get(url)
            assert response.status_code == 200, (url, response.status_code)

        pages = {
            "page: workspace home": "/w/ws-7/",
            "page: runs list": "/w/ws-7/runs/",
            "page: runs list, page 2": f"/w/ws-7/runs/?{second_page}",
            "page: runs list, failed only": "/w/ws-7/runs/?state=failed",
            "page: run": f"/w/ws-7/runs/{run_name}/",
            "page: queue": "/w/ws-7/queue/",
            "page: your workspaces (100)": "/",
        }
        results: dict[str, Any] = {}
        for label, url in pages.items():
            results[label] = measure(partial(get, browser, url), iterations=200, warmup=20)
        results["api: runs list"] = measure(
            lambda: get(api, "/api/v1/workspaces/ws-7/runs/"), iterations=300, warmup=20
        )
        results["api: runs list, state=failed"] = measure(
            lambda: get(api, "/api/v1/workspaces/ws-7/runs/?state=failed"),
            iterations=300,
            warmup=20,
        )

        def submit() -> None:
            response = api.post(
                "/api/v1/workspaces/ws-3/runs/",
                {"spec": SimpleUploadedFile("tau.yaml", SPEC)},
                format="multipart",
            )
            assert response.status_code == 201, response.content

        count = sized(300, 3)
        started = time.perf_counter()
        # A submission's cost, not the limiter's: past 30 a minute per token it refuses (429).
        unlimited = 10**9
        with override_settings(
            TAU_SUBMISSIONS_PER_MINUTE=unlimited, TAU_SUBMISSIONS_PER_MINUTE_PER_USER=unlimited
        ):
            submission = measure(submit, iterations=count, warmup=10)
        elapsed = time.perf_counter() - started
        submission["runs_per_second"] = round((count + sized(10, 1)) / elapsed, 1)
        results["api: submit a run"] = submission
        figures = http_figures(token_plaintext)
        results.update(figures)
        results["rows"] = {"workspaces": WORKSPACES, "runs": WORKSPACES * RUNS_PER_WORKSPACE}
        report("runs_at_scale", results)
        print_ratios(figures)


if __name__ == "__main__":
    main()
