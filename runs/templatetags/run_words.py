"""Template filters that give a run's codes their words (``runs.wording``):
``{{ event|event_words }}`` and ``{{ attempt.retry_reason|retry_reason_words }}``."""

from __future__ import annotations

from django import template

from runs import wording
from runs.models import RunEvent

register = template.Library()


@register.filter
def event_words(event: RunEvent) -> wording.EventWords:
    """What the timeline says for ``event``."""
    return wording.event_words(event.kind, event.new_state)


@register.filter
def retry_reason_words(reason: str) -> str:
    """Why an attempt was started, in words ("" for the first attempt)."""
    return wording.retry_reason_words(reason)
