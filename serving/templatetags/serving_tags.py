"""What other pages show of endpoints: the model version page's "Served by" and the platform
queue's endpoints (the catalog and the run core, below serving, know nothing of endpoints:
their templates load these), and the figures of an endpoint's traffic in words."""

from __future__ import annotations

from typing import Any

from django import template

from catalog.models import AssetVersion
from serving import selectors

register = template.Library()


@register.simple_tag
def served_by(version: AssetVersion) -> list[dict[str, Any]]:
    """The endpoints that serve the version or served it (``serving.selectors.served_by``)."""
    return selectors.served_by(version)


@register.simple_tag
def platform_endpoints() -> dict[str, Any]:
    """Every workspace's running endpoints, idle ones first (for platform staff only), and
    the hours that make one idle."""
    return {"rows": selectors.platform_endpoints(), "idle_hours": selectors.idle_hours()}


@register.filter
def percent(share: float | None) -> str:
    """A share of 0 to 1 as a percentage ("0.5 %"), "—" for none."""
    if share is None:
        return "—"
    value = 100 * float(share)
    return f"{value:.1f} %" if value < 10 else f"{value:.0f} %"
