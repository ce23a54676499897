"""``/metrics``: the portal's own metrics in the Prometheus text format, for Prometheus to
scrape and for the alert rules and the Grafana dashboard in ``deploy/`` (docs/metrics.md).

Read from the database at scrape time, never counted in the process that answers: the
portal is several processes (gunicorn workers, the Celery worker and beat, the Kubernetes
watcher, the local agent), so a counter kept by the web worker that happens to answer
would count that worker's share of the work only, and start again at every restart. The
rows (runs, deliveries, Kueue syncs, seal requests, the fleet sync) are the one source of
truth; :class:`PortalCollector` turns them into metrics with a fixed number of aggregate
queries (``GROUP BY``), whatever the number of runs, under a time limit
(:data:`QUERY_TIMEOUT_MS`), so a scrape costs bounded time. The watcher's lag is the age of
the heartbeat it writes into the shared cache (``executors.kubernetes.heartbeat``). Every replica
answers the same, so Prometheus scrapes one of them (the Service), not every pod.

The same queries run on both databases: PostgreSQL in production and SQLite on the embedded
default (``make run``). Where SQL differs, the expression says how on each
(:class:`Percentile`, :class:`SecondsBetween`), and the time limit is PostgreSQL's
``statement_timeout`` or, on SQLite, a progress handler that interrupts the scrape's queries
once the limit has passed (:func:`_time_limit`).

Who may read it: a scraper that sends ``TAU_METRICS_TOKEN`` as its bearer token, and nobody
else, wherever it connects from. ``make run`` generates one (``var/metrics-token``; the
curl in docs/operations.md sends it); in production, without one, nobody may. A loopback address is
no credential: runs on the embedded default connect from this machine, and a reverse proxy on
the same host that is missing from ``TAU_TRUSTED_PROXIES`` makes every client look local.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import (
    Aggregate,
    BooleanField,
    Count,
    ExpressionWrapper,
    F,
    Func,
    Max,
    Min,
    Q,
)
from django.db.models.fields import FloatField
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from evidence.models import SealRequest
from executors.kubernetes.heartbeat import HeartbeatUnreadable, last_heartbeat
from gpus.models import FleetSync
from runs.models import WAITING_STATES, Delivery, Run, RunState
from workspaces.models import KueueSync, Workspace

logger = logging.getLogger(__name__)

#: Each query of a scrape is stopped after this long (Prometheus' scrape timeout is 10 s by
#: default): a database under strain gets a refused scrape, not a pile of slow ones.
QUERY_TIMEOUT_MS = 5000
#: The latencies are quantiles over what completed in this window before the scrape.
LATENCY_WINDOW = timedelta(minutes=15)
LATENCY_QUANTILES = (0.5, 0.9, 0.99)
#: The one-row FleetSync (gpus.models): how the last GPU fleet syncs went.
FLEET_SYNC_PK = 1


#: The name SQLite knows :class:`SQLitePercentile` by, on the connections that scrape.
SQLITE_PERCENTILE = "taugrid_percentile_cont"


class Percentile(Aggregate):
    """PostgreSQL's ``percentile_cont(fraction) WITHIN GROUP (ORDER BY expression)``: the
    value below which ``fraction`` of the rows fall, interpolated; NULL over no rows. On
    SQLite, which has no such aggregate, the same computed by :class:`SQLitePercentile`."""

    function = "percentile_cont"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, fraction: float, expression: Any, **extra: Any) -> None:
        if not 0 <= fraction <= 1:
            raise ValueError(f"a percentile's fraction is between 0 and 1, not {fraction}")
        # A float from this module, never input: written into the SQL as a literal.
        super().__init__(expression, fraction=repr(float(fraction)), **extra)

    def as_sqlite(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        # On the copy's attributes, not as keywords: Aggregate.as_sql wraps self.template in
        # its FILTER clause itself.
        sqlite = self.copy()
        sqlite.function = SQLITE_PERCENTILE
        sqlite.template = "%(function)s(%(fraction)s, %(expressions)s)"
        return sqlite.as_sql(compiler, connection, **extra_context)


class SQLitePercentile:
    """``percentile_cont`` as a SQLite aggregate (``sqlite3.Connection.create_aggregate``):
    the values of the group are kept and the quantile interpolated between the two nearest
    ranks, as PostgreSQL does; NULLs are left out, and no values give NULL."""

    def __init__(self) -> None:
        self.fraction = 0.0
        self.values: list[float] = []

    def step(self, fraction: float, value: float | None) -> None:
        self.fraction = fraction
        if value is not None:
            self.values.append(float(value))

    def finalize(self) -> float | None:
        if not self.values:
            return None
        ordered = sorted(self.values)
        position = self.fraction * (len(ordered) - 1)
        below = int(position)
        above = min(below + 1, len(ordered) - 1)
        return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


class SecondsBetween(Func):
    """``later - earlier`` in seconds, as a float."""

    template = "EXTRACT(EPOCH FROM (%(expressions)s))::double precision"
    arg_joiner = " - "
    output_field = FloatField()

    def __init__(self, later: Any, earlier: Any) -> None:
        super().__init__(later, earlier)

    def as_sqlite(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        # Django keeps datetimes as ISO text on SQLite; julianday() reads them (in days).
        return self.as_sql(
            compiler,
            connection,
            template="((julianday(%(expressions)s)) * 86400.0)",
            arg_joiner=") - julianday(",
            **extra_context,
        )


@contextlib.contextmanager
def _time_limit(database: BaseDatabaseWrapper, milliseconds: int) -> Iterator[None]:
    """The queries run inside stop after ``milliseconds`` with a DatabaseError: PostgreSQL's
    ``statement_timeout`` for the enclosing transaction (each query), SQLite's progress
    handler for the whole block (SQLite has no statement timeout). Other databases: none."""
    if database.vendor == "postgresql":
        with database.cursor() as cursor:
            # Only for this transaction: the scrape's queries, nothing after them.
            cursor.execute("SET LOCAL statement_timeout = %s", [milliseconds])
        yield
        return
    if database.vendor != "sqlite":
        yield
        return
    database.ensure_connection()
    raw = database.connection
    raw.create_aggregate(SQLITE_PERCENTILE, 2, SQLitePercentile)
    deadline = time.monotonic() + milliseconds / 1000
    # Called every 10,000 virtual machine instructions; a true answer interrupts the query
    # ("interrupted", an OperationalError: a DatabaseError like PostgreSQL's cancel).
    raw.set_progress_handler(lambda: time.monotonic() > deadline, 10_000)
    try:
        yield
    finally:
        raw.set_progress_handler(None, 0)


def _seconds_since(moment: datetime | None, now: datetime) -> float:
    """How long ago ``moment`` was (0 when there is none, or it is in the future)."""
    if moment is None:
        return 0.0
    return max(0.0, (now - moment).total_seconds())


def _timestamp(moment: datetime | None) -> float:
    """Unix time, 0 for never (the Prometheus convention for ``*_timestamp_seconds``)."""
    return moment.timestamp() if moment is not None else 0.0


def _quantile(value: float | None) -> float:
    """A quantile of no observations is NaN, as Prometheus summaries say it."""
    return float("nan") if value is None else float(value)


def _summary(name: str, documentation: str) -> Metric:
    """A summary of quantiles only: a ``_count`` and ``_sum`` over a sliding window would
    not be the counters Prometheus takes them for (the ``*_sample_size`` gauges say how
    many observations the quantiles are over)."""
    return Metric(name, documentation, "summary")


def _add_quantiles(
    metric: Metric, row: Mapping[str, Any], prefix: str, labels: Mapping[str, str]
) -> None:
    for fraction in LATENCY_QUANTILES:
        metric.add_sample(
            metric.name,
            {**labels, "quantile": str(fraction)},
            _quantile(row.get(f"{prefix}{_quantile_column(fraction)}")),
        )


def _quantile_column(fraction: float) -> str:
    """The name the query gives a quantile's column (``p990`` for 0.99)."""
    return f"p{round(fraction * 1000)}"


class PortalCollector(Collector):
    """The portal's metrics, read from the database when collected (module docstring); ages
    are measured from the moment of the scrape."""

    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        with transaction.atomic(), _time_limit(connection, QUERY_TIMEOUT_MS):
            families = [
                *self._runs(now),
                *self._deliveries(now),
                *self._latencies(now),
                *self._kueue_syncs(now),
                *self._seals(now),
                *self._fleet_sync(),
            ]
        yield from families
        yield from self._watcher()

    # -- runs ---------------------------------------------------------------------------------

    def _runs(self, now: datetime) -> Iterable[Metric]:
        slugs = dict(Workspace.unscoped_objects.order_by().values_list("pk", "slug"))
        counts: dict[tuple[int, str], int] = {}
        oldest: dict[int, datetime] = {}
        rows = (
            Run.objects.unscoped()
            .order_by()
            .values("workspace_id", "state")
            .annotate(
                count=Count("pk"),
                # Where the queue has it: a run put back after an interruption keeps its
                # original place, and so its original time.
                waiting_since=Min(
                    Coalesce("queued_at", "created_at"), filter=Q(state__in=WAITING_STATES)
                ),
            )
        )
        for row in rows:
            workspace_id = row["workspace_id"]
            counts[(workspace_id, row["state"])] = row["count"]
            since = row["waiting_since"]
            if since is not None and (workspace_id not in oldest or since < oldest[workspace_id]):
                oldest[workspace_id] = since
        runs = GaugeMetricFamily(
            "taugrid_runs",
            "Runs by workspace and state, finished ones included (every run ever kept).",
            labels=["workspace", "state"],
        )
        depth = GaugeMetricFamily(
            "taugrid_queue_depth",
            "Runs waiting for resources (pending, queued, preempted, evicted), by workspace.",
            labels=["workspace"],
        )
        wait = GaugeMetricFamily(
            "taugrid_queue_oldest_wait_seconds",
            "Seconds the longest-waiting run of the workspace has waited, since it joined the "
            "queue (since its submission while pending); 0 when none waits.",
            labels=["workspace"],
        )
        for workspace_id, slug in sorted(slugs.items(), key=lambda item: item[1]):
            for state in RunState:
                runs.add_metric([slug, state.value], counts.get((workspace_id, state.value), 0))
            waiting = sum(counts.get((workspace_id, state.value), 0) for state in WAITING_STATES)
            depth.add_metric([slug], waiting)
            wait.add_metric([slug], _seconds_since(oldest.get(workspace_id), now))
        return [runs, depth, wait]

    # -- deliveries ---------------------------------------------------------------------------

    def _deliveries(self, now: datetime) -> Iterable[Metric]:
        rows = {
            row["action"]: row
            for row in Delivery.objects.unscoped()
            .filter(delivered_at__isnull=True, given_up_at__isnull=True)
            .order_by()
            .values("action")
            .annotate(
                pending=Count("pk"),
                failing=Count("pk", filter=~Q(last_error="")),
                oldest_due=Min("next_try_at", filter=Q(next_try_at__lte=now)),
            )
        }
        pending = GaugeMetricFamily(
            "taugrid_deliveries_pending",
            "Outbox rows the backend has not been told yet (submit: hand over an attempt; "
            "cancel: stop a run), waiting backoffs included.",
            labels=["action"],
        )
        failing = GaugeMetricFamily(
            "taugrid_deliveries_failing",
            "Pending deliveries whose last try failed: the backend refused or did not answer, "
            "and they wait to be tried again.",
            labels=["action"],
        )
        overdue = GaugeMetricFamily(
            "taugrid_delivery_oldest_due_seconds",
            "Seconds the longest-overdue pending delivery has been due and not delivered "
            "(a backoff not yet over does not count); 0 when none is due.",
            labels=["action"],
        )
        for action in Delivery.Action:
            row = rows.get(action.value, {})
            pending.add_metric([action.value], row.get("pending", 0))
            failing.add_metric([action.value], row.get("failing", 0))
            overdue.add_metric([action.value], _seconds_since(row.get("oldest_due"), now))
        return [pending, failing, overdue]

    def _latencies(self, now: datetime) -> Iterable[Metric]:
        since = now - LATENCY_WINDOW
        recent = Q(delivered_at__gte=since, delivered_at__lte=now)
        # A run's first attempt handed over: the submission's own delivery.
        first = recent & Q(action=Delivery.Action.SUBMIT, attempt__number=1)
        delivery_latency = SecondsBetween(F("delivered_at"), F("created_at"))
        submission_latency = SecondsBetween(F("delivered_at"), F("run__created_at"))
        aggregates: dict[str, Any] = {
            "given_up": Count("pk", filter=Q(given_up_at__isnull=False)),
            "delivered": Count("pk", filter=recent),
            "submitted": Count("pk", filter=first),
        }
        for fraction in LATENCY_QUANTILES:
            aggregates[f"delivery_{_quantile_column(fraction)}"] = Percentile(
                fraction, delivery_latency, filter=recent
            )
            aggregates[f"submission_{_quantile_column(fraction)}"] = Percentile(
                fraction, submission_latency, filter=first
            )
        rows = {
            row["action"]: row
            for row in Delivery.objects.unscoped()
            .filter(Q(given_up_at__isnull=False) | recent)
            .order_by()
            .values("action")
            .annotate(**aggregates)
        }
        window = int(LATENCY_WINDOW.total_seconds())
        given_up = CounterMetricFamily(
            "taugrid_deliveries_given_up",
            "Deliveries given up after their last failed try (their run failed with class "
            "infrastructure), ever.",
            labels=["action"],
        )
        delivery = _summary(
            "taugrid_delivery_latency_seconds",
            f"Seconds from writing a delivery to the backend having it (retries included), "
            f"quantiles over the deliveries delivered in the last {window} s; NaN when none.",
        )
        delivered = GaugeMetricFamily(
            "taugrid_delivery_latency_sample_size",
            f"Deliveries delivered in the last {window} s: what the latency quantiles are over.",
            labels=["action"],
        )
        for action in Delivery.Action:
            row = rows.get(action.value, {})
            given_up.add_metric([action.value], row.get("given_up", 0))
            _add_quantiles(delivery, row, "delivery_", {"action": action.value})
            delivered.add_metric([action.value], row.get("delivered", 0))
        submit = rows.get(Delivery.Action.SUBMIT.value, {})
        submission = _summary(
            "taugrid_submission_latency_seconds",
            f"Seconds from a run's submission to the backend having its first attempt, "
            f"quantiles over the runs handed over in the last {window} s; NaN when none.",
        )
        _add_quantiles(submission, submit, "submission_", {})
        submitted = GaugeMetricFamily(
            "taugrid_submission_latency_sample_size",
            f"Runs whose first attempt was handed over in the last {window} s: what the "
            "submission latency quantiles are over.",
            value=submit.get("submitted", 0),
        )
        return [given_up, delivery, delivered, submission, submitted]

    # -- Kueue syncs, evidence, the GPU fleet -------------------------------------------------

    def _kueue_syncs(self, now: datetime) -> Iterable[Metric]:
        # Whether a target (a workspace's queues, the cluster-wide objects) is in step is
        # what its newest sync says: an older failure was superseded by the rows after it.
        # The newest of each target is its highest pk (one query; no DISTINCT ON, which
        # SQLite lacks).
        newest_pks = (
            KueueSync.objects.order_by()
            .values("scope", "workspace_slug")
            .annotate(newest=Max("pk"))
            .values("newest")
        )
        newest = (
            KueueSync.objects.filter(pk__in=newest_pks)
            .order_by()
            .annotate(erroring=ExpressionWrapper(~Q(last_error=""), output_field=BooleanField()))
            .values_list("state", "erroring", "created_at")
        )
        by_state: dict[str, int] = {}
        erroring = 0
        oldest_unfinished: datetime | None = None
        for state, has_error, created_at in newest:
            by_state[state] = by_state.get(state, 0) + 1
            erroring += bool(has_error)
            if state in (KueueSync.State.PENDING, KueueSync.State.WAITING) and (
                oldest_unfinished is None or created_at < oldest_unfinished
            ):
                oldest_unfinished = created_at
        targets = GaugeMetricFamily(
            "taugrid_kueue_sync_targets",
            "Kueue sync targets (a workspace's queues, or the cluster-wide flavors, cohorts and "
            "priority classes) by the state of their newest sync: synced is in step, pending "
            "and waiting are not yet, failed gave up (Kubernetes refused).",
            labels=["state"],
        )
        for state in KueueSync.State:
            targets.add_metric([state.value], by_state.get(state.value, 0))
        errors = GaugeMetricFamily(
            "taugrid_kueue_sync_errors",
            "Kueue sync targets whose newest sync's last try failed (failed, or pending a "
            "retry after an error): the cluster's Kueue objects are not what TauGrid says.",
            value=erroring,
        )
        unfinished = GaugeMetricFamily(
            "taugrid_kueue_sync_oldest_unfinished_seconds",
            "Seconds since the oldest unfinished Kueue sync (pending or waiting) was asked "
            "for; 0 when every target is done.",
            value=_seconds_since(oldest_unfinished, now),
        )
        return [targets, errors, unfinished]

    def _seals(self, now: datetime) -> Iterable[Metric]:
        row = (
            SealRequest.objects.unscoped()
            .filter(sealed_at__isnull=True)
            .aggregate(
                pending=Count("pk", filter=Q(given_up_at__isnull=True)),
                # A seal waiting for a cluster's log keeps a last_error without a failed try.
                failing=Count("pk", filter=Q(given_up_at__isnull=True, tries__gt=0)),
                given_up=Count("pk", filter=Q(given_up_at__isnull=False)),
                oldest=Min("created_at", filter=Q(given_up_at__isnull=True)),
            )
        )
        return [
            GaugeMetricFamily(
                "taugrid_evidence_seals_pending",
                "Finished runs whose evidence record is not sealed yet (given up ones not "
                "counted).",
                value=row["pending"],
            ),
            GaugeMetricFamily(
                "taugrid_evidence_seals_failing",
                "Pending seals with a failed try behind them (tried again until they are given "
                "up after evidence.sealing.MAX_TRIES tries).",
                value=row["failing"],
            ),
            GaugeMetricFamily(
                "taugrid_evidence_seals_given_up",
                "Evidence records that could not be sealed and were given up: the run page "
                "and the admin say why; staff can seal them again once the cause is fixed.",
                value=row["given_up"],
            ),
            GaugeMetricFamily(
                "taugrid_evidence_seal_oldest_pending_seconds",
                "Seconds since the run of the oldest pending seal ended; 0 when none is pending.",
                value=_seconds_since(row["oldest"], now),
            ),
        ]

    def _fleet_sync(self) -> Iterable[Metric]:
        # The row exists once the first sync has run; before that, it has never succeeded.
        sync = FleetSync.objects.filter(pk=FLEET_SYNC_PK).first()
        # Not last_error: a sync that read a machine without GPUs succeeded, and says so there.
        failing = (
            sync is not None
            and sync.last_attempt_at is not None
            and (sync.last_success_at is None or sync.last_attempt_at > sync.last_success_at)
        )
        return [
            GaugeMetricFamily(
                "taugrid_gpu_fleet_sync_last_success_timestamp_seconds",
                "When the GPU fleet was last read from Kubernetes (or NVML) without an error, "
                "Unix time; 0 for never.",
                value=_timestamp(sync.last_success_at if sync else None),
            ),
            GaugeMetricFamily(
                "taugrid_gpu_fleet_sync_last_attempt_timestamp_seconds",
                "When the GPU fleet was last read, successfully or not, Unix time; 0 for never.",
                value=_timestamp(sync.last_attempt_at if sync else None),
            ),
            GaugeMetricFamily(
                "taugrid_gpu_fleet_sync_failing",
                "1 when the last GPU fleet sync could not read the fleet (the fleet pages show "
                "what an earlier one read), else 0.",
                value=1 if failing else 0,
            ),
            GaugeMetricFamily(
                "taugrid_gpu_fleet_nodes",
                "GPU nodes the last successful fleet sync saw.",
                value=sync.node_count if sync else 0,
            ),
        ]

    # -- the Kubernetes watcher ---------------------------------------------------------------

    def _watcher(self) -> Iterable[Metric]:
        if settings.TAU_BACKEND != "kubernetes":
            return []  # no watcher runs: nothing can lag
        try:
            heartbeat = last_heartbeat()
        except HeartbeatUnreadable as error:
            # Unknown is not "never": a false alarm for every cache hiccup helps nobody.
            logger.warning("/metrics: the watcher's heartbeat is not known (%s)", error)
            return []
        return [
            GaugeMetricFamily(
                "taugrid_kube_watcher_heartbeat_timestamp_seconds",
                "When the active Kubernetes watcher last had every kind listed and had "
                "reconciled what it read, Unix time; 0 for never. time() minus this is "
                "the watcher's lag.",
                value=heartbeat.at if heartbeat else 0.0,
            ),
            GaugeMetricFamily(
                "taugrid_kube_watcher_backlog",
                "Changes the watcher had read from the cluster and not taken in yet, at its "
                "last heartbeat.",
                value=heartbeat.backlog if heartbeat else 0,
            ),
            GaugeMetricFamily(
                "taugrid_kube_unknown_attempts",
                "Attempts whose objects carry TauGrid's labels in the cluster but which the "
                "database does not know (after a database restore), at the watcher's last "
                "heartbeat; the watcher's log names them.",
                value=heartbeat.unknown if heartbeat else 0,
            ),
        ]


# --- the view -------------------------------------------------------------------------------

_REALM = 'Bearer realm="taugrid-metrics"'


def _digest(text: str) -> bytes:
    # Compared as digests: equal length whatever was sent, so the comparison says nothing
    # about the token's length either.
    return hashlib.sha256(text.encode("utf-8")).digest()


def _bearer_token(request: HttpRequest) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _plain(text: str, status: int) -> HttpResponse:
    return HttpResponse(text + "\n", status=status, content_type="text/plain; charset=utf-8")


def refusal(request: HttpRequest) -> HttpResponse | None:
    """Why this request may not read /metrics (the response to send), or None if it may:
    the scrape token, from wherever the request comes (module docstring)."""
    expected: str | None = settings.TAU_METRICS_TOKEN
    if not expected:  # production without a token
        return _plain(
            "/metrics is off: set TAU_METRICS_TOKEN (or TAU_METRICS_TOKEN_FILE) on the portal "
            "and give the same token to the scraper (docs/metrics.md).",
            403,
        )
    given = _bearer_token(request)
    if given is not None and hmac.compare_digest(_digest(given), _digest(expected)):
        return None
    where = (
        "TAU_METRICS_TOKEN on the portal"
        if settings.PRODUCTION
        else f"TAU_METRICS_TOKEN, or {settings.VAR_DIR / 'metrics-token'} where make run keeps it"
    )
    response = _plain(
        "/metrics needs the scrape token: send it as 'Authorization: Bearer <token>' "
        f"({where}; docs/metrics.md).",
        401,
    )
    response["WWW-Authenticate"] = _REALM if given is None else f'{_REALM}, error="invalid_token"'
    return response


@never_cache
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    """The Prometheus exposition of :class:`PortalCollector` (OpenMetrics when asked for)."""
    refused = refusal(request)
    if refused is not None:
        return refused
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    try:
        body = encoder(PortalCollector())
    except DatabaseError:
        logger.warning("/metrics: the database did not answer in time", exc_info=True)
        return _plain("The database did not answer; the metrics cannot be read now.", 503)
    return HttpResponse(body, content_type=content_type)
