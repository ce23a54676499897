"""RFC 8785 (JSON Canonicalization Scheme): the one byte form of a JSON value.

The manifest is signed as bytes, so writer and verifier must agree on them exactly, in any
language: object keys sorted by their UTF-16 code units, no whitespace, numbers as
ECMAScript's ``Number.prototype.toString`` writes them, strings with only the escapes JSON
requires and everything else as UTF-8.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from json.encoder import encode_basestring
from typing import Any

__all__ = ["MAX_SAFE_INTEGER", "canonical_json"]

# The largest integer every IEEE 754 double holds exactly: JCS numbers are doubles, so an
# integer beyond it that a double cannot hold would silently change its value.
_EXACT_INTEGER_LIMIT = 2**53

#: The largest integer a record holds as itself, whatever reads it: every integer up to it
#: and none above it is exactly one double (JavaScript's ``Number.MAX_SAFE_INTEGER``; 2^53
#: itself is exact, but so would be 2^53 + 1 read as a double). What a run reports that ends
#: up in its evidence (metric steps, checkpoint steps and sizes) is refused above it where it
#: arrives, so that a record can always be sealed and every reader gets the number back.
MAX_SAFE_INTEGER = 2**53 - 1


def canonical_json(value: Any) -> bytes:
    """``value`` (dicts with string keys, lists, tuples, strings, ints, floats, bools, None) as
    RFC 8785 canonical JSON, UTF-8. Raises ``ValueError`` for NaN, infinities, integers a
    double cannot hold and lone surrogates; ``TypeError`` for anything that is not JSON."""
    parts: list[str] = []
    _write(value, parts)
    try:
        return "".join(parts).encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"not valid Unicode (a lone surrogate?): {error}") from None


def _write(value: Any, parts: list[str]) -> None:
    # bool before int: True is an int to Python, a literal to JSON.
    if value is None:
        parts.append("null")
    elif value is True:
        parts.append("true")
    elif value is False:
        parts.append("false")
    elif isinstance(value, str):
        parts.append(_string(value))
    elif isinstance(value, int):
        parts.append(_integer(value))
    elif isinstance(value, float):
        parts.append(es6_number(value))
    elif isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f"object keys must be strings, not {type(key).__name__}")
        parts.append("{")
        for index, key in enumerate(sorted(value, key=_utf16_order)):
            if index:
                parts.append(",")
            parts.append(_string(key))
            parts.append(":")
            _write(value[key], parts)
        parts.append("}")
    elif isinstance(value, list | tuple):
        parts.append("[")
        for index, item in enumerate(value):
            if index:
                parts.append(",")
            _write(item, parts)
        parts.append("]")
    else:
        raise TypeError(f"{type(value).__name__} is not a JSON value")


def _utf16_order(key: str) -> bytes:
    # Big-endian UTF-16 compares byte by byte exactly as its code units compare, which is
    # the order RFC 8785 asks for (it differs from code point order above U+FFFF).
    return key.encode("utf-16-be", "surrogatepass")


# Python's encoder with ensure_ascii=False escapes exactly what RFC 8785 does: the quote, the
# backslash, \b \f \n \r \t, other controls below U+0020 as lowercase \u00xx. This is the
# function json.dumps(text, ensure_ascii=False) ends in (C), called without building an
# encoder for each string first (eight times as fast: a record's manifest is mostly strings).
_string: Callable[[str], str] = encode_basestring


def _integer(number: int) -> str:
    if abs(number) <= _EXACT_INTEGER_LIMIT:
        return str(number)
    as_double = float(number)
    if as_double != number:
        raise ValueError(f"{number} cannot be held exactly by an IEEE 754 double")
    return es6_number(as_double)


def es6_number(number: float) -> str:
    """A finite double as ECMAScript writes it (RFC 8785 section 3.2.2.3): the shortest digits
    that read back to the same double (Python's ``repr`` finds the same ones), placed in
    plain notation for exponents from -6 to 21 and in ``1e+21`` form beyond."""
    if math.isnan(number) or math.isinf(number):
        raise ValueError(f"{number} is not a JSON number")
    if number == 0:
        return "0"  # -0 too
    if number < 0:
        return "-" + es6_number(-number)
    mantissa, _, exponent_text = repr(number).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    leading_zeros = len(digits) - len(digits.lstrip("0"))
    digits = digits.strip("0")
    # The value is 0.<digits> x 10**point (ECMAScript's n).
    point = len(whole) + int(exponent_text or 0) - leading_zeros
    count = len(digits)
    if count <= point <= 21:
        return digits + "0" * (point - count)
    if 0 < point <= 21:
        return f"{digits[:point]}.{digits[point:]}"
    if -6 < point <= 0:
        return "0." + "0" * -point + digits
    exponent = point - 1
    sign = "+" if exponent >= 0 else "-"
    head = digits if count == 1 else f"{digits[0]}.{digits[1:]}"
    return f"{head}e{sign}{abs(exponent)}"
