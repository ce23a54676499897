"""How the usage pages, the CSV's readers and the admin write an amount of hours (GPU-hours,
CPU-hours, GiB-hours): enough digits that a short run is not ``0.0``, no more than a person
reads, and ``0`` only for nothing at all."""

from __future__ import annotations


def hours_text(value: float) -> str:
    """``0``, ``< 0.001``, ``0.008``, ``0.25``, ``1.25``, ``12.5``, ``1,234.5``."""
    if value <= 0:
        return "0"
    if value < 0.001:
        return "< 0.001"
    digits = 3 if value < 1 else 2 if value < 10 else 1
    text = f"{value:,.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text
