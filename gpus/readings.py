"""GPU telemetry as pages and the API read it: the adapter (:mod:`telemetry`) configured from
settings, and every answer cached briefly in the shared cache, so that everyone looking at
the fleet at the same moment costs Prometheus one query per metric, not one per viewer.

A Prometheus that is down or slow never breaks a page: the failure is cached like an answer
(for the same few seconds, so each page does not wait out the timeout again) and comes back
as a :class:`Reading` with ``notice`` set, which pages show in place of the numbers. Node data
(capacity, health, runs) comes from the database and shows regardless.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, Literal, TypeVar

from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from portal.caching import hashed_key, through_cache
from telemetry import nvml
from telemetry.dcgm import DcgmTelemetry, MetricNames
from telemetry.prometheus import (
    PrometheusClient,
    TelemetryQueryError,
    TelemetryUnavailable,
    fit_step,
)
from telemetry.samples import GpuSample

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: The charts' windows, by the name the pages use in ``?window=``.
WINDOWS: dict[str, timedelta] = {
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
}
DEFAULT_WINDOW = "1h"
#: What a chart of one node shows, in this order.
NODE_CHART_FIELDS = ("utilization", "memory_used_mib", "temperature_c", "power_w")

NOT_CONFIGURED = (
    "GPU telemetry is not configured: set TAU_PROMETHEUS_URL to a Prometheus that scrapes "
    "NVIDIA's dcgm-exporter (docs/gpus.md)."
)


@dataclass(frozen=True)
class Reading(Generic[T]):
    """An answer, or why there is none (``notice``, shown as it is)."""

    value: T | None
    notice: str = ""
    at: datetime | None = None  # when it was read (the cached answer's age)

    @property
    def ok(self) -> bool:
        return not self.notice


def configured() -> bool:
    return bool(settings.TAU_PROMETHEUS_URL)


def metric_names() -> MetricNames:
    return MetricNames.from_overrides(settings.TAU_DCGM_METRICS, settings.TAU_DCGM_LABELS)


def prometheus() -> PrometheusClient:
    return PrometheusClient(
        settings.TAU_PROMETHEUS_URL,
        timeout=settings.TAU_PROMETHEUS_TIMEOUT_SECONDS,
        token=settings.TAU_PROMETHEUS_TOKEN,
    )


def dcgm() -> DcgmTelemetry:
    return DcgmTelemetry(prometheus(), metric_names())


def _key(*parts: object) -> str:
    """A cache key for one answer of this configuration (another Prometheus, other names:
    another key)."""
    return hashed_key(
        "gpus:telemetry",
        settings.TAU_PROMETHEUS_URL,
        settings.TAU_DCGM_METRICS,
        settings.TAU_DCGM_LABELS,
        *parts,
    )


def _read(what: str, compute: Callable[[], T]) -> Reading[T]:
    """``compute()`` now, its failure as a notice."""
    now = timezone.now()
    try:
        return Reading(compute(), at=now)
    except TelemetryUnavailable as error:
        # A machine without GPUs is read every few seconds; saying so each time is noise.
        level = logging.DEBUG if isinstance(error, NoLocalGpus) else logging.WARNING
        logger.log(level, "GPU telemetry unavailable (%s): %s", what, error)
        return Reading(
            None,
            f"GPU telemetry is unavailable right now: {error}. Node health and capacity "
            "come from Kubernetes and are shown as last read.",
            at=now,
        )
    except (TelemetryQueryError, ValueError) as error:
        logger.error("GPU telemetry query refused (%s): %s", what, error)
        return Reading(
            None,
            f"Prometheus refused TauGrid's query: {error}. Check TAU_DCGM_METRICS and "
            "TAU_DCGM_LABELS against the exporter's metric and label names.",
            at=now,
        )


def cached(
    what: str, compute: Callable[[], T], *parts: object, prometheus: bool = True
) -> Reading[T]:
    """``compute()`` at most once per TAU_PROMETHEUS_CACHE_SECONDS for everyone; its failure
    as a notice, remembered as long. ``prometheus``: it asks Prometheus (so it needs one)."""
    if prometheus and not configured():
        return Reading(None, NOT_CONFIGURED)
    return through_cache(
        _key(what, *parts),
        Reading,
        lambda: _read(what, compute),
        seconds=settings.TAU_PROMETHEUS_CACHE_SECONDS,
    )


# --- The whole fleet's GPUs -------------------------------------------------------------------
# Read by a periodic task (``gpus.tasks.refresh_fleet_telemetry``) and kept in the cache, so
# that the fleet page never waits on Prometheus: with a thousand nodes, the answers alone
# (eight GPUs each, one query per metric) take longer to read than the page may. Without the
# task (no beat running), the first viewer after they expire reads them, once for everyone.


@dataclass(frozen=True)
class FleetTelemetry:
    by_host: dict[str, list[GpuSample]]
    summaries: dict[str, NodeSummary]


def _fleet_keys() -> tuple[str, str]:
    return _key("fleet-gpus"), _key("fleet-summaries")


def _fleet_timeout() -> int:
    # Longer than the task's period, so that the page finds the last answer while the next
    # is read; short enough that a stopped task is noticed (the page reads them itself).
    return max(3 * settings.TAU_PROMETHEUS_CACHE_SECONDS, 15)


def local() -> bool:
    """The embedded default: this machine's GPUs, through NVML, and no Prometheus."""
    return settings.TAU_BACKEND == "local"


class NoLocalGpus(TelemetryUnavailable):
    """This machine has no GPU NVML can read: the normal case of a laptop, not a fault."""


def _local_samples() -> list[GpuSample]:
    found = nvml.probe_local_gpus(socket.gethostname())
    if found.gpus is None:
        raise NoLocalGpus(found.reason)
    return found.gpus


def refresh_fleet() -> Reading[FleetTelemetry]:
    """Read every GPU the exporter reports now (one query per metric; on the embedded
    default, this machine's through NVML) and keep it, with a summary per host, for the pages
    and the API. On the embedded default each reading is also kept in a rolling history for
    the node page's charts (there is no Prometheus to ask for the past)."""
    if not local() and not configured():
        return Reading(None, NOT_CONFIGURED)

    def read() -> FleetTelemetry:
        by_host: dict[str, list[GpuSample]] = {}
        for sample in _local_samples() if local() else dcgm().current():
            by_host.setdefault(sample.host, []).append(sample)
        for samples in by_host.values():
            samples.sort(key=lambda sample: sample.index)
        summaries = {
            host: found for host, samples in by_host.items() if (found := summary(samples))
        }
        return FleetTelemetry(by_host, summaries)

    reading = _read("fleet", read)
    if local() and reading.value is not None and reading.at is not None:
        _remember_locally(reading.at, reading.value.by_host)
    full, summaries = _fleet_keys()
    value = reading.value
    cache.set_many(
        {
            full: Reading(value.by_host if value else None, reading.notice, reading.at),
            summaries: Reading(value.summaries if value else None, reading.notice, reading.at),
        },
        timeout=_fleet_timeout(),
    )
    return reading


def _fleet_part(index: int) -> Reading[Any]:
    if not local() and not configured():
        return Reading(None, NOT_CONFIGURED)
    key = _fleet_keys()[index]
    found = cache.get(key)
    if isinstance(found, Reading):
        return found
    reading = refresh_fleet()
    value = reading.value
    part = None if value is None else (value.by_host if index == 0 else value.summaries)
    return Reading(part, reading.notice, reading.at)


def fleet_gpus() -> Reading[dict[str, list[GpuSample]]]:
    """Every GPU the exporter reports, by host (the API's fleet)."""
    return _fleet_part(0)


def fleet_summaries() -> Reading[dict[str, NodeSummary]]:
    """Each host's GPUs in one line (the fleet page)."""
    return _fleet_part(1)


def node_gpus(node: str) -> Reading[list[GpuSample]]:
    """One node's GPUs now (the node page): one query per metric, for that host only; on the
    embedded default, this machine's through NVML."""
    if local():
        return cached("local-gpus", _local_samples, prometheus=False)
    return cached("node-gpus", lambda: dcgm().current(hosts=[node]), node)


# --- This machine's GPUs over time (the embedded default) ---------------------------------
#: Readings kept: six hours at the default refresh of ten seconds.
LOCAL_HISTORY_READINGS = 2_160
LOCAL_HISTORY_KEY = "gpus:local-history"


def _remember_locally(at: datetime, by_host: dict[str, list[GpuSample]]) -> None:
    """Append one reading to the rolling history (one writer: the refresh task)."""
    history: list[tuple[str, list[GpuSample]]] = cache.get(LOCAL_HISTORY_KEY) or []
    history.append((at.isoformat(), [gpu for samples in by_host.values() for gpu in samples]))
    cache.set(LOCAL_HISTORY_KEY, history[-LOCAL_HISTORY_READINGS:], timeout=None)


def _local_charts(window: timedelta) -> list[Chart]:
    since = (timezone.now() - window).isoformat()
    history: list[tuple[str, list[GpuSample]]] = [
        entry for entry in cache.get(LOCAL_HISTORY_KEY) or [] if entry[0] >= since
    ]
    charts = []
    for name in NODE_CHART_FIELDS:
        series: dict[str, list[tuple[str, float]]] = {}
        for moment, samples in history:
            for sample in samples:
                value = getattr(sample, name)
                if value is not None:
                    series.setdefault(f"GPU {sample.index}", []).append((moment, value))
        charts.append(Chart(name, dict(sorted(series.items()))))
    return charts


@dataclass(frozen=True)
class Chart:
    """One chart's series: per GPU, (ISO time, value) points."""

    field: str
    series: dict[str, list[tuple[str, float]]]


def window_of(name: str | None) -> tuple[str, timedelta]:
    chosen = name if name in WINDOWS else DEFAULT_WINDOW
    return chosen, WINDOWS[chosen]


def aligned_end(step: float, now: datetime | None = None) -> datetime:
    """The window's end rounded down to the step, so that everyone looking within one step
    asks (and caches) the same query."""
    moment = now or timezone.now()
    seconds = int(moment.timestamp())
    return datetime.fromtimestamp(seconds - seconds % max(1, int(step)), tz=moment.tzinfo)


def node_charts(node: str, window: timedelta) -> Reading[list[Chart]]:
    """The node's GPUs over ``window``: one range query per charted metric (on the embedded
    default, what the refresh task kept of this machine's readings)."""
    if local():
        return Reading(_local_charts(window), at=timezone.now())
    end_guess = timezone.now()
    step = fit_step(end_guess - window, end_guess)
    end = aligned_end(step, end_guess)
    start = end - window

    def read() -> list[Chart]:
        telemetry = dcgm()
        charts = []
        for name in NODE_CHART_FIELDS:
            found = telemetry.history(name, start, end, step=step, hosts=[node])
            charts.append(
                Chart(
                    name,
                    {
                        f"GPU {index}": [(moment.isoformat(), value) for moment, value in points]
                        for (_host, index, _uuid), points in sorted(found.items())
                    },
                )
            )
        return charts

    return cached("node-charts", read, node, int(window.total_seconds()), end.isoformat())


@dataclass(frozen=True)
class NodeSummary:
    """A node's GPUs in one line of the fleet table (None: nothing reported)."""

    gpus: int
    utilization: float | None  # the average of its GPUs, percent
    memory_used_mib: float | None  # all its GPUs together
    memory_total_mib: float | None
    temperature_c: float | None  # the hottest
    power_w: float | None  # all together
    xid_gpus: tuple[int, ...] = ()  # GPUs whose last XID is not 0

    @property
    def memory_percent(self) -> int | None:
        if self.memory_used_mib is None or not self.memory_total_mib:
            return None
        return round(100 * self.memory_used_mib / self.memory_total_mib)


def _known(values: list[float | None]) -> list[float]:
    return [value for value in values if value is not None]


def summary(samples: list[GpuSample]) -> NodeSummary | None:
    if not samples:
        return None
    utilization = _known([sample.utilization for sample in samples])
    used = _known([sample.memory_used_mib for sample in samples])
    totals = [
        sample.memory_used_mib + sample.memory_free_mib
        for sample in samples
        if sample.memory_used_mib is not None and sample.memory_free_mib is not None
    ]
    temperatures = _known([sample.temperature_c for sample in samples])
    power = _known([sample.power_w for sample in samples])
    return NodeSummary(
        gpus=len(samples),
        utilization=sum(utilization) / len(utilization) if utilization else None,
        memory_used_mib=sum(used) if used else None,
        memory_total_mib=sum(totals) if totals and len(totals) == len(samples) else None,
        temperature_c=max(temperatures) if temperatures else None,
        power_w=sum(power) if power else None,
        xid_gpus=tuple(sample.index for sample in samples if sample.xid),
    )


# --- One workspace's pods ---------------------------------------------------------------------
# Every question here names the workspace's namespace (and its runs' pods by name): nothing of
# another tenant is asked for, so nothing of it comes back.


def pod_values(namespace: str) -> Reading[dict[str, tuple[float | None, float | None]]]:
    """Per pod of ``namespace``: its GPUs' average utilisation and their memory in use, now
    (one query per metric, whatever the number of pods)."""

    def read() -> dict[str, tuple[float | None, float | None]]:
        by_pod: dict[str, list[GpuSample]] = {}
        for sample in dcgm().current(namespace=namespace):
            if sample.pod:
                by_pod.setdefault(sample.pod, []).append(sample)
        values: dict[str, tuple[float | None, float | None]] = {}
        for pod, samples in by_pod.items():
            utilization = _known([sample.utilization for sample in samples])
            memory = _known([sample.memory_used_mib for sample in samples])
            values[pod] = (
                sum(utilization) / len(utilization) if utilization else None,
                sum(memory) if memory else None,
            )
        return values

    return cached("pods", read, namespace)


GpuSeries = dict[tuple[str, int, str], list[tuple[datetime, float]]]


def run_history(
    namespace: str,
    prefixes: list[str],
    start: datetime,
    end: datetime,
    step: float,
    *,
    shared: str | None = None,
) -> Reading[tuple[GpuSeries, GpuSeries, GpuSeries]]:
    """Per GPU of the run's pods over its life: utilisation averaged per step, its peak per
    step, and framebuffer used at its highest per step (three range queries). The answer is
    shared by everyone asking with the same ``shared`` (default: the same window)."""

    def read() -> tuple[GpuSeries, GpuSeries, GpuSeries]:
        telemetry = dcgm()

        def ask(field_name: str, over: Literal["avg", "max"]) -> GpuSeries:
            return telemetry.step_stats(
                field_name,
                start,
                end,
                step=step,
                over=over,
                namespace=namespace,
                pod_prefixes=prefixes,
            )

        return (
            ask("utilization", "avg"),
            ask("utilization", "max"),
            ask("memory_used_mib", "max"),
        )

    window = shared or f"{start.isoformat()}|{end.isoformat()}"
    return cached("run-history", read, namespace, *prefixes, window, step)


def run_current(namespace: str, pods: list[str]) -> Reading[list[GpuSample]]:
    """Each GPU of these pods of ``namespace`` now (one query per metric)."""
    if not pods:
        return Reading([], at=timezone.now())

    def read() -> list[GpuSample]:
        return dcgm().current(namespace=namespace, pods=pods)

    return cached("run-current", read, namespace, *sorted(pods))
