"""The normal form: explicit defaults, canonical spellings, a stable hash, an exact round trip."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
import yaml

from tau.spec import SpecError, canonical_json, load_spec, spec_from_dict, spec_hash
from tau.spec.samples import ARTICLE_EXAMPLE, FULL_EXAMPLE, SERVE_EXAMPLE, SERVE_FULL_EXAMPLE

from .support import EXAMPLES, spec


def test_defaults_are_explicit_and_unset_stays_none() -> None:
    assert load_spec(spec()).to_dict() == {
        "schema_version": 1,
        "name": "demo",
        "run": {
            "entrypoint": "train.py",
            "workload_kind": "rayjob",
            "args": [],
            "project_dir": ".",
            "exclude": [],
            "max_runtime": None,
        },
        "compute": {"gpus": 0, "cpus": "1", "memory": "4Gi", "workers": 1, "gpu_type": None},
        "runtime": {"image": None, "pip": [], "env": {}, "secrets": []},
        "queue": {"priority": None, "name": None},
        "resilience": {
            "max_retries": 3,
            "retry_on": ["preempted", "evicted", "node_failure", "infrastructure"],
            "backoff": {"initial": 30, "max": 600},
            "checkpoint_dir": None,
        },
        "outputs": {"metrics_file": "metrics.jsonl", "artifacts": []},
        "experiment": {"project": None, "group": None, "tags": []},
    }


@pytest.mark.parametrize(
    ("cpus", "canonical"),
    [
        ("16", "16"),
        ("16000m", "16"),
        ("0.5", "500m"),
        ("500m", "500m"),
        ("1.5", "1500m"),
        ("2e1", "20"),
        ("'16'", "16"),
    ],
)
def test_cpu_quantities_normalise(cpus: str, canonical: str) -> None:
    assert load_spec(spec(f"compute:\n  cpus: {cpus}\n")).compute.cpus == canonical


@pytest.mark.parametrize(
    ("memory", "canonical"),
    [
        ("64Gi", "64Gi"),
        ("65536Mi", "64Gi"),
        ("68719476736", "64Gi"),
        ("1G", "1G"),
        ("1000M", "1G"),
        ("1.5Gi", "1536Mi"),
        ("1000001k", "1000001k"),
        ("1048577", "1048577"),
    ],
)
def test_memory_quantities_normalise(memory: str, canonical: str) -> None:
    compute = load_spec(spec(f"compute:\n  memory: {memory}\n")).compute
    assert compute.memory == canonical
    assert compute.memory_bytes == int(compute.memory_bytes)


def test_sets_are_sorted_and_sequences_keep_their_order() -> None:
    text = spec(
        "runtime:\n  pip: [zlib-ng, absl-py]\n  env: {B: '2', A: '1'}\n"
        "resilience:\n  retry_on: [infrastructure, preempted]\n"
        "experiment:\n  tags: [zeta, alpha]\n",
        run="args: [--z, --a]\nexclude: [z/**, a/**]\n",
    )
    data = load_spec(text).to_dict()
    assert data["run"]["args"] == ["--z", "--a"]
    assert data["runtime"]["pip"] == ["zlib-ng", "absl-py"]
    assert data["run"]["exclude"] == ["a/**", "z/**"]
    assert list(data["runtime"]["env"]) == ["A", "B"]
    assert data["resilience"]["retry_on"] == ["preempted", "infrastructure"]
    assert data["experiment"]["tags"] == ["alpha", "zeta"]


def test_spec_hash_is_sha256_of_the_canonical_json() -> None:
    loaded = load_spec(ARTICLE_EXAMPLE)
    canonical = canonical_json(loaded.to_dict())
    assert " " not in canonical.replace("aks-gpu-quickstart", "")
    assert canonical.startswith('{"compute":{"cpus":"16"')
    assert spec_hash(loaded) == hashlib.sha256(canonical.encode()).hexdigest()
    assert len(spec_hash(loaded)) == 64


EQUIVALENT_SPELLINGS = [
    ARTICLE_EXAMPLE,
    # Keys reordered, flow style, comments, other quantity spellings, explicit defaults.
    """\
# the same workload
runtime:
  pip: ["torch>=2.4.0"]
  image: "mcr.microsoft.com/aks/ai-runtime/ray:py3.12-ray2.56.0-cuda13.0"
compute: {memory: 65536Mi, cpus: 16000m, workers: 1, gpus: 1}   # same amounts
run: {workload_kind: rayjob, entrypoint: ./train.py, project_dir: ./, args: []}
name: 'aks-gpu-quickstart'
schema_version: 1
queue: {}
resilience:
  retry_on: [infrastructure, node_failure, evicted, preempted]
  backoff: {initial: 30s, max: 10m}
""",
    # The same again, as JSON (YAML's subset).
    json.dumps(yaml.safe_load(ARTICLE_EXAMPLE), indent=4),
]


def test_spec_hash_is_stable_across_order_formatting_comments_and_spellings() -> None:
    hashes = {spec_hash(load_spec(text)) for text in EQUIVALENT_SPELLINGS}
    assert len(hashes) == 1


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("gpus: 1", "gpus: 2"),
        ("cpus: 16", "cpus: 15"),
        ("memory: 64Gi", "memory: 64G"),
        ("entrypoint: train.py", "entrypoint: train2.py"),
        ("workload_kind: rayjob", "workload_kind: job"),
        ("torch>=2.4.0", "torch>=2.4.1"),
        ("name: aks-gpu-quickstart", "name: aks-gpu-quickstart2"),
        ("ray2.56.0", "ray2.56.1"),
    ],
)
def test_spec_hash_changes_when_the_meaning_changes(old: str, new: str) -> None:
    changed = ARTICLE_EXAMPLE.replace(old, new)
    assert changed != ARTICLE_EXAMPLE
    assert spec_hash(load_spec(changed)) != spec_hash(load_spec(ARTICLE_EXAMPLE))


def test_setting_a_default_explicitly_keeps_the_hash_but_unset_policy_fields_do_not() -> None:
    base = spec_hash(load_spec(spec()))
    assert spec_hash(load_spec(spec("compute:\n  gpus: 0\n"))) == base
    # An explicit priority is a different request from "the workspace default".
    assert spec_hash(load_spec(spec("queue:\n  priority: normal\n"))) != base


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
def test_to_dict_from_dict_round_trip_is_exact(text: str) -> None:
    original = load_spec(text)
    stored = json.loads(json.dumps(original.to_dict()))
    restored = spec_from_dict(stored)
    assert restored == original
    assert restored.to_dict() == original.to_dict()
    assert spec_hash(restored) == spec_hash(original)


def test_the_normal_form_is_a_fixed_point() -> None:
    original = load_spec(FULL_EXAMPLE)
    assert load_spec(yaml.safe_dump(original.to_dict())) == original


def test_from_dict_checks_with_the_same_rules() -> None:
    data = load_spec(ARTICLE_EXAMPLE).to_dict()
    data["compute"]["gpus"] = 99
    data["runtime"]["env"] = {"TAU_RUN_ID": "x"}
    with pytest.raises(SpecError) as raised:
        spec_from_dict(data)
    assert [(p.path, p.line, p.column) for p in raised.value.errors] == [
        ("compute.gpus", 0, 0),
        ("runtime.env.TAU_RUN_ID", 0, 0),
    ]


def test_from_dict_refuses_what_json_cannot_hold() -> None:
    with pytest.raises(SpecError) as raised:
        spec_from_dict({"schema_version": 1, "name": "x", "run": {"entrypoint": {1, 2}}})
    assert raised.value.errors[0].message == "not JSON-like data: set is not a JSON value"


def test_the_spec_is_immutable_and_hashable() -> None:
    loaded = load_spec(FULL_EXAMPLE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        loaded.name = "other"  # type: ignore[misc]
    assert hash(loaded) == hash(load_spec(FULL_EXAMPLE))


def test_helpers_renderers_use() -> None:
    loaded = load_spec(FULL_EXAMPLE)
    assert str(loaded.compute.cpu_cores) == "32"
    assert loaded.compute.memory_bytes == 256 * 2**30
    assert loaded.compute.total_gpus == 32
    assert loaded.runtime.env_dict()["OMP_NUM_THREADS"] == "8"
    backoff = loaded.resilience.backoff
    assert [backoff.delay(retry) for retry in (1, 2, 3, 5, 50)] == [30, 60, 120, 480, 600]
    assert loaded.resilience.retries("preempted", retries_so_far=4)
    assert not loaded.resilience.retries("preempted", retries_so_far=5)
    assert not loaded.resilience.retries("user_error", retries_so_far=0)
