"""The building blocks of the schema: one class per kind of value a field can hold.

Each kind does three jobs from one definition, so they cannot drift apart: it checks a located
node (reporting precise problems), returns the value's normalised form, and describes itself
as a JSON Schema fragment for editors and the web submit page. ``tau.spec.schema`` assembles
them into the blocks of schema version 1.
"""

from __future__ import annotations

import difflib
import posixpath
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final, Generic, TypeVar

import yaml

from tau.printable import hidden_character_problem
from tau.quantity import QuantityError, format_quantity, parse_quantity
from tau.spec.nodes import MappingNode, Node, ScalarNode, SequenceNode
from tau.spec.problems import Located, ProblemCollector, index_path, join_path, quote

T = TypeVar("T")
JsonSchema = dict[str, Any]


class Invalid:
    """The result of checking a value that had problems (already reported)."""

    _instance: Invalid | None = None

    def __new__(cls) -> Invalid:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "INVALID"


INVALID: Final = Invalid()

# Characters that never belong in a one-line value: C0/C1 controls, DEL, and the Unicode line
# and paragraph separators (which some tools treat as line breaks and others do not).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# Multi-line values (an argument, an environment value) may hold tabs and newlines, never NUL.
_CONTROL_MULTILINE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def describe(node: Node) -> str:
    """What a node is, for "expected …, got …" messages."""
    if isinstance(node, SequenceNode):
        return "a list"
    if isinstance(node, MappingNode):
        return "a mapping"
    text = quote(node.text)
    if node.kind == "str":
        return f"the string {text}" if node.text else "an empty string"
    if node.kind == "int":
        return f"the integer {text}"
    if node.kind == "float":
        return f"the number {text}"
    if node.kind == "bool":
        return f"{text} (a boolean)"
    if node.kind == "timestamp":
        return f"{text} (a date)"
    return "nothing (null)"


def is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.kind == "null"


def _quote_hint(node: ScalarNode) -> str:
    """YAML typed an unquoted value the user probably meant as text."""
    reading = {
        "bool": "a boolean",
        "null": "null",
        "int": "a number",
        "float": "a number",
        "timestamp": "a date",
    }.get(node.kind)
    if reading and node.plain:
        return f'YAML reads {quote(node.text or "~")} as {reading}; put it in quotes: "{node.text}"'
    return "write it as text"


class Kind(ABC, Generic[T]):
    """A kind of value: checks a node and returns the normalised value or ``INVALID``."""

    #: Completes "expected …": "an integer", "a list of strings".
    expected: str = "a value"
    #: A ``null`` (or an empty ``key:``) in place of this kind means "empty" (lists, blocks).
    null_is_empty: bool = False

    def check(self, node: Node, path: str, problems: ProblemCollector) -> T | Invalid:
        if isinstance(node, ScalarNode) and node.kind == "invalid":
            return INVALID  # the loader reported it already
        return self.check_node(node, path, problems)

    @abstractmethod
    def check_node(self, node: Node, path: str, problems: ProblemCollector) -> T | Invalid: ...

    @abstractmethod
    def json_schema(self) -> JsonSchema: ...

    def empty(self) -> T | Invalid:
        """The value when the key is absent and the field names no default."""
        return INVALID

    def type_problem(
        self, node: Node, path: str, problems: ProblemCollector, hint: str | None = None
    ) -> Invalid:
        problems.add(path, node, f"expected {self.expected}, got {describe(node)}", hint)
        return INVALID


@dataclass(frozen=True)
class Field:
    """One key of a block: its kind, default and the words that document it."""

    name: str
    kind: Kind[Any]
    description: str
    required: bool = False
    #: The normalised value when the key is absent; ``None`` means "unset" and also lets the
    #: key be written as ``null``. Left as ``...``, the kind's empty value is used (an empty
    #: list, a block with all its defaults).
    default: Any = ...
    #: How the value is typically written, for hints and docs ("train.py", "64Gi").
    example: str | None = None

    @property
    def has_explicit_default(self) -> bool:
        return self.default is not ...

    @property
    def nullable(self) -> bool:
        return self.has_explicit_default and self.default is None

    def default_value(self) -> Any:
        return self.default if self.has_explicit_default else self.kind.empty()


@dataclass
class BlockValues:
    """A checked block, handed to the block's cross-field checks."""

    path: str
    node: Node
    values: dict[str, Any]
    nodes: dict[str, Node]

    def where(self, name: str) -> Located:
        """The node a problem about field ``name`` points at (the block when it is absent)."""
        return self.nodes.get(name, self.node)

    def valid(self, *names: str) -> bool:
        return all(self.values.get(name, INVALID) is not INVALID for name in names)

    def path_of(self, name: str) -> str:
        return join_path(self.path, name)


BlockCheck = Callable[[BlockValues, ProblemCollector], None]


class ObjectKind(Kind[T]):
    """A mapping with a fixed set of keys (a block such as ``compute``, or a secret reference)."""

    null_is_empty = True

    def __init__(
        self,
        fields: Sequence[Field],
        build: Callable[[dict[str, Any]], T],
        *,
        description: str,
        checks: Sequence[BlockCheck] = (),
        aliases: Mapping[str, str] | None = None,
        expected: str = "a mapping",
    ) -> None:
        self.fields = {field.name: field for field in fields}
        #: Words people use for a field ("replicas" for ``workers``) → the field's name.
        self.aliases = dict(aliases or {})
        self.build = build
        self.description = description
        self.checks = tuple(checks)
        self.expected = expected
        #: Field name → paths of the blocks that do have it, for "`image` belongs in …" hints.
        #: Filled in once the whole schema is assembled.
        self.elsewhere: Mapping[str, Sequence[str]] = {}

    def check_node(self, node: Node, path: str, problems: ProblemCollector) -> T | Invalid:
        if is_null(node):
            return self._finish(node, path, {}, problems)
        if not isinstance(node, MappingNode):
            hint = None
            if isinstance(node, ScalarNode) and path:
                hint = f"put the keys of `{path}` on the lines below it, indented"
            return self.type_problem(node, path, problems, hint)
        present: dict[str, tuple[ScalarNode, Node]] = {}
        for key, value in node.entries:
            if key.text in self.fields:
                present[key.text] = (key, value)
            else:
                self._unknown_key(key, path, problems)
        return self._finish(node, path, present, problems)

    def _finish(
        self,
        node: Node,
        path: str,
        present: dict[str, tuple[ScalarNode, Node]],
        problems: ProblemCollector,
    ) -> T | Invalid:
        values: dict[str, Any] = {}
        nodes: dict[str, Node] = {}
        for name, field in self.fields.items():
            field_path = join_path(path, name)
            if name not in present:
                if field.required:
                    self._missing(field, node, field_path, problems)
                    values[name] = INVALID
                else:
                    values[name] = field.default_value()
                continue
            _key, value_node = present[name]
            nodes[name] = value_node
            values[name] = self._field_value(field, value_node, field_path, problems)
        block = BlockValues(path, node, values, nodes)
        for check in self.checks:
            check(block, problems)
        if any(value is INVALID for value in values.values()):
            return INVALID
        return self.build(values)

    @staticmethod
    def _field_value(
        field: Field, node: Node, path: str, problems: ProblemCollector
    ) -> Any | Invalid:
        if is_null(node):
            if field.nullable:
                return None
            if field.kind.null_is_empty and not field.required:
                return field.default_value()
            hint: str | None = None
            if not field.required:
                shown = describe_default(field)
                hint = f"give a value, or remove the key to use the default ({shown})"
            elif field.example:
                hint = f"give a value, e.g. {field.example}"
            return field.kind.type_problem(node, path, problems, hint)
        return field.kind.check(node, path, problems)

    def _missing(self, field: Field, node: Node, path: str, problems: ProblemCollector) -> None:
        what = "block" if isinstance(field.kind, ObjectKind) else "key"
        hint = f"add `{field.name}: {field.example}`" if field.example else None
        problems.add(path, node, f"missing required {what} `{field.name}`", hint)

    def _unknown_key(self, key: ScalarNode, path: str, problems: ProblemCollector) -> None:
        if problems.full:
            problems.add(join_path(path, key.text), key, "unknown key")  # counted, not shown
            return
        names = list(self.fields)
        # A key that is another block's field was more likely put in the wrong place than
        # misspelt: only a very near name here is suggested instead (`datasets` in `outputs`,
        # but not `inputs` for a top-level `gpus`).
        homes = [home for home in self.elsewhere.get(key.text, ()) if home != path]
        cutoff = 0.8 if homes else 0.6
        close = difflib.get_close_matches(key.text, names, n=1, cutoff=cutoff)
        if not close:
            lowered = {name.lower(): name for name in names}
            if key.text.lower() in lowered:
                close = [lowered[key.text.lower()]]
        if not close and key.text.lower() in self.aliases:
            close = [self.aliases[key.text.lower()]]
        if close:
            hint = f"did you mean `{close[0]}`?"
        elif homes and homes[0]:
            hint = f"`{key.text}` belongs in the `{homes[0]}` block"
        elif homes:
            hint = f"`{key.text}` is a top-level key; move it out of `{path}`"
        else:
            hint = "expected one of: " + ", ".join(f"`{name}`" for name in names)
        problems.add(join_path(path, key.text), key, f"unknown key {quote(key.text)}", hint)

    def empty(self) -> T | Invalid:
        if any(field.required for field in self.fields.values()):
            return INVALID
        return self.build({name: field.default_value() for name, field in self.fields.items()})

    def json_schema(self) -> JsonSchema:
        properties = {name: field_json_schema(field) for name, field in self.fields.items()}
        schema: JsonSchema = {
            "type": "object",
            "description": self.description,
            "properties": properties,
            "additionalProperties": False,
        }
        required = [name for name, field in self.fields.items() if field.required]
        if required:
            schema["required"] = required
        return schema


def field_json_schema(field: Field) -> JsonSchema:
    schema = dict(field.kind.json_schema())
    if field.nullable or (field.kind.null_is_empty and not field.required):
        schema = {"anyOf": [schema, {"type": "null"}]}
    schema["description"] = field.description
    if field.has_explicit_default or field.kind.null_is_empty:
        default = field.default_value()
        if not isinstance(default, Invalid):
            schema["default"] = to_json(default)
    if field.example is not None and not isinstance(field.kind, ObjectKind):
        # Examples are written as YAML ("[--epochs, 10]"); JSON Schema wants the values.
        schema["examples"] = [yaml.safe_load(field.example)]
    return schema


def describe_default(field: Field) -> str:
    """The default as a user would write it: ``30s`` rather than 30 for a duration."""
    value = field.default_value()
    if isinstance(field.kind, DurationKind) and isinstance(value, int):
        return format_duration(value)
    if value is None:
        return "unset"
    if isinstance(value, tuple):
        return "[" + ", ".join(str(to_json(item)) for item in value) + "]"
    return str(value)


def to_json(value: Any) -> Any:
    """A normalised value as JSON data (blocks and records know their own shape)."""
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    if isinstance(value, tuple):
        return [to_json(item) for item in value]
    return value


class ListKind(Kind[tuple[T, ...]]):
    """A list of values of one kind; optionally without repeats, optionally put in order."""

    null_is_empty = True

    def __init__(
        self,
        item: Kind[T],
        *,
        max_items: int,
        unique: bool = False,
        unique_key: Callable[[T], Hashable] | None = None,
        sort_key: Callable[[T], Any] | None = None,
        example: str,
    ) -> None:
        self.item = item
        self.max_items = max_items
        self.unique = unique or unique_key is not None
        self.unique_key = unique_key
        self.sort_key = sort_key
        self.example = example
        self.expected = f"a list of {_plural_of(item.expected)}"

    def check_node(
        self, node: Node, path: str, problems: ProblemCollector
    ) -> tuple[T, ...] | Invalid:
        if not isinstance(node, SequenceNode):
            hint = f"write a list: [{self.example}], or one `- item` per line"
            return self.type_problem(node, path, problems, hint)
        if len(node.items) > self.max_items:
            problems.add(
                path,
                node,
                f"has {len(node.items)} items; at most {self.max_items} are allowed",
            )
            return INVALID
        values: list[T] = []
        seen: dict[Any, int] = {}
        failed = False
        for index, item_node in enumerate(node.items):
            value = self.item.check(item_node, index_path(path, index), problems)
            if isinstance(value, Invalid):
                failed = True
                continue
            if self.unique:
                marker = self.unique_key(value) if self.unique_key is not None else value
                if marker in seen:
                    problems.add(
                        index_path(path, index),
                        item_node,
                        f"{quote(str(marker))} is listed twice "
                        f"(also item {seen[marker] + 1} of the list)",
                        "remove one of them",
                    )
                    failed = True
                    continue
                seen[marker] = index
            values.append(value)
        if failed:
            return INVALID
        if self.sort_key is not None:
            values.sort(key=self.sort_key)
        return tuple(values)

    def empty(self) -> tuple[T, ...]:
        return ()

    def json_schema(self) -> JsonSchema:
        schema: JsonSchema = {
            "type": "array",
            "items": self.item.json_schema(),
            "maxItems": self.max_items,
        }
        # Only where JSON's notion of "equal" matches the spec's (a verbatim 1 and 1.0 differ).
        if self.unique and self.unique_key is None and not getattr(self.item, "verbatim", False):
            schema["uniqueItems"] = True
        return schema


def _plural_of(expected: str) -> str:
    """ "a string" → "strings", "a relative path" → "relative paths" (for list descriptions)."""
    words = expected.split(" ", 1)
    noun = words[1] if words[0] in ("a", "an") and len(words) == 2 else expected
    head, _, tail = noun.partition(" (")
    head = head if head.endswith("s") else head + "s"
    return head + (f" ({tail}" if tail else "")


class IntegerKind(Kind[int]):
    """A whole number in plain decimal digits, within bounds."""

    def __init__(
        self, minimum: int, maximum: int, *, too_big_hint: str | None = None, noun: str = ""
    ) -> None:
        self.minimum = minimum
        self.maximum = maximum
        self.too_big_hint = too_big_hint
        self.expected = "an integer"
        self.noun = noun

    def check_node(self, node: Node, path: str, problems: ProblemCollector) -> int | Invalid:
        if (
            not isinstance(node, ScalarNode)
            or node.kind != "int"
            or not isinstance(node.value, int)
        ):
            hint = None
            if (
                isinstance(node, ScalarNode)
                and node.kind == "str"
                and _PLAIN_INTEGER.fullmatch(node.text.strip())
            ):
                hint = f"remove the quotes: {node.text.strip()}"
            elif isinstance(node, ScalarNode) and node.kind == "float":
                hint = "write a whole number"
            return self.type_problem(node, path, problems, hint)
        if node.plain and not _PLAIN_INTEGER.fullmatch(node.text):
            problems.add(
                path,
                node,
                f"write integers in plain decimal digits, not {quote(node.text)}",
                f"YAML readers disagree about forms like `010`, `0x10` and `1:30`; "
                f"this one means {node.value}",
            )
            return INVALID
        value = node.value
        if not self.minimum <= value <= self.maximum:
            unit = f" {self.noun}" if self.noun else ""
            hint = self.too_big_hint if value > self.maximum else None
            problems.add(
                path,
                node,
                f"must be between {self.minimum} and {self.maximum}{unit} (got {value})",
                hint,
            )
            return INVALID
        return value

    def json_schema(self) -> JsonSchema:
        return {"type": "integer", "minimum": self.minimum, "maximum": self.maximum}


# No leading zeros: YAML 1.1 reads 010 as 8, YAML 1.2 as 10.
_PLAIN_INTEGER = re.compile(r"[-+]?(?:0|[1-9][0-9]*)")


class EnumKind(Kind[str]):
    """One of a fixed set of words."""

    def __init__(self, choices: Sequence[str]) -> None:
        self.choices = tuple(choices)
        self.expected = "one of " + ", ".join(self.choices)

    def check_node(self, node: Node, path: str, problems: ProblemCollector) -> str | Invalid:
        if not isinstance(node, ScalarNode) or node.kind != "str":
            hint = _quote_hint(node) if isinstance(node, ScalarNode) else None
            return self.type_problem(node, path, problems, hint)
        if node.text in self.choices:
            return node.text
        close = [choice for choice in self.choices if node.text and choice.startswith(node.text)]
        close = close or difflib.get_close_matches(node.text.lower(), self.choices, n=1, cutoff=0.6)
        problems.add(
            path,
            node,
            f"{quote(node.text)} is not allowed here; expected one of: "
            + ", ".join(f"`{choice}`" for choice in self.choices),
            f"did you mean `{close[0]}`?" if close else None,
        )
        return INVALID

    def json_schema(self) -> JsonSchema:
        return {"type": "string", "enum": list(self.choices)}


class StringKind(Kind[str]):
    """Text with a length limit and, optionally, a rule about its shape.

    ``verbatim`` strings also take unquoted numbers and booleans *as written*: ``10`` becomes
    "10" and ``1.10`` stays "1.10" (never reinterpreted as 1.1), which is what a user means
    by ``args: [--epochs, 10]``.
    """

    def __init__(
        self,
        *,
        max_length: int,
        min_length: int = 1,
        rule: Callable[[str], str | None] | None = None,
        rule_hint: Callable[[str], str | None] | None = None,
        normalise: Callable[[str], str] | None = None,
        pattern: str | None = None,
        verbatim: bool = False,
        multiline: bool = False,
        strip: bool = False,
        too_long_hint: str | None = None,
        expected: str = "a string",
    ) -> None:
        self.max_length = max_length
        self.min_length = min_length
        self.rule = rule
        self.rule_hint = rule_hint
        self.normalise = normalise
        self.pattern = pattern
        self.verbatim = verbatim
        self.multiline = multiline
        self.strip = strip
        self.too_long_hint = too_long_hint
        self.expected = expected

    def check_node(self, node: Node, path: str, problems: ProblemCollector) -> str | Invalid:
        if not isinstance(node, ScalarNode):
            return self.type_problem(node, path, problems)
        accepted = ("str", "int", "float", "bool", "timestamp") if self.verbatim else ("str",)
        if node.kind not in accepted:
            return self.type_problem(node, path, problems, _quote_hint(node))
        return self.check_text(node.text, node, path, problems)

    def check_text(
        self, text: str, at: Located, path: str, problems: ProblemCollector
    ) -> str | Invalid:
        if len(text) > self.max_length:
            problems.add(
                path,
                at,
                f"is {len(text)} characters long; at most {self.max_length} are allowed",
                self.too_long_hint,
            )
            return INVALID
        # Stripped after the length check, which counts what was written, as JSON Schema does.
        if self.strip:
            text = text.strip()
        if len(text) < self.min_length:
            problems.add(path, at, "must not be empty" if self.min_length == 1 else "is too short")
            return INVALID
        control = (_CONTROL_MULTILINE if self.multiline else _CONTROL).search(text)
        if control:
            character = f"U+{ord(control.group()):04X}"
            what = "a control character" if self.multiline else "a line break or control character"
            problems.add(path, at, f"contains {what} ({character})", "remove it")
            return INVALID
        if self.rule is not None:
            problem = self.rule(text)
            if problem is not None:
                hint = self.rule_hint(text) if self.rule_hint is not None else None
                problems.add(path, at, problem, hint)
                return INVALID
        return self.normalise(text) if self.normalise is not None else text

    def json_schema(self) -> JsonSchema:
        schema: JsonSchema = {"type": "string", "maxLength": self.max_length}
        if self.min_length:
            schema["minLength"] = self.min_length
        if self.pattern is not None:
            schema["pattern"] = self.pattern
        if self.verbatim:
            return {"anyOf": [schema, {"type": ["number", "boolean"]}]}
        return schema


class QuantityKind(Kind[str]):
    """A Kubernetes quantity (``16``, ``500m``, ``64Gi``), normalised to one canonical spelling.

    CPU normalises to whole cores or millicores ("16", "500m"); memory to whole bytes written
    with the largest exact binary suffix, else decimal suffix, else plain bytes ("64Gi",
    "1G", "1536"). Equal amounts therefore always normalise (and hash) the same.
    """

    _SCHEMA_PATTERN = (
        r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?$"
    )
    _LOOSE_MEMORY = re.compile(r"(?i)([0-9]+(?:\.[0-9]+)?)\s*([kmgtpe])(i)?b?")

    def __init__(self, resource: str, *, minimum: Decimal, maximum: Decimal) -> None:
        if resource not in ("cpu", "memory"):  # pragma: no cover - a programming error
            raise ValueError(resource)
        self.resource = resource
        self.minimum = minimum
        self.maximum = maximum
        self.expected = (
            "a quantity such as 4 or 500m"
            if resource == "cpu"
            else ("a quantity such as 64Gi or 512Mi")
        )

    def _format(self, value: Decimal) -> str:
        return format_quantity(value) if self.resource == "cpu" else canonical_bytes(value)

    def check_node(self, node: Node, path: str, problems: ProblemCollector) -> str | Invalid:
        if not isinstance(node, ScalarNode) or node.kind not in ("str", "int", "float"):
            return self.type_problem(node, path, problems)
        text = node.text
        value: Decimal | None = None
        if text.isascii() and text == text.strip():
            try:
                value = parse_quantity(text)
            except QuantityError:
                value = None
        if value is None:
            problems.add(
                path,
                node,
                f"{quote(text)} is not a Kubernetes quantity",
                self._spelling_hint(text),
            )
            return INVALID
        if value < self.minimum or value > self.maximum:
            low, high = self._format(self.minimum), self._format(self.maximum)
            hint = None
            if (
                self.resource == "memory"
                and value < self.minimum
                and _PLAIN_INTEGER.fullmatch(text)
            ):
                hint = f"a number without a suffix is bytes; did you mean {text}Gi or {text}Mi?"
            problems.add(path, node, f"must be between {low} and {high} (got {text})", hint)
            return INVALID
        if self.resource == "cpu" and (value * 1000) != (value * 1000).to_integral_value():
            problems.add(
                path,
                node,
                f"{quote(text)} is finer than Kubernetes can request; "
                "CPU is counted in millicores (1m = 0.001 cores)",
                f"round it, e.g. {format_quantity((value * 1000).to_integral_value() / 1000)}",
            )
            return INVALID
        if self.resource == "memory" and value != value.to_integral_value():
            problems.add(
                path,
                node,
                f"{quote(text)} is not a whole number of bytes",
                "use a suffix such as Mi or Gi, e.g. 512Mi",
            )
            return INVALID
        return self._format(value)

    def _spelling_hint(self, text: str) -> str:
        if self.resource == "memory":
            loose = self._LOOSE_MEMORY.fullmatch(text.strip())
            if loose:
                number, prefix, _binary = loose.groups()
                binary = "Ki" if prefix.lower() == "k" else prefix.upper() + "i"
                decimal = "k" if prefix.lower() == "k" else prefix.upper()
                return (
                    f"suffixes are case-sensitive and have no B: did you mean {number}{binary}? "
                    f"{number}{decimal} would mean powers of 1000"
                )
            return "write a number with a suffix: Ki, Mi, Gi, Ti (powers of 1024) or k, M, G, T"
        return "write a number of cores, e.g. 4, 0.5 or 500m"

    def json_schema(self) -> JsonSchema:
        return {
            "anyOf": [
                {"type": "string", "pattern": self._SCHEMA_PATTERN},
                {"type": "number", "exclusiveMinimum": 0},
            ]
        }


def canonical_bytes(value: Decimal) -> str:
    """Whole bytes in the one spelling the spec uses: largest exact binary, then decimal suffix."""
    exact = format_quantity(value, binary=True)
    if not exact.isdigit() or value == 0:
        return exact
    amount = int(value)
    for suffix, factor in (
        ("E", 10**18),
        ("P", 10**15),
        ("T", 10**12),
        ("G", 10**9),
        ("M", 10**6),
        ("k", 10**3),
    ):
        if amount % factor == 0:
            return f"{amount // factor}{suffix}"
    return str(amount)


_DURATION = re.compile(
    r"\s*(?:(?P<d>[0-9]{1,9})\s*d)?\s*(?:(?P<h>[0-9]{1,9})\s*h)?"
    r"\s*(?:(?P<m>[0-9]{1,9})\s*m)?\s*(?:(?P<s>[0-9]{1,12})\s*s)?\s*"
)
_DURATION_SCHEMA_PATTERN = (
    r"^\s*(([0-9]{1,9}\s*d)?\s*([0-9]{1,9}\s*h)?\s*([0-9]{1,9}\s*m)?\s*([0-9]{1,12}\s*s)?"
    r"|[0-9]{1,12})\s*$"
)
_SECONDS = re.compile(r"[0-9]{1,12}")


def parse_duration(text: str) -> int | None:
    """``"1h30m"`` → 5400, ``"90m"`` → 5400, ``"3600"`` → 3600; None if not a duration."""
    if _SECONDS.fullmatch(text.strip()):
        return int(text.strip())
    match = _DURATION.fullmatch(text)
    if match is None or not any(match.groups()):
        return None
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    return sum(int(match[unit]) * factor for unit, factor in units.items() if match[unit])


def format_duration(seconds: int) -> str:
    """5400 → "1h30m", 45 → "45s", 0 → "0s"."""
    if seconds == 0:
        return "0s"
    parts = []
    for unit, factor in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        amount, seconds = divmod(seconds, factor)
        if amount:
            parts.append(f"{amount}{unit}")
    return "".join(parts)


class DurationKind(Kind[int]):
    """A length of time: whole seconds or units d/h/m/s (``90m``, ``1h30m``); kept as seconds."""

    def __init__(self, minimum: int, maximum: int) -> None:
        self.minimum = minimum
        self.maximum = maximum
        self.expected = "a duration such as 90m, 2h or 3600"

    def check_node(self, node: Node, path: str, problems: ProblemCollector) -> int | Invalid:
        if not isinstance(node, ScalarNode) or node.kind not in ("str", "int", "float"):
            return self.type_problem(node, path, problems)
        if node.kind == "float":
            return self.type_problem(
                node, path, problems, "use whole seconds or units, e.g. 1h30m or 5400"
            )
        if node.kind == "int" and node.plain and not _PLAIN_INTEGER.fullmatch(node.text):
            problems.add(
                path,
                node,
                f"write integers in plain decimal digits, not {quote(node.text)}",
                f"YAML reads this one as {node.value} seconds; write 90m or 5400 instead",
            )
            return INVALID
        seconds = parse_duration(node.text)
        if seconds is None:
            problems.add(
                path,
                node,
                f"{quote(node.text)} is not a duration",
                "write whole seconds (3600) or use the units d, h, m and s: 90m, 2h, 1h30m",
            )
            return INVALID
        if not self.minimum <= seconds <= self.maximum:
            problems.add(
                path,
                node,
                f"must be between {format_duration(self.minimum)} and "
                f"{format_duration(self.maximum)} (got {format_duration(seconds)})",
            )
            return INVALID
        return seconds

    def json_schema(self) -> JsonSchema:
        return {
            "anyOf": [
                {"type": "integer", "minimum": self.minimum, "maximum": self.maximum},
                {"type": "string", "pattern": _DURATION_SCHEMA_PATTERN, "minLength": 1},
            ]
        }


def relative_path_problem(text: str, *, what: str = "path") -> str | None:
    """Why ``text`` is not a path that stays inside the directory it is relative to."""
    if "\\" in text:
        return f"the {what} {quote(text)} uses `\\`; separate directories with `/`"
    if text.startswith("/") or re.match(r"[A-Za-z]:", text):
        return f"the {what} {quote(text)} is absolute; it must be relative"
    if text.startswith("~"):
        return f"the {what} {quote(text)} starts with `~`, which is not expanded"
    if ".." in text.split("/"):
        return f"the {what} {quote(text)} uses `..`; it must stay inside its directory"
    return hidden_character_problem(text, f"the {what} {quote(text)}")


def normalise_relative_path(text: str) -> str:
    """``./src//train.py`` → ``src/train.py``; the directory itself is ``.``."""
    return posixpath.normpath(text)


def path_kind(
    *, what: str, relative_to: str, example: str, max_length: int = 1024, glob: bool = False
) -> StringKind:
    """A relative path (or glob pattern) that cannot point outside its directory."""
    return StringKind(
        max_length=max_length,
        rule=lambda text: relative_path_problem(text, what=what),
        rule_hint=lambda _text: f"write it relative to {relative_to}, e.g. `{example}`",
        normalise=(lambda text: text.removeprefix("./")) if glob else normalise_relative_path,
        pattern=r"^(?![/~\\])(?![A-Za-z]:)(?!(.*/)?\.\.(/|$))[^\\]*$",
        expected=f"a relative {what}",
    )
