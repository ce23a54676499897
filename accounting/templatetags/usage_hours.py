"""``{{ value|hours }}``: an amount of hours as the usage pages write it
(``accounting.hours.hours_text``)."""

from __future__ import annotations

from django import template

from accounting.hours import hours_text

register = template.Library()


@register.filter
def hours(value: float | None) -> str:
    return "" if value is None else hours_text(float(value))
