"""Kubernetes resource quantities ("500m", "16", "64Gi", "1.5e3") as exact decimals.

Quotas and requests are compared and summed, so they are parsed into ``Decimal`` in base
units (cores, bytes, devices) rather than floats, and formatted back the way people write them.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_PATTERN = re.compile(
    r"^(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+))"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)|[eE](?P<exponent>[+-]?\d+))?$"
)
# Kubernetes itself caps quantities at 2^63-1 milli-units; nothing sensible is near that.
_MAXIMUM = Decimal(2**63 - 1) / 1000


class QuantityError(ValueError):
    """Not a Kubernetes quantity; the message says what one looks like."""


def parse_quantity(text: str | int | float | Decimal) -> Decimal:
    """Parse a quantity into base units: ``"64Gi"`` → bytes, ``"500m"`` → 0.5."""
    if isinstance(text, bool):
        raise QuantityError("a quantity is a number such as 4, 500m or 64Gi, not true/false")
    if isinstance(text, int | Decimal):
        value = Decimal(text)
    elif isinstance(text, float):
        value = Decimal(repr(text))
    else:
        match = _PATTERN.match(text.strip())
        if not match:
            raise QuantityError(
                f"{text!r} is not a Kubernetes quantity; write a number with an optional "
                "suffix, such as 4, 500m, 1.5, 64Gi or 512Mi"
            )
        try:
            number = Decimal(match["number"])
        except InvalidOperation:  # pragma: no cover - the pattern only admits decimals
            raise QuantityError(f"{text!r} is not a number") from None
        suffix = match["suffix"]
        if suffix in _BINARY:
            value = number * _BINARY[suffix]
        elif match["exponent"] is not None:
            exponent = int(match["exponent"])
            if abs(exponent) > 30:
                raise QuantityError(f"{text!r} has an exponent out of range")
            value = number.scaleb(exponent)
        else:
            value = number * _DECIMAL[suffix or ""]
    if not value.is_finite():
        raise QuantityError(f"{text!r} is not a finite number")
    if abs(value) > _MAXIMUM:
        raise QuantityError(f"{text!r} is larger than Kubernetes allows")
    return value.normalize() if value != value.to_integral_value() else value.quantize(Decimal(1))


def format_quantity(value: Decimal, *, binary: bool = False) -> str:
    """The shortest exact spelling: 68719476736 → "64Gi" (binary), 0.5 → "500m", 16 → "16"."""
    if value == 0:
        return "0"
    if binary and value == value.to_integral_value():
        for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
            factor = _BINARY[suffix]
            if value % factor == 0:
                return f"{int(value // factor)}{suffix}"
        return str(int(value))
    if value == value.to_integral_value():
        return str(int(value))
    milli = value * 1000
    if milli == milli.to_integral_value():
        return f"{int(milli)}m"
    return format(value.normalize(), "f")
