"""``inputs.models`` (issue 34, batch inference): model versions a run reads, shaped as
``inputs.datasets``: what they normalise to, each refusal at its key (their folders apart
from every dataset's too), offline validation, the JSON Schema, and unchanged hashes for
specs that do not use them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from tau.spec import (
    DatasetInput,
    Inputs,
    ModelInput,
    json_schema,
    load_spec,
    spec_from_dict,
    spec_hash,
)

from .support import MINIMAL, REPO, line_of, only_problem, problems, spec


def _inputs(body: str) -> str:
    """The minimal spec plus an ``inputs`` block (its body, dedented)."""
    return spec() + "inputs:\n" + textwrap.indent(textwrap.dedent(body), "  ")


def _models(*items: str, datasets: str = "") -> str:
    body = f"datasets: {datasets}\n" if datasets else ""
    return _inputs(body + "models:\n" + "".join(f"  - {item}\n" for item in items))


# --------------------------------------------------------------------------- valid values


def test_models_parse_in_the_order_written_with_the_defaults_of_datasets() -> None:
    loaded = load_spec(
        _models(
            "{name: reviews-classifier}",
            "{name: tiny-gpt, version: 3, path: ./models//gpt/}",
            "{name: tiny-gpt, version: production, path: prod}",
            datasets="[{name: reviews-raw, path: reviews}]",
        )
    )
    assert loaded.inputs == Inputs(
        (DatasetInput(name="reviews-raw", version="latest", path="reviews"),),
        (
            ModelInput(name="reviews-classifier", version="latest", path="reviews-classifier"),
            ModelInput(name="tiny-gpt", version="3", path="models/gpt"),
            ModelInput(name="tiny-gpt", version="production", path="prod"),
        ),
    )


def test_models_alone_are_inputs_and_round_trip_through_the_normal_form() -> None:
    loaded = load_spec(_models("{name: tiny-gpt, version: 3, path: model/}"))
    data = loaded.to_dict()
    assert data["inputs"] == {
        "datasets": [],
        "models": [{"name": "tiny-gpt", "version": "3", "path": "model"}],
    }
    restored = spec_from_dict(data)
    assert restored == loaded
    assert spec_hash(restored) == spec_hash(loaded)
    assert load_spec(yaml.safe_dump(data)) == loaded


@pytest.mark.parametrize("models", ["", "  models:\n", "  models: []\n"])
def test_no_models_leaves_the_normal_form_and_hash_of_a_spec_that_reads_datasets(
    models: str,
) -> None:
    datasets = "inputs:\n  datasets: [{name: wiki, version: 3}]\n"
    loaded = load_spec(spec(datasets + models))
    assert loaded.inputs.models == ()
    assert loaded.to_dict()["inputs"] == {
        "datasets": [{"name": "wiki", "version": "3", "path": "wiki"}]
    }
    # The hash of this spec before inputs.models existed.
    assert spec_hash(loaded) == spec_hash(load_spec(spec(datasets)))
    assert spec_hash(loaded) == "f741346f34583ad5b4f9bbcc5c413f21e13faf502683f82fca5a0fdb424d49c6"


@pytest.mark.parametrize("inputs", ["", "inputs:\n  models: []\n", "inputs: {models: }\n"])
def test_a_spec_without_inputs_keeps_its_hash(inputs: str) -> None:
    loaded = load_spec(spec(inputs))
    assert "inputs" not in loaded.to_dict()
    assert spec_hash(loaded) == "aa4af48dd6616adf542342d3477d714c1fd153595f0f9585f69adce07fdd3a3b"


def test_equal_meanings_hash_the_same_and_other_versions_do_not() -> None:
    def hashed(models: str) -> str:
        return spec_hash(load_spec(_inputs(f"models: {models}\n")))

    assert hashed("[{name: m}]") == hashed("[{name: m, version: latest, path: m/}]")
    assert hashed("[{name: m, version: 3}]") == hashed("[{name: m, version: '3'}]")
    assert hashed("[{name: m, version: 3}]") != hashed("[{name: m, version: 4}]")
    # A model is not a dataset of the same name.
    as_dataset = spec_hash(load_spec(_inputs("datasets: [{name: m}]\n")))
    assert hashed("[{name: m}]") != as_dataset


def test_a_model_beside_datasets_in_folders_of_their_own() -> None:
    loaded = load_spec(
        _models(
            "{name: wiki, path: models/wiki}",  # a model may share a dataset's name
            datasets="[{name: wiki, path: data/wiki}, {name: books, path: data/books}]",
        )
    )
    assert [model.path for model in loaded.inputs.models] == ["models/wiki"]


# ------------------------------------------------------------------------------- refusals

APART_MODELS = (
    "give each model a folder of its own under TAU_DATA_DIR with `path`, none inside another"
)
APART_BOTH = (
    "give each dataset and each model a folder of its own under TAU_DATA_DIR with `path`, "
    "none inside another"
)
LOWER_CASE = "use lower-case letters, digits, `.`, `_` and `-`, starting with a letter or a digit"

REFUSED = [
    (
        _models("{name: Tiny_GPT}"),
        "inputs.models[0].name",
        f"`Tiny_GPT` is not a valid model name: {LOWER_CASE}",
        "try `tiny_gpt`",
    ),
    (
        _models("{version: 3}"),
        "inputs.models[0].name",
        "missing required key `name`",
        "add `name: tiny-gpt`",
    ),
    (
        _models("{name: tiny-gpt, version: Production}"),
        "inputs.models[0].version",
        "`Production` is neither a version number nor an alias",
        "aliases are lower-case: `production`",
    ),
    (
        _models("{name: tiny-gpt, version: 0}"),
        "inputs.models[0].version",
        "there is no version 0: versions are numbered from 1",
        "name a version the model has, or leave `version` out for the newest one",
    ),
    (
        _models("{name: tiny-gpt, version: 'tiny-gpt@3'}"),
        "inputs.models[0].version",
        "`tiny-gpt@3` is neither a version number nor an alias",
        "write only what follows `@` here, and the model's name in `name`",
    ),
    (
        _models("{name: tiny-gpt, path: /models/gpt}"),
        "inputs.models[0].path",
        "the model path `/models/gpt` is absolute; it must be relative",
        "write a folder relative to `TAU_DATA_DIR`, e.g. `tiny-gpt`",
    ),
    (
        _models("{name: tiny-gpt, path: .}"),
        "inputs.models[0].path",
        "`.` is the whole of `TAU_DATA_DIR`; name a folder inside it",
        "write a folder relative to `TAU_DATA_DIR`, e.g. `tiny-gpt`",
    ),
    (
        _models("{name: tiny-gpt, version: 2}", "{name: tiny-gpt, version: 2, path: again}"),
        "inputs.models[1].name",
        "`tiny-gpt@2` is listed twice (also item 1 of the list)",
        "remove one of them",
    ),
    (
        _models("{name: a, path: models}", "{name: b, path: models/b}"),
        "inputs.models[1].path",
        "the path `models/b` is inside the folder of item 1 (`a`), `models`",
        APART_MODELS,
    ),
    (
        _models("{name: wiki}", datasets="[{name: wiki}]"),
        "inputs.models[0].path",
        "the path `wiki` (the model's name, as there is no `path`) is taken by the dataset "
        "`wiki` (`inputs.datasets[0]`)",
        APART_BOTH,
    ),
    (
        _models("{name: m, path: data/model}", datasets="[{name: a}, {name: b, path: data}]"),
        "inputs.models[0].path",
        "the path `data/model` is inside the folder of the dataset `b` (`inputs.datasets[1]`), "
        "`data`",
        APART_BOTH,
    ),
    (
        _models("{name: m, path: data}", datasets="[{name: b, path: data/b}]"),
        "inputs.models[0].path",
        "the path `data` holds the folder of the dataset `b` (`inputs.datasets[0]`), `data/b`",
        APART_BOTH,
    ),
    (
        _models("tiny-gpt@production"),
        "inputs.models[0]",
        "expected a model ({name, version, path}), got the string `tiny-gpt@production`",
        "write `{name: tiny-gpt, version: production}`",
    ),
    (
        _models("{name: tiny-gpt, mount: m}"),
        "inputs.models[0].mount",
        "unknown key `mount`",
        "did you mean `path`?",
    ),
    (
        _inputs("models: tiny-gpt\n"),
        "inputs.models",
        "expected a list of models ({name, version, path}), got the string `tiny-gpt`",
        "write a list: [{name: tiny-gpt, version: production}], or one `- item` per line",
    ),
    (
        _models(*(f"{{name: m{index}}}" for index in range(9))),
        "inputs.models",
        "has 9 items; at most 8 are allowed",
        None,
    ),
    (
        _inputs("model: [{name: tiny-gpt}]\n"),
        "inputs.model",
        "unknown key `model`",
        "did you mean `models`?",
    ),
    (
        spec(
            "serve: {import_path: 'app:app', model: {name: m}}\ninputs:\n  models: [{name: m}]\n",
            run="workload_kind: rayservice\n",
        ).replace("  entrypoint: train.py\n", ""),
        "inputs.models",
        "an endpoint reads the model it serves from `serve.model`, not `inputs.models`",
        "remove `inputs.models`; name the model version in `serve.model`",
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


def test_a_clash_with_a_dataset_points_where_the_model_is_written() -> None:
    text = _models("{name: m,\n      path: corpus/}", datasets="[{name: wiki, path: corpus}]")
    problem = only_problem(text)
    line = line_of(text, "corpus/")
    column = text.splitlines()[line - 1].index("corpus/") + 1
    assert (problem.path, problem.line, problem.column) == ("inputs.models[0].path", line, column)


def test_every_broken_model_is_reported_at_once_with_the_datasets() -> None:
    text = _models(
        "{name: M}",
        "{name: m, version: 0}",
        "{name: wiki}",
        datasets="[{name: Wiki}]",
    )
    assert [problem.path for problem in problems(text)] == [
        "inputs.datasets[0].name",
        "inputs.models[0].name",
        "inputs.models[1].version",
    ]


def test_tau_validate_checks_models_offline(tmp_path: Path) -> None:
    bad = tmp_path / "tau.yaml"
    bad.write_text(_models("{name: m, path: reviews}", datasets="[{name: reviews}]"))
    result = subprocess.run(
        [sys.executable, "-m", "tau.spec", "validate", str(bad)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"{bad}:8:23: inputs.models[0].path: the path `reviews` is taken by the dataset "
        f"`reviews` (`inputs.datasets[0]`) ({APART_BOTH})"
    ]


# ---------------------------------------------------------------------------- JSON Schema


def _schema_errors(document: Any) -> list[str]:
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json_schema())
    return [error.message for error in validator.iter_errors(document)]


def test_the_json_schema_states_models_as_datasets() -> None:
    (inputs,) = [
        option
        for option in json_schema()["properties"]["inputs"]["anyOf"]
        if option.get("type") == "object"
    ]
    models = inputs["properties"]["models"]["anyOf"][0]
    assert models["maxItems"] == 8
    item = models["items"]
    # A catalog asset by name, or (in a pipeline's stage) the stage that makes it.
    assert "required" not in item
    assert item["oneOf"] == [
        {"required": ["name"]},
        {"required": ["from"], "not": {"required": ["version"]}},
    ]
    assert item["additionalProperties"] is False
    assert item["properties"]["name"]["pattern"] == "^[a-z0-9][a-z0-9._-]{0,62}$"
    assert item["properties"]["version"]["default"] == "latest"
    assert item["properties"]["path"]["default"] is None
    assert inputs["properties"]["models"]["default"] == []


def test_the_json_schema_accepts_and_refuses_models_as_the_checker_does() -> None:
    text = _models("{name: tiny-gpt, version: 3, path: m}", datasets="[{name: wiki}]")
    assert _schema_errors(yaml.safe_load(text)) == []
    assert _schema_errors(load_spec(text).to_dict()) == []
    document = yaml.safe_load(MINIMAL)
    for models in (
        [{"name": "Tiny"}],
        [{"name": "m", "version": 0}],
        [{"name": "m", "path": "/abs"}],
        [{"name": "m", "path": "./"}],
        [{"name": "m", "extra": 1}],
        [{"name": f"m{index}"} for index in range(9)],
    ):
        document["inputs"] = {"models": models}
        assert _schema_errors(document), models
