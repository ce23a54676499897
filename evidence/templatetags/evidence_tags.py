"""The run page's evidence section reads its state here, so that the run page's own view
(the run core) needs to know nothing about evidence."""

from __future__ import annotations

from django import template

from evidence import selectors
from evidence.models import EvidenceRecord
from runs.models import Run

register = template.Library()


@register.simple_tag
def run_evidence(run: Run) -> EvidenceRecord | None:
    """The record of the run's present ending, or None (live, or still sealing)."""
    return selectors.current_record(run)
