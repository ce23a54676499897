"""/metrics (web/portal_metrics.py): the exposition parses, its numbers are the rows the test made
(runs in several states and workspaces, waiting ages, deliveries and their latencies, Kueue
syncs, seal requests, the fleet sync, the watcher's heartbeat), who may read it, a fixed
number of queries for 1 and 100 runs, and a database that does not answer.

Real PostgreSQL and Redis throughout; tests/portal/test_metrics_prometheus.py has a real
Prometheus scrape it, and the alert rules and dashboard checked against these names.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import DatabaseError, connection
from django.db.utils import ConnectionHandler
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from evidence.models import SealRequest
from executors.kubernetes.heartbeat import HEARTBEAT_KEY, HeartbeatWriter
from gpus.models import FleetSync
from runs import submission
from runs.models import Delivery, Run, RunAttempt, RunState
from runs.state import transition
from tests.conftest import make_workspace
from tests.runs.factories import TINY_FILES, TINY_SPEC, zip_bytes
from tests.runs.processes import free_port
from web.portal_metrics import LATENCY_QUANTILES, SQLITE_PERCENTILE, _time_limit
from workspaces.models import KueueSync, Workspace

pytestmark = pytest.mark.django_db

TOKEN = "metrics-token-for-tests-0123456789"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of an exposition, by name and labels; the parser refuses a bad one."""
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in found, f"{sample.name}{sample.labels} appears twice"
            found[key] = sample.value
    return found


def value(samples: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, f"no sample {name}{labels}; there are {sorted(k[0] for k in samples)}"
    return samples[key]


def scraper(**extra: Any) -> Client:
    """A client that sends the scrape token the portal has (generated into var/ here)."""
    return Client(HTTP_AUTHORIZATION=f"Bearer {settings.TAU_METRICS_TOKEN}", **extra)


def scrape(client: Client | None = None, **headers: Any) -> Samples:
    response = (client or scraper()).get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return parse(response.content.decode())


def submit_in(workspace: Workspace, user: Any) -> Run:
    """A run submitted as real ones are: its first attempt and its submit delivery with it."""
    return submission.submit(
        workspace=workspace,
        user=user,
        spec_source=TINY_SPEC,
        bundle=io.BytesIO(zip_bytes(TINY_FILES)),
    )


def set_run(run: Run, **fields: Any) -> None:
    Run.objects.unscoped().filter(pk=run.pk).update(**fields)


def first_delivery(run: Run) -> Delivery:
    return Delivery.objects.unscoped().get(run=run, attempt__number=1)


def set_delivery(delivery: Delivery, **fields: Any) -> None:
    Delivery.objects.unscoped().filter(pk=delivery.pk).update(**fields)


def ago(now: datetime, seconds: float) -> datetime:
    return now - timedelta(seconds=seconds)


@dataclass
class Scene:
    now: datetime
    runs: dict[str, Run]


@pytest.fixture
def scene(world: Any) -> Scene:
    """Runs in alpha and beta in several states, their deliveries with known latencies, seal
    requests, Kueue syncs and a failing fleet sync, all at known times before ``now``."""
    now = timezone.now()
    alpha, beta = world.alpha, world.beta
    rob, otto = world.users["researcher"], world.users["outsider"]
    runs = {
        name: submit_in(alpha if name.startswith("a_") else beta, rob if name[0] == "a" else otto)
        for name in ("a_pending", "a_queued", "a_running", "a_old", "b_retrying", "b_failed")
    }
    runs["b_cancelled"] = submit_in(beta, otto)

    # alpha: waiting since 600 s (pending, its delivery due and not made) and 790 s (queued).
    set_run(runs["a_pending"], created_at=ago(now, 600))
    set_delivery(
        first_delivery(runs["a_pending"]), created_at=ago(now, 600), next_try_at=ago(now, 600)
    )
    set_run(
        runs["a_queued"], state=RunState.QUEUED, created_at=ago(now, 800), queued_at=ago(now, 790)
    )
    set_delivery(
        first_delivery(runs["a_queued"]), created_at=ago(now, 800), delivered_at=ago(now, 798)
    )  # delivery 2 s, submission 2 s
    set_run(runs["a_running"], state=RunState.RUNNING, created_at=ago(now, 301))
    set_delivery(
        first_delivery(runs["a_running"]), created_at=ago(now, 300), delivered_at=ago(now, 296)
    )  # delivery 4 s, submission 5 s
    retry = RunAttempt.objects.create(run=runs["a_running"], number=2)
    Delivery.objects.create(
        run=runs["a_running"],
        action=Delivery.Action.SUBMIT,
        attempt=retry,
        created_at=ago(now, 60),
        delivered_at=ago(now, 50),
    )  # a retry's hand-over, 10 s: a delivery latency, not a submission's
    Delivery.objects.create(
        run=runs["a_running"],
        action=Delivery.Action.CANCEL,
        created_at=ago(now, 100),
        delivered_at=ago(now, 99),
    )
    # Long finished: outside the latency window, and never sealed (its state was set).
    set_run(runs["a_old"], state=RunState.SUCCEEDED, created_at=ago(now, 7200))
    set_delivery(
        first_delivery(runs["a_old"]), created_at=ago(now, 7200), delivered_at=ago(now, 7170)
    )

    # beta: one waiting 120 s whose delivery keeps failing (backing off, not due), one failed
    # because its delivery was given up, one cancelled before it was handed over.
    set_run(runs["b_retrying"], created_at=ago(now, 120))
    set_delivery(
        first_delivery(runs["b_retrying"]),
        created_at=ago(now, 120),
        tries=2,
        last_error="ConnectionError: the API server did not answer",
        next_try_at=now + timedelta(seconds=60),
    )
    transition(runs["b_failed"], RunState.FAILED, reason="It could not be handed over.")
    set_delivery(
        first_delivery(runs["b_failed"]),
        tries=5,
        last_error="Forbidden",
        given_up_at=ago(now, 30),
    )
    SealRequest.objects.unscoped().filter(run=runs["b_failed"]).update(
        created_at=ago(now, 300), last_error="the signing key cannot be read", tries=1
    )
    transition(runs["b_cancelled"], RunState.CANCELLED, reason="Cancelled.")
    set_run(runs["b_cancelled"], created_at=ago(now, 22))
    set_delivery(
        first_delivery(runs["b_cancelled"]), created_at=ago(now, 21), delivered_at=ago(now, 20)
    )  # superseded (it ended first): delivery 1 s, submission 2 s

    # Kueue: alpha failed once and is in step since; beta's newest sync gave up; the
    # cluster-wide objects wait for a retry after an error, asked for 120 s ago.
    for target, state, error, created in (
        ("alpha", KueueSync.State.FAILED, "admission webhook said no", 900),
        ("alpha", KueueSync.State.SYNCED, "", 800),
        ("beta", KueueSync.State.FAILED, "forbidden: cannot patch clusterqueues", 600),
    ):
        KueueSync.objects.create(
            scope=KueueSync.Scope.WORKSPACE,
            workspace_slug=target,
            state=state,
            last_error=error,
            created_at=ago(now, created),
        )
    KueueSync.objects.create(
        scope=KueueSync.Scope.CLUSTER,
        state=KueueSync.State.PENDING,
        attempts=1,
        last_error="timed out",
        created_at=ago(now, 120),
    )
    FleetSync.objects.create(
        pk=1,
        source="kubernetes",
        last_attempt_at=ago(now, 5),
        last_success_at=ago(now, 65),
        last_error="cannot list nodes: connection refused",
        node_count=2,
    )
    return Scene(now=now, runs=runs)


def test_the_numbers_are_the_rows(scene: Scene) -> None:
    samples = scrape()
    runs = {(workspace, state.value): 0 for workspace in ("alpha", "beta") for state in RunState}
    runs.update(
        {
            ("alpha", "pending"): 1,
            ("alpha", "queued"): 1,
            ("alpha", "running"): 1,
            ("alpha", "succeeded"): 1,
            ("beta", "pending"): 1,
            ("beta", "failed"): 1,
            ("beta", "cancelled"): 1,
        }
    )
    exposed = {
        (dict(labels)["workspace"], dict(labels)["state"]): number
        for (name, labels), number in samples.items()
        if name == "taugrid_runs"
    }
    assert exposed == runs  # every workspace and state, zeros included, nothing else
    assert value(samples, "taugrid_queue_depth", workspace="alpha") == 2
    assert value(samples, "taugrid_queue_depth", workspace="beta") == 1
    # The queued run joined the queue 790 s ago; the pending one was submitted 600 s ago.
    assert value(samples, "taugrid_queue_oldest_wait_seconds", workspace="alpha") == (
        pytest.approx(790, abs=5)
    )
    assert value(samples, "taugrid_queue_oldest_wait_seconds", workspace="beta") == (
        pytest.approx(120, abs=5)
    )

    assert value(samples, "taugrid_deliveries_pending", action="submit") == 2
    assert value(samples, "taugrid_deliveries_pending", action="cancel") == 0
    assert value(samples, "taugrid_deliveries_failing", action="submit") == 1
    assert value(samples, "taugrid_deliveries_failing", action="cancel") == 0
    # The failing one backs off (not due): the one due for 600 s is the oldest.
    assert value(samples, "taugrid_delivery_oldest_due_seconds", action="submit") == (
        pytest.approx(600, abs=5)
    )
    assert value(samples, "taugrid_delivery_oldest_due_seconds", action="cancel") == 0
    assert value(samples, "taugrid_deliveries_given_up_total", action="submit") == 1
    assert value(samples, "taugrid_deliveries_given_up_total", action="cancel") == 0

    # Submit deliveries in the window took 1, 2, 4 and 10 s (the one of two hours ago, 30 s,
    # is outside it); percentile_cont interpolates between neighbours.
    expected_submit = {0.5: 3.0, 0.9: 8.2, 0.99: 9.82}
    for fraction in LATENCY_QUANTILES:
        quantile = str(fraction)
        assert value(
            samples, "taugrid_delivery_latency_seconds", action="submit", quantile=quantile
        ) == pytest.approx(expected_submit[fraction], abs=0.01)
        assert value(
            samples, "taugrid_delivery_latency_seconds", action="cancel", quantile=quantile
        ) == pytest.approx(1.0, abs=0.01)
    assert value(samples, "taugrid_delivery_latency_sample_size", action="submit") == 4
    assert value(samples, "taugrid_delivery_latency_sample_size", action="cancel") == 1
    # First attempts handed over in the window: 2, 5 and 2 s after their submission.
    expected_submission = {0.5: 2.0, 0.9: 4.4, 0.99: 4.94}
    for fraction in LATENCY_QUANTILES:
        assert value(
            samples, "taugrid_submission_latency_seconds", quantile=str(fraction)
        ) == pytest.approx(expected_submission[fraction], abs=0.01)
    assert value(samples, "taugrid_submission_latency_sample_size") == 3

    assert value(samples, "taugrid_kueue_sync_targets", state="synced") == 1
    assert value(samples, "taugrid_kueue_sync_targets", state="failed") == 1
    assert value(samples, "taugrid_kueue_sync_targets", state="pending") == 1
    assert value(samples, "taugrid_kueue_sync_targets", state="waiting") == 0
    assert value(samples, "taugrid_kueue_sync_errors") == 2  # alpha's old failure is over
    assert value(samples, "taugrid_kueue_sync_oldest_unfinished_seconds") == (
        pytest.approx(120, abs=5)
    )

    assert value(samples, "taugrid_evidence_seals_pending") == 2
    assert value(samples, "taugrid_evidence_seals_failing") == 1
    assert value(samples, "taugrid_evidence_seals_given_up") == 0
    assert value(samples, "taugrid_evidence_seal_oldest_pending_seconds") == (
        pytest.approx(300, abs=5)
    )

    now = scene.now.timestamp()
    assert value(samples, "taugrid_gpu_fleet_sync_last_success_timestamp_seconds") == pytest.approx(
        now - 65, abs=0.01
    )
    assert value(samples, "taugrid_gpu_fleet_sync_last_attempt_timestamp_seconds") == pytest.approx(
        now - 5, abs=0.01
    )
    assert value(samples, "taugrid_gpu_fleet_sync_failing") == 1
    assert value(samples, "taugrid_gpu_fleet_nodes") == 2
    # The local backend runs no watcher: nothing of it is said.
    assert not [name for name, _ in samples if name.startswith("taugrid_kube_watcher")]


def test_a_given_up_seal_is_counted_as_given_up_not_as_pending(scene: Scene) -> None:
    """A seal given up after its last try waits for nobody: it leaves pending, failing and
    the oldest-pending age (which an alert watches), and is counted on its own; a seal that
    only waits for a cluster's log (a last_error, no failed try) is not failing."""
    failed = scene.runs["b_failed"]
    SealRequest.objects.unscoped().filter(run=failed).update(given_up_at=timezone.now(), tries=8)
    SealRequest.objects.unscoped().exclude(run=failed).filter(sealed_at__isnull=True).update(
        last_error="waiting for the log of attempt 1", tries=0
    )
    samples = scrape()
    assert value(samples, "taugrid_evidence_seals_given_up") == 1
    assert value(samples, "taugrid_evidence_seals_pending") == 1
    assert value(samples, "taugrid_evidence_seals_failing") == 0
    assert value(samples, "taugrid_evidence_seal_oldest_pending_seconds") < 300


def test_an_empty_portal_says_zero_and_nan_not_nothing() -> None:
    """No workspace, no run, no fleet sync yet: the per-workspace metrics have no series,
    every other one has a value (alerts and panels see 0), and the quantiles of nothing are
    NaN, as Prometheus summaries say it."""
    samples = scrape()
    assert not [name for name, _ in samples if name in {"taugrid_runs", "taugrid_queue_depth"}]
    assert value(samples, "taugrid_deliveries_pending", action="submit") == 0
    assert math.isnan(value(samples, "taugrid_submission_latency_seconds", quantile="0.5"))
    assert value(samples, "taugrid_submission_latency_sample_size") == 0
    assert value(samples, "taugrid_gpu_fleet_sync_last_success_timestamp_seconds") == 0
    assert value(samples, "taugrid_gpu_fleet_sync_failing") == 0
    assert value(samples, "taugrid_kueue_sync_errors") == 0
    assert value(samples, "taugrid_evidence_seals_pending") == 0


def test_a_gpu_less_machine_read_successfully_is_not_a_failing_sync(world: Any) -> None:
    """The embedded default without a GPU: last_error says why the fleet is empty, and the
    sync succeeded (gpus.fleet sets last_success_at with it)."""
    now = timezone.now()
    FleetSync.objects.create(
        pk=1,
        source="local",
        last_attempt_at=now,
        last_success_at=now,
        last_error="no NVIDIA driver on this machine",
    )
    samples = scrape()
    assert value(samples, "taugrid_gpu_fleet_sync_failing") == 0
    assert value(samples, "taugrid_gpu_fleet_sync_last_success_timestamp_seconds") == pytest.approx(
        now.timestamp(), abs=0.01
    )


# --- the watcher's heartbeat ------------------------------------------------------------------


@pytest.fixture
def no_heartbeat() -> Iterator[None]:
    from django.core.cache import cache

    cache.delete(HEARTBEAT_KEY)
    yield
    cache.delete(HEARTBEAT_KEY)


def test_the_watchers_heartbeat_on_the_kubernetes_backend(no_heartbeat: None) -> None:
    with override_settings(TAU_BACKEND="kubernetes"):
        never = scrape()
        assert value(never, "taugrid_kube_watcher_heartbeat_timestamp_seconds") == 0
        assert value(never, "taugrid_kube_watcher_backlog") == 0
        written = HeartbeatWriter("watcher-a", clock=lambda: 1_700_000_000.5)
        assert value(never, "taugrid_kube_unknown_attempts") == 0
        assert written.beat(listed=True, backlog=7, unknown=2)
        samples = scrape()
    assert value(samples, "taugrid_kube_watcher_heartbeat_timestamp_seconds") == 1_700_000_000.5
    assert value(samples, "taugrid_kube_watcher_backlog") == 7
    assert value(samples, "taugrid_kube_unknown_attempts") == 2


def test_a_cache_that_does_not_answer_leaves_the_watcher_unknown_not_never(
    no_heartbeat: None,
) -> None:
    """No false 'never heard of it' (which would page someone) when only Redis hiccups."""
    down = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{free_port()}/0",
            "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
        }
    }
    with override_settings(TAU_BACKEND="kubernetes", CACHES=down):
        samples = scrape()
    assert not [name for name, _ in samples if name.startswith("taugrid_kube_watcher")]
    assert value(samples, "taugrid_evidence_seals_pending") == 0  # the rest is there


# --- who may read it --------------------------------------------------------------------------


def test_this_machine_is_no_credential(world: Any) -> None:
    """Runs on the embedded default connect from this machine: loopback without the token
    is refused like anyone (it was let in). Outside production there always is a token:
    generated once into var/, where the refusal says to look."""
    assert settings.TAU_METRICS_TOKEN
    assert (settings.VAR_DIR / "metrics-token").read_text().strip() == settings.TAU_METRICS_TOKEN
    for address in ("127.0.0.1", "::1"):
        refused = Client(REMOTE_ADDR=address).get("/metrics")
        assert refused.status_code == 401
        assert "taugrid_runs" not in refused.content.decode()
        assert str(settings.VAR_DIR / "metrics-token") in refused.content.decode()
    # In production without a token nobody, from anywhere.
    with override_settings(PRODUCTION=True, TAU_METRICS_TOKEN=None):
        closed = Client(REMOTE_ADDR="127.0.0.1").get("/metrics")
    assert closed.status_code == 403
    assert "TAU_METRICS_TOKEN" in closed.content.decode()


@override_settings(TAU_METRICS_TOKEN=TOKEN)
def test_with_a_token_only_the_token_counts(world: Any) -> None:
    with CaptureQueriesContext(connection) as queries:
        missing = Client().get("/metrics")  # from loopback too
    assert missing.status_code == 401
    assert missing["WWW-Authenticate"] == 'Bearer realm="taugrid-metrics"'
    assert not queries.captured_queries, "a refused scrape must not touch the database"
    wrong = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}x")
    assert wrong.status_code == 401
    assert wrong["WWW-Authenticate"] == 'Bearer realm="taugrid-metrics", error="invalid_token"'
    prefix = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN[:-1]}")
    assert prefix.status_code == 401
    basic = Client().get("/metrics", HTTP_AUTHORIZATION=f"Basic {TOKEN}")
    assert basic.status_code == 401
    # A signed-in platform admin without the token: a session is not a scrape token.
    assert world.client_for("platform_admin").get("/metrics").status_code == 401
    for response in (missing, wrong, prefix, basic):
        assert TOKEN not in response.content.decode()
        assert "taugrid_" not in response.content.decode()

    remote = Client(REMOTE_ADDR="192.0.2.7")
    samples = scrape(remote, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert value(samples, "taugrid_queue_depth", workspace="alpha") == 0
    assert scrape(remote, HTTP_AUTHORIZATION=f"bearer  {TOKEN} ")  # scheme case, spaces


def test_it_is_never_cached_and_only_read(world: Any) -> None:
    response = scraper().get("/metrics")
    assert "no-store" in response["Cache-Control"]
    assert scraper().head("/metrics").status_code == 200
    assert scraper().post("/metrics").status_code == 405
    # The security headers stay (a plain-text body has nothing for them to break).
    assert response["X-Content-Type-Options"] == "nosniff"


def test_openmetrics_when_the_scraper_asks_for_it(world: Any) -> None:
    response = scraper().get(
        "/metrics", HTTP_ACCEPT="application/openmetrics-text; version=1.0.0; charset=utf-8"
    )
    assert response["Content-Type"].startswith("application/openmetrics-text")
    body = response.content.decode()
    assert body.endswith("# EOF\n")
    assert 'taugrid_deliveries_given_up_total{action="submit"} 0.0' in body


# --- cost -------------------------------------------------------------------------------------


def make_runs(world: Any, count: int) -> None:
    """``count`` runs over ``count // 10 + 1`` workspaces in every state, each with its
    delivery; and as many Kueue syncs and seal requests (copies of one submitted run)."""
    template = submit_in(world.alpha, world.users["researcher"])
    workspaces = [world.alpha] + [make_workspace(f"ws-{n}") for n in range(count // 10)]
    states = list(RunState)
    copies = [
        Run(
            workspace=workspaces[n % len(workspaces)],
            name=f"copy-{n}",
            spec_name=template.spec_name,
            spec=template.spec,
            spec_hash=template.spec_hash,
            spec_source=template.spec_source,
            submitted_by_username="rob",
            backend=template.backend,
            state=states[n % len(states)],
            queued_at=timezone.now(),
        )
        for n in range(count - 1)
    ]
    Run.objects.bulk_create(copies)
    now = timezone.now()
    Delivery.objects.bulk_create(
        Delivery(run=run, action=Delivery.Action.SUBMIT, delivered_at=now if n % 2 else None)
        for n, run in enumerate(copies)
    )
    SealRequest.objects.bulk_create(
        SealRequest(run=run, terminal_seq=1, attempt_count=1) for run in copies[::3]
    )
    KueueSync.objects.bulk_create(
        KueueSync(scope=KueueSync.Scope.WORKSPACE, workspace_slug=workspace.slug)
        for workspace in workspaces
    )


@pytest.mark.parametrize("backend", ["local", "kubernetes"])
def test_a_fixed_number_of_queries_whatever_the_number_of_runs(
    world: Any, backend: str, no_heartbeat: None
) -> None:
    counted: dict[int, int] = {}
    for total in (1, 100):
        make_runs(world, total)
        runs_now = Run.objects.unscoped().count()
        with override_settings(TAU_BACKEND=backend), CaptureQueriesContext(connection) as queries:
            samples = scrape()
        exposed = sum(v for (name, _), v in samples.items() if name == "taugrid_runs")
        assert exposed == runs_now  # the rows were there, and counted
        counted[total] = len(queries.captured_queries)
        Run.objects.unscoped().delete()
    # The statement timeout, workspaces, runs, two of deliveries, Kueue, seals, the fleet,
    # and the savepoint pair of the scrape's transaction inside the test's.
    assert counted == {1: 10, 100: 10}


@pytest.mark.django_db(transaction=True)
def test_a_database_that_does_not_answer_is_a_503(world: Any) -> None:
    connection.close()
    saved = dict(connection.settings_dict)
    connection.settings_dict.update({"HOST": "127.0.0.1", "PORT": str(free_port())})
    try:
        response = scraper().get("/metrics")
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
    assert response.status_code == 503
    assert "database" in response.content.decode()
    assert str(saved["PORT"]) not in response.content.decode()


# --- SQLite (make run) ------------------------------------------------------------------------
# The whole scrape on SQLite runs in tests/portal/test_make_run.py against the real make run;
# these pin the two SQLite stand-ins against PostgreSQL's behaviour.

VALUES = [3.0, 1.0, 10.0, 4.0, 2.0]


@pytest.fixture
def sqlite() -> Iterator[Any]:
    """A Django connection to an in-memory SQLite database, as make run's (not the suite's)."""
    handler = ConnectionHandler(
        {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
    )
    database = handler["default"]
    try:
        yield database
    finally:
        database.close()


def test_sqlite_quantiles_are_postgresqls(sqlite: Any) -> None:
    """The stand-in for percentile_cont interpolates as PostgreSQL does (the suite's
    PostgreSQL answers the same query), leaves NULLs out and gives NULL over no rows."""
    rows = ", ".join(f"({v})" for v in [*VALUES, "NULL"])
    fractions = [0.0, 0.5, 0.9, 0.99, 1.0]
    postgresql = ", ".join(f"percentile_cont({f}) WITHIN GROUP (ORDER BY x)" for f in fractions)
    ours = ", ".join(f"{SQLITE_PERCENTILE}({f}, x)" for f in fractions)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {postgresql} FROM (VALUES {rows}) AS t(x)")  # noqa: S608
        expected = list(cursor.fetchone())
    with _time_limit(sqlite, 5000), sqlite.cursor() as cursor:
        cursor.execute(f"WITH t(x) AS (VALUES {rows}) SELECT {ours} FROM t")  # noqa: S608
        found = list(cursor.fetchone())
        cursor.execute(f"SELECT {SQLITE_PERCENTILE}(0.5, 1.0) WHERE 0")
        empty = cursor.fetchone()[0]
    assert found == pytest.approx(expected)
    assert empty is None


def test_sqlite_scrapes_are_stopped_after_the_time_limit(sqlite: Any) -> None:
    """SQLite has no statement_timeout: the progress handler stops the scrape's queries once
    the limit has passed, with a DatabaseError (a 503, as on PostgreSQL); after the block the
    connection is as it was."""
    endless = (
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n"
    )
    with pytest.raises(DatabaseError), _time_limit(sqlite, 100), sqlite.cursor() as cursor:
        cursor.execute(endless)
    with sqlite.cursor() as cursor:
        cursor.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
            "WHERE i < 300000) SELECT count(*) FROM n"
        )
        assert cursor.fetchone()[0] == 300000  # no limit left behind
