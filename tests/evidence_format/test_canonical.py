"""RFC 8785 canonical JSON, checked against the RFC's own examples (the expected strings are
copied from the RFC, not produced by the code under test)."""

from __future__ import annotations

import json
import math
import struct

import pytest

from tau.evidence.canonical import canonical_json

# RFC 8785 Appendix B: IEEE 754 doubles (as hex) and their canonical form.
RFC_NUMBERS = [
    ("0000000000000000", "0"),
    ("8000000000000000", "0"),  # minus zero
    ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
]


@pytest.mark.parametrize(("bits", "expected"), RFC_NUMBERS)
def test_numbers_follow_the_rfc_table(bits: str, expected: str) -> None:
    (number,) = struct.unpack(">d", bytes.fromhex(bits))
    assert canonical_json(number) == expected.encode()


@pytest.mark.parametrize(
    ("number", "expected"),
    [
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (1e-7, "1e-7"),
        (1e-6, "0.000001"),
        (0.1, "0.1"),
        (-0.0, "0"),
        (1.0, "1"),
        (-1.5, "-1.5"),
        (123456.789, "123456.789"),
        (2**53, "9007199254740992"),
        # Held exactly by a double, written as ECMAScript does: the shortest digits.
        (2**60, "1152921504606847000"),
        (-7, "-7"),
    ],
)
def test_numbers_in_es6_form(number: float, expected: str) -> None:
    assert canonical_json(number) == expected.encode()


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf, 2**53 + 1])
def test_numbers_json_cannot_hold_are_refused(number: float) -> None:
    with pytest.raises(ValueError, match=r"not a JSON number|cannot be held"):
        canonical_json({"x": number})


def test_the_rfc_example_object() -> None:
    # RFC 8785 section 3.2.2's input and its canonical output, verbatim.
    source = (
        '{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],'
        r'"string": "\u20ac$\u000F\u000aA'
        "'"
        r'\u0042\u0022\u005c\\\"\/",'
        '"literals": [null, true, false]}'
    )
    expected = (
        '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
        '"string":"€$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    )
    assert canonical_json(json.loads(source)) == expected.encode("utf-8")


def test_keys_sort_by_utf16_code_units() -> None:
    # RFC 8785 section 3.2.3: the emoji (a surrogate pair, D83D DE00) sorts before U+FB33
    # although its code point is higher.
    source = (
        r'{"\u20ac": "Euro Sign", "\r": "Carriage Return", "\ufb33": "Hebrew Letter Dalet With'
        r' Dagesh", "1": "One", "\ud83d\ude00": "Emoji: Grinning Face", "\u0080": "Control",'
        r' "\u00f6": "Latin Small Letter O With Diaeresis"}'
    )
    values = list(json.loads(canonical_json(json.loads(source))).values())
    assert values == [
        "Carriage Return",
        "One",
        "Control",
        "Latin Small Letter O With Diaeresis",
        "Euro Sign",
        "Emoji: Grinning Face",
        "Hebrew Letter Dalet With Dagesh",
    ]


def test_strings_escape_only_what_json_requires() -> None:
    text = 'tab\t nl\n quote" back\\ bell\x07 del\x7f line\u2028 é 😀'
    assert canonical_json(text) == (
        '"tab\\t nl\\n quote\\" back\\\\ bell\\u0007 del\x7f line\u2028 é 😀"'.encode()
    )


def test_no_whitespace_and_nested_values() -> None:
    assert canonical_json({"b": [1, {"d": None, "c": True}], "a": (), "": {}}) == (
        b'{"":{},"a":[],"b":[1,{"c":true,"d":null}]}'
    )


def test_lone_surrogates_and_non_json_types_are_refused() -> None:
    with pytest.raises(ValueError, match="surrogate"):
        canonical_json("\ud800")
    with pytest.raises(TypeError, match="set"):
        canonical_json({1, 2})
    with pytest.raises(TypeError, match="keys must be strings"):
        canonical_json({1: "one"})
