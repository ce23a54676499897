"""The run page's evidence section reads its state here, so that the run page's own view
(the run core) needs to know nothing about evidence."""

from __future__ import annotations

from django import template

from evidence import sealing, selectors
from runs.models import Run

register = template.Library()


@register.simple_tag
def run_evidence(run: Run) -> selectors.RunEvidence | None:
    """Every ending of the run and its evidence (None: the run has not ended yet)."""
    return selectors.run_evidence(run)


@register.simple_tag
def seal_tries() -> int:
    """How often sealing is tried before it is given up."""
    return sealing.MAX_TRIES
