"""NVIDIA's dcgm-exporter as Prometheus holds it: the metric and label names, and the few
batched queries the GPU pages ask.

Batched
=======

Every method is a fixed number of PromQL queries whatever the size of the fleet:
:meth:`DcgmTelemetry.current` one instant query per metric (nine) for every GPU it covers,
joined here by (host, gpu index, UUID); :meth:`~DcgmTelemetry.history`,
:meth:`~DcgmTelemetry.host_history` and :meth:`~DcgmTelemetry.pod_history` one range query;
:meth:`~DcgmTelemetry.window_stats` one instant query. Never one per GPU or per node: a fleet
page of 1,000 nodes would otherwise be 72,000 round trips.

Narrowed, for tenancy
=====================

``namespace`` (and ``pods``, which need it: pod names are unique only within a namespace)
narrow the *selector*, so Prometheus never sends another tenant's series to a workspace's
page: filtering after the fact would be one forgotten ``if`` away from a leak. This relies on
dcgm-exporter's pod mapping (``namespace``/``pod``/``container`` labels on a GPU held by a
pod); a GPU no pod holds has no such labels and is never in a narrowed answer. An empty
``pods`` collection asks nothing and answers nothing (``pod=~""`` would match every GPU
*without* a pod).

Names
=====

:class:`MetricNames` holds dcgm-exporter's defaults; ``TAU_DCGM_METRICS`` and
``TAU_DCGM_LABELS`` (JSON objects) override them for another exporter or a relabelled
scrape, through :meth:`MetricNames.from_overrides`. Two cases need it in practice:

- a Prometheus that scrapes the exporter through Kubernetes service discovery without
  ``honor_labels`` renames the exporter's own ``namespace``/``pod``/``container`` labels to
  ``exported_namespace``/``exported_pod``/``exported_container`` (the target's labels win);
- the host label: dcgm-exporter called it ``Hostname`` and renamed it ``hostname`` in 2026;
  both are accepted by default (a selector on the host asks for either, with ``or``).

Unsupported values
==================

dcgm-exporter writes a field the GPU does not support as one of DCGM's "blank" codes: the
64-bit ones from 9223372036854775792 (the client drops anything from 9.2e18), the 32-bit ones
from 2147483632 and the FP64 ones from 2**47. No reading of the nine fields comes near
2147483632 (that would be 2 PiB of framebuffer), so every expression here keeps only values
below it — in PromQL, so a sentinel never enters an average Prometheus computes.

Not handled: MIG. A MIG-partitioned GPU is several series per (host, gpu, UUID)
(``GPU_I_ID``); the first one seen wins.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import Any, Final, Literal

from telemetry.prometheus import (
    InstantSample,
    PrometheusClient,
    fit_step,
    match_any,
    quote,
    regex_alternation,
)
from telemetry.samples import GpuSample

__all__ = [
    "DCGM_BLANK_MIN",
    "METRIC_FIELDS",
    "Aggregation",
    "DcgmTelemetry",
    "GpuKey",
    "LabelNames",
    "MetricNames",
    "Points",
    "WindowStats",
]

#: DCGM_INT32_BLANK (0x7ffffff0): the lowest of dcgm's "no value" codes a field here can carry.
DCGM_BLANK_MIN: Final = 2147483632
#: GpuSample's telemetry fields, in the order they are queried.
METRIC_FIELDS: Final[tuple[str, ...]] = (
    "utilization",
    "memory_used_mib",
    "memory_free_mib",
    "temperature_c",
    "power_w",
    "sm_clock_mhz",
    "xid",
    "tensor_active",
    "dram_active",
)
# What Prometheus accepts as a metric name and as a label name (a leading "__" is reserved).
METRIC_NAME: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME: Final = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

#: A GPU: (host, index on the host, UUID).
GpuKey = tuple[str, int, str]
#: A time series: (moment, value), oldest first.
Points = list[tuple[datetime, float]]
Aggregation = Literal["avg", "max", "min", "sum", "count"]
AGGREGATIONS: Final = frozenset({"avg", "max", "min", "sum", "count"})
#: The label :meth:`DcgmTelemetry.host_history` groups by: the host, whichever label held it.
HOST_TAG: Final = "taugrid_host"


@dataclass(frozen=True)
class LabelNames:
    """The exporter's label names. ``host`` is a tuple: any one of them names the node
    (dcgm-exporter's ``Hostname``, renamed ``hostname``)."""

    host: tuple[str, ...] = ("Hostname", "hostname")
    gpu: str = "gpu"
    uuid: str = "UUID"
    model: str = "modelName"
    namespace: str = "namespace"
    pod: str = "pod"
    container: str = "container"


@dataclass(frozen=True)
class MetricNames:
    """Which metric holds each of :class:`~telemetry.samples.GpuSample`'s telemetry fields,
    and the labels that say which GPU (and which pod) a series is about."""

    utilization: str = "DCGM_FI_DEV_GPU_UTIL"
    memory_used_mib: str = "DCGM_FI_DEV_FB_USED"
    memory_free_mib: str = "DCGM_FI_DEV_FB_FREE"
    temperature_c: str = "DCGM_FI_DEV_GPU_TEMP"
    power_w: str = "DCGM_FI_DEV_POWER_USAGE"
    sm_clock_mhz: str = "DCGM_FI_DEV_SM_CLOCK"
    xid: str = "DCGM_FI_DEV_XID_ERRORS"
    tensor_active: str = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
    dram_active: str = "DCGM_FI_PROF_DRAM_ACTIVE"
    labels: LabelNames = field(default_factory=LabelNames)

    def metric(self, field_name: str) -> str:
        """The metric name of a telemetry field; a ValueError names the valid fields."""
        if field_name not in METRIC_FIELDS:
            raise ValueError(
                f"{field_name!r} is not a GPU telemetry field; the fields are "
                f"{', '.join(METRIC_FIELDS)}"
            )
        name: str = getattr(self, field_name)
        return name

    @classmethod
    def from_overrides(cls, metrics_json: str, labels_json: str) -> MetricNames:
        """The defaults with ``TAU_DCGM_METRICS`` (``{"utilization": "my_gpu_util"}``) and
        ``TAU_DCGM_LABELS`` (``{"host": "node", "pod": "exported_pod"}``) applied; an empty
        string leaves the defaults. An override of ``host`` replaces both default host
        labels. A ValueError names the setting and the bad key or value, and lists what is
        valid: settings make it a startup error."""
        metrics = parse_overrides("TAU_DCGM_METRICS", metrics_json, METRIC_FIELDS, METRIC_NAME)
        label_fields = tuple(f.name for f in fields(LabelNames))
        labels = parse_overrides("TAU_DCGM_LABELS", labels_json, label_fields, LABEL_NAME)
        label_values: dict[str, Any] = dict(labels)
        if "host" in label_values:
            label_values["host"] = (label_values["host"],)
        return replace(cls(), **metrics, labels=replace(LabelNames(), **label_values))


def parse_overrides(
    setting: str, text: str, valid: tuple[str, ...], syntax: re.Pattern[str]
) -> dict[str, str]:
    if not text.strip():
        return {}
    try:
        parsed = json.loads(text)
    except ValueError as error:
        raise ValueError(
            f'{setting} is not JSON ({error}); give an object such as {{"{valid[0]}": "..."}}'
        ) from None
    if not isinstance(parsed, dict):
        raise ValueError(
            f"{setting} must be a JSON object mapping names, not {type(parsed).__name__}"
        )
    overrides: dict[str, str] = {}
    for key, value in parsed.items():
        if key not in valid:
            raise ValueError(
                f"{setting} has an unknown key {key!r}; the keys are {', '.join(valid)}"
            )
        if not isinstance(value, str):
            raise ValueError(
                f"{setting}[{key!r}] must be a string (a name), not {json.dumps(value)}"
            )
        if not syntax.fullmatch(value) or value.startswith("__"):
            raise ValueError(
                f"{setting}[{key!r}] = {value!r} is not a valid Prometheus name "
                f"(letters, digits and _{', :' if syntax is METRIC_NAME else ''}; not starting "
                "with a digit or __)"
            )
        overrides[key] = value
    return overrides


@dataclass(frozen=True)
class WindowStats:
    """One GPU's readings of one field over a window: ``mean`` and ``peak`` of the samples
    seen, and ``seconds_seen`` (samples times resolution): how much of the window the GPU was
    reported at all (a run that started five minutes ago has not been idle for fifteen)."""

    mean: float
    peak: float
    seconds_seen: float


class DcgmTelemetry:
    """The GPU telemetry questions TauGrid asks, as batched PromQL over dcgm-exporter's
    metrics. ``scrape_interval`` (seconds) is the finest step worth asking for."""

    def __init__(
        self,
        client: PrometheusClient,
        names: MetricNames | None = None,
        *,
        scrape_interval: float = 15.0,
    ) -> None:
        if scrape_interval <= 0:
            raise ValueError(f"scrape_interval must be positive, not {scrape_interval}")
        self.client = client
        self.names = names if names is not None else MetricNames()
        self.scrape_interval = scrape_interval

    # --- questions --------------------------------------------------------------------------

    def current(
        self,
        *,
        namespace: str | None = None,
        pods: Collection[str] | None = None,
        hosts: Collection[str] | None = None,
        at: datetime | None = None,
    ) -> list[GpuSample]:
        """Every GPU's latest readings (at ``at``, default now), one instant query per metric,
        sorted by host and index. Narrowed to a namespace's pods or to hosts when given. A
        metric the exporter does not offer leaves that field None."""
        if not self._asks_anything(namespace, pods, hosts):
            return []
        readings: dict[GpuKey, dict[str, Any]] = {}
        for field_name in METRIC_FIELDS:
            expr = self._per_gpu(self.names.metric(field_name), namespace, pods, hosts)
            for sample in self.client.query(expr, at):
                key = self._key(sample.labels)
                if key is None:
                    continue
                gpu = readings.setdefault(key, self._identity(key, sample))
                self._fill_identity(gpu, sample)
                value: float | int = int(sample.value) if field_name == "xid" else sample.value
                previous = gpu.get(field_name)
                # Several series for one GPU and field: two scrape jobs, or XID's err_code
                # label changing. The error wins over "no error"; otherwise the first stays.
                if previous is None or (field_name == "xid" and value > previous):
                    gpu[field_name] = value
        return [GpuSample(**readings[key]) for key in sorted(readings)]

    def history(
        self,
        field_name: str,
        start: datetime,
        end: datetime,
        *,
        step: float | None = None,
        namespace: str | None = None,
        pods: Collection[str] | None = None,
        hosts: Collection[str] | None = None,
    ) -> dict[GpuKey, Points]:
        """One field of every GPU (narrowed as :meth:`current`) from ``start`` to ``end``:
        one range query, ``step`` fitted to the window when None. Series of one GPU under
        different labels (its pod changed, its XID did) are merged into one line."""
        metric = self.names.metric(field_name)
        if not self._asks_anything(namespace, pods, hosts):
            return {}
        expr = self._per_gpu(metric, namespace, pods, hosts)
        found: dict[GpuKey, dict[datetime, float]] = {}
        for series in self.client.query_range(expr, start, end, self._step(start, end, step)):
            key = self._key(series.labels)
            if key is None:
                continue
            line = found.setdefault(key, {})
            for moment, value in series.points:
                line[moment] = max(value, line.get(moment, value))
        return {key: sorted(found[key].items()) for key in sorted(found)}

    def host_history(
        self,
        field_name: str,
        start: datetime,
        end: datetime,
        *,
        how: Aggregation = "avg",
        step: float | None = None,
        hosts: Collection[str] | None = None,
    ) -> dict[str, Points]:
        """One field aggregated per host (``how``: avg, max, min, sum, or count = GPUs
        reporting) over the window: one range query for the whole fleet (staff views)."""
        metric = self.names.metric(field_name)
        if not self._asks_anything(None, None, hosts):
            return {}
        # Grouped by one label that holds the host whichever spelling the exporter used:
        # grouping by (Hostname, hostname) would split a host in two while a renamed
        # series and its stale predecessor are both in the window.
        expr = self._aggregate(how, (HOST_TAG,), metric, None, None, hosts, tag_host=True)
        found: dict[str, Points] = {}
        for series in self.client.query_range(expr, start, end, self._step(start, end, step)):
            host = series.labels.get(HOST_TAG)
            if host:
                found[host] = series.points
        return {host: found[host] for host in sorted(found)}

    def pod_history(
        self,
        field_name: str,
        start: datetime,
        end: datetime,
        *,
        namespace: str,
        pods: Collection[str] | None = None,
        how: Aggregation = "avg",
        step: float | None = None,
    ) -> dict[str, Points]:
        """One field aggregated per pod of ``namespace`` (``how="count"``: GPUs held over
        time, the workspace dashboard against its quota): one range query."""
        metric = self.names.metric(field_name)
        if not self._asks_anything(namespace, pods, None):
            return {}
        pod_label = self.names.labels.pod
        expr = self._aggregate(how, (pod_label,), metric, namespace, pods, None)
        found: dict[str, Points] = {}
        for series in self.client.query_range(expr, start, end, self._step(start, end, step)):
            pod = series.labels.get(pod_label)
            if pod:
                found[pod] = series.points
        return {pod: found[pod] for pod in sorted(found)}

    def window_stats(
        self,
        field_name: str,
        start: datetime,
        end: datetime,
        *,
        namespace: str | None = None,
        pods: Collection[str] | None = None,
        hosts: Collection[str] | None = None,
    ) -> dict[GpuKey, WindowStats]:
        """Mean and peak of one field per GPU over ``start``..``end`` (a run's GPU efficiency:
        average and peak utilisation, memory high-water mark; "idle for 15 minutes"): one
        instant query at ``end``, however long the window — no peak is lost to a coarse
        chart step. The samples are read every scrape interval (a subquery, so dcgm's blanks
        are left out before averaging): a GPU first reported less than one interval before
        ``end`` is not in the answer yet."""
        metric = self.names.metric(field_name)
        if not self._asks_anything(namespace, pods, hosts):
            return {}
        window = (end - start).total_seconds()
        if window <= 0:
            raise ValueError(f"the window must end after it starts ({start} .. {end})")
        resolution = self.scrape_interval
        # PromQL durations are whole units: milliseconds keep a 1.5 s interval exact.
        series = self._per_gpu(metric, namespace, pods, hosts)
        inner = f"({series})[{max(round(window * 1000), 1)}ms:{max(round(resolution * 1000), 1)}ms]"
        # One query: each statistic tagged with a `stat` label, unioned with `or` (the label
        # sets differ, so none hides another).
        expr = " or ".join(
            f'label_replace({function}({inner}), "taugrid_stat", "{stat}", "", "")'
            for stat, function in (
                ("mean", "avg_over_time"),
                ("peak", "max_over_time"),
                ("count", "count_over_time"),
            )
        )
        collected: dict[GpuKey, dict[str, float]] = {}
        for sample in self.client.query(expr, end):
            key = self._key(sample.labels)
            stat = sample.labels.get("taugrid_stat")
            if key is None or stat is None:
                continue
            stats = collected.setdefault(key, {})
            if stat == "peak":
                stats[stat] = max(sample.value, stats.get(stat, sample.value))
            elif stat == "count":
                stats[stat] = stats.get(stat, 0.0) + sample.value
            else:
                stats.setdefault(stat, sample.value)
        return {
            key: WindowStats(
                mean=stats["mean"],
                peak=stats["peak"],
                seconds_seen=stats.get("count", 0.0) * resolution,
            )
            for key, stats in sorted(collected.items())
            if "mean" in stats and "peak" in stats
        }

    def step_stats(
        self,
        field_name: str,
        start: datetime,
        end: datetime,
        *,
        step: float,
        over: Literal["avg", "max"],
        namespace: str,
        pod_prefixes: Collection[str],
    ) -> dict[GpuKey, Points]:
        """Per GPU held by the pods of ``namespace`` whose names start with one of
        ``pod_prefixes`` (a run's: its Jobs' and RayJobs' names), one value per step: the
        average (``over="avg"``) or the peak (``"max"``) of the samples *in* that step, not
        one sample of it — a run's efficiency over its life, in one range query. The range
        is over the raw samples, where dcgm's blank codes cannot be filtered out first:
        points at or above the lowest blank are dropped (a field a GPU does not support is
        blank in every sample)."""
        if over not in ("avg", "max"):
            raise ValueError(f"over must be avg or max, not {over!r}")
        metric = self.names.metric(field_name)
        if not self._asks_anything(namespace, None, None) or not pod_prefixes:
            return {}
        matchers = [
            f"{self.names.labels.namespace}={quote(namespace)}",
            f"{self.names.labels.pod}=~{quote(f'({regex_alternation(pod_prefixes)}).+')}",
        ]
        labels = self.names.labels
        by = ", ".join(dict.fromkeys([*labels.host, labels.gpu, labels.uuid]))
        # PromQL durations are whole units: milliseconds keep any step exact.
        window = f"[{max(round(step * 1000), 1)}ms]"
        expr = f"{over} by ({by}) ({over}_over_time({selector(metric, matchers)}{window}))"
        found: dict[GpuKey, dict[datetime, float]] = {}
        for series in self.client.query_range(expr, start, end, step):
            key = self._key(series.labels)
            if key is None:
                continue
            line = found.setdefault(key, {})
            for moment, value in series.points:
                if value < DCGM_BLANK_MIN:
                    line[moment] = max(value, line.get(moment, value))
        return {key: sorted(found[key].items()) for key in sorted(found) if found[key]}

    # --- PromQL -----------------------------------------------------------------------------

    def _series(
        self,
        metric: str,
        namespace: str | None,
        pods: Collection[str] | None,
        hosts: Collection[str] | None,
        *,
        tag_host: bool = False,
    ) -> str:
        """The metric's series, narrowed, without dcgm's blanks. Several host labels with a
        host narrowing: one selector each, joined with ``or`` (an exporter writes one of
        them). ``tag_host``: each series also gets the host in the label ``taugrid_host``,
        whichever label held it, for grouping by host."""
        matchers = []
        if namespace is not None:
            matchers.append(f"{self.names.labels.namespace}={quote(namespace)}")
        if pods is not None:
            matchers.append(match_any(self.names.labels.pod, pods))
        if tag_host:
            selectors = [
                f"label_replace({selector(metric, [*matchers, host_matcher(label, hosts)])}, "
                f'"{HOST_TAG}", "$1", "{label}", "(.*)")'
                for label in self.names.labels.host
            ]
        elif hosts is None:
            selectors = [selector(metric, matchers)]
        else:
            selectors = [
                selector(metric, [*matchers, match_any(label, hosts)])
                for label in self.names.labels.host
            ]
        return f"({' or '.join(selectors)}) < {DCGM_BLANK_MIN}"

    def _per_gpu(
        self,
        metric: str,
        namespace: str | None,
        pods: Collection[str] | None,
        hosts: Collection[str] | None,
    ) -> str:
        """:meth:`_series` reduced to one series per GPU (and pod) with only the labels
        TauGrid reads. Why: on a large fleet the answer's size is mostly labels
        (``pci_bus_id``, the driver version, ``instance``, ``job``...), and parsing it is
        most of a page's time; ``max`` also merges duplicates (two scrape jobs, XID's
        ``err_code`` series) the way :meth:`current` wants, the error over "no error"."""
        labels = self.names.labels
        keep = [
            *labels.host,
            labels.gpu,
            labels.uuid,
            labels.model,
            labels.namespace,
            labels.pod,
            labels.container,
        ]
        series = self._series(metric, namespace, pods, hosts)
        return f"max by ({', '.join(dict.fromkeys(keep))}) ({series})"

    def _aggregate(
        self,
        how: str,
        by: Iterable[str],
        metric: str,
        namespace: str | None,
        pods: Collection[str] | None,
        hosts: Collection[str] | None,
        *,
        tag_host: bool = False,
    ) -> str:
        if how not in AGGREGATIONS:
            raise ValueError(f"how must be one of {', '.join(sorted(AGGREGATIONS))}, not {how!r}")
        series = self._series(metric, namespace, pods, hosts, tag_host=tag_host)
        return f"{how} by ({', '.join(by)}) ({series})"

    def _step(self, start: datetime, end: datetime, step: float | None) -> float:
        if step is not None:
            return step
        return fit_step(start, end, minimum=self.scrape_interval)

    @staticmethod
    def _asks_anything(
        namespace: str | None, pods: Collection[str] | None, hosts: Collection[str] | None
    ) -> bool:
        """False when the narrowing leaves nothing to ask; a ValueError for a narrowing that
        would be wider than meant."""
        if isinstance(pods, str) or isinstance(hosts, str):
            raise TypeError("pods and hosts are collections of names, not one string")
        if namespace is not None and not namespace:
            raise ValueError("namespace must be a namespace's name, not empty")
        if pods is not None and namespace is None:
            raise ValueError("pods are only unique within a namespace: pass namespace= with pods=")
        return not (pods is not None and not pods) and not (hosts is not None and not hosts)

    # --- answers ----------------------------------------------------------------------------

    def _host(self, labels: Mapping[str, str]) -> str | None:
        for label in self.names.labels.host:
            value = labels.get(label)
            if value:
                return value
        return None

    def _key(self, labels: Mapping[str, str]) -> GpuKey | None:
        """The GPU a series is about, or None for a series that does not say (no host or no
        index: nothing could be joined or shown for it)."""
        host = self._host(labels)
        try:
            index = int(labels.get(self.names.labels.gpu, ""))
        except ValueError:
            return None
        if host is None:
            return None
        return (host, index, labels.get(self.names.labels.uuid, ""))

    def _identity(self, key: GpuKey, sample: InstantSample) -> dict[str, Any]:
        host, index, uuid = key
        return {
            "host": host,
            "index": index,
            "uuid": uuid,
            "model": sample.labels.get(self.names.labels.model, ""),
        }

    def _fill_identity(self, gpu: dict[str, Any], sample: InstantSample) -> None:
        labels = self.names.labels
        for field_name, label in (
            ("namespace", labels.namespace),
            ("pod", labels.pod),
            ("container", labels.container),
            ("model", labels.model),
        ):
            value = sample.labels.get(label)
            if value and not gpu.get(field_name):
                gpu[field_name] = value


def host_matcher(label: str, hosts: Collection[str] | None) -> str:
    """Series of these hosts, or of any host (the label present) when None."""
    return f'{label}!=""' if hosts is None else match_any(label, hosts)


def selector(metric: str, matchers: list[str]) -> str:
    return f"{metric}{{{', '.join(matchers)}}}" if matchers else metric
