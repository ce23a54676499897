"""The normalised spec: what a valid tau.yaml means, with every default made explicit.

These frozen dataclasses are what the server stores (``Spec.to_dict()`` as JSON), hashes
(``spec_hash``) and renders into Kubernetes objects. They hold no defaults of their own: the
schema (``tau.spec.schema``) is the one place defaults live, and every ``Spec`` comes from it,
either by loading a tau.yaml or by ``spec_from_dict`` re-checking stored JSON.

Normal form, so that equal meanings are equal values (and hash the same):

* quantities are canonical strings: CPU ``"16"``/``"500m"``, memory ``"64Gi"``/``"1G"``;
* durations are whole seconds;
* relative paths are normalised (``./src//a.py`` → ``src/a.py``);
* lists whose order carries no meaning (``exclude``, ``artifacts``, ``retry_on``, ``tags``)
  are sorted; ``env`` and ``secrets`` are ordered by variable name; ``args``, ``pip``,
  ``inputs.datasets`` and ``inputs.models`` keep the order they were written in (an input's
  problems found at submission name its item by index);
* ``image``, ``queue.priority`` and ``queue.name`` (among others) stay ``None`` when unset,
  because workspace policy fills them at submission and must be able to tell "unset" from
  "set to the workspace default".
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal, TypeAlias

from tau.quantity import parse_quantity

SCHEMA_VERSION = 1

WorkloadKind: TypeAlias = Literal["rayjob", "job", "rayservice"]
#: ``rayservice`` is an endpoint (a long-running Ray Serve application), not a run: its spec
#: has a ``serve`` block and no entry point.
WORKLOAD_KINDS: tuple[WorkloadKind, ...] = ("rayjob", "job", "rayservice")

FailureClass: TypeAlias = Literal[
    "user_error",
    "oom_killed",
    "preempted",
    "evicted",
    "node_failure",
    "deadline_exceeded",
    "infrastructure",
    "unknown",
]
#: Every failure class, in the order the normal form lists them.
FAILURE_CLASSES: tuple[FailureClass, ...] = (
    "user_error",
    "oom_killed",
    "preempted",
    "evicted",
    "node_failure",
    "deadline_exceeded",
    "infrastructure",
    "unknown",
)
#: Failures that are not the workload's fault; retried unless the spec says otherwise.
DEFAULT_RETRY_ON: tuple[FailureClass, ...] = (
    "preempted",
    "evicted",
    "node_failure",
    "infrastructure",
)

#: How a script entry point is started, by file extension.
SCRIPT_INTERPRETERS = {".py": "python", ".sh": "bash"}


@dataclass(frozen=True, slots=True)
class Run:
    """What to run and for how long."""

    #: A script in the project directory (``train.py``, ``scripts/train.py --lr 0.1``) or a
    #: command line (``torchrun --nproc-per-node 8 train.py``, ``python -m pkg.train``).
    #: None only for a ``rayservice``, which starts ``serve.import_path`` instead.
    entrypoint: str | None
    workload_kind: WorkloadKind
    args: tuple[str, ...]
    project_dir: str
    exclude: tuple[str, ...]
    #: Seconds; None = no limit of the spec's own (workspace policy may still set one).
    max_runtime: int | None

    @property
    def script(self) -> str | None:
        """The script the entry point starts (its first word, when that is a .py/.sh file);
        None for a command line and for an endpoint, which has no entry point."""
        if self.entrypoint is None:
            return None
        first = shlex.split(self.entrypoint)[0]
        return first if script_interpreter(first) else None

    def command(self) -> tuple[str, ...]:
        """The full argument vector: ``("python", "train.py", *args)`` or the command line's
        words followed by ``args``. Renderers join it with ``shlex.join`` where a shell
        string is needed (a RayJob ``entrypoint``). An endpoint has no command: it raises
        :class:`NoEntrypoint`."""
        if self.entrypoint is None:
            raise NoEntrypoint(
                f"a {self.workload_kind} has no run.entrypoint to start: an endpoint starts "
                "its serve.import_path"
            )
        words = shlex.split(self.entrypoint)
        interpreter = script_interpreter(words[0])
        prefix = (interpreter,) if interpreter else ()
        return (*prefix, *words, *self.args)

    def to_dict(self) -> dict[str, Any]:
        return {
            "entrypoint": self.entrypoint,
            "workload_kind": self.workload_kind,
            "args": list(self.args),
            "project_dir": self.project_dir,
            "exclude": list(self.exclude),
            "max_runtime": self.max_runtime,
        }


class NoEntrypoint(ValueError):
    """``Run.command()`` of a spec without an entry point (a ``rayservice``)."""


def script_interpreter(word: str) -> str | None:
    """``python`` for ``train.py``, ``bash`` for ``run.sh``, None for anything else."""
    for extension, interpreter in SCRIPT_INTERPRETERS.items():
        if word.endswith(extension) and len(word) > len(extension):
            return interpreter
    return None


@dataclass(frozen=True, slots=True)
class Compute:
    """Resources of each worker, and how many workers."""

    gpus: int
    #: Canonical Kubernetes quantity: "16", "500m".
    cpus: str
    #: Canonical Kubernetes quantity: "64Gi", "1G", "1536".
    memory: str
    workers: int
    #: A flavor the workspace offers (a Kueue ResourceFlavor name), or None for any.
    gpu_type: str | None
    #: Each worker's limits where they differ from its requests (``cpus``/``memory``).
    limits: Limits
    #: The Ray head's size; None = the platform's (``HEAD_DEFAULT``). RayJobs and endpoints (a
    #: RayService has a Ray head too); not Jobs.
    head: Head | None

    @property
    def cpu_cores(self) -> Decimal:
        return parse_quantity(self.cpus)

    @property
    def memory_bytes(self) -> int:
        return int(parse_quantity(self.memory))

    @property
    def total_gpus(self) -> int:
        return self.gpus * self.workers

    @property
    def cpu_limit(self) -> str:
        """Each worker's CPU limit: its request unless ``limits.cpus`` says otherwise."""
        return self.limits.cpus or self.cpus

    @property
    def memory_limit(self) -> str:
        return self.limits.memory or self.memory

    @property
    def ray_head(self) -> Head:
        """The Ray head's size, the platform's default filled in."""
        return self.head or HEAD_DEFAULT

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "gpus": self.gpus,
            "cpus": self.cpus,
            "memory": self.memory,
            "workers": self.workers,
            "gpu_type": self.gpu_type,
        }
        # Present only when set, so that specs written before these fields existed keep
        # their normal form (and spec hash).
        if self.limits.cpus is not None or self.limits.memory is not None:
            data["limits"] = self.limits.to_dict()
        if self.head is not None:
            data["head"] = self.head.to_dict()
        return data


@dataclass(frozen=True, slots=True)
class Limits:
    """Limits that differ from the requests; None = the same as the request."""

    cpus: str | None
    memory: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            key: value for key, value in (("cpus", self.cpus), ("memory", self.memory)) if value
        }


@dataclass(frozen=True, slots=True)
class Head:
    """The Ray head pod: CPU only; it runs the driver, the GCS and the dashboard, and Ray
    schedules no task there."""

    cpus: str
    memory: str
    limits: Limits

    @property
    def cpu_limit(self) -> str:
        return self.limits.cpus or self.cpus

    @property
    def memory_limit(self) -> str:
        return self.limits.memory or self.memory

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"cpus": self.cpus, "memory": self.memory}
        if self.limits.cpus is not None or self.limits.memory is not None:
            data["limits"] = self.limits.to_dict()
        return data


#: The Ray head when ``compute.head`` is unset: room for the GCS, the dashboard and the driver.
HEAD_DEFAULT = Head(cpus="2", memory="8Gi", limits=Limits(None, None))


@dataclass(frozen=True, slots=True)
class EnvVar:
    name: str
    value: str


@dataclass(frozen=True, slots=True)
class SecretRef:
    """An environment variable whose value comes from a key of a Kubernetes Secret."""

    #: The environment variable the workload reads.
    env: str
    #: The Secret's name, in the workspace's namespace.
    secret: str
    #: The key inside the Secret.
    key: str

    def to_dict(self) -> dict[str, Any]:
        return {"env": self.env, "secret": self.secret, "key": self.key}


@dataclass(frozen=True, slots=True)
class Runtime:
    """The software the workload runs in."""

    #: None = the workspace's default image.
    image: str | None
    pip: tuple[str, ...]
    #: Literal values, ordered by name (the shape of a container's ``env`` list).
    env: tuple[EnvVar, ...]
    #: Ordered by variable name.
    secrets: tuple[SecretRef, ...]

    def env_dict(self) -> dict[str, str]:
        return {variable.name: variable.value for variable in self.env}

    def installs(self, project: str) -> bool:
        """Whether ``pip`` names ``project`` (``ray`` for ``ray[train]==2.60.0``)."""
        wanted = project_name(project)
        return any(project_name(requirement) == wanted for requirement in self.pip)

    def to_dict(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "pip": list(self.pip),
            "env": self.env_dict(),
            "secrets": [secret.to_dict() for secret in self.secrets],
        }


_PROJECT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def project_name(requirement: str) -> str:
    """A pip requirement's project, normalised as PyPI compares names (PEP 503): ``ray`` for
    ``Ray[default,train] == 2.60.0``, ``typing-extensions`` for ``typing_extensions``."""
    match = _PROJECT_NAME.match(requirement.strip())
    name = match.group(0) if match else requirement.strip()
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True, slots=True)
class Queue:
    """Where the workload waits: both None = the workspace's defaults."""

    #: A Kueue WorkloadPriorityClass name the workspace allows.
    priority: str | None
    #: One of the workspace's queues (a Kueue LocalQueue name).
    name: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"priority": self.priority, "name": self.name}


@dataclass(frozen=True, slots=True)
class Backoff:
    """Wait before a retry: ``initial`` seconds, doubling per retry, at most ``max``."""

    initial: int
    max: int

    def delay(self, retry: int) -> int:
        """Seconds to wait before retry number ``retry`` (1 for the first retry)."""
        if retry <= 1:
            return min(self.initial, self.max)
        # Doubling stops mattering long before the exponent gets large.
        doubled: int = self.initial * 2 ** min(retry - 1, 32)
        return min(self.max, doubled)

    def to_dict(self) -> dict[str, Any]:
        return {"initial": self.initial, "max": self.max}


@dataclass(frozen=True, slots=True)
class Resilience:
    """When a failed attempt is retried, and where its checkpoints are."""

    max_retries: int
    #: Failure classes that are retried, in ``FAILURE_CLASSES`` order.
    retry_on: tuple[FailureClass, ...]
    backoff: Backoff
    #: Relative to the project directory as it runs; None = the platform's choice. Either
    #: way the workload finds it in ``TAU_CHECKPOINT_DIR``.
    checkpoint_dir: str | None

    def retries(self, failure_class: FailureClass, *, retries_so_far: int) -> bool:
        """Whether a failure of this class, after this many retries, gets another attempt."""
        return failure_class in self.retry_on and retries_so_far < self.max_retries

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_retries": self.max_retries,
            "retry_on": list(self.retry_on),
            "backoff": self.backoff.to_dict(),
            "checkpoint_dir": self.checkpoint_dir,
        }


@dataclass(frozen=True, slots=True)
class DatasetInput:
    """A dataset of the workspace's catalog that the run reads, at one version."""

    #: The dataset's name in the workspace (``wiki``).
    name: str
    #: A version number (``"3"``) or an alias (``"train"``, ``"latest"``), as written: the
    #: server resolves it once, at submission, and every attempt of the run reads that version.
    version: str
    #: Where its files appear (read-only), relative to ``TAU_DATA_DIR``; normalised, never
    #: ``.``. The dataset's name when the spec gives none (the stage's, for ``from``).
    path: str
    #: In a pipeline's stage: the stage whose run made the version it reads (``{from:
    #: prepare}``), resolved when this stage starts; ``name`` is then empty and ``version``
    #: ``latest`` (unused). None: the catalog's ``name`` at ``version``.
    from_stage: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        """What it reads, to tell two items apart: the asset and version, or the stage."""
        return (f"from {self.from_stage}", "") if self.from_stage else (self.name, self.version)

    def to_dict(self) -> dict[str, Any]:
        if self.from_stage is not None:
            return {"from": self.from_stage, "path": self.path}
        return {"name": self.name, "version": self.version, "path": self.path}


@dataclass(frozen=True, slots=True)
class ModelInput:
    """A model of the workspace's catalog that the run reads, at one version (batch
    inference, or training that starts from a registered model)."""

    #: The model's name in the workspace (``reviews-classifier``).
    name: str
    #: A version number or an alias, as written; resolved once, at submission, as a dataset's.
    version: str
    #: Where its files appear (read-only), relative to ``TAU_DATA_DIR``, apart from every
    #: dataset's folder; normalised, never ``.``. The model's name when the spec gives none
    #: (the stage's, for ``from``).
    path: str
    #: In a pipeline's stage: the stage whose run made the model version it reads; as a
    #: dataset's.
    from_stage: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        """What it reads, to tell two items apart: the asset and version, or the stage."""
        return (f"from {self.from_stage}", "") if self.from_stage else (self.name, self.version)

    def to_dict(self) -> dict[str, Any]:
        if self.from_stage is not None:
            return {"from": self.from_stage, "path": self.path}
        return {"name": self.name, "version": self.version, "path": self.path}


#: An item of ``inputs.datasets`` or ``inputs.models``.
AssetInput: TypeAlias = DatasetInput | ModelInput


@dataclass(frozen=True, slots=True)
class Inputs:
    """What the run reads besides its project directory."""

    #: In the order written; names and paths are unique, and no path is inside another.
    datasets: tuple[DatasetInput, ...]
    #: In the order written, as ``datasets``; no path is inside another's, a dataset's
    #: included (each is staged in a folder of its own under ``TAU_DATA_DIR``).
    models: tuple[ModelInput, ...]

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"datasets": [dataset.to_dict() for dataset in self.datasets]}
        # Present only when used, so that specs that read only datasets keep their normal
        # form (and spec hash).
        if self.models:
            data["models"] = [model.to_dict() for model in self.models]
        return data


@dataclass(frozen=True, slots=True)
class OutputAsset:
    """A folder the run writes that becomes a new version of a dataset or a model of the
    workspace when the run succeeds."""

    #: The dataset's or model's name in the workspace (made by the first such run).
    name: str
    #: The folder, relative to ``TAU_OUTPUT_DIR``; normalised, never ``.``.
    path: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path}


@dataclass(frozen=True, slots=True)
class Outputs:
    """What the workload writes under ``TAU_OUTPUT_DIR``, and what is kept as evidence."""

    metrics_file: str
    #: Glob patterns relative to ``TAU_OUTPUT_DIR``, sorted.
    artifacts: tuple[str, ...]
    #: A folder that becomes a new dataset version on success; None = none.
    dataset: OutputAsset | None
    #: A folder that becomes a new model version on success; None = none.
    model: OutputAsset | None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "metrics_file": self.metrics_file,
            "artifacts": list(self.artifacts),
        }
        # Present only when set, so that specs written before these fields existed keep
        # their normal form (and spec hash).
        if self.dataset is not None:
            data["dataset"] = self.dataset.to_dict()
        if self.model is not None:
            data["model"] = self.model.to_dict()
        return data


@dataclass(frozen=True, slots=True)
class Experiment:
    """Labels for comparing runs; they change nothing about how a run executes."""

    project: str | None
    group: str | None
    #: Sorted.
    tags: tuple[str, ...]
    #: The experiment within the project (runs of one experiment are compared together).
    name: str | None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "project": self.project,
            "group": self.group,
            "tags": list(self.tags),
        }
        if self.name is not None:
            data["name"] = self.name
        return data


DataAccess: TypeAlias = Literal["read-only", "read-write"]


@dataclass(frozen=True, slots=True)
class Storage:
    """A data volume: an existing PersistentVolumeClaim mounted at ``/data`` in every pod."""

    data_pvc: str | None
    data_access: DataAccess

    #: Where the data volume is mounted (``TAU_DATA_DIR`` names it too).
    MOUNT_PATH = "/data"

    @property
    def read_only(self) -> bool:
        return self.data_access == "read-only"

    def to_dict(self) -> dict[str, Any]:
        return {"data_pvc": self.data_pvc, "data_access": self.data_access}


SweepMode: TypeAlias = Literal["min", "max"]
#: A sweep parameter's value as written: text, a number or a boolean.
ParameterValue: TypeAlias = str | int | float | bool


@dataclass(frozen=True, slots=True)
class SweepParameter:
    """One key of ``execution.configs``: a list of values to try, or one value for all."""

    name: str
    values: tuple[ParameterValue, ...]
    #: True for a list (each value is tried: a grid axis); False for a constant.
    grid: bool

    def to_json(self) -> Any:
        return list(self.values) if self.grid else self.values[0]


@dataclass(frozen=True, slots=True)
class Execution:
    """How the entry point is launched: once (``launcher`` None) or as a Ray Tune sweep."""

    launcher: Literal["ray-tune"] | None
    metric: str | None
    mode: SweepMode
    num_samples: int
    max_concurrent_trials: int
    #: Ordered by name.
    configs: tuple[SweepParameter, ...]

    @property
    def is_sweep(self) -> bool:
        return self.launcher == "ray-tune"

    def trials(self) -> list[dict[str, ParameterValue]]:
        """Each trial's config, in order: every combination of the grid (the last parameter
        varying fastest), the whole grid repeated ``num_samples`` times."""
        grid: list[dict[str, ParameterValue]] = [{}]
        for parameter in self.configs:
            grid = [
                {**config, parameter.name: value} for config in grid for value in parameter.values
            ]
        return [dict(config) for _sample in range(self.num_samples) for config in grid]

    def to_dict(self) -> dict[str, Any]:
        return {
            "launcher": self.launcher,
            "metric": self.metric,
            "mode": self.mode,
            "num_samples": self.num_samples,
            "max_concurrent_trials": self.max_concurrent_trials,
            "configs": {parameter.name: parameter.to_json() for parameter in self.configs},
        }


@dataclass(frozen=True, slots=True)
class ModelRef:
    """The model version an endpoint serves, staged read-only at ``TAU_MODEL_DIR``."""

    #: A model's name in the workspace (``tiny-gpt``).
    name: str
    #: A version number (``"3"``) or an alias (``"production"``, ``"latest"``), as written;
    #: the server resolves it when the endpoint is deployed.
    version: str
    #: In a pipeline's stage: the stage whose run made the model version to serve (``{from:
    #: finetune}``), resolved when this stage starts; ``name`` is then empty.
    from_stage: str | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.from_stage is not None:
            return {"from": self.from_stage}
        return {"name": self.name, "version": self.version}


@dataclass(frozen=True, slots=True)
class Autoscaling:
    """Ray Serve's autoscaling: between ``min_replicas`` (0: scale to zero) and
    ``max_replicas``, aiming at ``target_ongoing_requests`` requests in flight per replica."""

    min_replicas: int
    max_replicas: int
    target_ongoing_requests: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "min_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
            "target_ongoing_requests": self.target_ongoing_requests,
        }


@dataclass(frozen=True, slots=True)
class Serve:
    """An endpoint (``run.workload_kind: rayservice``): a Ray Serve application of the
    project, its replicas each sized by ``compute``."""

    #: ``module:attribute`` (``app:deployment``, ``pkg.serve:app``) in the project directory.
    import_path: str
    #: None = the application loads no model version of the workspace.
    model: ModelRef | None
    #: A fixed number of replicas; None exactly when ``autoscaling`` is set.
    replicas: int | None
    autoscaling: Autoscaling | None
    #: Where requests are routed: ``/`` or ``/a/b`` (never a trailing ``/`` after the root).
    route_prefix: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "import_path": self.import_path,
            "model": None if self.model is None else self.model.to_dict(),
            "replicas": self.replicas,
            "autoscaling": None if self.autoscaling is None else self.autoscaling.to_dict(),
            "route_prefix": self.route_prefix,
        }


@dataclass(frozen=True, slots=True)
class Spec:
    """A validated, normalised tau.yaml (schema version 1)."""

    schema_version: int
    name: str
    run: Run
    compute: Compute
    runtime: Runtime
    queue: Queue
    resilience: Resilience
    inputs: Inputs
    outputs: Outputs
    experiment: Experiment
    storage: Storage
    execution: Execution
    #: The endpoint a ``rayservice`` is; None for runs (``rayjob``, ``job``).
    serve: Serve | None

    @property
    def is_endpoint(self) -> bool:
        """Whether this spec describes an endpoint (deployed with ``tau serve deploy``)
        rather than a run."""
        return self.run.workload_kind == "rayservice"

    def to_dict(self) -> dict[str, Any]:
        """The normal form as JSON-ready data; ``tau.spec.spec_from_dict`` reads it back
        exactly."""
        data = self._base_dict()
        # Blocks newer than the first specs are present only when used, so that older specs
        # keep their normal form and spec hash.
        if self.storage != NO_STORAGE:
            data["storage"] = self.storage.to_dict()
        if self.execution != NO_EXECUTION:
            data["execution"] = self.execution.to_dict()
        if self.inputs != NO_INPUTS:
            data["inputs"] = self.inputs.to_dict()
        if self.serve is not None:
            data["serve"] = self.serve.to_dict()
        return data

    def _base_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "name": self.name,
            "run": self.run.to_dict(),
            "compute": self.compute.to_dict(),
            "runtime": self.runtime.to_dict(),
            "queue": self.queue.to_dict(),
            "resilience": self.resilience.to_dict(),
            "outputs": self.outputs.to_dict(),
            "experiment": self.experiment.to_dict(),
        }

    def canonical_json(self) -> str:
        return canonical_json(self.to_dict())


NO_STORAGE = Storage(data_pvc=None, data_access="read-only")
NO_INPUTS = Inputs(datasets=(), models=())
NO_EXECUTION = Execution(
    launcher=None, metric=None, mode="min", num_samples=1, max_concurrent_trials=1, configs=()
)


def canonical_json(data: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 text. The normal form holds only strings, integers,
    booleans, null, lists and objects with ASCII keys, for which this is also RFC 8785 (JCS)."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def spec_hash(spec: Spec) -> str:
    """SHA-256 (hex) of the canonical JSON of the normal form; part of a run's evidence.

    Stable across key order, formatting, comments and equivalent spellings (``16`` and
    ``16000m`` CPUs, ``2h`` and ``7200`` seconds); any change of meaning changes it.
    """
    return hashlib.sha256(canonical_json(spec.to_dict()).encode("utf-8")).hexdigest()
