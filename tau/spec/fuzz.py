"""``python -m tau.spec.fuzz --seconds 180``: hunt for inputs that break the spec's contract.

The contract, for *any* bytes or text:

* the only exception is ``SpecError``, and every problem has a path, a message and a
  position (line and column ≥ 1);
* a valid spec survives ``to_dict`` → ``from_dict`` exactly, hashes the same after the trip,
  is a fixed point of normalisation (its normal form, written back as YAML, loads to the same
  spec) and, when ``jsonschema`` is installed, is accepted by the exported JSON Schema;
* no input takes long (a slow input is a denial of service on the submission path).

The Hypothesis strategies here are shared with the property tests (``tests/spec``), which
run them briefly; this entry point runs them, plus a fast byte-level mutation fuzzer, for as
long as asked. It exits 1 on the first broken promise and saves the input to ``--crash-dir``.
It is meant for ``make fuzz``, not for the normal test run.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import importlib
import json
import random
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tau.spec import Spec, SpecError, canonical_json, load_spec, spec_hash, validate
from tau.spec.fields import Kind, ListKind, ObjectKind
from tau.spec.samples import (
    ARTICLE_EXAMPLE,
    FULL_EXAMPLE,
    SERVE_EXAMPLE,
    SERVE_FULL_EXAMPLE,
)
from tau.spec.schema import ROOT, json_schema, read_source, spec_from_dict

_EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"


def seed_texts() -> list[str]:
    """Valid specs to start mutating from: the samples (runs and endpoints) and the
    repository's examples."""
    texts = [ARTICLE_EXAMPLE, FULL_EXAMPLE, SERVE_EXAMPLE, SERVE_FULL_EXAMPLE]
    if _EXAMPLES_DIR.is_dir():
        texts.extend(path.read_text("utf-8") for path in sorted(_EXAMPLES_DIR.glob("*/tau.yaml")))
    return texts


SEED_TEXTS = seed_texts()
SEED_DOCUMENTS: list[dict[str, Any]] = [yaml.safe_load(text) for text in SEED_TEXTS]


def _keys_of(kind: Kind[Any]) -> set[str]:
    """Every key a value of ``kind`` can hold: its fields, and those of its list items."""
    if isinstance(kind, ObjectKind):
        found = set(kind.fields)
        for field in kind.fields.values():
            found |= _keys_of(field.kind)
        return found
    if isinstance(kind, ListKind):
        return _keys_of(kind.item)
    return set()


#: Every key of the schema: the blocks' fields and those of list items (secrets, datasets).
FIELD_NAMES = sorted(_keys_of(ROOT))

# Values that sit on the edges of the rules: near-miss spellings, YAML 1.1 surprises,
# bounds, path escapes, reserved names, control characters.
INTERESTING_STRINGS = (
    "16",
    "16000m",
    "0.5",
    "500m",
    "100u",
    "64Gi",
    "64GB",
    "64gi",
    "1e3",
    "-1",
    "2h",
    "1h30m",
    "3600s",
    "90 m",
    "1:30",
    "0x10",
    "010",
    "1_000",
    ".inf",
    ".nan",
    "yes",
    "no",
    "on",
    "~",
    "null",
    "",
    " ",
    "a" * 39,
    "a" * 38,
    "rayjob",
    "job",
    "rayservice",
    "app:deployment",
    "app.deployment",
    "/v1/",
    "preempted",
    "torch>=2.4.0",
    "torch=2.4",
    "-r requirements.txt",
    "train.py",
    "../train.py",
    "/abs/path",
    "C:\\x",
    "~/x",
    "a/../b",
    "python -m pkg 'unclosed",
    "TAU_RUN_ID",
    "tau_x",
    "1BAD",
    "x\ny",
    "x\x00y",
    "\u2028",
    "é",
    "\U0001f600",
    "2024-01-01",
    "<<",
    "=",
    "*alias",
    "&anchor",
    "!tag",
    "ubuntu:22.04",
    "Ubuntu:22.04",
    "latest",
    "007",
    "0",
    "wiki@train",
    "Wiki",
    ".",
    "./",
    "data/wiki",
)

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(INTERESTING_STRINGS),
)
_keys = st.one_of(st.sampled_from(FIELD_NAMES), st.text(max_size=12), st.integers(-3, 3))
json_like_values = st.recursive(
    _scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(_keys, children, max_size=5),
    ),
    max_leaves=12,
)

_YAML_TOKENS = (
    ": ",
    ":",
    "- ",
    "-",
    "  ",
    "    ",
    "\n",
    "\r\n",
    "\t",
    "#",
    "[",
    "]",
    "{",
    "}",
    ",",
    "?",
    "|",
    ">",
    "'",
    '"',
    "&a ",
    "*a",
    "!!str ",
    "!!int ",
    "!!binary ",
    "!foo ",
    "<<",
    "---\n",
    "...\n",
    "%YAML 1.1\n",
    "%TAG ! tag:x,2000:\n",
    "\\x00",
    "\ufeff",
    "\x85",
    "\u2028",
)


@st.composite
def yamlish_texts(draw: st.DrawFn) -> str:
    """Text built from YAML's own punctuation, the schema's keys and edge-case values."""
    pieces = draw(
        st.lists(
            st.one_of(
                st.sampled_from(_YAML_TOKENS),
                st.sampled_from(FIELD_NAMES),
                st.sampled_from(INTERESTING_STRINGS),
                st.text(max_size=8),
            ),
            max_size=60,
        )
    )
    return "".join(pieces)


def _entries(document: Any) -> list[tuple[Any, Any]]:
    """Every (container, key or index) pair inside a document, for picking what to mutate."""
    found: list[tuple[Any, Any]] = []
    stack = [document]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                found.append((node, key))
                stack.append(value)
        elif isinstance(node, list):
            for index, value in enumerate(node):
                found.append((node, index))
                stack.append(value)
    return found


def _typo(word: str, rng: random.Random) -> str:
    if len(word) < 2:
        return word + "x"
    position = rng.randrange(len(word))
    choice = rng.randrange(3)
    if choice == 0:  # drop a letter
        return word[:position] + word[position + 1 :]
    if choice == 1 and position + 1 < len(word):  # swap two letters
        return word[:position] + word[position + 1] + word[position] + word[position + 2 :]
    return word[:position] + rng.choice("aeiosx_") + word[position:]


@st.composite
def mutated_documents(draw: st.DrawFn) -> Any:
    """A valid spec (as data) with one to four mutations: values replaced, keys deleted,
    misspelt or added, containers swapped for scalars and back."""
    document: Any = copy.deepcopy(draw(st.sampled_from(SEED_DOCUMENTS)))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))  # noqa: S311 - test data, not secrets
    for _ in range(draw(st.integers(1, 4))):
        entries = _entries(document)
        if not entries:
            break
        container, key = draw(st.sampled_from(entries))
        action = draw(st.sampled_from(("replace", "replace", "delete", "rename", "insert")))
        if action == "replace":
            container[key] = draw(json_like_values)
        elif action == "delete":
            del container[key]
        elif action == "rename" and isinstance(container, dict) and isinstance(key, str):
            container[_typo(key, rng)] = container.pop(key)
        elif action == "insert" and isinstance(container, dict):
            container[draw(_keys)] = draw(json_like_values)
        elif isinstance(container, list):
            container.insert(key, draw(json_like_values))
    return document


@st.composite
def mutated_spec_texts(draw: st.DrawFn) -> str:
    """A mutated spec written as YAML in a random style, sometimes also damaged as text."""
    document = draw(mutated_documents())
    text = yaml.safe_dump(
        document,
        default_flow_style=draw(st.sampled_from((None, True, False))),
        allow_unicode=draw(st.booleans()),
        sort_keys=False,
        width=draw(st.sampled_from((80, 20, 10_000))),
    )
    if draw(st.booleans()):
        text = draw(damaged_texts(text))
    return text


@st.composite
def damaged_texts(draw: st.DrawFn, text: str) -> str:
    """``text`` with a few edits: characters inserted or deleted, a line doubled or re-indented."""
    for _ in range(draw(st.integers(1, 3))):
        if not text:
            break
        position = draw(st.integers(0, len(text) - 1))
        action = draw(st.sampled_from(("insert", "delete", "double_line", "indent")))
        if action == "insert":
            insertion = draw(st.one_of(st.sampled_from(_YAML_TOKENS), st.text(max_size=4)))
            text = text[:position] + insertion + text[position:]
        elif action == "delete":
            text = text[:position] + text[position + draw(st.integers(1, 8)) :]
        else:
            lines = text.split("\n")
            index = position % len(lines)
            if action == "double_line":
                lines.insert(index, lines[index])
            else:
                lines[index] = " " * draw(st.integers(1, 4)) + lines[index]
            text = "\n".join(lines)
    return text


class _JsonLikeLoader(yaml.SafeLoader):
    """YAML as an editor's JSON Schema check sees it: no dates, no ``=`` value tag."""


_JsonLikeLoader.yaml_implicit_resolvers = {
    first: [
        (tag, pattern)
        for tag, pattern in resolvers
        if tag not in ("tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:value")
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _schema_validator() -> Callable[[Any], list[str]] | None:
    # Imported by name: jsonschema is optional, and untyped where it is installed.
    try:
        jsonschema: Any = importlib.import_module("jsonschema")
    except ImportError:  # pragma: no cover - jsonschema is optional
        return None
    validator = jsonschema.Draft202012Validator(json_schema())

    def errors(instance: Any) -> list[str]:
        return [error.message for error in validator.iter_errors(instance)]

    return errors


SCHEMA_ERRORS = _schema_validator()


class ContractBroken(AssertionError):
    """The spec package broke one of its promises (not an assert: ``python -O`` keeps it)."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ContractBroken(message)


def check_invariants(source: str | bytes) -> Spec | None:
    """Everything the package promises about ``source``; ContractBroken if a promise breaks.

    Any exception other than SpecError propagates: that is a broken promise too.
    """
    failure: SpecError | None = None
    try:
        spec = load_spec(source)
    except SpecError as error:
        failure = error
    if failure is not None:
        _require(bool(failure.errors), "SpecError without problems")
        for problem in failure.errors:
            _require(bool(problem.path), f"problem without a path: {problem!r}")
            _require(bool(problem.message), f"problem without a message: {problem!r}")
            _require(problem.line >= 1, f"line < 1: {problem!r}")
            _require(problem.column >= 1, f"column < 1: {problem!r}")
        _require(validate(source) == failure.errors, "validate() disagrees with load_spec()")
        return None
    _require(validate(source) == [], "validate() disagrees with load_spec()")
    data = spec.to_dict()
    _require(json.loads(canonical_json(data)) == data, "the normal form is not plain JSON")
    again = spec_from_dict(data)
    _require(again == spec, "from_dict(to_dict()) changed the spec")
    _require(again.to_dict() == data, "to_dict() is not stable")
    _require(spec_hash(again) == spec_hash(spec), "the hash changed over a round trip")
    _require(load_spec(yaml.safe_dump(data)) == spec, "the normal form is not a fixed point")
    if SCHEMA_ERRORS is not None:
        # The JSON Schema is TauGrid's own v1: a file in another dialect is held to it
        # through its normal form, which is always a v1 document.
        if read_source(source).dialect == "tau":
            instance = yaml.load(source, Loader=_JsonLikeLoader)  # noqa: S506 - a safe loader
            problems = SCHEMA_ERRORS(instance)
            _require(not problems, f"a valid spec is rejected by the JSON Schema: {problems}")
        problems = SCHEMA_ERRORS(data)
        _require(not problems, f"a normal form is rejected by the JSON Schema: {problems}")
    return spec


# --------------------------------------------------------------------------- the fuzz run


def _byte_mutations(rng: random.Random, seeds: Sequence[bytes]) -> bytes:
    data = bytearray(rng.choice(seeds))
    for _ in range(rng.randint(1, 8)):
        action = rng.randrange(5)
        position = rng.randrange(len(data) + 1)
        if action == 0 and data:  # flip a bit
            index = min(position, len(data) - 1)
            data[index] ^= 1 << rng.randrange(8)
        elif action == 1:  # insert a token
            token = rng.choice(_YAML_TOKENS + INTERESTING_STRINGS).encode("utf-8", "surrogatepass")
            data[position:position] = token
        elif action == 2:  # delete a few bytes
            del data[position : position + rng.randint(1, 16)]
        elif action == 3:  # splice in part of another seed
            other = rng.choice(seeds)
            start = rng.randrange(len(other))
            data[position:position] = other[start : start + rng.randint(1, 64)]
        else:  # random bytes
            data[position:position] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
    return bytes(data)


class _Failure(Exception):
    def __init__(self, source: str | bytes, error: BaseException) -> None:
        super().__init__(str(error))
        self.source = source
        self.error = error


def _checked(source: str | bytes, slow_seconds: float) -> None:
    started = time.perf_counter()
    try:
        check_invariants(source)
    except Exception as error:  # every exception is a finding here
        raise _Failure(source, error) from error
    elapsed = time.perf_counter() - started
    if elapsed > slow_seconds:
        # A busy machine can stall any one call; only an input that is slow every time counts.
        for _ in range(2):
            started = time.perf_counter()
            check_invariants(source)
            elapsed = min(elapsed, time.perf_counter() - started)
        if elapsed > slow_seconds:
            slow = ContractBroken(f"took {elapsed:.2f}s (limit {slow_seconds}s)")
            raise _Failure(source, slow)


def _hypothesis_round(strategy: st.SearchStrategy[Any], examples: int, slow_seconds: float) -> None:
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=False,
        phases=(Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )
    @given(strategy)
    def round_(source: str | bytes) -> None:
        _checked(source, slow_seconds)

    round_()


def _save(crash_dir: Path, failure: _Failure) -> Path:
    crash_dir.mkdir(parents=True, exist_ok=True)
    data = (
        failure.source
        if isinstance(failure.source, bytes)
        else failure.source.encode("utf-8", "surrogatepass")
    )
    path = crash_dir / f"crash-{hashlib.sha256(data).hexdigest()[:16]}.yaml"
    path.write_bytes(data)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tau.spec.fuzz", description=__doc__)
    parser.add_argument("--seconds", type=float, default=180.0, help="how long to run")
    parser.add_argument("--seed", type=int, default=None, help="seed of the byte mutator")
    parser.add_argument(
        "--crash-dir", type=Path, default=Path("var/fuzz"), help="where failing inputs go"
    )
    parser.add_argument(
        "--slow-seconds", type=float, default=2.0, help="an input slower than this fails"
    )
    arguments = parser.parse_args(argv)
    seed = arguments.seed if arguments.seed is not None else random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)  # noqa: S311 - test data, not secrets
    seeds = [text.encode("utf-8") for text in SEED_TEXTS]
    strategies: list[tuple[str, st.SearchStrategy[Any]]] = [
        ("mutated specs", mutated_spec_texts()),
        ("YAML-ish text", yamlish_texts()),
        ("arbitrary text", st.text(max_size=400)),
        ("arbitrary bytes", st.binary(max_size=400)),
    ]
    deadline = time.monotonic() + arguments.seconds
    counts = {"hypothesis rounds": 0, "byte mutations": 0}
    print(f"fuzzing tau.spec for {arguments.seconds:g}s (byte mutator seed {seed})", flush=True)
    try:
        while time.monotonic() < deadline:
            for _label, strategy in strategies:
                if time.monotonic() >= deadline:
                    break
                _hypothesis_round(strategy, 100, arguments.slow_seconds)
                counts["hypothesis rounds"] += 1
            burst_end = min(deadline, time.monotonic() + 2.0)
            while time.monotonic() < burst_end:
                _checked(_byte_mutations(rng, seeds), arguments.slow_seconds)
                counts["byte mutations"] += 1
    except _Failure as failure:
        saved = _save(arguments.crash_dir, failure)
        print("FAILED: the spec package broke its contract on this input:", file=sys.stderr)
        print(repr(failure.source)[:2000], file=sys.stderr)
        traceback.print_exception(failure.error, file=sys.stderr)
        print(f"input saved to {saved}", file=sys.stderr)
        return 1
    except Exception:  # Hypothesis itself gave up (a flaky example): still a finding
        print("FAILED: Hypothesis stopped with an error:", file=sys.stderr)
        traceback.print_exc()
        return 1
    print(
        f"ok: {counts['hypothesis rounds']} Hypothesis rounds of 100 examples, "
        f"{counts['byte mutations']} byte mutations, no contract broken"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
