"""The exported JSON Schema: well-formed, complete, and in agreement with the checker."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tau.spec import json_schema
from tau.spec.samples import ARTICLE_EXAMPLE, FULL_EXAMPLE, SERVE_EXAMPLE, SERVE_FULL_EXAMPLE
from tau.spec.schema import field_paths

from .support import EXAMPLES

BLOCKS = (
    "run",
    "compute",
    "runtime",
    "queue",
    "resilience",
    "inputs",
    "outputs",
    "experiment",
    "storage",
    "execution",
    "serve",
)


def _object_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The object alternative of a nullable block (``anyOf: [object, null]``)."""
    if schema.get("type") == "object":
        return schema
    options: list[dict[str, Any]] = schema.get("anyOf", [])
    (found,) = [option for option in options if option.get("type") == "object"]
    return found


def _objects(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, schema)]
    for name, property_schema in schema.get("properties", {}).items():
        try:
            inner = _object_schema(property_schema)
        except ValueError:
            continue
        if "properties" in inner:
            found.extend(_objects(inner, f"{path}.{name}" if path else name))
    return found


def test_the_schema_is_json_and_declares_draft_2020_12() -> None:
    schema = json_schema()
    assert json.loads(json.dumps(schema)) == schema
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["type"] == "object"
    assert schema["required"] == ["schema_version", "name", "run"]


def test_the_schema_covers_every_top_level_block_and_closes_every_object() -> None:
    schema = json_schema()
    assert set(schema["properties"]) == {"schema_version", "name", *BLOCKS}
    objects = _objects(schema)
    assert {path for path, _ in objects} >= {
        "",
        *BLOCKS,
        "resilience.backoff",
        "compute.limits",
        "compute.head",
        "compute.head.limits",
        "outputs.dataset",
        "outputs.model",
        "serve.model",
        "serve.autoscaling",
    }
    for path, object_schema in objects:
        assert object_schema["additionalProperties"] is False, path
        assert object_schema.get("description"), path


def test_every_field_is_described() -> None:
    schema = json_schema()
    for path in field_paths():
        node = schema
        for part in path.split("."):
            node = _object_schema(node) if "properties" not in node else node
            node = node["properties"][part]
        assert node.get("description"), path


def test_the_schema_states_the_bounds() -> None:
    properties = json_schema()["properties"]
    assert properties["name"]["maxLength"] == 38
    assert properties["name"]["pattern"] == "^[a-z]([-a-z0-9]*[a-z0-9])?$"
    compute = _object_schema(properties["compute"])["properties"]
    assert (compute["gpus"]["minimum"], compute["gpus"]["maximum"]) == (0, 16)
    assert compute["gpus"]["default"] == 0
    env = _object_schema(properties["runtime"])["properties"]["env"]["anyOf"][0]
    assert env["propertyNames"]["not"] == {"pattern": "^[Tt][Aa][Uu]_"}


# With jsonschema installed (it is optional), the examples are checked against the schema.


def _validator() -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize(
    "text",
    [
        ARTICLE_EXAMPLE,
        FULL_EXAMPLE,
        SERVE_EXAMPLE,
        SERVE_FULL_EXAMPLE,
        *(path.read_text("utf-8") for path in EXAMPLES),
    ],
)
def test_the_examples_validate_against_the_schema(text: str) -> None:
    errors = [error.message for error in _validator().iter_errors(yaml.safe_load(text))]
    assert errors == []


@pytest.mark.parametrize(
    ("change", "value"),
    [
        (("compute", "wokers"), 2),
        (("compute", "gpus"), 17),
        (("name",), "Not_A_Name"),
        (("run", "workload_kind"), "rayjobs"),
        (("runtime", "env"), {"TAU_X": "1"}),
        (("run", "project_dir"), "../x"),
    ],
)
def test_the_schema_rejects_what_the_checker_rejects_where_it_can(
    change: tuple[str, ...], value: Any
) -> None:
    document = yaml.safe_load(ARTICLE_EXAMPLE)
    target = document
    for key in change[:-1]:
        target = target[key]
    target[change[-1]] = value
    assert list(_validator().iter_errors(document))
