"""GPU efficiency of one run, from its GPUs' utilisation and memory over its life.

Pure functions over series (no Prometheus, no database), so the numbers the run page and the
API show are tested as a table. The series come from ``gpus.run_gpus``: per GPU, the average
utilisation of each step (``avg_over_time`` over the step, so a step's value is a true
average, not a sample), its peak (``max_over_time``), and the framebuffer in use at its
highest.

"Idle" is the waste the platform team cares about: the run's GPUs, on average, used less than
``idle_percent`` for at least ``idle_minutes`` in a row. A run that starts slowly (data
loading) shows one short stretch; a run that holds eight GPUs and trains on one shows an idle
average the whole time, and says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

#: One GPU's series: (time, value) in time order.
Series = Sequence[tuple[datetime, float]]
#: A GPU as the telemetry names it: (host, index, uuid).
GpuKey = tuple[str, int, str]


@dataclass(frozen=True)
class IdleStretch:
    start: datetime
    end: datetime
    average: float  # the GPUs' average utilisation over the stretch, percent

    @property
    def minutes(self) -> int:
        return int((self.end - self.start).total_seconds() // 60)


@dataclass(frozen=True)
class Efficiency:
    """What the run page says of a run's use of its GPUs. ``None``: no sample at all."""

    gpus: int
    average_utilization: float | None
    peak_utilization: float | None
    memory_high_water_mib: float | None
    idle_stretches: list[IdleStretch] = field(default_factory=list)
    #: The newest stretch reaches the end of the window: the run is idle now.
    idle_now: bool = False
    idle_percent: int = 10
    idle_minutes: int = 15

    @property
    def idle_minutes_total(self) -> int:
        return sum(stretch.minutes for stretch in self.idle_stretches)

    @property
    def wasteful(self) -> bool:
        """Worth a warning on the run page."""
        return bool(self.idle_stretches)

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus,
            "average_utilization": _rounded(self.average_utilization),
            "peak_utilization": _rounded(self.peak_utilization),
            "memory_high_water_mib": _rounded(self.memory_high_water_mib),
            "idle": {
                "threshold_percent": self.idle_percent,
                "threshold_minutes": self.idle_minutes,
                "now": self.idle_now,
                "minutes": self.idle_minutes_total,
                "stretches": [
                    {
                        "start": stretch.start.isoformat(),
                        "end": stretch.end.isoformat(),
                        "average_utilization": _rounded(stretch.average),
                    }
                    for stretch in self.idle_stretches
                ],
            },
        }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def summarise(
    average: Mapping[GpuKey, Series],
    peak: Mapping[GpuKey, Series],
    memory: Mapping[GpuKey, Series],
    *,
    step: timedelta,
    end: datetime,
    idle_percent: int,
    idle_minutes: int,
) -> Efficiency:
    """The run's efficiency. ``average``/``peak``/``memory``: per GPU, the step averages of
    utilisation, the step peaks, and the step peaks of framebuffer used (MiB); ``step`` the
    series' step; ``end`` the window's end (now, for a live run)."""
    gpus = set(average) | set(peak) | set(memory)
    values = [value for series in average.values() for _, value in series]
    peaks = [value for series in peak.values() for _, value in series] or values
    memories = [value for series in memory.values() for _, value in series]
    stretches = idle_stretches(
        average, step=step, idle_percent=idle_percent, idle_minutes=idle_minutes
    )
    return Efficiency(
        gpus=len(gpus),
        average_utilization=sum(values) / len(values) if values else None,
        peak_utilization=max(peaks) if peaks else None,
        memory_high_water_mib=max(memories) if memories else None,
        idle_stretches=stretches,
        idle_now=bool(stretches) and stretches[-1].end >= end - step,
        idle_percent=idle_percent,
        idle_minutes=idle_minutes,
    )


def fleet_average(average: Mapping[GpuKey, Series]) -> list[tuple[datetime, float]]:
    """The run's GPUs together: at each time, the average of the GPUs that reported."""
    totals: dict[datetime, list[float]] = {}
    for series in average.values():
        for moment, value in series:
            totals.setdefault(moment, []).append(value)
    return [(moment, sum(found) / len(found)) for moment, found in sorted(totals.items())]


def idle_stretches(
    average: Mapping[GpuKey, Series], *, step: timedelta, idle_percent: int, idle_minutes: int
) -> list[IdleStretch]:
    """Stretches of at least ``idle_minutes`` in which the run's GPUs together averaged under
    ``idle_percent``. A missing step (no sample: the run was not running, or the scrape
    failed) ends a stretch: only what was measured counts as idle."""
    combined = fleet_average(average)
    stretches: list[IdleStretch] = []
    started: datetime | None = None
    last: datetime | None = None
    values: list[float] = []

    def close() -> None:
        if started is not None and last is not None:
            # Each point stands for the step that ends at it.
            begin = started - step
            if last - begin >= timedelta(minutes=idle_minutes):
                stretches.append(IdleStretch(begin, last, sum(values) / len(values)))

    for moment, value in combined:
        gap = last is not None and moment - last > step * 1.5
        if value < idle_percent and not gap and started is not None:
            last = moment
            values.append(value)
            continue
        close()
        if value < idle_percent:
            started, last, values = moment, moment, [value]
        else:
            started, last, values = None, None, []
    close()
    return stretches
