"""Files written for the reference TauGrid CLI: its direct run config and managed manifest are
read, normalised into schema version 1 and said how they were read; what TauGrid cannot
honour is refused at the key the user wrote."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tau.spec import load_spec, spec_hash
from tau.spec.dialects import detect
from tau.spec.loader import load_yaml
from tau.spec.problems import ProblemCollector
from tau.spec.schema import read_source

from .support import REPO

REFERENCE = Path(__file__).resolve().parent / "reference"

#: How each fixture must be read: its dialect and shape, as `validate` prints them.
READINGS = {
    "gpu-data-volume.yaml": (
        "direct run config: 1 head + 1 worker, 1 GPU of type h100, "
        "data volume team-data at /data (read-write)"
    ),
    "tune-grid.yaml": (
        "direct run config: 1 head + 1 worker, 1 GPU, a sweep of 6 trials (2 at a time) "
        "by loss (min)"
    ),
    "kind-job.yaml": "direct run config: Job, 1 pod, 0 GPUs",
    "kind-ray.yaml": "direct run config: 1 head + 2 workers, 0 GPUs",
    "portal-ray.yaml": (
        "direct run config: 1 head + 1 worker, 1 GPU, data volume blob-training at /data "
        "(read-write)"
    ),
    "working-dir.yaml": "direct run config: 1 head + 1 worker, 0 GPUs",
    "managed-env-list.yaml": "managed manifest: 1 head + 2 workers, 1 GPU per worker (2 GPUs)",
}


def test_every_fixture_has_an_expected_reading() -> None:
    files = {path.name for path in REFERENCE.glob("*.yaml")}
    assert files == {*READINGS, "managed-shared-script.yaml"}


@pytest.mark.parametrize("name", sorted(READINGS))
def test_reference_configs_are_read_and_say_how(name: str) -> None:
    reading = read_source((REFERENCE / name).read_bytes())
    assert reading.problems == []
    assert reading.spec is not None
    assert reading.summary() == READINGS[name]


def test_an_entrypoint_outside_the_folder_is_the_only_problem() -> None:
    reading = read_source((REFERENCE / "managed-shared-script.yaml").read_bytes())
    assert reading.dialect == "managed"
    assert [(problem.path, problem.line, problem.column) for problem in reading.problems] == [
        ("run.entrypoint", 5, 15)
    ]
    assert "`..`" in reading.problems[0].message
    # With the script inside the folder it is read like any other managed manifest.
    fixed = (REFERENCE / "managed-shared-script.yaml").read_text().replace("../shared-demo/", "")
    spec = load_spec(fixed)
    assert (spec.compute.workers, spec.compute.cpus, spec.compute.memory) == (4, "2", "4Gi")
    assert spec.compute.head is not None
    assert (spec.compute.head.cpus, spec.compute.head.memory) == ("1", "12Gi")


def test_validate_accepts_them_all_and_prints_how_each_was_read() -> None:
    files = sorted(REFERENCE.glob("*.yaml"))
    result = subprocess.run(
        [sys.executable, "-m", "tau.spec", "validate", *map(str, files)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1  # the ../ one
    lines = result.stdout.splitlines()
    for name, summary in READINGS.items():
        assert f"{REFERENCE / name}: ok ({summary})" in lines
    errors = [line for line in lines if ": warning: " not in line and ": ok (" not in line]
    errors = [line for line in errors if ": note: " not in line]
    assert len(errors) == 1
    assert errors[0].startswith(f"{REFERENCE / 'managed-shared-script.yaml'}:5:15: run.entrypoint:")


def test_fields_of_the_references_own_services_are_ignored_with_a_warning() -> None:
    reading = read_source((REFERENCE / "gpu-data-volume.yaml").read_bytes())
    warned = {warning.path: warning for warning in reading.warnings}
    assert set(warned) == {
        "storage.output",
        "metrics.history",
        "metrics.offload",
        "policy.workspace",
        "policy.topology",
        "policy.disable_default_priorities",
    }
    offload = warned["metrics.offload"]
    assert (offload.line, offload.column) == (33, 5)
    assert offload.message.startswith("ignored: ")
    assert "Azure Data Explorer" in offload.message
    assert reading.notes == [
        "`workers: 1` is read as 1 head + 1 worker: the Ray head runs no training work, "
        "so a cluster has at least one worker"
    ]


def test_a_direct_config_keeps_the_references_semantics() -> None:
    spec = load_spec((REFERENCE / "gpu-data-volume.yaml").read_bytes())
    # gpus_per_worker 1; GPU-worker defaults; a head of 2/8Gi requested, 4/16Gi limits.
    assert (spec.compute.gpus, spec.compute.workers, spec.compute.gpu_type) == (1, 1, "h100")
    assert (spec.compute.cpus, spec.compute.memory) == ("8", "64Gi")
    assert (spec.compute.cpu_limit, spec.compute.memory_limit) == ("16", "128Gi")
    head = spec.compute.ray_head
    assert (head.cpus, head.memory, head.cpu_limit, head.memory_limit) == ("2", "8Gi", "4", "16Gi")
    # No retries unless asked; preemptions, evictions and OOM kills when asked.
    assert spec.resilience.max_retries == 0
    assert spec.resilience.retry_on == ("oom_killed", "preempted", "evicted")
    assert (spec.storage.data_pvc, spec.storage.data_access) == ("team-data", "read-write")
    assert (spec.experiment.project, spec.experiment.name, spec.experiment.group) == (
        "tau-examples",
        "pricing-policy-training",
        "offline-eval",
    )
    assert spec.runtime.env_dict()["PRICING_STEPS"] == "4000"


def test_a_direct_job_is_sized_by_its_requests() -> None:
    spec = load_spec((REFERENCE / "kind-job.yaml").read_bytes())
    assert spec.run.workload_kind == "job"
    assert spec.run.command() == ("bash", "train.sh")
    assert (spec.compute.cpus, spec.compute.memory, spec.compute.limits.cpus) == (
        "10m",
        "32Mi",
        None,
    )
    assert spec.queue.name == "laptop-cpu"
    assert spec.experiment.project == "Tau Local"


# --- one normal form ----------------------------------------------------------------------

HAND_WRITTEN_V1 = {
    "kind-ray.yaml": """\
        schema_version: 1
        name: laptop-ray
        run:
          entrypoint: ray_train.py
        compute:
          workers: 2
          cpus: 50m
          memory: 256Mi
          limits: {cpus: 1, memory: 768Mi}
          head:
            cpus: 20m
            memory: 512Mi
            limits: {cpus: 1, memory: 6Gi}
        runtime:
          image: registry.example.org/ray/ray:2.54.0-py312
          env: {LAPTOP_MARKER: laptop-ray}
        queue: {name: laptop-cpu}
        resilience:
          max_retries: 0
          retry_on: [preempted, evicted, oom_killed]
        experiment: {project: Tau Local, name: laptop-ray-smoke, group: local-laptop}
        """,
    "working-dir.yaml": """\
        schema_version: 1
        name: cpu-working-dir-demo
        run: {entrypoint: train.py, workload_kind: rayjob, project_dir: .}
        compute:
          workers: 1
          cpus: 2
          memory: 4Gi
          head: {cpus: 1, memory: 4Gi}
        runtime:
          image: registry.example.org/ray/ray:2.54.0-py312
          pip: [torch>=2.4.0]
          env: {DEMO_EXPERIMENT: lr-sweep, DEMO_LR: 5e-4, DEMO_STEPS: "48"}
        resilience: {max_retries: 0, retry_on: [oom_killed, preempted, evicted]}
        """,
    "tune-grid.yaml": """\
        schema_version: 1
        name: grid-smoke
        run: {entrypoint: train.py}
        compute:
          gpus: 1
          cpus: 8
          memory: 64Gi
          limits: {cpus: 16, memory: 128Gi}
          head: {cpus: 2, memory: 8Gi, limits: {cpus: 4, memory: 16Gi}}
        runtime:
          image: registry.example.org/ray/ray:2.56.0-py312
          pip: [torch==2.4.0]
        resilience: {max_retries: 0, retry_on: [preempted, evicted, oom_killed]}
        execution:
          launcher: ray-tune
          metric: loss
          max_concurrent_trials: 2
          configs:
            batch_size: {grid_search: [32, 64]}
            lr: [0.001, 0.01, 0.1]
        """,
    "managed-env-list.yaml": """\
        schema_version: 1
        name: managed-gpu
        run: {entrypoint: train.py}
        compute:
          gpus: 1
          workers: 2
          cpus: 8
          memory: 64Gi
          limits: {cpus: 16, memory: 128Gi}
          head: {cpus: 2, memory: 8Gi, limits: {cpus: 4, memory: 16Gi}}
        runtime:
          image: registry.example.org/ray/ray:2.56.0-py312-cuda
          pip: [torch>=2.4.0]
          env: {LOG_EVERY: "25", HF_HOME: /tmp/hf}
        """,
}


@pytest.mark.parametrize("name", sorted(HAND_WRITTEN_V1))
def test_a_reference_config_and_its_v1_equivalent_hash_the_same(name: str) -> None:
    translated = load_spec((REFERENCE / name).read_bytes())
    written = load_spec(textwrap.dedent(HAND_WRITTEN_V1[name]))
    assert translated.to_dict() == written.to_dict()
    assert spec_hash(translated) == spec_hash(written)


def test_changing_the_meaning_changes_the_hash() -> None:
    source = (REFERENCE / "kind-ray.yaml").read_text()
    base = spec_hash(load_spec(source))
    for old, new in (
        ("workers: 3", "workers: 4"),
        ('head_cpu_limit: "1"', 'head_cpu_limit: "2"'),
        ("worker_memory_request: 256Mi", "worker_memory_request: 257Mi"),
    ):
        assert spec_hash(load_spec(source.replace(old, new))) != base, new


# --- how the dialect is recognised -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "dialect"),
    [
        ("schema_version: 1\nname: a\nrun: {entrypoint: t.py}\n", "tau"),
        ("name: a\nengine: job\nentrypoint: t.py\n", "direct"),
        ("name: a\nrun: {engine: ray, entrypoint: t.py}\n", "direct"),
        ("name: a\nentrypoint: t.py\n", "direct"),
        ("schema_version: 1\nname: a\nengine: job\nentrypoint: t.py\n", "direct"),
        ("schema_version: 1\nname: a\nresource_naming: {prefix: x}\n", "managed"),
        ("schema_version: 1\nname: a\ncompute: {worker_cpus: 2}\n", "managed"),
        # A TauGrid file with a list-shaped env keeps its one problem.
        ("schema_version: 1\nname: a\nruntime: {env: [{name: A, value: b}]}\n", "tau"),
        ("name: a\nrun: {entrypoint: t.py}\n", "tau"),
    ],
)
def test_the_dialect_is_recognised_by_its_shape(text: str, dialect: str) -> None:
    assert detect(load_yaml(text, ProblemCollector())) == dialect


# --- strictness, refusals, and where problems point ----------------------------------------


def only(text: str) -> tuple[str, int, int, str, str | None]:
    reading = read_source(textwrap.dedent(text))
    assert len(reading.problems) == 1, reading.problems
    problem = reading.problems[0]
    return problem.path, problem.line, problem.column, problem.message, problem.hint


DIRECT = "name: demo\nengine: rayjob\nentrypoint: train.py\n"


def test_a_direct_config_is_read_strictly() -> None:
    path, line, column, message, hint = only(DIRECT + "compute:\n  gpus_per_wroker: 1\n")
    assert (path, line, column, message) == (
        "compute.gpus_per_wroker",
        5,
        3,
        "unknown key `gpus_per_wroker`",
    )
    assert hint == "did you mean `gpus_per_worker`?"


def test_a_managed_manifest_is_read_loosely() -> None:
    reading = read_source(
        "schema_version: 1\nname: demo\nresource_naming: {prefix: tau}\n"
        "run: {entrypoint: train.py}\nsurprise: 1\n"
    )
    assert reading.problems == []
    assert [warning.path for warning in reading.warnings] == ["resource_naming", "surprise"]


def test_problems_name_the_key_the_user_wrote() -> None:
    path, line, _column, message, _hint = only(DIRECT + "compute:\n  worker_memory_limit: 1Gb\n")
    assert (path, line) == ("compute.worker_memory_limit", 5)
    assert "not a Kubernetes quantity" in message
    # A limit below its request is found by the v1 checker and still named as written.
    path, line, _column, message, _hint = only(
        DIRECT + "compute:\n  head_cpu_request: 2\n  head_cpu_limit: 1\n"
    )
    assert (path, line) == ("compute.head_cpu_limit", 6)
    assert message == "the limit 1 is below the request of 2 (`cpus`)"
    # The name rule of v1 applies at `name`.
    path, *_ = only(DIRECT.replace("name: demo", "name: Demo_Run"))
    assert path == "name"


@pytest.mark.parametrize(
    ("extra", "path", "fragment"),
    [
        ("run:\n  source: {image: x, path: /w}\n", "run.source", "not supported"),
        ("runtime:\n  working_dir: /workspace\n", "runtime.working_dir", "not supported"),
        ("runtime:\n  security: {mode: privileged}\n", "runtime.security.mode", "restricted"),
        ("policy:\n  node_selector: {pool: a}\n", "policy.node_selector", "not supported"),
        ("storage:\n  volumes: [x]\n", "storage.volumes", "not supported"),
        ("execution:\n  launcher: ray-train\n", "execution.launcher", "ray-train"),
        ("workflow: {manifest: x}\n", "workflow", "not supported"),
        ("compute:\n  gpus: 2\n", "compute.gpus", "gpus_per_worker"),
        ("compute:\n  gpus_per_worker: 9\n", "compute.gpus_per_worker", "between 0 and 8"),
        ("resilience:\n  retry_on: [Sunspots]\n", "resilience.retry_on[0]", "Sunspots"),
    ],
)
def test_what_taugrid_cannot_honour_is_refused_with_a_hint(
    extra: str, path: str, fragment: str
) -> None:
    found, _line, _column, message, hint = only(DIRECT + extra)
    assert found == path
    assert fragment in message + (hint or "")


def test_a_direct_job_with_several_workers_is_refused_toward_torchrun() -> None:
    path, _line, _column, message, hint = only(
        "name: demo\nengine: job\nentrypoint: train.py\ncompute: {workers: 2}\n"
    )
    assert path == "compute.workers"
    assert "one pod" in message
    assert hint is not None
    assert "torchrun" in hint


def test_the_torchrun_launcher_becomes_the_command_and_the_pod_count() -> None:
    spec = load_spec(
        "name: demo\nengine: job\nentrypoint: train.py\n"
        "execution: {launcher: torchrun, nodes: 2, processes_per_node: 4}\n"
        "compute: {gpus: 4}\n"
    )
    assert spec.run.command() == ("torchrun", "--nproc-per-node", "4", "train.py")
    assert (spec.compute.workers, spec.compute.gpus, spec.compute.total_gpus) == (2, 4, 8)


def test_a_missing_engine_or_entrypoint_says_what_to_add() -> None:
    path, _line, _column, message, hint = only("name: demo\nentrypoint: train.py\n")
    assert (path, message) == ("engine", "missing required key `engine`")
    assert hint is not None
    assert "engine: rayjob" in hint
    path, _line, _column, message, _hint = only("name: demo\nengine: job\n")
    assert (path, message) == ("entrypoint", "missing required key `entrypoint`")


def test_secrets_from_env_secret() -> None:
    spec = load_spec(DIRECT + "runtime:\n  env_secret:\n    WANDB_API_KEY: wandb:api-key\n")
    (secret,) = spec.runtime.secrets
    assert (secret.env, secret.secret, secret.key) == ("WANDB_API_KEY", "wandb", "api-key")
    path, *_ = only(DIRECT + "runtime:\n  env_secret:\n    WANDB_API_KEY: wandb\n")
    assert path == "runtime.env_secret.WANDB_API_KEY"
