"""Endpoints in tau.yaml (issue 34): ``run.workload_kind: rayservice`` with a ``serve`` block.

What they normalise to, that the normal form comes back exactly, the words of each refusal
(and that a refused file yields no spec), and that specs without a ``serve`` block keep
their normal form and hash."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest
import yaml

from tau.spec import (
    MAX_REPLICAS,
    WORKLOAD_KINDS,
    Autoscaling,
    ModelRef,
    NoEntrypoint,
    Serve,
    SpecError,
    json_schema,
    load_spec,
    spec_from_dict,
    spec_hash,
    validate,
)
from tau.spec.dialects import describe_shape
from tau.spec.samples import ARTICLE_EXAMPLE, FULL_EXAMPLE, SERVE_EXAMPLE, SERVE_FULL_EXAMPLE

from .support import MINIMAL, line_of, only_problem

#: The smallest endpoint: a kind and an application.
ENDPOINT = """\
schema_version: 1
name: tiny-endpoint
run:
  workload_kind: rayservice
serve:
  import_path: app:deployment
"""


def endpoint(serve: str = "", extra: str = "", run: str = "") -> str:
    """``ENDPOINT`` with more ``serve`` keys, more ``run`` keys and more top-level YAML."""
    text = ENDPOINT.replace(
        "  workload_kind: rayservice\n",
        "  workload_kind: rayservice\n" + textwrap.indent(textwrap.dedent(run), "  "),
    )
    return text + textwrap.indent(textwrap.dedent(serve), "  ") + textwrap.dedent(extra)


# --------------------------------------------------------------------------- valid values


def test_the_issue_s_example_normalises_to_its_dataclasses() -> None:
    loaded = load_spec(SERVE_EXAMPLE)
    assert loaded.is_endpoint
    assert loaded.run.workload_kind == "rayservice"
    assert loaded.run.entrypoint is None
    assert loaded.run.script is None
    assert loaded.serve == Serve(
        import_path="app:deployment",
        model=ModelRef(name="tiny-gpt", version="production"),
        replicas=2,
        autoscaling=None,
        route_prefix="/",
    )
    assert (loaded.compute.gpus, loaded.compute.cpus, loaded.compute.memory) == (1, "8", "32Gi")
    assert loaded.compute.workers == 1


def test_the_normal_form_of_an_endpoint() -> None:
    data = load_spec(SERVE_EXAMPLE).to_dict()
    assert data["run"] == {
        "entrypoint": None,
        "workload_kind": "rayservice",
        "args": [],
        "project_dir": ".",
        "exclude": [],
        "max_runtime": None,
    }
    assert data["serve"] == {
        "import_path": "app:deployment",
        "model": {"name": "tiny-gpt", "version": "production"},
        "replicas": 2,
        "autoscaling": None,
        "route_prefix": "/",
    }


def test_defaults_one_replica_at_the_root_and_no_model() -> None:
    loaded = load_spec(ENDPOINT)
    assert loaded.serve == Serve("app:deployment", None, 1, None, "/")
    # Written out, the defaults are the same spec.
    explicit = endpoint("replicas: 1\nroute_prefix: /\nmodel: null\nautoscaling: null\n")
    assert load_spec(explicit) == loaded
    assert spec_hash(load_spec(explicit)) == spec_hash(loaded)


def test_autoscaling_has_defaults_and_leaves_replicas_unset() -> None:
    loaded = load_spec(endpoint("autoscaling: {max_replicas: 4}\n"))
    assert loaded.serve is not None
    assert loaded.serve.replicas is None
    assert loaded.serve.autoscaling == Autoscaling(
        min_replicas=1, max_replicas=4, target_ongoing_requests=2
    )
    zero = load_spec(endpoint("autoscaling: {min_replicas: 0, max_replicas: 1}\n"))
    assert zero.serve is not None
    assert zero.serve.autoscaling is not None
    assert zero.serve.autoscaling.min_replicas == 0  # scale to zero


@pytest.mark.parametrize(
    ("serve", "expected"),
    [
        ("route_prefix: /v1/\n", {"route_prefix": "/v1"}),
        ("route_prefix: /v1/chat//\n", {"route_prefix": "/v1/chat"}),
        ("route_prefix: //\n", {"route_prefix": "/"}),
        ("model: {name: tiny-gpt}\n", {"model": {"name": "tiny-gpt", "version": "latest"}}),
        ("model: {name: tiny-gpt, version: 3}\n", {"model": {"name": "tiny-gpt", "version": "3"}}),
        (
            "model: {name: tiny-gpt, version: '12'}\n",
            {"model": {"name": "tiny-gpt", "version": "12"}},
        ),
        ("replicas: 64\n", {"replicas": 64}),
        (
            "autoscaling: {min_replicas: 2, max_replicas: 2, target_ongoing_requests: 1000}\n",
            {
                "replicas": None,
                "autoscaling": {
                    "min_replicas": 2,
                    "max_replicas": 2,
                    "target_ongoing_requests": 1000,
                },
            },
        ),
        ("replicas: null\nautoscaling: {max_replicas: 3}\n", {"replicas": None}),
    ],
)
def test_serve_values_normalise(serve: str, expected: dict[str, Any]) -> None:
    data = load_spec(endpoint(serve)).to_dict()["serve"]
    assert {key: data[key] for key in expected} == expected


@pytest.mark.parametrize(
    ("written", "normalised"),
    [
        ("' app:deployment '", "app:deployment"),
        ("chat.serve.v2:app", "chat.serve.v2:app"),
        ("_private:_App2", "_private:_App2"),
        ("app.py:deployment", "app.py:deployment"),  # the module `py` of the package `app`
    ],
)
def test_import_paths(written: str, normalised: str) -> None:
    loaded = load_spec(ENDPOINT.replace("app:deployment", written))
    assert loaded.serve is not None
    assert loaded.serve.import_path == normalised


def test_what_an_endpoint_may_have_besides() -> None:
    loaded = load_spec(SERVE_FULL_EXAMPLE)
    assert loaded.serve == Serve(
        import_path="chat.serve:app",
        model=ModelRef("tiny-gpt", "3"),
        replicas=None,
        autoscaling=Autoscaling(0, 4, 8),
        route_prefix="/v1/chat",
    )
    assert loaded.compute.head is not None  # a RayService has a Ray head
    assert [dataset.name for dataset in loaded.inputs.datasets] == ["prompts"]
    assert loaded.run.project_dir == "serving"
    # An empty `args` and an unset `max_runtime` are what the normal form writes.
    assert load_spec(endpoint(run="args: []\nmax_runtime: null\n")) == load_spec(ENDPOINT)


def test_an_endpoint_has_no_command() -> None:
    run = load_spec(ENDPOINT).run
    with pytest.raises(NoEntrypoint, match=r"serve\.import_path"):
        run.command()
    assert isinstance(NoEntrypoint("x"), ValueError)


def test_the_kinds() -> None:
    assert WORKLOAD_KINDS == ("rayjob", "job", "rayservice")
    assert not load_spec(ARTICLE_EXAMPLE).is_endpoint
    assert load_spec(ARTICLE_EXAMPLE).serve is None
    assert load_spec(FULL_EXAMPLE).serve is None


def test_validate_describes_an_endpoint() -> None:
    assert describe_shape(load_spec(SERVE_EXAMPLE)) == (
        "an endpoint of app:deployment at /: 2 replicas, 1 GPU each (2 GPUs), "
        "model tiny-gpt@production"
    )
    assert describe_shape(load_spec(SERVE_FULL_EXAMPLE)) == (
        "an endpoint of chat.serve:app at /v1/chat: 0 to 4 replicas, 1 GPU each "
        "(at most 4 GPUs) of type h100, model tiny-gpt@3"
    )
    assert describe_shape(load_spec(ENDPOINT)) == (
        "an endpoint of app:deployment at /: 1 replica, 0 GPUs"
    )


# ---------------------------------------------------------------------------- round trips


@pytest.mark.parametrize(
    "text",
    [
        SERVE_EXAMPLE,
        SERVE_FULL_EXAMPLE,
        ENDPOINT,
        endpoint("autoscaling: {min_replicas: 0, max_replicas: 8}\nroute_prefix: /a/\n"),
    ],
)
def test_the_normal_form_round_trips(text: str) -> None:
    original = load_spec(text)
    stored = json.loads(json.dumps(original.to_dict()))
    restored = spec_from_dict(stored)
    assert restored == original
    assert restored.to_dict() == stored
    assert spec_hash(restored) == spec_hash(original)
    # A fixed point: the normal form, written back as YAML, is the same spec.
    assert load_spec(yaml.safe_dump(stored)) == original


# ------------------------------------------------------------------- specs from before it

#: Hashes pinned before `serve` existed (the same as test_data_fields.py pins).
OLD_HASHES = [
    (MINIMAL, "aa4af48dd6616adf542342d3477d714c1fd153595f0f9585f69adce07fdd3a3b"),
    (ARTICLE_EXAMPLE, "5c62bd5b7567f8437de449171b742f2f0b7fd181c39d32e8736c9a64797edb10"),
]


@pytest.mark.parametrize(("text", "expected"), OLD_HASHES)
def test_runs_keep_their_normal_form_and_hash(text: str, expected: str) -> None:
    loaded = load_spec(text)
    assert spec_hash(loaded) == expected
    assert "serve" not in loaded.to_dict()
    assert loaded.to_dict()["run"]["entrypoint"] == "train.py"
    # `serve: null` on a run is the same as no `serve`.
    assert spec_hash(load_spec(text + "serve:\n")) == expected


def test_stored_run_specs_without_serve_still_load() -> None:
    data = load_spec(FULL_EXAMPLE).to_dict()
    assert "serve" not in data
    assert spec_from_dict(data).serve is None


# ------------------------------------------------------------------------------- refusals

REFUSALS = [
    pytest.param(
        ENDPOINT.replace("serve:\n  import_path: app:deployment\n", ""),
        "serve",
        "an endpoint (`workload_kind: rayservice`) needs a `serve` block",
        "add `serve:` with the `import_path` of your Ray Serve application, e.g. `app:deployment`",
        id="rayservice-without-serve",
    ),
    pytest.param(
        ENDPOINT.replace("serve:\n  import_path: app:deployment\n", "serve:\n"),
        "serve",
        "an endpoint (`workload_kind: rayservice`) needs a `serve` block",
        "add `serve:` with the `import_path` of your Ray Serve application, e.g. `app:deployment`",
        id="rayservice-with-null-serve",
    ),
    pytest.param(
        MINIMAL + "serve:\n  import_path: app:deployment\n",
        "serve",
        "`serve` describes an endpoint, but `run.workload_kind` is `rayjob`",
        "set `run.workload_kind: rayservice`, or remove `serve`",
        id="serve-on-a-rayjob",
    ),
    pytest.param(
        MINIMAL + "  workload_kind: job\nserve:\n  import_path: app:deployment\n",
        "serve",
        "`serve` describes an endpoint, but `run.workload_kind` is `job`",
        "set `run.workload_kind: rayservice`, or remove `serve`",
        id="serve-on-a-job",
    ),
    pytest.param(
        endpoint(run="entrypoint: serve.py\n"),
        "run.entrypoint",
        "an endpoint has no entry point: it starts the application in `serve.import_path`",
        "remove `run.entrypoint`",
        id="entrypoint",
    ),
    pytest.param(
        endpoint(run="args: [--port, 8000]\n"),
        "run.args",
        "an endpoint has no entry point to pass `args` to",
        "remove `run.args`; configure the application with `runtime.env`",
        id="args",
    ),
    pytest.param(
        endpoint(run="max_runtime: 2h\n"),
        "run.max_runtime",
        "an endpoint runs until it is stopped; it has no `max_runtime`",
        "remove `run.max_runtime`",
        id="max-runtime",
    ),
    pytest.param(
        endpoint("replicas: 2\nautoscaling: {max_replicas: 4}\n"),
        "serve.autoscaling",
        "`replicas` and `autoscaling` exclude each other",
        "give a fixed number in `replicas`, or a range in `autoscaling`, not both",
        id="replicas-and-autoscaling",
    ),
    pytest.param(
        endpoint("replicas: 0\n"),
        "serve.replicas",
        "must be between 1 and 64 (got 0)",
        None,
        id="no-replicas",
    ),
    pytest.param(
        endpoint("replicas: 65\n"),
        "serve.replicas",
        "must be between 1 and 64 (got 65)",
        "or let `autoscaling` add replicas as requests come",
        id="too-many-replicas",
    ),
    pytest.param(
        endpoint("replicas: '2'\n"),
        "serve.replicas",
        "expected an integer, got the string `2`",
        "remove the quotes: 2",
        id="quoted-replicas",
    ),
    pytest.param(
        endpoint("autoscaling: {min_replicas: 5, max_replicas: 2}\n"),
        "serve.autoscaling.min_replicas",
        "`min_replicas` (5) is more than `max_replicas` (2)",
        "the autoscaler keeps between `min_replicas` and `max_replicas` replicas",
        id="min-above-max",
    ),
    pytest.param(
        endpoint("autoscaling: {min_replicas: 1}\n"),
        "serve.autoscaling.max_replicas",
        "missing required key `max_replicas`",
        "add `max_replicas: 4`",
        id="no-max-replicas",
    ),
    pytest.param(
        endpoint("autoscaling: {max_replicas: 0}\n"),
        "serve.autoscaling.max_replicas",
        "must be between 1 and 64 (got 0)",
        None,
        id="max-replicas-zero",
    ),
    pytest.param(
        endpoint("autoscaling: {max_replicas: 65}\n"),
        "serve.autoscaling.max_replicas",
        "must be between 1 and 64 (got 65)",
        None,
        id="max-replicas-too-many",
    ),
    pytest.param(
        endpoint("autoscaling: {min_replicas: -1, max_replicas: 2}\n"),
        "serve.autoscaling.min_replicas",
        "must be between 0 and 64 (got -1)",
        None,
        id="min-replicas-negative",
    ),
    pytest.param(
        endpoint("autoscaling: {max_replicas: 2, target_ongoing_requests: 0}\n"),
        "serve.autoscaling.target_ongoing_requests",
        "must be between 1 and 1000 (got 0)",
        None,
        id="target-zero",
    ),
    pytest.param(
        endpoint("autoscaling: {max_replicas: 2, target_ongoing_requests: 1001}\n"),
        "serve.autoscaling.target_ongoing_requests",
        "must be between 1 and 1000 (got 1001)",
        None,
        id="target-too-high",
    ),
    pytest.param(
        endpoint(extra="compute: {workers: 3}\n"),
        "compute.workers",
        "an endpoint's `compute` sizes each replica; `workers` must be 1 (got 3)",
        "use `serve.replicas: 3` for 3 replicas, or `serve.autoscaling`",
        id="workers",
    ),
    pytest.param(
        endpoint(extra="execution: {launcher: ray-tune, metric: loss, configs: {lr: [1, 2]}}\n"),
        "execution.launcher",
        "an endpoint serves requests; it runs no sweep",
        "remove `execution`, or set `run.workload_kind: rayjob` to run the sweep",
        id="sweep",
    ),
    pytest.param(
        endpoint(extra="outputs: {dataset: {name: predictions, path: out}}\n"),
        "outputs.dataset",
        "an endpoint makes no dataset versions",
        "remove `outputs.dataset`; a run (`rayjob` or `job`) makes dataset versions",
        id="outputs-dataset",
    ),
    pytest.param(
        endpoint(extra="outputs: {model: {name: tiny-gpt, path: model}}\n"),
        "outputs.model",
        "an endpoint makes no model versions",
        "remove `outputs.model`; `serve.model` names the model version it serves",
        id="outputs-model",
    ),
    pytest.param(
        ENDPOINT.replace("  import_path: app:deployment\n", "  replicas: 2\n"),
        "serve.import_path",
        "missing required key `import_path`",
        "add `import_path: app:deployment`",
        id="no-import-path",
    ),
    pytest.param(
        endpoint().replace("app:deployment", "app.deployment"),
        "serve.import_path",
        "`app.deployment` is not an import path: write the module, `:` and the application's "
        "name in it",
        "write `app:deployment`",
        id="import-path-with-a-dot",
    ),
    pytest.param(
        endpoint().replace("app:deployment", "src/app:deployment"),
        "serve.import_path",
        "`src/app:deployment` is not an import path: write the module, `:` and the "
        "application's name in it",
        "write `src.app:deployment`",
        id="import-path-with-a-slash",
    ),
    pytest.param(
        endpoint().replace("app:deployment", "app"),
        "serve.import_path",
        "`app` is not an import path: write the module, `:` and the application's name in it",
        "e.g. `app:deployment` for the application `deployment` in `app.py`, "
        "or `pkg.serve:app` in a package",
        id="import-path-without-attribute",
    ),
    pytest.param(
        endpoint().replace("app:deployment", "class:app"),
        "serve.import_path",
        "`class:app` is not an import path: `class` is a Python keyword",
        "e.g. `app:deployment` for the application `deployment` in `app.py`, "
        "or `pkg.serve:app` in a package",
        id="import-path-keyword",
    ),
    pytest.param(
        endpoint().replace("app:deployment", "'   '"),
        "serve.import_path",
        "must not be empty",
        "e.g. `app:deployment` for the application `deployment` in `app.py`, "
        "or `pkg.serve:app` in a package",
        id="import-path-blank",
    ),
    pytest.param(
        endpoint().replace("app:deployment", "a" * 250 + ":" + "b" * 6),
        "serve.import_path",
        "is 257 characters long; at most 256 are allowed",
        None,
        id="import-path-too-long",
    ),
    pytest.param(
        endpoint("route_prefix: v1\n"),
        "serve.route_prefix",
        "the route prefix `v1` does not start with `/`",
        "write `/v1`",
        id="route-without-slash",
    ),
    pytest.param(
        endpoint("route_prefix: '/v1 chat'\n"),
        "serve.route_prefix",
        "the route prefix `/v1 chat` contains whitespace",
        "write a path such as `/` or `/v1/chat`",
        id="route-with-a-space",
    ),
    pytest.param(
        endpoint("route_prefix: /v1?x=1\n"),
        "serve.route_prefix",
        "the route prefix `/v1?x=1` contains `?`: it is a path, without a query",
        "write a path such as `/` or `/v1/chat`",
        id="route-with-a-query",
    ),
    pytest.param(
        endpoint("route_prefix: '/v1#top'\n"),
        "serve.route_prefix",
        "the route prefix `/v1#top` contains `#`: it is a path, without a fragment",
        "write a path such as `/` or `/v1/chat`",
        id="route-with-a-fragment",
    ),
    pytest.param(
        endpoint("route_prefix: '/{name}'\n"),
        "serve.route_prefix",
        "the route prefix `/{name}` contains `{` or `}`: Ray Serve has no wildcards",
        "write a path such as `/` or `/v1/chat`",
        id="route-with-a-wildcard",
    ),
    pytest.param(
        endpoint("route_prefix: /" + "a" * 256 + "\n"),
        "serve.route_prefix",
        "is 257 characters long; at most 256 are allowed",
        None,
        id="route-too-long",
    ),
    pytest.param(
        endpoint("model: tiny-gpt@production\n"),
        "serve.model",
        "expected a model version ({name, version}), got the string `tiny-gpt@production`",
        "write `{name: tiny-gpt, version: production}`",
        id="model-as-text",
    ),
    pytest.param(
        endpoint("model: {name: Tiny GPT}\n"),
        "serve.model.name",
        "`Tiny GPT` is not a valid model name: use lower-case letters, digits, `.`, `_` and "
        "`-`, starting with a letter or a digit",
        "try `tiny-gpt`",
        id="model-name",
    ),
    pytest.param(
        endpoint("model: {name: tiny-gpt, version: '007'}\n"),
        "serve.model.version",
        "the version number `007` has leading zeros",
        "write `7`",
        id="model-version",
    ),
    pytest.param(
        endpoint("model: {name: tiny-gpt, version: tiny-gpt@3}\n"),
        "serve.model.version",
        "`tiny-gpt@3` is neither a version number nor an alias",
        "write only what follows `@` here, and the model's name in `name`",
        id="model-version-with-the-name",
    ),
    pytest.param(
        endpoint("model: {version: production}\n"),
        "serve.model.name",
        "missing required key `name`",
        "add `name: tiny-gpt`",
        id="model-without-a-name",
    ),
    pytest.param(
        endpoint("num_replicas: 2\n"),
        "serve.num_replicas",
        "unknown key `num_replicas`",
        "did you mean `replicas`?",
        id="alias-num-replicas",
    ),
    pytest.param(
        endpoint("autoscaling_config: {max_replicas: 2}\n"),
        "serve.autoscaling_config",
        "unknown key `autoscaling_config`",
        "did you mean `autoscaling`?",
        id="alias-autoscaling-config",
    ),
    pytest.param(
        endpoint("autoscaling: {min: 1, max_replicas: 2}\n"),
        "serve.autoscaling.min",
        "unknown key `min`",
        "did you mean `min_replicas`?",
        id="alias-min",
    ),
    pytest.param(
        ENDPOINT + "replicas: 2\n",
        "replicas",
        "unknown key `replicas`",
        "`replicas` belongs in the `serve` block",
        id="replicas-at-the-top",
    ),
    pytest.param(
        ENDPOINT.replace("rayservice", "rayserve"),
        "run.workload_kind",
        "`rayserve` is not allowed here; expected one of: `rayjob`, `job`, `rayservice`",
        "did you mean `rayservice`?",
        id="kind-misspelt",
    ),
]


@pytest.mark.parametrize(("text", "path", "message", "hint"), REFUSALS)
def test_each_rule_is_one_problem_with_a_hint(
    text: str, path: str, message: str, hint: str | None
) -> None:
    problem = only_problem(text)
    assert (problem.path, problem.message, problem.hint) == (path, message, hint)
    assert problem.line >= 1
    # Refused means no spec at all: nothing is quietly changed or dropped.
    with pytest.raises(SpecError):
        load_spec(text)


def test_ray_serve_s_own_words_are_hinted() -> None:
    found = validate(ENDPOINT.replace("import_path:", "app:"))
    assert [(problem.path, problem.message, problem.hint) for problem in found] == [
        ("serve.app", "unknown key `app`", "did you mean `import_path`?"),
        (
            "serve.import_path",
            "missing required key `import_path`",
            "add `import_path: app:deployment`",
        ),
    ]


def test_problems_point_at_what_was_written() -> None:
    text = endpoint(run="entrypoint: serve.py\n", extra="compute:\n  workers: 2\n")
    found = {problem.path: problem for problem in validate(text)}
    assert set(found) == {"run.entrypoint", "compute.workers"}
    assert found["run.entrypoint"].line == line_of(text, "entrypoint: serve.py")
    assert found["compute.workers"].line == line_of(text, "workers: 2")
    missing = MINIMAL.replace("train.py", "x.py") + "serve:\n  import_path: app:x\n"
    assert only_problem(missing).line == line_of(missing, "import_path")


def test_every_problem_is_said_at_once() -> None:
    text = ENDPOINT.replace("serve:\n  import_path: app:deployment\n", "") + textwrap.dedent(
        """\
        compute: {workers: 2}
        outputs: {model: {name: tiny-gpt, path: model}}
        """
    )
    text = text.replace(
        "  workload_kind: rayservice\n", "  workload_kind: rayservice\n  args: [x]\n"
    )
    assert sorted(problem.path for problem in validate(text)) == [
        "compute.workers",
        "outputs.model",
        "run.args",
        "serve",
    ]


def test_a_run_without_an_entry_point_keeps_its_words() -> None:
    missing = only_problem("schema_version: 1\nname: demo\nrun:\n  args: [x]\n")
    assert (missing.path, missing.message, missing.hint, missing.line) == (
        "run.entrypoint",
        "missing required key `entrypoint`",
        "add `entrypoint: train.py`",
        4,
    )
    null = only_problem(MINIMAL.replace("entrypoint: train.py", "entrypoint:"))
    assert (null.path, null.message, null.hint) == (
        "run.entrypoint",
        "expected a script or a command line, got nothing (null)",
        "give a value, e.g. train.py",
    )
    job = only_problem("schema_version: 1\nname: demo\nrun:\n  workload_kind: job\n")
    assert (job.path, job.message) == ("run.entrypoint", "missing required key `entrypoint`")


def test_a_stored_endpoint_is_checked_by_the_same_rules() -> None:
    data = load_spec(SERVE_EXAMPLE).to_dict()
    data["serve"]["autoscaling"] = {"max_replicas": 4}
    data["run"]["max_runtime"] = 60
    with pytest.raises(SpecError) as raised:
        spec_from_dict(data)
    assert [problem.path for problem in raised.value.errors] == [
        "run.max_runtime",
        "serve.autoscaling",
    ]


# ---------------------------------------------------------------------------- JSON Schema


def _schema_errors(document: Any) -> list[str]:
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json_schema())
    return [error.message for error in validator.iter_errors(document)]


def _serve_schema() -> dict[str, Any]:
    options: list[dict[str, Any]] = json_schema()["properties"]["serve"]["anyOf"]
    (block,) = [option for option in options if option.get("type") == "object"]
    return block


def test_the_json_schema_describes_the_serve_block() -> None:
    schema = json_schema()
    assert schema["properties"]["run"]["properties"]["workload_kind"]["enum"] == [
        "rayjob",
        "job",
        "rayservice",
    ]
    assert "entrypoint" not in schema["properties"]["run"].get("required", [])
    serve = _serve_schema()
    assert serve["required"] == ["import_path"]
    assert serve["additionalProperties"] is False
    properties = serve["properties"]
    assert set(properties) == {"import_path", "model", "replicas", "autoscaling", "route_prefix"}
    assert properties["route_prefix"]["default"] == "/"
    replicas = properties["replicas"]["anyOf"][0]
    assert (replicas["minimum"], replicas["maximum"]) == (1, MAX_REPLICAS)
    (autoscaling,) = [o for o in properties["autoscaling"]["anyOf"] if o.get("type") == "object"]
    assert autoscaling["required"] == ["max_replicas"]
    assert autoscaling["properties"]["target_ongoing_requests"]["default"] == 2


@pytest.mark.parametrize("text", [SERVE_EXAMPLE, SERVE_FULL_EXAMPLE, ENDPOINT, ARTICLE_EXAMPLE])
def test_the_json_schema_accepts_endpoints_and_runs(text: str) -> None:
    assert _schema_errors(yaml.safe_load(text)) == []
    assert _schema_errors(load_spec(text).to_dict()) == []


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            ENDPOINT.replace("serve:\n  import_path: app:deployment\n", ""), id="no-serve"
        ),
        pytest.param(MINIMAL + "serve:\n  import_path: app:deployment\n", id="serve-on-a-rayjob"),
        pytest.param("schema_version: 1\nname: demo\nrun:\n  args: [x]\n", id="no-entrypoint"),
        pytest.param(endpoint(run="entrypoint: serve.py\n"), id="entrypoint"),
        pytest.param(endpoint(run="max_runtime: 2h\n"), id="max-runtime"),
        pytest.param(endpoint(run="args: [x]\n"), id="args"),
        pytest.param(endpoint(extra="compute: {workers: 2}\n"), id="workers"),
        pytest.param(endpoint().replace("app:deployment", "app.deployment"), id="import-path"),
        pytest.param(endpoint("route_prefix: v1\n"), id="route-prefix"),
        pytest.param(endpoint("replicas: 65\n"), id="replicas"),
    ],
)
def test_the_json_schema_refuses_what_it_can(text: str) -> None:
    assert validate(text)
    assert _schema_errors(yaml.safe_load(text))
