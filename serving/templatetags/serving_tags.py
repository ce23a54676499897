"""What other pages show of endpoints: the model version page's "Served by" (the catalog,
below serving, knows nothing of endpoints: its template loads these), and the figures of an
endpoint's traffic in words."""

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


@register.filter
def percent(share: float | None) -> str:
    """A share of 0 to 1 as a percentage ("0.5 %"), "—" for none."""
    if share is None:
        return "—"
    value = 100 * float(share)
    return f"{value:.1f} %" if value < 10 else f"{value:.0f} %"
