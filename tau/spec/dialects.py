"""The two other tau.yaml dialects TauGrid reads: the reference CLI's direct run config and
its managed workflow manifest.

People who used the reference TauGrid CLI (Azure/taugrid) have files of two shapes:

* the **direct run config** (``name``, ``engine: job|rayjob``, a top-level ``entrypoint``,
  ``compute.gpus_per_worker``, per-role ``head_cpu_request`` … ``worker_memory_limit``,
  ``policy``, ``storage.data_pvc``, ``metrics``, ``execution`` with a Ray Tune grid). It has
  no ``schema_version`` and is recognised by its ``engine`` or top-level ``entrypoint``;
* the **managed manifest** (``schema_version: 1`` with ``resource_naming``,
  ``compute.worker_cpus``, ``compute.cpu_limit`` …; its ``runtime.env`` may be a list), whose
  ``cpus``/``memory`` size the Ray head and ``worker_*`` the workers.

Both are translated here into TauGrid's own schema version 1, as a node tree that keeps the
line and column of every value the user wrote, and checked by the one schema: a direct config
and its hand-written v1 equivalent have the same normal form and spec hash. Problems found in
the translation name the key the user wrote (``compute.worker_cpu_limit``, not
``compute.limits.cpus``).

The reference's own semantics are kept where they differ from TauGrid's defaults:

* ``workers`` counts the Ray head (``workers: 2`` is 1 head + 1 worker). TauGrid's head runs
  no training work, so a Ray cluster always has at least one worker: ``workers: 1`` is read
  as 1 head + 1 worker, and the reading says so;
* ``gpus_per_worker`` defaults to 1; ``max_retries`` to 0, retrying preemptions, evictions
  and OOM kills; sizes default to 2 CPUs / 8Gi requested and 4 / 16Gi limits (8 / 64Gi and
  16 / 128Gi for a GPU worker); a request without a limit is also the limit;
* ``storage.data_pvc`` is mounted read-write.

The direct config is read strictly (an unknown key is an error with a close match); the
managed manifest loosely (an unknown key is a warning), as the reference reads them. Fields
that only mean something to the reference's own services (metrics offload to Azure Data
Explorer, ``resource_naming`` of its CRDs, its profiles and lanes) are accepted with a warning
naming them; fields that would change what runs and that TauGrid cannot honour are refused
with a hint.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal, TypeAlias

from tau.spec.fields import IntegerKind, Invalid, QuantityKind, StringKind, describe
from tau.spec.model import FailureClass, Serve, Spec
from tau.spec.nodes import MappingNode, Node, ScalarNode, SequenceNode, from_python
from tau.spec.problems import (
    DOCUMENT_PATH,
    ProblemCollector,
    SpecProblem,
    index_path,
    join_path,
    quote,
)

Dialect: TypeAlias = Literal["tau", "direct", "managed"]

#: How each dialect is named in ``validate`` output and messages.
DIALECT_NAMES: dict[Dialect, str] = {
    "tau": "TauGrid tau.yaml v1",
    "direct": "direct run config",
    "managed": "managed manifest",
}

#: Sizes the reference gives a pod whose config names none: (request, limit).
_CPU_DEFAULTS = {"cpu": ("2", "4"), "memory": ("8Gi", "16Gi")}
_GPU_DEFAULTS = {"cpu": ("8", "16"), "memory": ("64Gi", "128Gi")}
_MAX_DIRECT_GPUS = 8
_REFERENCE_RETRY_ON: dict[str, FailureClass] = {
    "preempted": "preempted",
    "evicted": "evicted",
    "oomkilled": "oom_killed",
    "oom_killed": "oom_killed",
    "nodefailure": "node_failure",
    "node_failure": "node_failure",
    "nodelost": "node_failure",
    "deadlineexceeded": "deadline_exceeded",
    "deadline_exceeded": "deadline_exceeded",
    "infrastructure": "infrastructure",
    "usererror": "user_error",
    "user_error": "user_error",
    "unknown": "unknown",
}
_DIRECT_DEFAULT_RETRY_ON = ("preempted", "evicted", "oom_killed")

_CPU = QuantityKind("cpu", minimum=Decimal("0.001"), maximum=Decimal(1024))
_MEMORY = QuantityKind("memory", minimum=Decimal(2**20), maximum=Decimal(16 * 2**40))


@dataclass
class Reading:
    """What a tau.yaml said and how it was read."""

    dialect: Dialect
    spec: Spec | None
    problems: list[SpecProblem]
    #: Accepted, but worth knowing: ignored fields, semantics that differ from TauGrid's.
    warnings: list[SpecProblem] = field(default_factory=list)
    #: Facts about how a file was read that its summary states ("workers: 1 is read as …").
    notes: list[str] = field(default_factory=list)
    #: v1 path → where the file wrote it (only for a translated dialect).
    sources: dict[str, str] = field(default_factory=dict)

    def written_at(self, path: str) -> str:
        """Where the file says what normal-form ``path`` holds (``compute.gpus`` of a direct
        RayJob is ``compute.gpus_per_worker``): for problems found after the schema."""
        return source_path(self.sources, path)

    @property
    def dialect_name(self) -> str:
        return DIALECT_NAMES[self.dialect]

    def summary(self) -> str:
        """``direct run config: 1 head + 1 worker, 0 GPUs`` (the spec must be valid)."""
        if self.spec is None:
            return f"{self.dialect_name}: not valid"
        return f"{self.dialect_name}: {describe_shape(self.spec)}"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def describe_shape(spec: Spec) -> str:
    """``1 head + 2 workers, 1 GPU per worker (2 GPUs)``, and what else shapes the run."""
    compute = spec.compute
    if spec.serve is not None:
        return _describe_endpoint(spec, spec.serve)
    if spec.run.workload_kind == "rayjob":
        shape = f"1 head + {_plural(compute.workers, 'worker')}"
    else:
        shape = f"Job, {_plural(compute.workers, 'pod')}"
    if compute.gpus == 0:
        shape += ", 0 GPUs"
    elif compute.workers == 1:
        shape += f", {_plural(compute.gpus, 'GPU')}"
    else:
        each = "pod" if spec.run.workload_kind == "job" else "worker"
        shape += f", {_plural(compute.gpus, 'GPU')} per {each} ({compute.total_gpus} GPUs)"
    if compute.gpu_type:
        shape += f" of type {compute.gpu_type}"
    if spec.storage.data_pvc:
        shape += f", data volume {spec.storage.data_pvc} at /data ({spec.storage.data_access})"
    if spec.execution.is_sweep:
        trials = len(spec.execution.trials())
        shape += (
            f", a sweep of {_plural(trials, 'trial')} "
            f"({spec.execution.max_concurrent_trials} at a time) by "
            f"{spec.execution.metric} ({spec.execution.mode})"
        )
    return shape


def _describe_endpoint(spec: Spec, serve: Serve) -> str:
    """``an endpoint of app:deployment at /: 2 replicas, 1 GPU each (2 GPUs), model tiny-gpt@3``."""
    compute = spec.compute
    shape = f"an endpoint of {serve.import_path} at {serve.route_prefix}: "
    if serve.autoscaling is not None:
        scaling = serve.autoscaling
        shape += f"{scaling.min_replicas} to {_plural(scaling.max_replicas, 'replica')}"
        most = scaling.max_replicas
    else:
        replicas = serve.replicas or 1
        shape += _plural(replicas, "replica")
        most = replicas
    if compute.gpus:
        shape += f", {_plural(compute.gpus, 'GPU')} each"
        if most > 1:
            shape += f" ({'at most ' if serve.autoscaling else ''}{compute.gpus * most} GPUs)"
    else:
        shape += ", 0 GPUs"
    if compute.gpu_type:
        shape += f" of type {compute.gpu_type}"
    if serve.model is not None:
        shape += f", model {serve.model.name}@{serve.model.version}"
    return shape


def detect(root: Node | None) -> Dialect:
    """Which dialect a document is written in (TauGrid's own unless its shape says not)."""
    if not isinstance(root, MappingNode):
        return "tau"
    top = _entries(root)
    run = _entries(top.get("run"))
    if "schema_version" in top and "engine" not in top and "engine" not in run:
        compute = _entries(top.get("compute"))
        # A list-shaped runtime.env is not enough: a TauGrid file with that mistake must get
        # its one problem, not another reading of its compute block.
        if any(key in top for key in _MANAGED_ONLY_TOP) or any(
            key in compute for key in _MANAGED_ONLY_COMPUTE
        ):
            return "managed"
        return "tau"
    if "schema_version" not in top and (
        "engine" in top or "engine" in run or "entrypoint" in top or "script" in top
    ):
        return "direct"
    if "engine" in top or "engine" in run:
        return "direct"
    return "tau"


_MANAGED_ONLY_TOP = ("resource_naming", "artifacts", "research", "model", "eval")
_MANAGED_ONLY_COMPUTE = (
    "worker_cpus",
    "worker_memory",
    "worker_cpu_limit",
    "worker_memory_limit",
    "cpu_limit",
    "memory_limit",
)


def _entries(node: Node | None) -> dict[str, Node]:
    if isinstance(node, MappingNode):
        return {key.text: value for key, value in node.entries}
    return {}


def _keys(node: Node | None) -> dict[str, tuple[ScalarNode, Node]]:
    if isinstance(node, MappingNode):
        return {key.text: (key, value) for key, value in node.entries}
    return {}


# ------------------------------------------------------------------------------ translating


class _Tree:
    """The v1 document being built: nested dicts of nodes, and where each came from."""

    def __init__(self, root: Node) -> None:
        self.root = root
        self.values: dict[str, Any] = {}
        #: v1 path → the path the user wrote it at.
        self.sources: dict[str, str] = {}

    def put(self, path: str, node: Node, source: str | None = None) -> None:
        parts = path.split(".")
        target = self.values
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = node
        self.sources[path] = source if source is not None else path

    def has(self, path: str) -> bool:
        target: Any = self.values
        for part in path.split("."):
            if not isinstance(target, dict) or part not in target:
                return False
            target = target[part]
        return True

    def node(self) -> MappingNode:
        return self._mapping(self.values, self.root)

    def _mapping(self, values: dict[str, Any], at: Node) -> MappingNode:
        entries: list[tuple[ScalarNode, Node]] = []
        for name, value in values.items():
            child = self._mapping(value, at) if isinstance(value, dict) else value
            key = ScalarNode("str", name, name, True, child.line, child.column)
            entries.append((key, child))
        return MappingNode(tuple(entries), at.line, at.column)

    def source_of(self, path: str) -> str:
        """The user's path for a problem at v1 ``path`` (its longest translated prefix)."""
        return source_path(self.sources, path)


def source_path(sources: dict[str, str], path: str) -> str:
    """The user's path for v1 ``path``: its longest translated prefix, renamed."""
    best = ""
    for v1 in sources:
        inside = path == v1 or path.startswith(v1 + ".") or path.startswith(v1 + "[")
        if inside and len(v1) > len(best):
            best = v1
    if not best:
        return path
    return sources[best] + path[len(best) :]


def synthesized(value: Any, at: Node) -> Node:
    """A node for a value the translation computed, placed where its source was written."""
    node = from_python(value, line=at.line, column=at.column)
    if isinstance(node, ScalarNode):
        return ScalarNode(node.kind, node.value, node.text, True, at.line, at.column)
    return node


class _Translator:
    def __init__(
        self, root: MappingNode, problems: ProblemCollector, warnings: ProblemCollector
    ) -> None:
        self.root = root
        self.problems = problems
        self.warnings = warnings
        self.tree = _Tree(root)
        self.notes: list[str] = []

    def translate(self) -> None:
        raise NotImplementedError

    # -- reporting --------------------------------------------------------------------

    def refuse(self, path: str, node: Node, message: str, hint: str | None = None) -> None:
        self.problems.add(path, node, message, hint)

    def warn(self, path: str, node: Node, message: str, hint: str | None = None) -> None:
        self.warnings.add(path, node, message, hint)

    def ignored(self, path: str, node: Node, why: str) -> None:
        self.warn(path, node, f"ignored: {why}")

    def unknown(self, path: str, key: ScalarNode, known: Iterable[str], *, strict: bool) -> None:
        names = list(known)
        close = difflib.get_close_matches(key.text, names, n=1, cutoff=0.6)
        hint = f"did you mean `{close[0]}`?" if close else None
        where = join_path(path, key.text)
        if strict:
            self.refuse(where, key, f"unknown key {quote(key.text)}", hint)
        else:
            self.warn(where, key, f"unknown key {quote(key.text)} is ignored", hint)

    def block(
        self, node: Node | None, path: str, known: Iterable[str], *, strict: bool
    ) -> dict[str, tuple[ScalarNode, Node]]:
        """The entries of a block, unknown keys reported; {} for an absent or empty block."""
        if node is None or (isinstance(node, ScalarNode) and node.kind == "null"):
            return {}
        if not isinstance(node, MappingNode):
            self.refuse(path, node, f"expected a mapping, got {describe(node)}")
            return {}
        allowed = set(known)
        entries = _keys(node)
        for name, (key, _value) in entries.items():
            if name not in allowed:
                self.unknown(path, key, known, strict=strict)
        return {name: entry for name, entry in entries.items() if name in allowed}

    # -- values -----------------------------------------------------------------------

    def quantity(self, kind: QuantityKind, node: Node, path: str) -> str | None:
        value = kind.check(node, path, self.problems)
        return None if isinstance(value, Invalid) else value

    def integer(self, node: Node, path: str, low: int, high: int) -> int | None:
        value = IntegerKind(low, high).check(node, path, self.problems)
        return None if isinstance(value, Invalid) else value

    def text(self, node: Node, path: str) -> str | None:
        value = StringKind(max_length=4096).check(node, path, self.problems)
        return None if isinstance(value, Invalid) else value

    def carry(
        self, v1: str, entries: dict[str, tuple[ScalarNode, Node]], name: str, path: str
    ) -> None:
        """Copy a value the user wrote unchanged into the v1 tree."""
        if name in entries:
            self.tree.put(v1, entries[name][1], join_path(path, name))

    def pass_block(
        self, v1: str, entries: dict[str, tuple[ScalarNode, Node]], names: Iterable[str], path: str
    ) -> None:
        for name in names:
            self.carry(f"{v1}.{name}", entries, name, path)


# -------------------------------------------------------------------------- direct config

_DIRECT_TOP = (
    "name",
    "engine",
    "entrypoint",
    "script",
    "image",
    "run",
    "runtime",
    "compute",
    "execution",
    "policy",
    "storage",
    "metrics",
    "experiment",
    "resilience",
    "profiler",
    "workflow",
    "schema_version",
)
_DIRECT_RUN = (
    "entrypoint",
    "script",
    "engine",
    "working_dir",
    "working_dir_excludes",
    "source",
    "ttl_seconds_after_finished",
    "args",
    "max_runtime",
)
_DIRECT_RUNTIME = ("image", "pip", "env", "env_secret", "working_dir", "security")
_ROLE_KEYS = tuple(
    f"{role}{resource}_{what}"
    for role in ("", "head_", "worker_")
    for resource in ("cpu", "memory")
    for what in ("request", "limit")
)
_DIRECT_COMPUTE = ("workers", "gpus", "gpus_per_worker", *_ROLE_KEYS)
_DIRECT_EXECUTION = (
    "launcher",
    "nodes",
    "processes_per_node",
    "metric",
    "mode",
    "num_samples",
    "max_concurrent_trials",
    "configs",
)
_DIRECT_POLICY = (
    "workspace",
    "namespace",
    "profile",
    "queue",
    "lane",
    "gpu_class",
    "topology",
    "priority",
    "node_selector",
    "disable_default_priorities",
)
_DIRECT_STORAGE = (
    "data_pvc",
    "output",
    "checkpoint",
    "result_pvc",
    "volumes",
    "mounts",
    "image_assets",
)
_DIRECT_RESILIENCE = (
    "max_retries",
    "retry_on",
    "checkpoint_path",
    "backoff_initial",
    "backoff_max",
)
_ENGINES = {"job": "job", "rayjob": "rayjob", "ray": "rayjob"}


class _Direct(_Translator):
    def translate(self) -> None:
        top = self.block(self.root, "", _DIRECT_TOP, strict=True)
        run = self.block(top.get("run", (None, None))[1], "run", _DIRECT_RUN, strict=True)
        self.tree.put("schema_version", synthesized(1, self.root), "schema_version")
        if "schema_version" in top:
            self.ignored(
                "schema_version",
                top["schema_version"][1],
                "a file with `engine` is read as a direct run config",
            )
        self.carry("name", top, "name", "")
        engine = self._engine(top, run)
        self._entrypoint(top, run)
        self._run(run)
        self._runtime(top, engine)
        self._compute(top, engine)
        self._execution(top, engine)
        self._policy(top)
        self._storage(top, engine)
        self._metrics(top)
        self._experiment(top)
        self._resilience(top)
        for name, why in (("profiler", "TauGrid does not run the reference's profiler"),):
            if name in top:
                self.ignored(name, top[name][1], why)
        if "workflow" in top:
            self.refuse(
                "workflow",
                top["workflow"][1],
                "delegating to a managed workflow is not supported",
                "submit the workflow's own tau.yaml instead",
            )

    def _engine(self, top: dict[str, Any], run: dict[str, Any]) -> str | None:
        found: list[tuple[str, Node]] = []
        for path, entries in (("engine", top), ("run.engine", run)):
            if "engine" in entries:
                found.append((path, entries["engine"][1]))
        if not found:
            self.refuse(
                "engine",
                self.root,
                "missing required key `engine`",
                "add `engine: rayjob` (a Ray cluster) or `engine: job` (a Kubernetes Job)",
            )
            return None
        engines: list[str] = []
        for path, node in found:
            if not isinstance(node, ScalarNode) or node.text not in _ENGINES:
                self.refuse(
                    path,
                    node,
                    f"{quote(node.text if isinstance(node, ScalarNode) else describe(node))} "
                    "is not an engine; expected one of: `job`, `rayjob`",
                )
                return None
            engines.append(_ENGINES[node.text])
        if len(set(engines)) > 1:
            self.refuse("run.engine", found[1][1], "says another engine than `engine`")
            return None
        path, node = found[0]
        self.tree.put("run.workload_kind", synthesized(engines[0], node), path)
        return engines[0]

    def _entrypoint(self, top: dict[str, Any], run: dict[str, Any]) -> None:
        written = [
            (path, entries[name][1])
            for path, entries, name in (
                ("entrypoint", top, "entrypoint"),
                ("script", top, "script"),
                ("run.entrypoint", run, "entrypoint"),
                ("run.script", run, "script"),
            )
            if name in entries
        ]
        if not written:
            self.refuse(
                "entrypoint",
                self.root,
                "missing required key `entrypoint`",
                "add `entrypoint: train.py`",
            )
            return
        texts = {node.text if isinstance(node, ScalarNode) else None for _path, node in written}
        if len(texts) > 1:
            self.refuse(
                written[1][0],
                written[1][1],
                f"says another entry point than `{written[0][0]}`",
                "keep one of them",
            )
            return
        path, node = written[0]
        self.tree.put("run.entrypoint", node, path)

    def _run(self, run: dict[str, Any]) -> None:
        self.carry("run.project_dir", run, "working_dir", "run")
        self.carry("run.exclude", run, "working_dir_excludes", "run")
        self.carry("run.args", run, "args", "run")
        self.carry("run.max_runtime", run, "max_runtime", "run")
        if "source" in run:
            self.refuse(
                "run.source",
                run["source"][1],
                "staging the source from an image is not supported",
                "remove `run.source`: TauGrid ships the folder tau.yaml is in with the run",
            )
        if "ttl_seconds_after_finished" in run:
            node = run["ttl_seconds_after_finished"][1]
            if self.integer(node, "run.ttl_seconds_after_finished", 1, 2_147_483_647) is not None:
                self.ignored(
                    "run.ttl_seconds_after_finished",
                    node,
                    "TauGrid keeps each run's record and evidence and removes finished "
                    "workloads itself",
                )

    def _runtime(self, top: dict[str, Any], engine: str | None) -> None:
        runtime = self.block(
            top.get("runtime", (None, None))[1], "runtime", _DIRECT_RUNTIME, strict=True
        )
        if "image" in runtime:
            self.carry("runtime.image", runtime, "image", "runtime")
            if "image" in top:
                self.ignored("image", top["image"][1], "`runtime.image` says the image")
        elif "image" in top:
            self.tree.put("runtime.image", top["image"][1], "image")
        self.carry("runtime.pip", runtime, "pip", "runtime")
        self.carry("runtime.env", runtime, "env", "runtime")
        if "env_secret" in runtime:
            self._env_secrets(runtime["env_secret"][1])
        if "working_dir" in runtime:
            self.refuse(
                "runtime.working_dir",
                runtime["working_dir"][1],
                "starting in a directory of the image is not supported",
                "remove it: a run starts in its shipped project folder; `cd` in a script if "
                "the program needs another directory",
            )
        if "security" in runtime:
            security = self.block(
                runtime["security"][1], "runtime.security", ("mode",), strict=True
            )
            if "mode" in security:
                mode = security["mode"][1]
                if not (isinstance(mode, ScalarNode) and mode.text == "restricted"):
                    self.refuse(
                        "runtime.security.mode",
                        mode,
                        "only `restricted` is supported",
                        "TauGrid's pods always run with the Kubernetes Restricted profile",
                    )

    def _env_secrets(self, node: Node) -> None:
        path = "runtime.env_secret"
        if not isinstance(node, MappingNode):
            self.refuse(
                path,
                node,
                f"expected a mapping of variable names to `secret:key`, got {describe(node)}",
            )
            return
        items: list[dict[str, str]] = []
        for key, value in node.entries:
            where = join_path(path, key.text)
            text = value.text if isinstance(value, ScalarNode) and value.kind == "str" else ""
            secret, colon, secret_key = text.partition(":")
            if not colon or not secret or not secret_key:
                self.refuse(
                    where, value, "expected `secret:key`", "e.g. `WANDB_API_KEY: wandb:api-key`"
                )
                continue
            items.append({"env": key.text, "secret": secret, "key": secret_key})
        if items:
            self.tree.put("runtime.secrets", synthesized(items, node), path)

    def _compute(self, top: dict[str, Any], engine: str | None) -> None:
        compute_node = top.get("compute", (None, self.root))[1]
        compute = self.block(
            top.get("compute", (None, None))[1], "compute", _DIRECT_COMPUTE, strict=True
        )
        at = compute_node if isinstance(compute_node, MappingNode) else self.root
        gpus = self._gpus(compute, engine, at)
        workers_node = compute.get("workers", (None, None))[1]
        workers = 1
        if workers_node is not None:
            checked = self.integer(workers_node, "compute.workers", 1, 1025)
            workers = checked if checked is not None else 1
        if engine == "rayjob":
            pods = max(workers - 1, 1)
            if workers == 1 and workers_node is not None:
                self.notes.append(
                    "`workers: 1` is read as 1 head + 1 worker: the Ray head runs no "
                    "training work, so a cluster has at least one worker"
                )
            self.tree.put(
                "compute.workers", synthesized(pods, workers_node or at), "compute.workers"
            )
        elif engine == "job" and workers > 1:
            self.refuse(
                "compute.workers",
                workers_node or at,
                "a direct Job runs one pod; `workers` above 1 is for RayJobs",
                "for a multi-node Job set `execution.launcher: torchrun` and `execution.nodes`",
            )
        if gpus is not None:
            self.tree.put("compute.gpus", synthesized(gpus, self._gpus_node or at), self._gpus_path)
        gpu_worker = bool(gpus)
        self._role("compute", compute, "worker_", gpu_worker, at, engine)
        if engine == "rayjob":
            self._role("compute.head", compute, "head_", False, at, engine)
        else:
            for name in _ROLE_KEYS:
                if name.startswith("head_") and name in compute:
                    self.refuse(
                        join_path("compute", name),
                        compute[name][1],
                        "a Job has no Ray head to size",
                        "remove it, or set `engine: rayjob`",
                    )

    _gpus_node: Node | None = None
    _gpus_path = "compute.gpus_per_worker"

    def _gpus(self, compute: dict[str, Any], engine: str | None, at: Node) -> int | None:
        if engine == "job":
            self._gpus_path = "compute.gpus"
            if "gpus_per_worker" in compute:
                self.refuse(
                    "compute.gpus_per_worker",
                    compute["gpus_per_worker"][1],
                    "`gpus_per_worker` is for RayJobs; a Job says `gpus`",
                    "write `gpus:` instead",
                )
                return None
            if "gpus" not in compute:
                return 0
            self._gpus_node = compute["gpus"][1]
            return self.integer(self._gpus_node, "compute.gpus", 0, _MAX_DIRECT_GPUS)
        if "gpus" in compute:
            self.refuse(
                "compute.gpus",
                compute["gpus"][1],
                "a RayJob says its GPUs per worker in `gpus_per_worker`",
                "write `gpus_per_worker:` instead",
            )
            return None
        if "gpus_per_worker" not in compute:
            return 1  # the reference's default for a RayJob
        self._gpus_node = compute["gpus_per_worker"][1]
        return self.integer(self._gpus_node, "compute.gpus_per_worker", 0, _MAX_DIRECT_GPUS)

    def _role(
        self,
        v1: str,
        compute: dict[str, Any],
        prefix: str,
        gpu: bool,
        at: Node,
        engine: str | None,
    ) -> None:
        """One pod role's requests and limits: its own keys, then the shared ones, then the
        reference's defaults; a request alone is also the limit, a limit alone the request."""
        defaults = _GPU_DEFAULTS if gpu else _CPU_DEFAULTS
        v1_names = {"cpu": "cpus", "memory": "memory"}
        for resource, kind in (("cpu", _CPU), ("memory", _MEMORY)):
            amounts: dict[str, tuple[str, Node, str] | None] = {}
            for what in ("request", "limit"):
                chosen = None
                for name in (f"{prefix}{resource}_{what}", f"{resource}_{what}"):
                    if name in compute:
                        node = compute[name][1]
                        path = join_path("compute", name)
                        value = self.quantity(kind, node, path)
                        if value is None:
                            return
                        chosen = (value, node, path)
                        break
                amounts[what] = chosen
            request, limit = amounts["request"], amounts["limit"]
            if request is None and limit is None:
                default_request, default_limit = defaults[resource]
                request = (default_request, at, "compute")
                limit = (default_limit, at, "compute")
            elif request is None:
                request = limit
            elif limit is None:
                limit = request
            assert request is not None
            assert limit is not None
            self.tree.put(
                f"{v1}.{v1_names[resource]}", synthesized(request[0], request[1]), request[2]
            )
            self.tree.put(
                f"{v1}.limits.{v1_names[resource]}", synthesized(limit[0], limit[1]), limit[2]
            )

    def _execution(self, top: dict[str, Any], engine: str | None) -> None:
        execution = self.block(
            top.get("execution", (None, None))[1], "execution", _DIRECT_EXECUTION, strict=True
        )
        launcher_node = execution.get("launcher", (None, None))[1]
        launcher = launcher_node.text if isinstance(launcher_node, ScalarNode) else None
        allowed = {"job": ("python", "torchrun"), "rayjob": ("python", "ray-train", "ray-tune")}
        if launcher_node is not None and engine is not None:
            if launcher not in ("python", "torchrun", "ray-train", "ray-tune"):
                self.refuse(
                    "execution.launcher",
                    launcher_node,
                    f"{quote(str(launcher))} is not a launcher; expected one of: "
                    + ", ".join(f"`{name}`" for name in allowed[engine]),
                )
                return
            if launcher not in allowed[engine]:
                other = "rayjob" if engine == "job" else "job"
                self.refuse(
                    "execution.launcher",
                    launcher_node,
                    f"`{launcher}` does not launch a {engine}",
                    f"use one of {', '.join(allowed[engine])}, or set `engine: {other}`",
                )
                return
        if launcher == "ray-train":
            self.refuse(
                "execution.launcher",
                launcher_node,  # type: ignore[arg-type]
                "the `ray-train` launcher is not supported",
                "write the Ray driver yourself (build a ray.train.torch.TorchTrainer in the "
                "entry point) and remove `launcher`",
            )
            return
        if launcher == "torchrun":
            self._torchrun(execution)
            return
        for name in ("nodes", "processes_per_node"):
            if name in execution:
                self.refuse(
                    join_path("execution", name),
                    execution[name][1],
                    f"`{name}` is only used by the torchrun launcher",
                    "a RayJob's size is `compute.workers`"
                    if engine == "rayjob"
                    else "set `launcher: torchrun`",
                )
        if launcher == "ray-tune":
            self.tree.put("execution.launcher", launcher_node, "execution.launcher")  # type: ignore[arg-type]
        self.pass_block(
            "execution",
            execution,
            ("metric", "mode", "num_samples", "max_concurrent_trials", "configs"),
            "execution",
        )

    def _torchrun(self, execution: dict[str, Any]) -> None:
        nodes = 1
        if "nodes" in execution:
            nodes = self.integer(execution["nodes"][1], "execution.nodes", 1, 1024) or 1
            self.tree.put(
                "compute.workers", synthesized(nodes, execution["nodes"][1]), "execution.nodes"
            )
        processes = 1
        if "processes_per_node" in execution:
            processes = (
                self.integer(
                    execution["processes_per_node"][1], "execution.processes_per_node", 1, 64
                )
                or 1
            )
        entry = self.tree.values.get("run", {}).get("entrypoint")
        if isinstance(entry, ScalarNode) and entry.kind == "str":
            words = entry.text.split()
            if not words or not words[0].endswith(".py"):
                self.refuse(
                    self.tree.sources["run.entrypoint"],
                    entry,
                    "the torchrun launcher starts a Python script",
                    "name the script, e.g. `entrypoint: train.py`",
                )
                return
            command = f"torchrun --nproc-per-node {processes} {entry.text}"
            self.tree.put(
                "run.entrypoint",
                ScalarNode("str", command, command, False, entry.line, entry.column),
                self.tree.sources["run.entrypoint"],
            )
        for name in ("metric", "mode", "num_samples", "max_concurrent_trials", "configs"):
            if name in execution:
                self.refuse(
                    join_path("execution", name),
                    execution[name][1],
                    f"`{name}` is only used by the ray-tune launcher",
                )

    def _policy(self, top: dict[str, Any]) -> None:
        policy = self.block(
            top.get("policy", (None, None))[1], "policy", _DIRECT_POLICY, strict=True
        )
        self.carry("queue.name", policy, "queue", "policy")
        self.carry("queue.priority", policy, "priority", "policy")
        if "gpu_class" in policy:
            node = policy["gpu_class"][1]
            if isinstance(node, ScalarNode) and node.text == "any":
                pass  # any flavor: TauGrid's default
            else:
                self.tree.put("compute.gpu_type", node, "policy.gpu_class")
        reasons = {
            "workspace": "a run goes to the workspace you submit it to "
            "(`tau run submit --workspace`)",
            "namespace": "a run goes to its workspace's namespace",
            "profile": "TauGrid has no cluster profiles; the workspace's queues decide",
            "lane": "TauGrid has no lanes; `policy.queue` names the queue",
            "topology": "TauGrid places pods by the flavor (`policy.gpu_class`) alone",
            "disable_default_priorities": "the workspace's priorities apply",
        }
        for name, why in reasons.items():
            if name in policy:
                self.ignored(join_path("policy", name), policy[name][1], why)
        if "node_selector" in policy:
            self.refuse(
                "policy.node_selector",
                policy["node_selector"][1],
                "choosing nodes by label is not supported",
                "name the GPU flavor in `policy.gpu_class`; your platform team maps flavors "
                "to nodes",
            )

    def _storage(self, top: dict[str, Any], engine: str | None) -> None:
        storage = self.block(
            top.get("storage", (None, None))[1], "storage", _DIRECT_STORAGE, strict=True
        )
        if "data_pvc" in storage:
            node = storage["data_pvc"][1]
            self.tree.put("storage.data_pvc", node, "storage.data_pvc")
            self.tree.put(
                "storage.data_access", synthesized("read-write", node), "storage.data_pvc"
            )
        if "output" in storage:
            self.ignored(
                "storage.output",
                storage["output"][1],
                "TauGrid gives each run its own output directory (`TAU_OUTPUT_DIR`); what "
                "the program writes under /data stays on the data volume",
            )
        if "checkpoint" in storage:
            self.ignored(
                "storage.checkpoint",
                storage["checkpoint"][1],
                "checkpoints go to `TAU_CHECKPOINT_DIR`, which TauGrid hands to the next attempt",
            )
        for name, hint in (
            ("result_pvc", "write results under `TAU_OUTPUT_DIR` or the data volume"),
            ("volumes", "mount one data volume with `storage.data_pvc`"),
            ("mounts", "mount one data volume with `storage.data_pvc`"),
            ("image_assets", "put the files in the image, or in the project folder"),
        ):
            if name in storage:
                self.refuse(
                    join_path("storage", name),
                    storage[name][1],
                    f"`storage.{name}` is not supported",
                    hint,
                )

    def _metrics(self, top: dict[str, Any]) -> None:
        metrics = self.block(
            top.get("metrics", (None, None))[1], "metrics", ("history", "offload"), strict=True
        )
        if "history" in metrics:
            self.ignored(
                "metrics.history",
                metrics["history"][1],
                "TauGrid records the metrics the program reports (the rows of "
                "`TAU_OUTPUT_DIR/metrics.jsonl`, or the tau SDK)",
            )
        if "offload" in metrics:
            self.ignored(
                "metrics.offload",
                metrics["offload"][1],
                "offloading metrics to Azure Data Explorer is the reference's own service; "
                "TauGrid keeps the metrics itself",
            )

    def _experiment(self, top: dict[str, Any]) -> None:
        experiment = self.block(
            top.get("experiment", (None, None))[1],
            "experiment",
            ("project", "name", "group", "tags"),
            strict=True,
        )
        self.pass_block(
            "experiment", experiment, ("project", "name", "group", "tags"), "experiment"
        )

    def _resilience(self, top: dict[str, Any]) -> None:
        resilience = self.block(
            top.get("resilience", (None, None))[1], "resilience", _DIRECT_RESILIENCE, strict=True
        )
        at = top.get("resilience", (None, self.root))[1]
        if "max_retries" in resilience:
            self.carry("resilience.max_retries", resilience, "max_retries", "resilience")
        else:
            self.tree.put("resilience.max_retries", synthesized(0, at), "resilience")
        if "retry_on" in resilience:
            self._retry_on(resilience["retry_on"][1])
        else:
            self.tree.put(
                "resilience.retry_on", synthesized(list(_DIRECT_DEFAULT_RETRY_ON), at), "resilience"
            )
        self.carry("resilience.backoff.initial", resilience, "backoff_initial", "resilience")
        self.carry("resilience.backoff.max", resilience, "backoff_max", "resilience")
        if "checkpoint_path" in resilience:
            self.ignored(
                "resilience.checkpoint_path",
                resilience["checkpoint_path"][1],
                "checkpoints go to `TAU_CHECKPOINT_DIR`, which TauGrid hands to the next attempt",
            )

    def _retry_on(self, node: Node) -> None:
        path = "resilience.retry_on"
        if not isinstance(node, SequenceNode):
            self.refuse(path, node, f"expected a list of failure reasons, got {describe(node)}")
            return
        classes: list[str] = []
        for index, item in enumerate(node.items):
            text = item.text if isinstance(item, ScalarNode) else ""
            found = _REFERENCE_RETRY_ON.get(text.lower())
            if found is None:
                self.refuse(
                    index_path(path, index),
                    item,
                    f"{quote(text or describe(item))} is not a failure reason TauGrid knows",
                    "use Preempted, Evicted, OOMKilled, NodeFailure or DeadlineExceeded",
                )
                return
            if found not in classes:
                classes.append(found)
        self.tree.put(path, synthesized(classes, node), path)


# ----------------------------------------------------------------------- managed manifest

_MANAGED_TOP = (
    "schema_version",
    "name",
    "resource_naming",
    "run",
    "compute",
    "runtime",
    "storage",
    "queue",
    "resilience",
    "outputs",
    "experiment",
    "execution",
    "artifacts",
    "research",
    "model",
    "eval",
)
_MANAGED_RUN = ("entrypoint", "workload_kind", "args", "project_dir", "exclude", "max_runtime")
_MANAGED_COMPUTE = ("gpus", "gpu_type", "workers", "cpus", "memory", *_MANAGED_ONLY_COMPUTE)


class _Managed(_Translator):
    def translate(self) -> None:
        top = self.block(self.root, "", _MANAGED_TOP, strict=False)
        self.carry("schema_version", top, "schema_version", "")
        self.carry("name", top, "name", "")
        run = self.block(top.get("run", (None, None))[1], "run", _MANAGED_RUN, strict=False)
        if "run" in top:
            for name in _MANAGED_RUN:
                self.carry(f"run.{name}", run, name, "run")
        else:
            self.tree.put("run", top.get("run", (None, self.root))[1], "run")
        kind_node = run.get("workload_kind", (None, None))[1]
        engine = kind_node.text if isinstance(kind_node, ScalarNode) else "rayjob"
        if "resource_naming" in top:
            self.ignored(
                "resource_naming",
                top["resource_naming"][1],
                "it names the reference's own resources; TauGrid names a run's objects after "
                "the run",
            )
        for name in ("artifacts", "research", "model", "eval"):
            if name in top:
                self.ignored(
                    name, top[name][1], "it describes the reference's managed workflow stages"
                )
        self._compute(top, engine)
        self._runtime(top)
        storage = self.block(
            top.get("storage", (None, None))[1], "storage", ("data_pvc", "mounts"), strict=False
        )
        if "data_pvc" in storage:
            node = storage["data_pvc"][1]
            self.tree.put("storage.data_pvc", node, "storage.data_pvc")
            self.tree.put(
                "storage.data_access", synthesized("read-write", node), "storage.data_pvc"
            )
        if "mounts" in storage:
            self.refuse(
                "storage.mounts",
                storage["mounts"][1],
                "`storage.mounts` is not supported",
                "mount one data volume with `storage.data_pvc`",
            )
        for name in ("queue", "resilience", "outputs", "experiment", "execution"):
            if name in top:
                self.tree.put(name, top[name][1], name)

    def _compute(self, top: dict[str, Any], engine: str) -> None:
        compute = self.block(
            top.get("compute", (None, None))[1], "compute", _MANAGED_COMPUTE, strict=False
        )
        self.carry("compute.gpus", compute, "gpus", "compute")
        self.carry("compute.gpu_type", compute, "gpu_type", "compute")
        if engine != "rayjob":
            # A Job's pods are sized by cpus/memory; worker_* has nothing else to size.
            self.pass_block("compute", compute, ("workers", "cpus", "memory"), "compute")
            self.carry("compute.limits.cpus", compute, "cpu_limit", "compute")
            self.carry("compute.limits.memory", compute, "memory_limit", "compute")
            for name in ("worker_cpus", "worker_memory", "worker_cpu_limit", "worker_memory_limit"):
                if name in compute:
                    self.ignored(
                        join_path("compute", name),
                        compute[name][1],
                        "a Job's pods are sized by `cpus` and `memory`",
                    )
            return
        if "workers" in compute:
            node = compute["workers"][1]
            workers = self.integer(node, "compute.workers", 1, 1025)
            if workers is not None:
                if workers == 1:
                    self.notes.append(
                        "`workers: 1` is read as 1 head + 1 worker: the Ray head runs no "
                        "training work, so a cluster has at least one worker"
                    )
                self.tree.put(
                    "compute.workers", synthesized(max(workers - 1, 1), node), "compute.workers"
                )
        # cpus/memory (and their limits) size the head; worker_* the workers, which are sized
        # like the head when the manifest says nothing about them.
        for head_key, worker_key, v1_head, v1_worker in (
            ("cpus", "worker_cpus", "compute.head.cpus", "compute.cpus"),
            ("memory", "worker_memory", "compute.head.memory", "compute.memory"),
            ("cpu_limit", "worker_cpu_limit", "compute.head.limits.cpus", "compute.limits.cpus"),
            (
                "memory_limit",
                "worker_memory_limit",
                "compute.head.limits.memory",
                "compute.limits.memory",
            ),
        ):
            self.carry(v1_head, compute, head_key, "compute")
            if worker_key in compute:
                self.carry(v1_worker, compute, worker_key, "compute")
            elif head_key in compute:
                self.carry(v1_worker, compute, head_key, "compute")

    def _runtime(self, top: dict[str, Any]) -> None:
        runtime = self.block(
            top.get("runtime", (None, None))[1],
            "runtime",
            ("image", "pip", "env", "secrets"),
            strict=False,
        )
        self.pass_block("runtime", runtime, ("image", "pip", "secrets"), "runtime")
        if "env" not in runtime:
            return
        node = runtime["env"][1]
        if not isinstance(node, SequenceNode):
            self.carry("runtime.env", runtime, "env", "runtime")
            return
        entries: list[tuple[ScalarNode, Node]] = []
        for index, item in enumerate(node.items):
            where = index_path("runtime.env", index)
            fields_ = _keys(item)
            if "valueFrom" in fields_ or "value_from" in fields_:
                self.refuse(
                    where,
                    item,
                    "values from other sources are not supported in `runtime.env`",
                    "take a Secret's value with `runtime.secrets`: {env, secret, key}",
                )
                continue
            name = fields_.get("name")
            value = fields_.get("value")
            if name is None or not isinstance(name[1], ScalarNode):
                self.refuse(where, item, "expected `{name: …, value: …}`")
                continue
            key = name[1]
            value_node = value[1] if value is not None else synthesized("", item)
            entries.append(
                (ScalarNode("str", key.text, key.text, True, key.line, key.column), value_node)
            )
        self.tree.put(
            "runtime.env", MappingNode(tuple(entries), node.line, node.column), "runtime.env"
        )


# --------------------------------------------------------------------------- entry point

Check: TypeAlias = Callable[[Node | None, ProblemCollector], "Spec | None"]


def read_document(
    root: Node | None, problems: ProblemCollector, check: Check
) -> tuple[Dialect, Spec | None, list[SpecProblem], list[str], dict[str, str]]:
    """Detect the dialect, translate it and check it with ``check`` (the v1 checker).

    Returns the dialect, the spec (None when there are problems; they are in ``problems``,
    with the user's paths), the warnings, the reading's notes and the path map."""
    dialect = detect(root)
    if dialect == "tau" or not isinstance(root, MappingNode):
        return dialect, check(root, problems), [], [], {}
    warnings = ProblemCollector()
    translator: _Translator = (
        _Direct(root, problems, warnings)
        if dialect == "direct"
        else _Managed(root, problems, warnings)
    )
    translator.translate()
    translated = ProblemCollector()
    spec = check(translator.tree.node(), translated)
    # What the translation said already (a missing entry point) is not said twice.
    said = {(problem.line, problem.column, problem.message) for problem in problems.sorted()}
    for problem in translated.sorted():
        if (problem.line, problem.column, problem.message) in said:
            continue
        path = problem.path
        if path != DOCUMENT_PATH:
            path = translator.tree.source_of(path)
        problems.add_at(path, problem.line, problem.column, problem.message, problem.hint)
    if problems:
        spec = None
    return dialect, spec, warnings.sorted(), translator.notes, dict(translator.tree.sources)


__all__ = ["DIALECT_NAMES", "Dialect", "Reading", "describe_shape", "detect", "read_document"]
