"""The spec's own document tree: YAML values that remember where they were written.

The schema checks these nodes rather than plain Python values so that every problem can name
its line and column, and so that a scalar keeps the text the user typed (``1.10`` stays
``1.10`` in ``args``; ``010`` in an integer field is caught rather than read as 8).
``from_python`` builds the same tree from JSON-like data, which is how ``spec_from_dict``
re-validates a stored normalised spec with exactly the same rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, TypeAlias

#: What YAML made of a scalar. ``timestamp`` is an unquoted date such as 2024-01-01 (the text
#: is kept); ``invalid`` is a scalar the loader already reported (an ``!!int`` that is not one),
#: which the schema skips so that one mistake gives one problem.
ScalarKind: TypeAlias = Literal["str", "int", "float", "bool", "null", "timestamp", "invalid"]
ScalarValue: TypeAlias = str | int | float | bool | None


@dataclass(frozen=True, slots=True)
class ScalarNode:
    kind: ScalarKind
    value: ScalarValue
    text: str
    #: Written without quotes, so YAML decided its type (``yes`` → true, ``1.10`` → 1.1).
    plain: bool
    line: int
    column: int


@dataclass(frozen=True, slots=True)
class SequenceNode:
    items: tuple[Node, ...]
    line: int
    column: int


@dataclass(frozen=True, slots=True)
class MappingNode:
    #: Keys are string scalars, in file order, without duplicates (the loader reports those).
    entries: tuple[tuple[ScalarNode, Node], ...]
    line: int
    column: int


Node: TypeAlias = ScalarNode | SequenceNode | MappingNode


class NotJsonLike(TypeError):
    """``from_python`` was given something JSON cannot hold (a set, bytes, a non-string key)."""


def from_python(value: object, *, line: int = 0, column: int = 0) -> Node:
    """A node tree for JSON-like data (dict, list, str, int, float, bool, None)."""
    if isinstance(value, Mapping):
        entries: list[tuple[ScalarNode, Node]] = []
        for key, item in value.items():
            if not isinstance(key, str):
                raise NotJsonLike(f"mapping keys must be strings, not {type(key).__name__}")
            entries.append((_scalar(key, line, column), from_python(item)))
        return MappingNode(tuple(entries), line, column)
    if isinstance(value, list | tuple):
        return SequenceNode(tuple(from_python(item) for item in value), line, column)
    return _scalar(value, line, column)


def _scalar(value: object, line: int, column: int) -> ScalarNode:
    if value is None:
        return ScalarNode("null", None, "null", True, line, column)
    if isinstance(value, bool):
        return ScalarNode("bool", value, "true" if value else "false", True, line, column)
    if isinstance(value, int):
        return ScalarNode("int", value, str(value), True, line, column)
    if isinstance(value, float):
        return ScalarNode("float", value, repr(value), True, line, column)
    if isinstance(value, str):
        return ScalarNode("str", value, value, False, line, column)
    raise NotJsonLike(f"{type(value).__name__} is not a JSON value")
