"""Template filters that give a run's codes their words (``runs.wording``):
``{{ event|event_words }}``, ``{{ attempt.retry_reason|retry_reason_words }}`` and
``{{ delta|duration_words }}``; ``{{ path|break_at_dots }}`` lets a long dotted path
(``runtime.env.LR``) wrap at its dots rather than inside a word."""

from __future__ import annotations

from datetime import timedelta

from django import template
from django.utils.html import conditional_escape
from django.utils.safestring import SafeString, mark_safe

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


@register.filter
def duration_words(delta: timedelta | None) -> str:
    """``4 min 30 s`` for a timedelta; "" for None."""
    return "" if delta is None else wording.duration_words(delta)


@register.filter
def break_at_dots(text: str) -> SafeString:
    """The text, escaped, with a line-break opportunity after each dot."""
    return mark_safe(  # noqa: S308 - escaped here, only <wbr> added
        str(conditional_escape(text)).replace(".", ".<wbr>")
    )
