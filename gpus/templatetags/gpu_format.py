"""How GPU numbers read on the pages: a dash for what nobody reported, units always."""

from __future__ import annotations

from datetime import UTC, datetime

from django import template

register = template.Library()

UNKNOWN = "\u2013"  # an en dash: nobody reported it


@register.filter
def percent(value: float | None) -> str:
    return UNKNOWN if value is None else f"{value:.0f} %"


@register.filter
def gib(mib: float | None) -> str:
    """MiB (what DCGM and NVML report) as GiB."""
    return UNKNOWN if mib is None else f"{mib / 1024:.1f} GiB"


@register.filter
def celsius(value: float | None) -> str:
    return UNKNOWN if value is None else f"{value:.0f} °C"


@register.filter
def watts(value: float | None) -> str:
    return UNKNOWN if value is None else f"{value:.0f} W"


@register.filter
def mhz(value: float | None) -> str:
    return UNKNOWN if value is None else f"{value:.0f} MHz"


@register.filter
def iso_time(value: str) -> str:
    """A Kubernetes time (``2026-12-01T12:03:07Z``) as people read it."""
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except (AttributeError, ValueError):
        return value or UNKNOWN
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")
