"""The YAML layer: positions, and the parts of YAML a spec refuses."""

from __future__ import annotations

import difflib
import time
from typing import Any

import pytest
import yaml

from tau.spec import MAX_DEPTH, MAX_FILE_BYTES, SpecError, load_spec, loader, validate
from tau.spec.loader import MAX_NODES
from tau.spec.problems import MAX_PROBLEMS
from tau.spec.samples import ARTICLE_EXAMPLE

from .support import MINIMAL, only_problem, problems, spec


def test_positions_are_one_based_line_and_column_of_the_value() -> None:
    problem = only_problem(spec("compute:\n  gpus: -1\n"))
    assert (problem.path, problem.line, problem.column) == ("compute.gpus", 6, 9)


def test_aliases_and_anchors_are_refused() -> None:
    problem = only_problem(MINIMAL + "compute: &c {gpus: 1}\nqueue: *c\n")
    assert "anchors (`&c`) are not allowed" in problem.message
    assert (problem.line, problem.column) == (5, 10)


def test_an_alias_without_its_anchor_is_refused() -> None:
    problem = only_problem(MINIMAL + "queue: *somewhere\n")
    assert "aliases (`*somewhere`) are not allowed" in problem.message


def test_a_billion_laughs_is_refused_at_once() -> None:
    laughs = ['lol0: &lol0 ["lol"]']
    for level in range(1, 30):
        previous = f"*lol{level - 1}"
        laughs.append(f"lol{level}: &lol{level} [{', '.join([previous] * 10)}]")
    started = time.perf_counter()
    problem = only_problem("\n".join(laughs) + "\n")
    assert "not allowed" in problem.message
    assert time.perf_counter() - started < 1.0


def test_merge_keys_are_refused() -> None:
    found = problems(spec("compute:\n  <<: {gpus: 1}\n"))
    assert [(p.path, p.message) for p in found] == [
        ("compute", "merge keys (`<<`) are not allowed in tau.yaml")
    ]


@pytest.mark.parametrize(
    "tagged",
    [
        "!!python/object:os.system echo",
        "!!binary aGVsbG8=",
        "!custom value",
        "!!timestamp 2024-01-01",
    ],
)
def test_tags_other_than_the_core_ones_are_refused(tagged: str) -> None:
    problem = only_problem(spec(f"experiment:\n  project: {tagged}\n"))
    assert "is not allowed in tau.yaml" in problem.message
    assert problem.hint is not None


def test_core_tags_are_accepted() -> None:
    text = spec("experiment:\n  project: !!str 2024\n  group: !!str yes\n")
    assert load_spec(text).experiment.project == "2024"


def test_a_core_tag_on_a_value_it_cannot_read_is_one_problem() -> None:
    problem = only_problem(spec("compute:\n  gpus: !!int lots\n"))
    assert problem.path == "compute.gpus"
    assert problem.message == "`lots` is not an integer YAML can read"


def test_duplicate_keys_name_both_lines() -> None:
    text = spec("compute:\n  gpus: 1\n  workers: 2\n  gpus: 4\n")
    problem = only_problem(text)
    assert problem.path == "compute.gpus"
    assert problem.message == "`gpus` is given twice, on line 6 and line 8"
    assert (problem.line, problem.column) == (8, 3)


def test_duplicate_top_level_keys_are_reported() -> None:
    problem = only_problem(MINIMAL + "name: other\n")
    assert problem.message == "`name` is given twice, on line 2 and line 5"


@pytest.mark.parametrize(("key", "reading"), [("1", "an integer"), ("on", "a boolean")])
def test_keys_must_be_strings(key: str, reading: str) -> None:
    problem = only_problem(spec(f"runtime:\n  env:\n    {key}: x\n"))
    assert problem.message == f"a key must be a string, but YAML reads `{key}` as {reading}"
    assert problem.hint == f'put it in quotes: "{key}"'


def test_complex_keys_are_refused() -> None:
    problem = only_problem(spec("runtime:\n  env:\n    ? [a, b]\n    : x\n"))
    assert problem.message == "a key must be a string, not a list or a mapping"


def test_multiple_documents_are_refused() -> None:
    problem = only_problem(ARTICLE_EXAMPLE + "---\nschema_version: 1\n")
    assert "more than one YAML document" in problem.message
    assert problem.line == ARTICLE_EXAMPLE.count("\n") + 1


def test_one_explicit_document_is_fine() -> None:
    assert validate("---\n" + ARTICLE_EXAMPLE + "...\n") == []


def test_huge_input_is_refused_before_parsing() -> None:
    text = ARTICLE_EXAMPLE + "#" * MAX_FILE_BYTES
    for source in (text, text.encode("utf-8")):
        started = time.perf_counter()
        problem = only_problem(source)
        assert "larger than 256 KiB" in problem.message
        assert time.perf_counter() - started < 0.1


def test_the_size_limit_counts_utf8_bytes() -> None:
    text = "# " + "é" * (MAX_FILE_BYTES // 2) + "\n" + ARTICLE_EXAMPLE
    assert "larger than" in only_problem(text).message


def test_invalid_utf8_is_located() -> None:
    problem = only_problem(b"schema_version: 1\nname: d\xe9mo\n")
    assert problem.message == "the file is not valid UTF-8 (byte 0xe9 cannot appear here)"
    assert (problem.line, problem.column) == (2, 8)
    assert problem.hint == "save the file as UTF-8"


def test_utf16_is_refused_with_a_hint() -> None:
    problem = only_problem(ARTICLE_EXAMPLE.encode("utf-16"))
    assert problem.message == "the file is encoded as UTF-16; tau.yaml must be UTF-8"


def test_a_utf8_byte_order_mark_is_accepted() -> None:
    assert validate(b"\xef\xbb\xbf" + ARTICLE_EXAMPLE.encode()) == []
    assert validate("\ufeff" + ARTICLE_EXAMPLE) == []


def test_control_characters_are_refused_with_their_position() -> None:
    problem = only_problem("schema_version: 1\nname: a\x00b\n")
    assert (
        problem.message == "the file contains a control character (U+0000) that YAML does not allow"
    )
    assert (problem.line, problem.column) == (2, 8)


def test_nesting_is_bounded() -> None:
    deep = "experiment:\n  project: " + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + "\n"
    problem = only_problem(spec(deep))
    assert f"nested more than {MAX_DEPTH} levels deep" in problem.message


def test_very_deep_nesting_is_refused_without_a_recursion_error() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    problem = only_problem(deep)
    assert "nested more than" in problem.message


def test_syntax_errors_point_at_the_problem() -> None:
    text = MINIMAL + "compute:\n  gpus: 1\n   workers: 2\n"
    problem = only_problem(text)
    assert problem.message.startswith("invalid YAML: mapping values are not allowed here")
    assert (problem.line, problem.column) == (7, 11)
    assert problem.hint is not None


def test_tabs_get_a_hint() -> None:
    problem = only_problem(MINIMAL + "compute:\n\tgpus: 1\n")
    assert problem.hint == "YAML does not allow tabs for indentation; use spaces"


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n", "~\n", "{}\n"])
def test_empty_documents_say_how_to_start(text: str) -> None:
    problem = only_problem(text)
    assert problem.message in ("the file is empty", "the file has no settings")
    assert problem.hint == "a tau.yaml starts with `schema_version: 1` and `name: …`"


@pytest.mark.parametrize("text", ["- a\n- b\n", "just text\n", "42\n"])
def test_the_document_must_be_a_mapping(text: str) -> None:
    problem = only_problem(text)
    assert problem.message.startswith("expected a mapping of keys such as `schema_version`")


@pytest.mark.parametrize(
    "source",
    [b"\x00\x01\x02", b"\xff" * 10, b"\x80abc", "\ud800".encode("utf-8", "surrogatepass")],
)
def test_binary_garbage_is_only_ever_a_spec_error(source: bytes) -> None:
    with pytest.raises(SpecError) as raised:
        load_spec(source)
    assert raised.value.errors


def test_long_numbers_are_refused_not_converted() -> None:
    problem = only_problem(spec("compute:\n  gpus: " + "9" * 5000 + "\n"))
    assert problem.path == "compute.gpus"
    assert "not an integer YAML can read" in problem.message


def test_too_many_problems_are_cut_short() -> None:
    keys = "".join(f"  unknown{index}: 1\n" for index in range(300))
    found = problems(spec("compute:\n" + keys))
    assert len(found) == 101
    assert found[-1].message == "200 more problems not shown (only the first 100 are listed)"


def the_attack_of_issue_30() -> str:
    """A 260 KB tau.yaml of 20,000 unknown keys (4 s of CPU per submission before reading
    was bounded, and 101 problems, each with a near-name search)."""
    return MINIMAL + "".join(f"k{i:05d}: 1234\n" for i in range(20_000))


def test_thousands_of_keys_are_refused_after_reading_a_bounded_part(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What reading and checking cost is counted in nodes composed and near-name searches,
    not in seconds: both stop at a bound however many keys follow."""
    composed = []
    original = loader._StrictLoader.compose_node

    def counting(self: Any, parent: Any, index: Any) -> Any:
        composed.append(1)
        return original(self, parent, index)

    monkeypatch.setattr(loader._StrictLoader, "compose_node", counting)
    text = the_attack_of_issue_30()
    assert len(text.encode()) < MAX_FILE_BYTES
    problem = only_problem(text)
    assert problem.message == "the file holds more than 4,000 keys, values and list items"
    assert problem.hint is not None
    assert "keep data and long lists in the project directory" in problem.hint
    # At the node past the limit: MINIMAL holds 9, each key line 2, so the 1,996th key's value.
    assert (problem.line, problem.column) == (4 + 1_996, 9)
    assert len(composed) == MAX_NODES + 1


def test_unknown_keys_past_the_shown_problems_cost_no_near_name_search(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    searches = []
    original = difflib.get_close_matches

    def counting(*args: Any, **kwargs: Any) -> Any:
        searches.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(difflib, "get_close_matches", counting)
    found = problems(MINIMAL + "".join(f"unknown{i}: 1\n" for i in range(1_500)))
    assert len(found) == MAX_PROBLEMS + 1
    assert found[-1].message == "1400 more problems not shown (only the first 100 are listed)"
    assert len(searches) == MAX_PROBLEMS


def test_every_list_at_its_longest_stays_within_the_node_limit() -> None:
    """The bound refuses no spec the schema accepts."""
    lines = ["run:", "  entrypoint: train.py", "  args:"]
    lines += [f"    - --a{i}" for i in range(256)]
    lines += ["runtime:", "  pip:", *[f"    - pkg{i}" for i in range(128)]]
    lines += ["  env:", *[f"    V{i}: x" for i in range(64)]]
    lines += ["  secrets:", *[f"    - {{env: S{i}, secret: s{i}, key: k}}" for i in range(64)]]
    lines += ["inputs:", "  datasets:"]
    lines += [f"    - {{name: d{i}, version: v{i}, path: data/d{i}}}" for i in range(32)]
    lines += ["outputs:", "  artifacts:", *[f"    - out{i}/*" for i in range(64)]]
    lines += ["experiment:", "  project: p", "  tags:", *[f"    - t{i}" for i in range(32)]]
    text = "schema_version: 1\nname: longest\n" + "\n".join(lines) + "\n"
    assert validate(text) == []
    composed = yaml.compose(text)
    assert composed is not None
    assert _nodes(composed) < MAX_NODES / 3


def _nodes(node: yaml.Node) -> int:
    if isinstance(node, yaml.MappingNode):
        return 1 + sum(_nodes(key) + _nodes(value) for key, value in node.value)
    if isinstance(node, yaml.SequenceNode):
        return 1 + sum(_nodes(item) for item in node.value)
    return 1


def test_an_escape_past_the_last_unicode_character_is_a_problem_not_a_crash() -> None:
    """Found by the fuzzer: PyYAML's scanner raised ValueError (chr() out of range)."""
    found = problems('schema_version: 1\nname: demo\nrun:\n  entrypoint: "\\U00110000"\n')
    assert [(p.line, p.message) for p in found] == [
        (4, "a \\U escape in a double-quoted string names no character")
    ]
