"""``inputs.datasets``, ``outputs.dataset`` and ``outputs.model`` (issue 33): what they
normalise to, the words of each refusal, and the hashes of specs that do not use them."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest
import yaml

from tau.spec import (
    DatasetInput,
    Inputs,
    OutputAsset,
    json_schema,
    load_spec,
    spec_from_dict,
    spec_hash,
)
from tau.spec.samples import ARTICLE_EXAMPLE, FULL_EXAMPLE

from .support import MINIMAL, line_of, only_problem, problems, spec


def _with(inputs: str = "", outputs: str = "") -> str:
    """The minimal spec plus an ``inputs`` and an ``outputs`` block (their bodies, dedented)."""
    text = spec()
    if inputs:
        text += "inputs:\n" + textwrap.indent(textwrap.dedent(inputs), "  ")
    if outputs:
        text += "outputs:\n" + textwrap.indent(textwrap.dedent(outputs), "  ")
    return text


# --------------------------------------------------------------------------- valid values


def test_datasets_parse_in_the_order_written_with_their_defaults() -> None:
    loaded = load_spec(
        _with(
            """\
            datasets:
              - name: wiki
              - {name: books, version: 3, path: ./corpora//books/}
              - {name: code, version: train}
            """
        )
    )
    assert loaded.inputs == Inputs(
        (
            DatasetInput(name="wiki", version="latest", path="wiki"),
            DatasetInput(name="books", version="3", path="corpora/books"),
            DatasetInput(name="code", version="train", path="code"),
        ),
        (),
    )


def test_two_versions_of_one_dataset_are_read_in_two_folders() -> None:
    loaded = load_spec(
        _with(
            """\
            datasets:
              - {name: wiki, version: 1, path: before}
              - {name: wiki, version: 2, path: after}
            """
        )
    )
    assert [(item.version, item.path) for item in loaded.inputs.datasets] == [
        ("1", "before"),
        ("2", "after"),
    ]


def test_outputs_parse_to_assets_and_are_unset_by_default() -> None:
    loaded = load_spec(
        _with(
            outputs="""\
            dataset: {name: wiki-tokenized, path: tokenized/}
            model: {name: tiny-gpt, path: ./model}
            """
        )
    )
    assert loaded.outputs.dataset == OutputAsset(name="wiki-tokenized", path="tokenized")
    assert loaded.outputs.model == OutputAsset(name="tiny-gpt", path="model")
    plain = load_spec(spec())
    assert (plain.inputs, plain.outputs.dataset, plain.outputs.model) == (
        Inputs((), ()),
        None,
        None,
    )


@pytest.mark.parametrize(
    ("written", "version"),
    [
        ("3", "3"),
        ("'3'", "3"),
        ("999999999", "999999999"),
        ("train", "train"),
        ("v1.2_rc-1", "v1.2_rc-1"),
        ("'1.10'", "1.10"),
        ("latest", "latest"),
    ],
)
def test_versions_are_numbers_or_aliases_kept_as_text(written: str, version: str) -> None:
    loaded = load_spec(_with(f"datasets: [{{name: wiki, version: {written}}}]\n"))
    assert loaded.inputs.datasets[0].version == version


@pytest.mark.parametrize(
    "inputs",
    ["", "inputs:\n", "inputs: {}\n", "inputs:\n  datasets:\n", "inputs:\n  datasets: []\n"],
)
def test_no_datasets_is_the_normal_form_without_inputs(inputs: str) -> None:
    loaded = load_spec(spec(inputs))
    assert loaded.inputs == Inputs((), ())
    assert "inputs" not in loaded.to_dict()
    assert spec_hash(loaded) == spec_hash(load_spec(spec()))


def test_the_normal_form_writes_every_default_and_round_trips() -> None:
    loaded = load_spec(
        _with(
            "datasets: [{name: wiki, version: 3}, {name: books, path: corpora/books/}]\n",
            "dataset: {name: wiki-tokenized, path: tokenized/}\nmodel: {name: tiny-gpt, path: m}\n",
        )
    )
    data = loaded.to_dict()
    assert data["inputs"] == {
        "datasets": [
            {"name": "wiki", "version": "3", "path": "wiki"},
            {"name": "books", "version": "latest", "path": "corpora/books"},
        ]
    }
    assert data["outputs"] == {
        "metrics_file": "metrics.jsonl",
        "artifacts": [],
        "dataset": {"name": "wiki-tokenized", "path": "tokenized"},
        "model": {"name": "tiny-gpt", "path": "m"},
    }
    restored = spec_from_dict(json.loads(json.dumps(data)))
    assert restored == loaded
    assert spec_hash(restored) == spec_hash(loaded)
    assert load_spec(yaml.safe_dump(data)) == loaded


def test_equal_meanings_hash_the_same_and_other_versions_do_not() -> None:
    def hashed(datasets: str) -> str:
        return spec_hash(load_spec(_with(f"datasets: {datasets}\n")))

    assert hashed("[{name: wiki}]") == hashed("[{name: wiki, version: latest, path: wiki/}]")
    assert hashed("[{name: wiki, version: 3}]") == hashed("[{name: wiki, version: '3'}]")
    assert hashed("[{name: wiki, version: 3}]") != hashed("[{name: wiki, version: 4}]")
    assert hashed("[{name: wiki}]") != hashed("[{name: wiki, path: w}]")


def test_the_full_sample_uses_the_data_fields() -> None:
    loaded = load_spec(FULL_EXAMPLE)
    assert [dataset.version for dataset in loaded.inputs.datasets] == ["train", "3"]
    assert loaded.outputs.dataset is not None
    assert loaded.outputs.model == OutputAsset(name="resnet50-vision", path="model")


# ------------------------------------------------------------------- specs from before them

#: Hashes computed before these fields existed: specs that do not use them keep them, as the
#: hashes stored with existing runs (and the golden render files) say.
EVERY_OLD_BLOCK = """\
schema_version: 1
name: every-old-block
run:
  entrypoint: train.py
compute:
  cpus: 4
  memory: 16Gi
  limits: {memory: 32Gi}
  head: {cpus: 1, memory: 4Gi}
outputs:
  metrics_file: logs/metrics.jsonl
  artifacts: [model/**]
experiment:
  project: vision
  name: resnet
storage:
  data_pvc: training-data
execution:
  launcher: ray-tune
  metric: val_loss
  configs: {lr: [0.001, 0.01]}
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (MINIMAL, "aa4af48dd6616adf542342d3477d714c1fd153595f0f9585f69adce07fdd3a3b"),
        (ARTICLE_EXAMPLE, "5c62bd5b7567f8437de449171b742f2f0b7fd181c39d32e8736c9a64797edb10"),
        (EVERY_OLD_BLOCK, "3c2af3b7349bf1aeb564950406a0f767bb32dbd0c4bfa3613a90bdd242cbba45"),
    ],
)
def test_specs_without_the_new_keys_hash_as_before(text: str, expected: str) -> None:
    loaded = load_spec(text)
    assert spec_hash(loaded) == expected
    data = loaded.to_dict()
    assert "inputs" not in data
    assert set(data["outputs"]) == {"metrics_file", "artifacts"}


# ------------------------------------------------------------------------------- refusals


def _datasets(*items: str) -> str:
    return _with("datasets:\n" + "".join(f"  - {item}\n" for item in items))


LOWER_CASE = "use lower-case letters, digits, `.`, `_` and `-`, starting with a letter or a digit"
APART = "give each dataset a folder of its own under TAU_DATA_DIR with `path`, none inside another"

REFUSED = [
    (
        _datasets("{name: Wiki_Data}"),
        "inputs.datasets[0].name",
        f"`Wiki_Data` is not a valid dataset name: {LOWER_CASE}",
        "try `wiki_data`",
    ),
    (
        _datasets("{name: -wiki}"),
        "inputs.datasets[0].name",
        f"`-wiki` is not a valid dataset name: {LOWER_CASE}",
        "try `wiki`",
    ),
    (
        _datasets("{name: " + "w" * 64 + "}"),
        "inputs.datasets[0].name",
        "is 64 characters long; at most 63 are allowed",
        None,
    ),
    (
        _datasets("{version: 3}"),
        "inputs.datasets[0].name",
        "missing required key `name`",
        "add `name: wiki`",
    ),
    (
        _datasets("{name: wiki}", "{name: wiki, version: Train}"),
        "inputs.datasets[1].version",
        "`Train` is neither a version number nor an alias",
        "aliases are lower-case: `train`",
    ),
    (
        _datasets("{name: wiki, version: 'wiki@train'}"),
        "inputs.datasets[0].version",
        "`wiki@train` is neither a version number nor an alias",
        "write only what follows `@` here, and the dataset's name in `name`",
    ),
    (
        _datasets("{name: wiki, version: 0}"),
        "inputs.datasets[0].version",
        "there is no version 0: versions are numbered from 1",
        "name a version the dataset has, or leave `version` out for the newest one",
    ),
    (
        _datasets("{name: wiki, version: '007'}"),
        "inputs.datasets[0].version",
        "the version number `007` has leading zeros",
        "write `7`",
    ),
    (
        _datasets("{name: wiki, version: '1234567890'}"),
        "inputs.datasets[0].version",
        "`1234567890` is not a version number: they have at most 9 digits",
        "name a version the dataset has, or leave `version` out for the newest one",
    ),
    (
        _datasets("{name: wiki, version: 0x10}"),
        "inputs.datasets[0].version",
        "write version numbers in plain decimal digits, not `0x10`",
        "YAML readers disagree about forms like `0x10` and `1_000`; this one means 16",
    ),
    (
        _datasets("{name: wiki, version: 1.5}"),
        "inputs.datasets[0].version",
        "expected a version number or an alias, got the number `1.5`",
        'YAML reads `1.5` as a number; put it in quotes: "1.5"',
    ),
    (
        _datasets("{name: wiki}", "{name: books, path: /data/books}"),
        "inputs.datasets[1].path",
        "the dataset path `/data/books` is absolute; it must be relative",
        "write a folder relative to `TAU_DATA_DIR`, e.g. `wiki`",
    ),
    (
        _datasets("{name: wiki}", "{name: books, path: ../books}"),
        "inputs.datasets[1].path",
        "the dataset path `../books` uses `..`; it must stay inside its directory",
        "write a folder relative to `TAU_DATA_DIR`, e.g. `wiki`",
    ),
    (
        _datasets("{name: wiki, path: 'corpora\\wiki'}"),
        "inputs.datasets[0].path",
        "the dataset path `corpora\\wiki` uses `\\`; separate directories with `/`",
        "write a folder relative to `TAU_DATA_DIR`, e.g. `wiki`",
    ),
    (
        _datasets("{name: wiki, path: ./}"),
        "inputs.datasets[0].path",
        "`./` is the whole of `TAU_DATA_DIR`; name a folder inside it",
        "write a folder relative to `TAU_DATA_DIR`, e.g. `wiki`",
    ),
    (
        _datasets("{name: wiki, version: 2}", "{name: wiki, version: 2, path: wiki2}"),
        "inputs.datasets[1].name",
        "`wiki@2` is listed twice (also item 1 of the list)",
        "remove one of them",
    ),
    (
        _datasets("{name: wiki, path: corpus}", "{name: books, path: corpus/}"),
        "inputs.datasets[1].path",
        "the path `corpus` is taken by item 1 (`wiki`)",
        APART,
    ),
    (
        _datasets("{name: wiki, path: corpora}", "{name: books, path: corpora/books}"),
        "inputs.datasets[1].path",
        "the path `corpora/books` is inside the folder of item 1 (`wiki`), `corpora`",
        APART,
    ),
    (
        _datasets("{name: wiki, path: corpora/wiki}", "{name: corpora}"),
        "inputs.datasets[1].path",
        "the path `corpora` (the dataset's name, as there is no `path`) holds the folder of "
        "item 1 (`wiki`), `corpora/wiki`",
        APART,
    ),
    (
        _datasets("wiki@train"),
        "inputs.datasets[0]",
        "expected a dataset ({name, version, path}), got the string `wiki@train`",
        "write `{name: wiki, version: train}`",
    ),
    (
        _datasets("{name: wiki, mount: data}"),
        "inputs.datasets[0].mount",
        "unknown key `mount`",
        "did you mean `path`?",
    ),
    (
        _with("datasets: wiki\n"),
        "inputs.datasets",
        "expected a list of datasets ({name, version, path}), got the string `wiki`",
        "write a list: [{name: wiki, version: train}], or one `- item` per line",
    ),
    (
        _datasets(*(f"{{name: d{index}}}" for index in range(33))),
        "inputs.datasets",
        "has 33 items; at most 32 are allowed",
        None,
    ),
    (
        _with(outputs="dataset: {path: tokenized}\n"),
        "outputs.dataset.name",
        "missing required key `name`",
        "add `name: wiki-tokenized`",
    ),
    (
        _with(outputs="dataset: {name: Tokenized Wiki, path: tokenized}\n"),
        "outputs.dataset.name",
        f"`Tokenized Wiki` is not a valid dataset name: {LOWER_CASE}",
        "try `tokenized-wiki`",
    ),
    (
        _with(outputs="dataset: {name: wiki-tokenized}\n"),
        "outputs.dataset.path",
        "missing required key `path`",
        "add `path: tokenized`",
    ),
    (
        _with(outputs="dataset: {name: wiki-tokenized, path: /out/tokenized}\n"),
        "outputs.dataset.path",
        "the dataset folder `/out/tokenized` is absolute; it must be relative",
        "write a folder relative to `TAU_OUTPUT_DIR`, e.g. `tokenized`",
    ),
    (
        _with(outputs="model: {name: tiny-gpt, path: .}\n"),
        "outputs.model.path",
        "`.` is the whole of `TAU_OUTPUT_DIR`; name a folder inside it",
        "write a folder relative to `TAU_OUTPUT_DIR`, e.g. `model`",
    ),
    (
        _with(outputs="model: {name: tiny-gpt, path: ''}\n"),
        "outputs.model.path",
        "an empty path is the whole of `TAU_OUTPUT_DIR`; name a folder inside it",
        "write a folder relative to `TAU_OUTPUT_DIR`, e.g. `model`",
    ),
    (
        _with(outputs="model: {name: tiny-gpt, path: ../model}\n"),
        "outputs.model.path",
        "the model folder `../model` uses `..`; it must stay inside its directory",
        "write a folder relative to `TAU_OUTPUT_DIR`, e.g. `model`",
    ),
    (
        _with(outputs="model: tiny-gpt\n"),
        "outputs.model",
        "expected a model to make ({name, path}), got the string `tiny-gpt`",
        "put the keys of `outputs.model` on the lines below it, indented",
    ),
    (
        _with(outputs="dataset: {name: d, path: out}\nmodel: {name: m, path: out/}\n"),
        "outputs.model.path",
        "the model's folder `out` is also the dataset's",
        "give the dataset and the model folders of their own under TAU_OUTPUT_DIR",
    ),
    (
        _with(outputs="dataset: {name: d, path: out/data}\nmodel: {name: m, path: out}\n"),
        "outputs.model.path",
        "the model's folder `out` holds the dataset's, `out/data`",
        "give the dataset and the model folders of their own under TAU_OUTPUT_DIR",
    ),
    (
        _with(outputs="datasets: {name: d, path: out}\n"),
        "outputs.datasets",
        "unknown key `datasets`",
        "did you mean `dataset`?",
    ),
    (
        spec("datasets: [{name: wiki}]\n"),
        "datasets",
        "unknown key `datasets`",
        "`datasets` belongs in the `inputs` block",
    ),
]


@pytest.mark.parametrize(
    ("text", "path", "message", "hint"),
    REFUSED,
    ids=[f"{index}-{case[1]}" for index, case in enumerate(REFUSED)],
)
def test_each_mistake_is_one_problem_at_its_key(
    text: str, path: str, message: str, hint: str | None
) -> None:
    problem = only_problem(text)
    assert (problem.path, problem.message, problem.hint) == (path, message, hint)


def _at(text: str, needle: str) -> tuple[int, int]:
    """Line and column (1-based) of ``needle``'s first character on its first line."""
    line = line_of(text, needle)
    return line, text.splitlines()[line - 1].index(needle) + 1


def test_a_clash_points_at_the_later_item_where_it_is_written() -> None:
    text = _datasets("{name: wiki, path: corpus}", "{name: books,\n      path: corpus/}")
    problem = only_problem(text)
    assert (problem.path, problem.line, problem.column) == (
        "inputs.datasets[1].path",
        *_at(text, "corpus/"),
    )
    # Without a `path`, at the item.
    implicit = _datasets("{name: a, path: wiki}", "{name: wiki}")
    problem = only_problem(implicit)
    assert (problem.path, problem.line, problem.column) == (
        "inputs.datasets[1].path",
        *_at(implicit, "{name: wiki}"),
    )


def test_every_broken_dataset_is_reported_at_once() -> None:
    text = _datasets(
        "{name: Wiki}",
        "{name: books, version: 0}",
        "{name: code}",
        "{name: code, path: /x}",  # its own problem, not also the repeated name
        "{name: code}",
    )
    assert [problem.path for problem in problems(text)] == [
        "inputs.datasets[0].name",
        "inputs.datasets[1].version",
        "inputs.datasets[3].path",
        "inputs.datasets[4].name",
    ]


# ---------------------------------------------------------------------------- JSON Schema


def _property(schema: dict[str, Any], *names: str) -> dict[str, Any]:
    for name in names:
        if "properties" not in schema:
            (schema,) = [option for option in schema["anyOf"] if "properties" in option]
        schema = schema["properties"][name]
    return schema


def test_the_json_schema_states_the_data_fields() -> None:
    schema = json_schema()
    datasets = _property(schema, "inputs", "datasets")["anyOf"][0]
    assert datasets["maxItems"] == 32
    item = datasets["items"]
    # A catalog asset by name, or (in a pipeline's stage) the stage that makes it.
    assert "required" not in item
    assert item["oneOf"] == [
        {"required": ["name"]},
        {"required": ["from"], "not": {"required": ["version"]}},
    ]
    assert item["properties"]["name"]["pattern"] == "^[a-z0-9][a-z0-9._-]{0,62}$"
    assert item["properties"]["version"]["default"] == "latest"
    assert item["properties"]["path"]["default"] is None
    for kind in ("dataset", "model"):
        asset = _property(schema, "outputs", kind)
        assert asset["default"] is None
        (block,) = [option for option in asset["anyOf"] if option.get("type") == "object"]
        assert block["required"] == ["name", "path"]
        assert block["additionalProperties"] is False


def _schema_errors(document: Any) -> list[str]:
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json_schema())
    return [error.message for error in validator.iter_errors(document)]


def test_the_json_schema_accepts_what_the_checker_accepts() -> None:
    text = _with(
        "datasets: [{name: wiki, version: 3}, {name: books, version: train, path: c/b}]\n",
        "dataset: {name: wiki-tokenized, path: tokenized}\nmodel: {name: tiny-gpt, path: m/}\n",
    )
    assert _schema_errors(yaml.safe_load(text)) == []
    assert _schema_errors(load_spec(text).to_dict()) == []


@pytest.mark.parametrize(
    ("inputs", "outputs"),
    [
        ({"datasets": [{"name": "Wiki"}]}, None),
        ({"datasets": [{"name": "wiki", "version": 0}]}, None),
        ({"datasets": [{"name": "wiki", "version": "007"}]}, None),
        ({"datasets": [{"name": "wiki", "path": "/data"}]}, None),
        ({"datasets": [{"name": "wiki", "path": "a/../b"}]}, None),
        ({"datasets": [{"name": "wiki", "path": "./"}]}, None),
        ({"datasets": [{"name": f"d{index}"} for index in range(33)]}, None),
        (None, {"dataset": {"path": "tokenized"}}),
        (None, {"model": {"name": "tiny-gpt", "path": "."}}),
        (None, {"model": {"name": "tiny-gpt", "path": ""}}),
    ],
)
def test_the_json_schema_refuses_what_it_can(
    inputs: dict[str, Any] | None, outputs: dict[str, Any] | None
) -> None:
    document = yaml.safe_load(MINIMAL)
    if inputs is not None:
        document["inputs"] = inputs
    if outputs is not None:
        document["outputs"] = outputs
    assert _schema_errors(document)
