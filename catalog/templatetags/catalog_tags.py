"""The run page's Data section reads what the run read and made here, so that the run page's
own view (the run core, below the catalog) needs to know nothing about datasets or models."""

from __future__ import annotations

from django import template

from catalog import selectors
from runs.models import Run

register = template.Library()


@register.simple_tag
def run_data(run: Run) -> selectors.RunData | None:
    """The dataset versions the run read and the versions it made (None: neither)."""
    return selectors.run_data(run)
