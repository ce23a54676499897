"""A run's GPUs and how well it used them: the run page's GPU section and
``GET /api/v1/workspaces/{ws}/runs/{run}/gpus/``.

The run's GPUs are found through dcgm-exporter's pod mapping: series whose ``namespace`` is
the run's workspace's and whose ``pod`` is one of the run's (its pods are named after each
attempt's Job or RayJob). Over the run's life, three range queries — utilisation averaged
per step, its peak per step, framebuffer used at its highest per step — give the summary
(``gpus.efficiency``); for a live run, one instant query per metric gives each GPU now.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from gpus import efficiency, selectors
from gpus import readings as telemetry
from gpus.workspace_gpus import gpus_of, workload_prefixes
from portal import live
from runs.models import Backend, Run, RunAttempt
from telemetry.prometheus import fit_step
from telemetry.samples import GpuSample

#: Prometheus answers at most 11,000 points per series; stay well under.
MAX_POINTS = 5_000
#: No step finer than this: dcgm-exporter is scraped every 15 to 30 s in practice.
MIN_STEP_SECONDS = 15.0


@dataclass
class RunGpus:
    requested: int
    gpus: list[GpuSample] = field(default_factory=list)
    efficiency: efficiency.Efficiency | None = None
    #: The run's GPUs together over its life: (ISO time, average utilisation).
    utilization: list[tuple[str, float]] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    #: Why there is nothing to show (no GPUs asked for, not started, …), or a telemetry
    #: notice; "" when there is data.
    notice: str = ""
    window_start: datetime | None = None
    window_end: datetime | None = None
    etag: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "requested_gpus": self.requested,
            "nodes": self.nodes,
            "gpus": [gpu_dict(sample) for sample in self.gpus],
            # Always an object (a client needs no null check): no GPU seen is ``gpus: 0``.
            "efficiency": (self.efficiency or no_samples()).as_dict(),
            "window": {
                "start": self.window_start.isoformat() if self.window_start else None,
                "end": self.window_end.isoformat() if self.window_end else None,
            },
            "notice": self.notice,
        }


def no_samples() -> efficiency.Efficiency:
    """The efficiency of a run none of whose GPUs was seen yet."""
    return efficiency.Efficiency(
        gpus=0,
        average_utilization=None,
        peak_utilization=None,
        memory_high_water_mib=None,
        idle_percent=settings.TAU_GPU_IDLE_PERCENT,
        idle_minutes=settings.TAU_GPU_IDLE_MINUTES,
    )


def gpu_dict(sample: GpuSample) -> dict[str, object]:
    """A GPU as the API gives it (the same fields for the fleet and for a run)."""
    return {
        "node": sample.host,
        "index": sample.index,
        "uuid": sample.uuid,
        "model": sample.model,
        "utilization": sample.utilization,
        "memory_used_mib": sample.memory_used_mib,
        "memory_free_mib": sample.memory_free_mib,
        "temperature_c": sample.temperature_c,
        "power_w": sample.power_w,
        "sm_clock_mhz": sample.sm_clock_mhz,
        "xid": sample.xid,
        "pod": sample.pod,
    }


def step_for(start: datetime, end: datetime) -> float:
    """Fine enough to find ``TAU_GPU_IDLE_MINUTES`` of idling (a fifth of it), coarse
    enough for a long run to stay under ``MAX_POINTS``."""
    span = max((end - start).total_seconds(), 60.0)
    finest = max(MIN_STEP_SECONDS, settings.TAU_GPU_IDLE_MINUTES * 60 / 5)
    return max(min(fit_step(start, end, minimum=MIN_STEP_SECONDS), finest), span / MAX_POINTS)


def report(run: Run, *, now: datetime | None = None) -> RunGpus:
    requested = gpus_of(run.spec)
    result = RunGpus(requested=requested)
    if requested == 0:
        result.notice = "This run asks for no GPUs."
        result.etag = live.etag("none")
        return result
    if run.backend != Backend.KUBERNETES:
        result.notice = (
            "GPU telemetry per run comes from dcgm-exporter's pod mapping on Kubernetes; a run "
            "on this machine's local executor has none. The machine's GPUs are on the GPU "
            "fleet page."
        )
        result.etag = live.etag("local")
        return result
    attempts = list(
        RunAttempt.objects.for_workspace(run.workspace_id)
        .filter(run=run)
        .only("id", "number", "backend_name", "started_at", "finished_at", "node_names")
        .order_by("number")
    )
    started = [attempt.started_at for attempt in attempts if attempt.started_at is not None]
    if not started:
        result.notice = "Its GPUs show here once the run has started."
        result.etag = live.etag("waiting", run.state)
        return result
    if not telemetry.configured():
        result.notice = telemetry.NOT_CONFIGURED
        result.etag = live.etag("unconfigured")
        return result
    moment = now or timezone.now()
    start = min(started)
    end = run.finished_at or moment
    step = step_for(start, end)
    # Everyone looking at a live run within one step shares one answer (the cache key's end
    # is the step's start); the answer itself reaches now, so the newest step is in it.
    shared_end = telemetry.aligned_end(step, moment) if run.finished_at is None else end
    result.window_start, result.window_end = start, end
    result.nodes = sorted({name for attempt in attempts for name in attempt.node_names or []})
    prefixes = workload_prefixes(run, attempts)
    namespace = run.workspace.namespace
    # The steps end at ``end`` (Prometheus counts them from the start): the newest seconds
    # are in the last one, however long the run.
    steps = max(1, math.ceil((end - start).total_seconds() / step))
    first = end - timedelta(seconds=steps * step)
    history = telemetry.run_history(
        namespace, prefixes, first, end, step, shared=f"{start.isoformat()}|{shared_end}"
    )
    result.notice = history.notice
    if history.value is not None:
        average, peak, memory = history.value
        result.efficiency = efficiency.summarise(
            average,
            peak,
            memory,
            step=timedelta(seconds=step),
            end=end,
            idle_percent=settings.TAU_GPU_IDLE_PERCENT,
            idle_minutes=settings.TAU_GPU_IDLE_MINUTES,
        )
        result.utilization = [
            (when.isoformat(), round(value, 2)) for when, value in efficiency.fleet_average(average)
        ]
    if run.is_live and not result.notice:
        pods = [
            entry["pod"]
            for node in selectors.nodes_of_run(run.workspace.slug, run.name)
            for entry in node.runs
            if entry.get("run") == run.name and entry.get("workspace") == run.workspace.slug
        ]
        current = telemetry.run_current(namespace, pods)
        result.notice = current.notice
        result.gpus = current.value or []
        result.nodes = sorted(set(result.nodes) | {sample.host for sample in result.gpus})
    result.etag = live.etag(
        start, end, step, result.notice, len(result.gpus), len(result.utilization)
    )
    return result
