"""Runs at scale, on PostgreSQL: pages and API with 100 workspaces x 10,000 runs.

Targets (issues 6 and 7), on this machine:
- submission through the API: ≥ 100 runs/s, p95 < 100 ms (handing to the backend excluded:
  the run and its outbox row are written and the Celery task is published, nothing more);
- the runs list endpoint with 100,000+ runs in the database: p95 < 50 ms;
- page server time p95 < 50 ms with 100 workspaces x 10,000 runs.

Times are server time in this process (Django's test client through the whole middleware,
authentication and view stack, no network), p95 over repeated requests after a warm-up; and,
for submissions, also over HTTP with wrk against gunicorn (the client shares the two cores).
The rows are written with one INSERT … SELECT generate_series.
"""

from __future__ import annotations

import json
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import django_test_database, measure, report

WORKSPACES = 100
# Smaller for a quick look (TAU_BENCH_RUNS_PER_WORKSPACE=100); the targets are for 10,000.
RUNS_PER_WORKSPACE = int(os.environ.get("TAU_BENCH_RUNS_PER_WORKSPACE", "10000"))
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
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO runs_run (workspace_id, name, spec_name, spec, spec_hash, spec_source,
                submitted_by_id, submitted_by_username, backend, priority, priority_value, state,
                state_reason, attempt_count, failure_class, retry_reason, created_at, updated_at,
                queued_at, finished_at)
            SELECT w.id, 'bench-' || lpad(to_hex(g), 6, '0'), 'bench', %s::jsonb, %s, %s,
                %s, 'bench', 'local', '', 0, (%s::text[])[1 + g %% 5], 'Finished.', 1, '', '',
                now() - (g || ' seconds')::interval, now(), now() - (g || ' seconds')::interval,
                now() - (g || ' seconds')::interval
            FROM workspaces_workspace w CROSS JOIN generate_series(1, %s) AS g
            WHERE w.slug LIKE 'ws-%%'
            """,
            [
                json.dumps(spec.to_dict()),
                "0" * 64,
                SPEC.decode(),
                user_id,
                states,
                RUNS_PER_WORKSPACE,
            ],
        )
        cursor.execute("ANALYZE runs_run")
    took = time.perf_counter() - started
    print(f"  wrote {WORKSPACES * RUNS_PER_WORKSPACE:,} runs in {took:.1f} s", flush=True)


WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = BODY
wrk.headers["Content-Type"] = "multipart/form-data; boundary=taugridbench"
wrk.headers["Authorization"] = "Bearer TOKEN"
local other = 0
response = function(status, headers, body)
  if status ~= 201 then other = other + 1 end
end
done = function(summary, latency, requests)
  io.write(string.format("RESULT %d %d %.1f %.1f %.1f %d\\n", summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(95), latency:percentile(99),
    summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.timeout))
end
"""


def http_submissions(token: str, *, seconds: int = 10) -> dict[str, Any]:
    """Throughput the way scripts see it: gunicorn (HTTP_WORKERS sync workers; threads only
    add GIL contention for this CPU-bound work) on loopback, HTTP_CLIENTS connections at once
    from wrk (a C load generator, so the client takes little of the two cores), each request
    a multipart submission. Bounded: ``seconds`` long."""
    import shutil
    import signal
    import socket
    import subprocess
    import tempfile
    import urllib.request

    from django.conf import settings
    from django.db import connection

    wrk = shutil.which("wrk")
    if wrk is None:
        return {"skipped": "install Debian's wrk to measure HTTP throughput"}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    db = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "TAU_SECRET_KEY": settings.SECRET_KEY,
        "TAU_TOKEN_PEPPERS": settings.TAU_TOKEN_PEPPERS,
        # As in production: keep database connections (a new PostgreSQL connection per
        # request costs a SCRAM handshake, several milliseconds).
        "TAU_DB_CONN_MAX_AGE": "60",
    }
    gunicorn = str(Path(sys.executable).parent / "gunicorn")
    command = [gunicorn, "portal.wsgi:application", "--bind", f"127.0.0.1:{port}"]
    command += ["--workers", str(HTTP_WORKERS), "--threads", str(HTTP_THREADS)]
    server = subprocess.Popen(
        [*command, "--log-level", "warning"],
        cwd=Path(__file__).resolve().parents[1],
        env=env,
        start_new_session=True,
    )
    body = (
        '--taugridbench\r\nContent-Disposition: form-data; name="spec"; filename="tau.yaml"\r\n'
        "Content-Type: application/x-yaml\r\n\r\n" + SPEC.decode() + "\r\n--taugridbench--\r\n"
    )
    script = WRK_SCRIPT.replace("BODY", json.dumps(body)).replace("TOKEN", token)
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        with tempfile.NamedTemporaryFile("w", suffix=".lua") as lua:
            lua.write(script)
            lua.flush()
            url = f"http://127.0.0.1:{port}/api/v1/workspaces/ws-5/runs/"
            warm = [wrk, "-t1", f"-c{HTTP_CLIENTS}", "-d2s", "-s", lua.name, url]
            subprocess.run(warm, capture_output=True, check=True)
            measured = [wrk, "-t1", f"-c{HTTP_CLIENTS}", f"-d{seconds}s", "-s", lua.name, url]
            output = subprocess.run(measured, capture_output=True, text=True, check=True).stdout
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    line = next(line for line in output.splitlines() if line.startswith("RESULT"))
    requests_done, duration_us, p50, p95, p99, errors = line.split()[1:]
    return {
        "clients": HTTP_CLIENTS,
        "server": f"gunicorn {HTTP_WORKERS} workers x {HTTP_THREADS} threads",
        "requests": int(requests_done),
        "errors": int(errors),
        "runs_per_second": round(int(requests_done) / (int(duration_us) / 1e6), 1),
        "median_ms": float(p50) / 1000,
        "p95_ms": float(p95) / 1000,
        "p99_ms": float(p99) / 1000,
    }


def main() -> None:
    with django_test_database():
        from django.contrib.auth import get_user_model
        from django.core.files.uploadedfile import SimpleUploadedFile
        from django.test import Client
        from rest_framework.test import APIClient

        from portal.identity.tokens import issue_token
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

        count = 300
        started = time.perf_counter()
        submission = measure(submit, iterations=count, warmup=10)
        elapsed = time.perf_counter() - started
        submission["runs_per_second"] = round((count + 10) / elapsed, 1)
        results["api: submit a run"] = submission
        results["http: submit a run"] = http_submissions(token_plaintext)
        results["rows"] = {"workspaces": WORKSPACES, "runs": WORKSPACES * RUNS_PER_WORKSPACE}
        report("runs_at_scale", results)


if __name__ == "__main__":
    main()
