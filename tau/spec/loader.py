"""Reading tau.yaml text into located nodes, refusing the parts of YAML a spec never needs.

PyYAML's safe composer does the parsing; this module wraps it so that

* every value keeps its line and column (for error messages),
* anchors, aliases and merge keys are refused before anything is expanded, so a "billion
  laughs" document cannot cost more than reading its text,
* only the core tags (``!!str``, ``!!int``, ``!!float``, ``!!bool``, ``!!null``, ``!!map``,
  ``!!seq``) are accepted, and keys must be strings that appear once per mapping,
* one document per file, at most ``MAX_FILE_BYTES`` of UTF-8, ``MAX_DEPTH`` levels of
  nesting (the composer recurses; the limit keeps it far from Python's recursion limit) and
  ``MAX_NODES`` keys, values and list items, counted as they are read: reading costs about as
  much per node as checking does, so a file of 20,000 unknown keys (4 s of CPU per
  submission before this bound) is refused after reading its first ``MAX_NODES``,
* whatever the input bytes, the only outcome is a node tree or problems in the collector.
"""

from __future__ import annotations

import codecs
import math
from typing import Protocol

import yaml

from tau.spec.nodes import MappingNode, Node, ScalarKind, ScalarNode, ScalarValue, SequenceNode
from tau.spec.problems import DOCUMENT_PATH, ProblemCollector, index_path, join_path, quote

MAX_FILE_BYTES = 256 * 1024
MAX_DEPTH = 32
#: Keys, values and list items in one file. The spec using every field has about 140, and one
#: with every list of the schema at its longest (arguments, packages, environment, secrets,
#: datasets, artifacts, tags) about 1,300; a sweep adds a few hundred at most.
MAX_NODES = 4000

_CORE = "tag:yaml.org,2002:"
_MAP_TAG = _CORE + "map"
_SEQ_TAG = _CORE + "seq"
_MERGE_TAG = _CORE + "merge"
_SCALAR_KINDS: dict[str, ScalarKind] = {
    _CORE + "str": "str",
    _CORE + "int": "int",
    _CORE + "float": "float",
    _CORE + "bool": "bool",
    _CORE + "null": "null",
    # Only ever resolved implicitly (an unquoted 2024-01-01); an explicit !!timestamp is refused.
    _CORE + "timestamp": "timestamp",
}
_EXPLICIT_TAGS = frozenset(
    {"!", _MAP_TAG, _SEQ_TAG} | {_CORE + t for t in ("str", "int", "float", "bool", "null")}
)
_BOOLEANS = {"yes": True, "true": True, "on": True, "no": False, "false": False, "off": False}
# Longer numbers are refused instead of converted: Python limits int() to 4300 digits, and no
# field of a spec needs more than a handful.
_MAX_NUMBER_LENGTH = 100

_SYNTAX_HINTS = {
    "mapping values are not allowed here": (
        "a value that contains `: ` must be quoted, or the line is indented too far"
    ),
    "found character '\\t' that cannot start any token": (
        "YAML does not allow tabs for indentation; use spaces"
    ),
    "could not find expected ':'": (
        "each key needs a `:` after it; check this line and the one above"
    ),
    "expected <block end>, but found '-'": "check the indentation of this list item",
    "found undefined alias": "aliases are not allowed; write the value out in full",
}


class _Mark(Protocol):
    """Where a YAML event or error is (PyYAML's pure and C marks both have these)."""

    @property
    def line(self) -> int: ...

    @property
    def column(self) -> int: ...


class _Refusal(Exception):
    """Raised inside the composer for YAML features a spec refuses; never leaves this module."""

    def __init__(self, message: str, hint: str | None, mark: _Mark | None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.mark = mark


class _StrictLoader(yaml.SafeLoader):
    """The safe loader, with anchors, aliases, unknown tags and deep nesting refused as composed."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def next_event(self, *, consume: bool = True) -> yaml.Event:
        """The parser's next event (typed; the stubs leave these methods untyped)."""
        if consume:
            event: yaml.Event = self.get_event()  # type: ignore[no-untyped-call]
        else:
            event = self.peek_event()  # type: ignore[no-untyped-call]
        return event

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.next_event(consume=False)
        if isinstance(event, yaml.AliasEvent):
            raise _Refusal(
                f"aliases (`*{event.anchor}`) are not allowed in tau.yaml",
                "write the value out in full",
                event.start_mark,
            )
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise _Refusal(
                f"anchors (`&{anchor}`) are not allowed in tau.yaml",
                "remove the anchor and write each value out in full",
                event.start_mark,
            )
        tag = getattr(event, "tag", None)
        if tag is not None and tag not in _EXPLICIT_TAGS:
            raise _Refusal(
                f"the tag `{_short_tag(tag)}` is not allowed in tau.yaml",
                "remove it; a spec uses plain strings, numbers, booleans, lists and mappings",
                event.start_mark,
            )
        if self._depth >= MAX_DEPTH:
            raise _Refusal(
                f"the document is nested more than {MAX_DEPTH} levels deep",
                "a tau.yaml needs only a few levels; check the indentation",
                event.start_mark,
            )
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise _Refusal(
                f"the file holds more than {MAX_NODES:,} keys, values and list items",
                "a tau.yaml describes a workload in a few dozen lines; "
                "keep data and long lists in the project directory",
                event.start_mark,
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_yaml(data: str | bytes, problems: ProblemCollector) -> Node | None:
    """The document's root node, or None when the text cannot be read (problems say why).

    Problems inside an otherwise readable document (duplicate or non-string keys) are
    reported and the offending entries dropped, so the schema can still check the rest.
    """
    text = _decode(data, problems)
    if text is None:
        return None
    loader: _StrictLoader | None = None
    try:
        # The reader checks for unprintable characters as it is constructed.
        loader = _StrictLoader(text)
        try:
            root = _compose_single_document(loader, problems)
        except ValueError:
            # PyYAML's scanner takes chr() of a \U escape unchecked: past U+10FFFF it raises.
            line, column = _position(loader.get_mark())
            problems.add_at(
                DOCUMENT_PATH,
                line,
                column,
                "a \\U escape in a double-quoted string names no character",
                "Unicode ends at \\U0010FFFF",
            )
            return None
        if root is None:
            return None
        return _convert(root, "", problems)
    except _Refusal as refusal:
        line, column = _position(refusal.mark)
        problems.add_at(DOCUMENT_PATH, line, column, refusal.message, refusal.hint)
    except yaml.MarkedYAMLError as error:
        _report_syntax_error(error, problems)
    except yaml.reader.ReaderError as error:
        _report_reader_error(error, text, problems)
    except yaml.YAMLError as error:  # pragma: no cover - every PyYAML error above is marked
        problems.add_at(DOCUMENT_PATH, 1, 1, f"invalid YAML: {error}")
    finally:
        if loader is not None:
            loader.dispose()
    return None


def _compose_single_document(loader: _StrictLoader, problems: ProblemCollector) -> yaml.Node | None:
    loader.next_event()  # STREAM-START
    if loader.check_event(yaml.StreamEndEvent):
        problems.add_at(
            DOCUMENT_PATH,
            1,
            1,
            "the file is empty",
            "a tau.yaml starts with `schema_version: 1` and `name: …`",
        )
        return None
    root = loader.compose_document()
    if not loader.check_event(yaml.StreamEndEvent):
        event = loader.next_event()
        line, column = _position(event.start_mark)
        problems.add_at(
            DOCUMENT_PATH,
            line,
            column,
            "the file holds more than one YAML document; a second one starts here",
            "a tau.yaml describes one workload: remove this `---` and what follows, "
            "or put it in its own file",
        )
        return None
    return root


def _decode(data: str | bytes, problems: ProblemCollector) -> str | None:
    if isinstance(data, str):
        too_big = len(data) > MAX_FILE_BYTES or (
            4 * len(data) > MAX_FILE_BYTES
            and len(data.encode("utf-8", "surrogatepass")) > MAX_FILE_BYTES
        )
        if too_big:
            _report_too_big(problems)
            return None
        return data.removeprefix("\ufeff")
    if len(data) > MAX_FILE_BYTES:
        _report_too_big(problems)
        return None
    for bom, encoding in (
        (codecs.BOM_UTF32_LE, "UTF-32"),
        (codecs.BOM_UTF32_BE, "UTF-32"),
        (codecs.BOM_UTF16_LE, "UTF-16"),
        (codecs.BOM_UTF16_BE, "UTF-16"),
    ):
        if data.startswith(bom):
            problems.add_at(
                DOCUMENT_PATH,
                1,
                1,
                f"the file is encoded as {encoding}; tau.yaml must be UTF-8",
                "save the file as UTF-8",
            )
            return None
    data = data.removeprefix(codecs.BOM_UTF8)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        line_start = data.rfind(b"\n", 0, error.start) + 1
        column = len(data[line_start : error.start].decode("utf-8", "replace")) + 1
        problems.add_at(
            DOCUMENT_PATH,
            line,
            column,
            f"the file is not valid UTF-8 (byte 0x{data[error.start]:02x} cannot appear here)",
            "save the file as UTF-8",
        )
        return None


def _report_too_big(problems: ProblemCollector) -> None:
    problems.add_at(
        DOCUMENT_PATH,
        1,
        1,
        f"the file is larger than {MAX_FILE_BYTES // 1024} KiB",
        "a tau.yaml describes a workload in a few dozen lines; "
        "keep data and long lists in the project directory",
    )


def _convert(node: yaml.Node, path: str, problems: ProblemCollector) -> Node:
    line, column = _position(node.start_mark)
    if isinstance(node, yaml.ScalarNode):
        return _convert_scalar(node, path, problems)
    if isinstance(node, yaml.SequenceNode):
        if node.tag != _SEQ_TAG:
            raise _Refusal(f"`{_short_tag(node.tag)}` cannot tag a list", None, node.start_mark)
        items = tuple(
            _convert(item, index_path(path, index), problems)
            for index, item in enumerate(node.value)
        )
        return SequenceNode(items, line, column)
    if not isinstance(node, yaml.MappingNode) or node.tag != _MAP_TAG:
        raise _Refusal(f"`{_short_tag(node.tag)}` cannot tag a mapping", None, node.start_mark)
    entries: list[tuple[ScalarNode, Node]] = []
    first_line: dict[str, int] = {}
    for key_node, value_node in node.value:
        key = _mapping_key(key_node, path, problems)
        if key is None:
            continue
        key_path = join_path(path, key.text)
        if key.text in first_line:
            problems.add(
                key_path,
                key,
                f"{quote(key.text)} is given twice, on line {first_line[key.text]} "
                f"and line {key.line}",
                "keep only one of them",
            )
            continue
        first_line[key.text] = key.line
        entries.append((key, _convert(value_node, key_path, problems)))
    return MappingNode(tuple(entries), line, column)


def _mapping_key(node: yaml.Node, path: str, problems: ProblemCollector) -> ScalarNode | None:
    line, column = _position(node.start_mark)
    where = path or DOCUMENT_PATH
    if not isinstance(node, yaml.ScalarNode):
        problems.add_at(where, line, column, "a key must be a string, not a list or a mapping")
        return None
    if node.tag == _MERGE_TAG:
        problems.add_at(
            where,
            line,
            column,
            "merge keys (`<<`) are not allowed in tau.yaml",
            "write the keys out in full",
        )
        return None
    key = _convert_scalar(node, path, problems)
    if key.kind == "invalid":
        return None
    if key.kind != "str":
        problems.add_at(
            where,
            line,
            column,
            f"a key must be a string, but YAML reads {quote(key.text or '~')} as "
            f"{_KIND_NAMES[key.kind]}",
            f'put it in quotes: "{key.text}"',
        )
        return None
    return key


_KIND_NAMES: dict[ScalarKind, str] = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean",
    "null": "null",
    "timestamp": "a date",
    "invalid": "an invalid value",
}


def _convert_scalar(node: yaml.ScalarNode, path: str, problems: ProblemCollector) -> ScalarNode:
    line, column = _position(node.start_mark)
    text: str = node.value
    plain = node.style is None
    if node.tag in (_MAP_TAG, _SEQ_TAG):
        raise _Refusal(f"`{_short_tag(node.tag)}` cannot tag a single value", None, node.start_mark)
    kind = _SCALAR_KINDS.get(node.tag, "str")
    value: ScalarValue
    if kind == "str" or kind == "timestamp":
        value = text
    elif kind == "null":
        value = None
    elif kind == "bool":
        value = _BOOLEANS.get(text.lower())
    elif kind == "int":
        value = _yaml_int(text)
    else:
        value = _yaml_float(text)
    if value is None and kind in ("bool", "int", "float"):
        problems.add_at(
            path or DOCUMENT_PATH,
            line,
            column,
            f"{quote(text)} is not {_KIND_NAMES[kind]} YAML can read",
            "numbers have at most 100 characters" if len(text) > _MAX_NUMBER_LENGTH else None,
        )
        kind = "invalid"
    return ScalarNode(kind, value, text, plain, line, column)


def _yaml_int(text: str) -> int | None:
    """An integer as YAML 1.1 (PyYAML) reads it: ``1_000``, ``0x1f``, ``017``, ``1:30``."""
    digits = text.replace("_", "")
    if len(digits) > _MAX_NUMBER_LENGTH:
        return None
    sign = 1
    if digits[:1] in ("+", "-"):
        sign = -1 if digits[0] == "-" else 1
        digits = digits[1:]
    try:
        if digits.startswith("0b"):
            return sign * int(digits[2:], 2)
        if digits.startswith("0x"):
            return sign * int(digits[2:], 16)
        if digits.startswith("0o"):
            return sign * int(digits[2:], 8)
        if len(digits) > 1 and digits.startswith("0"):
            return sign * int(digits, 8)
        if ":" in digits:
            total = 0
            for part in digits.split(":"):
                total = total * 60 + int(part)
            return sign * total
        return sign * int(digits)
    except ValueError:
        return None


def _yaml_float(text: str) -> float | None:
    """A float as YAML 1.1 (PyYAML) reads it: ``1.5``, ``.5``, ``1e+3``, ``.inf``, ``1:30.5``."""
    digits = text.replace("_", "").lower()
    if len(digits) > _MAX_NUMBER_LENGTH:
        return None
    sign = -1.0 if digits.startswith("-") else 1.0
    if digits[:1] in ("+", "-"):
        digits = digits[1:]
    try:
        if digits == ".inf":
            return sign * math.inf
        if digits == ".nan":
            return math.nan
        if ":" in digits:
            total = 0.0
            for part in digits.split(":"):
                total = total * 60 + float(part)
            return sign * total
        return sign * float(digits)
    except ValueError:
        return None


def _report_syntax_error(error: yaml.MarkedYAMLError, problems: ProblemCollector) -> None:
    line, column = _position(error.problem_mark or error.context_mark)
    problem = error.problem or error.context or "the text is not valid YAML"
    message = f"invalid YAML: {problem}"
    if error.context and error.problem:
        message += f" ({error.context}"
        if error.context_mark is not None and error.context_mark.line + 1 != line:
            message += f" that starts on line {error.context_mark.line + 1}"
        message += ")"
    hint = next((hint for start, hint in _SYNTAX_HINTS.items() if problem.startswith(start)), None)
    problems.add_at(DOCUMENT_PATH, line, column, message, hint)


def _report_reader_error(
    error: yaml.reader.ReaderError, text: str, problems: ProblemCollector
) -> None:
    position = error.position if isinstance(error.position, int) else 0
    position = max(0, min(position, len(text)))
    line = text.count("\n", 0, position) + 1
    column = position - (text.rfind("\n", 0, position) + 1) + 1
    character = error.character
    if isinstance(character, str) and len(character) == 1:
        character = ord(character)
    shown = f"U+{character:04X}" if isinstance(character, int) else "?"
    problems.add_at(
        DOCUMENT_PATH,
        line,
        column,
        f"the file contains a control character ({shown}) that YAML does not allow",
        "remove it; a tau.yaml is plain text",
    )


def _position(mark: _Mark | None) -> tuple[int, int]:
    if mark is None:
        return 1, 1
    return mark.line + 1, mark.column + 1


def _short_tag(tag: str) -> str:
    return "!!" + tag.removeprefix(_CORE) if tag.startswith(_CORE) else tag


def locate(data: str | bytes, path: str) -> tuple[int, int] | None:
    """Line and column (1-based) of ``path`` (``compute.gpus``, ``run.args[0]``) in tau.yaml
    text: the key that holds it, or the nearest enclosing key the file does write (a default
    the file leaves out is about the block it would go in). None when nothing of the path is
    in the file, or the text cannot be read.

    Problems found after the schema (workspace policy, the backend's machines, the project
    zip) are about values too, and a researcher fixes them faster at their line.
    """
    node = load_yaml(data, ProblemCollector())
    found: tuple[int, int] | None = None
    for part in _path_parts(path):
        if isinstance(part, int):
            if not isinstance(node, SequenceNode) or part >= len(node.items):
                break
            node = node.items[part]
            found = (node.line, node.column)
            continue
        if not isinstance(node, MappingNode):
            break
        match = next(((key, value) for key, value in node.entries if key.value == part), None)
        if match is None:
            break
        key, node = match
        found = (key.line, key.column)
    return found


def _path_parts(path: str) -> list[str | int]:
    """``run.args[0]`` → ``["run", "args", 0]``."""
    parts: list[str | int] = []
    for word in path.split("."):
        name, _, rest = word.partition("[")
        if name:
            parts.append(name)
        for index in rest.rstrip("]").split("]["):
            if index.isdigit():
                parts.append(int(index))
    return parts
