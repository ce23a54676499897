"""A run's GPU efficiency from its series, as a table: average, peak, memory high-water mark,
and the idle stretches the run page warns about."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpus.efficiency import Efficiency, fleet_average, idle_stretches, summarise

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
STEP = timedelta(minutes=1)
GPU0 = ("gpu-h100-1", 0, "GPU-0")
GPU1 = ("gpu-h100-1", 1, "GPU-1")


def series(*values: float, start: datetime = T0) -> list[tuple[datetime, float]]:
    """One point per minute, the first at ``start`` + 1 min (each stands for the minute
    that ends at it)."""
    return [(start + STEP * (index + 1), value) for index, value in enumerate(values)]


def summary(
    average: dict[Any, Any],
    peak: dict[Any, Any] | None = None,
    memory: dict[Any, Any] | None = None,
) -> Efficiency:
    points = [moment for line in average.values() for moment, _ in line]
    return summarise(
        average,
        peak if peak is not None else average,
        memory or {},
        step=STEP,
        end=max(points) if points else T0,
        idle_percent=10,
        idle_minutes=15,
    )


def test_average_peak_and_memory_across_gpus() -> None:
    found = summary(
        {GPU0: series(80, 90, 100), GPU1: series(60, 70, 80)},
        peak={GPU0: series(95, 99, 100), GPU1: series(70, 75, 88)},
        memory={GPU0: series(60_000, 62_000, 61_000), GPU1: series(50_000, 71_500, 70_000)},
    )
    assert found.gpus == 2
    assert found.average_utilization == pytest.approx(80.0)
    assert found.peak_utilization == 100
    assert found.memory_high_water_mib == 71_500
    assert found.idle_stretches == []
    assert not found.wasteful


def test_no_samples_at_all() -> None:
    found = summary({})
    assert (found.gpus, found.average_utilization, found.peak_utilization) == (0, None, None)
    assert found.memory_high_water_mib is None
    assert found.as_dict()["idle"]["stretches"] == []


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        # 20 minutes under 10 %: one stretch of 20 minutes (from 12:00 to 12:20).
        ([3.0] * 20, [(0, 20)]),
        # 14 minutes is under the threshold of 15: nothing.
        ([3.0] * 14 + [90.0] * 6, []),
        # Exactly 15 minutes counts.
        ([90.0] * 5 + [5.0] * 15 + [90.0], [(5, 20)]),
        # Two stretches, broken by a busy minute.
        ([1.0] * 16 + [50.0] + [2.0] * 16, [(0, 16), (17, 33)]),
        # 10 % is not under 10 %.
        ([10.0] * 30, []),
    ],
    ids=["idle-20", "idle-14", "idle-15", "two-stretches", "at-threshold"],
)
def test_idle_stretches(values: list[float], expected: list[tuple[int, int]]) -> None:
    found = idle_stretches({GPU0: series(*values)}, step=STEP, idle_percent=10, idle_minutes=15)
    assert [(int((s.start - T0) / STEP), int((s.end - T0) / STEP)) for s in found] == expected


def test_idle_is_the_gpus_together_not_each() -> None:
    """One GPU at 0 % beside one at 30 % averages 15 %: the run uses its GPUs, unevenly."""
    found = idle_stretches(
        {GPU0: series(*[0.0] * 30), GPU1: series(*[30.0] * 30)},
        step=STEP,
        idle_percent=10,
        idle_minutes=15,
    )
    assert found == []
    assert fleet_average({GPU0: series(0, 10), GPU1: series(30, 50)}) == [
        (T0 + STEP, 15.0),
        (T0 + 2 * STEP, 30.0),
    ]


def test_a_gap_in_the_samples_ends_a_stretch() -> None:
    """Unmeasured minutes (the run was not running, a scrape failed) are not idle."""
    before = series(*[2.0] * 10)
    after = series(*[2.0] * 10, start=T0 + timedelta(minutes=30))
    assert idle_stretches({GPU0: before + after}, step=STEP, idle_percent=10, idle_minutes=15) == []


def test_idle_now_when_the_last_stretch_reaches_the_end() -> None:
    found = summary({GPU0: series(*[90.0] * 5, *[1.0] * 20)})
    assert found.wasteful
    assert found.idle_now
    assert found.idle_minutes_total == 20
    earlier = summary({GPU0: series(*[1.0] * 20, *[90.0] * 5)})
    assert earlier.wasteful
    assert not earlier.idle_now
    body = earlier.as_dict()
    assert body["idle"]["minutes"] == 20
    assert body["idle"]["stretches"][0]["average_utilization"] == 1.0
