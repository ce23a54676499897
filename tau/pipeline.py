"""pipeline.yaml, schema version 1: the stages of a workload's life in one graph (issue 35).

A pipeline names a stage per step — data preparation, training, fine-tuning, evaluation, an
endpoint — each an ordinary ``tau.yaml`` in a folder next to the file, with the stages it
``needs`` and, optionally, a gate on a finished stage's metrics (``when``)::

    schema_version: 1
    name: tiny-gpt-lifecycle
    stages:
      prepare:  {config: data-prep/tau.yaml}
      train:    {config: train/tau.yaml, needs: [prepare]}
      evaluate: {config: evaluate/tau.yaml, needs: [train]}
      serve:
        config: serve/tau.yaml
        needs: [evaluate]
        when: "evaluate.metrics.accuracy >= 0.8"

:func:`check_pipeline` reads the file and every stage's ``tau.yaml`` offline, as ``tau
pipeline validate`` does, and reports every problem at once, each with its file, line and
column: the file's own (unknown keys, names, limits), the graph's (a stage it needs that does
not exist, a circle, a gate on a stage that may not have ended, a stage that waits for an
endpoint, which never ends), and each stage's ``tau.yaml``'s. Pure Python like
:mod:`tau.spec`: no Django, no network. The format is documented in ``docs/pipelines.md``.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from tau.k8s_names import dns1035_label_problem
from tau.spec import locate
from tau.spec.fields import (
    INVALID,
    Field,
    Invalid,
    JsonSchema,
    Kind,
    ListKind,
    ObjectKind,
    StringKind,
    path_kind,
)
from tau.spec.loader import MAX_FILE_BYTES, load_yaml
from tau.spec.model import SCHEMA_VERSION, Spec
from tau.spec.nodes import MappingNode, Node, SequenceNode
from tau.spec.problems import DOCUMENT_PATH, ProblemCollector, SpecProblem, join_path, quote
from tau.spec.schema import (
    MAX_NAME_LENGTH,
    STAGE_NAME_MAX_LENGTH,
    SchemaVersionKind,
    read_source,
)

#: The file ``tau pipeline`` reads when none is named.
DEFAULT_FILE = "pipeline.yaml"
#: Stages of one pipeline.
MAX_STAGES: Final = 64
#: A stage's name: a DNS-1035 label, short enough to sit in a run's labels with the
#: pipeline's name.
MAX_STAGE_NAME_LENGTH: Final = STAGE_NAME_MAX_LENGTH  # as tau.yaml's `from` reads one
#: A gate's text.
MAX_GATE_LENGTH: Final = 200

Comparison = Literal[">=", ">", "<=", "<", "==", "!="]
_COMPARE: Final[dict[str, Callable[[float, float], bool]]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
    "==": operator.eq,
    "!=": operator.ne,
}
_GATE = re.compile(
    r"\s*(?P<stage>[a-z][a-z0-9-]*)\.metrics\.(?P<metric>[A-Za-z_][A-Za-z0-9_./-]*)"
    r"\s*(?P<op>>=|<=|==|!=|>|<)\s*"
    r"(?P<value>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*"
)
GATE_PATTERN: Final = (
    r"^\s*[a-z][a-z0-9-]*\.metrics\.[A-Za-z_][A-Za-z0-9_./-]*\s*(>=|<=|==|!=|>|<)\s*"
    r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?\s*$"
)


@dataclass(frozen=True)
class Gate:
    """``STAGE.metrics.METRIC OP NUMBER``: whether a stage starts, read from the final metrics
    of a stage it needs."""

    stage: str
    metric: str
    op: Comparison
    value: float

    @classmethod
    def parse(cls, text: str) -> Gate | None:
        match = _GATE.fullmatch(text)
        if match is None:
            return None
        value = float(match["value"])
        if not math.isfinite(value):
            return None
        op: Any = match["op"]
        return cls(match["stage"], match["metric"], op, value)

    def passes(self, reported: float) -> bool:
        """Whether the gate lets its stage start when the metric's final value is
        ``reported`` (a value that is not a number never passes)."""
        return math.isfinite(reported) and _COMPARE[self.op](reported, self.value)

    def __str__(self) -> str:
        return f"{self.stage}.metrics.{self.metric} {self.op} {self.value:g}"


def _gate_problem(text: str) -> str | None:
    if Gate.parse(text) is not None:
        return None
    return f"{quote(text)} is not a gate TauGrid reads"


GATE_KIND: Final = StringKind(
    max_length=MAX_GATE_LENGTH,
    rule=_gate_problem,
    rule_hint=lambda _text: (
        "write STAGE.metrics.METRIC, then one of >= > <= < == !=, then a number, "
        'e.g. "evaluate.metrics.accuracy >= 0.8"'
    ),
    normalise=lambda text: str(Gate.parse(text)),
    pattern=GATE_PATTERN,
    expected="a gate such as `evaluate.metrics.accuracy >= 0.8`",
)


def _stage_name_problem(text: str) -> str | None:
    problem = dns1035_label_problem(text, max_length=MAX_STAGE_NAME_LENGTH)
    return None if problem is None else f"the stage name {quote(text)} {problem}"


STAGE_NAME_KIND: Final = StringKind(
    max_length=MAX_STAGE_NAME_LENGTH,
    rule=_stage_name_problem,
    pattern=rf"^[a-z]([-a-z0-9]{{0,{MAX_STAGE_NAME_LENGTH - 2}}}[a-z0-9])?$",
    expected="a stage's name",
)


@dataclass(frozen=True)
class Stage:
    """One step: its ``tau.yaml`` (relative to the pipeline's folder), the stages that must
    have succeeded first, and its gate."""

    name: str
    config: str
    needs: tuple[str, ...]
    when: Gate | None
    #: Where the stage is written in pipeline.yaml (its name's key), 1-based.
    line: int = 0
    column: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "needs": list(self.needs),
            "when": None if self.when is None else str(self.when),
        }


@dataclass(frozen=True)
class Pipeline:
    schema_version: int
    name: str
    #: In the order the file writes them.
    stages: tuple[Stage, ...]

    def stage(self, name: str) -> Stage:
        return next(stage for stage in self.stages if stage.name == name)

    def order(self) -> list[str]:
        """The stages in an order that starts none before what it needs (the file's order
        among those that could start together)."""
        done: list[str] = []
        waiting = list(self.stages)
        while waiting:
            ready = [stage for stage in waiting if set(stage.needs) <= set(done)]
            if not ready:  # a circle: check_pipeline refuses the file before this is asked
                raise ValueError("the stages' needs go round in a circle")
            done.extend(stage.name for stage in ready)
            waiting = [stage for stage in waiting if stage not in ready]
        return done

    def upstream(self, name: str) -> set[str]:
        """Every stage ``name`` needs, directly or through another."""
        found: set[str] = set()
        pending = list(self.stage(name).needs)
        while pending:
            need = pending.pop()
            if need not in found:
                found.add(need)
                pending.extend(self.stage(need).needs)
        return found

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "name": self.name,
            "stages": {stage.name: stage.to_dict() for stage in self.stages},
        }


STAGE: Final = ObjectKind(
    [
        Field(
            "config",
            path_kind(
                what="path", relative_to="the folder of pipeline.yaml", example="train/tau.yaml"
            ),
            "The stage's tau.yaml, relative to the folder of pipeline.yaml; its project is the "
            "folder the tau.yaml is in.",
            required=True,
            example="train/tau.yaml",
        ),
        Field(
            "needs",
            ListKind(STAGE_NAME_KIND, max_items=MAX_STAGES, unique=True, example="prepare"),
            "The stages that must have succeeded before this one starts; stages that need "
            "nothing of each other run side by side, within the workspace's quota.",
            example="[prepare]",
        ),
        Field(
            "when",
            GATE_KIND,
            "A gate on the final metrics of a stage this one needs: when it is false, the "
            "pipeline stops here (`stopped`, not `failed`) and this stage and those after it "
            "do not start.",
            default=None,
            example='"evaluate.metrics.accuracy >= 0.8"',
        ),
    ],
    lambda values: Stage("", values["config"], values["needs"], _gate(values["when"])),
    description="One stage: a tau.yaml, what it needs, and its gate.",
)


def _gate(text: str | None) -> Gate | None:
    return None if text is None else Gate.parse(text)


class StagesKind(Kind[tuple[Stage, ...]]):
    """``name: {config, needs, when}`` for each stage, in file order, with the graph checked:
    every stage needed exists, none needs itself, no circle, and each gate reads a stage that
    has ended before its own starts."""

    expected = "a mapping of stage names to stages"

    def check_node(
        self, node: Node, path: str, problems: ProblemCollector
    ) -> tuple[Stage, ...] | Invalid:
        if not isinstance(node, MappingNode):
            hint = "write each stage as `NAME: {config: NAME/tau.yaml}` on a line of its own"
            return self.type_problem(node, path, problems, hint)
        if not node.entries:
            problems.add(path, node, "a pipeline needs at least one stage")
            return INVALID
        if len(node.entries) > MAX_STAGES:
            problems.add(
                path,
                node,
                f"has {len(node.entries)} stages; at most {MAX_STAGES} are allowed",
                "split it into pipelines of their own",
            )
            return INVALID
        stages: list[Stage] = []
        valid = True
        for key, value in node.entries:
            stage_path = join_path(path, key.text)
            name = STAGE_NAME_KIND.check_text(key.text, key, stage_path, problems)
            checked = STAGE.check(value, stage_path, problems)
            if isinstance(name, Invalid) or isinstance(checked, Invalid):
                valid = False
                continue
            stages.append(
                Stage(name, checked.config, checked.needs, checked.when, key.line, key.column)
            )
        # The graph is checked with what could be read, so that every problem is said at once.
        if not self._graph_holds(node, path, stages, problems, complete=valid) or not valid:
            return INVALID
        return tuple(stages)

    def _graph_holds(
        self,
        node: MappingNode,
        path: str,
        stages: list[Stage],
        problems: ProblemCollector,
        *,
        complete: bool,
    ) -> bool:
        """``complete``: every stage could be read (else only what each one needs is checked:
        a circle or a gate may go through a stage that could not be read)."""
        names = [key.text for key, _value in node.entries]
        entries = {key.text: value for key, value in node.entries}
        holds = True
        for stage in stages:
            needs_node = _entry(entries[stage.name], "needs")
            for index, need in enumerate(stage.needs):
                at = _item(needs_node, index) or needs_node or node
                need_path = f"{join_path(join_path(path, stage.name), 'needs')}[{index}]"
                if need == stage.name:
                    problems.add(need_path, at, f"the stage {quote(need)} needs itself")
                    holds = False
                elif need not in names:
                    problems.add(
                        need_path,
                        at,
                        f"needs {quote(need)}, which is not a stage of this pipeline",
                        "the stages are: " + ", ".join(f"`{name}`" for name in names),
                    )
                    holds = False
        if not holds or not complete:
            return False
        circle = _circle(stages)
        if circle:
            first = next(stage for stage in stages if stage.name == circle[0])
            problems.add(
                join_path(join_path(path, first.name), "needs"),
                _entry(entries[first.name], "needs") or node,
                "the stages' needs go round in a circle (each needs the next): "
                + " → ".join([*circle, circle[0]]),
                "a stage can only need stages that come before it",
            )
            return False
        graph = Pipeline(SCHEMA_VERSION, "-", tuple(stages))
        for stage in stages:
            gate = stage.when
            if gate is None or gate.stage in graph.upstream(stage.name):
                continue
            when_path = join_path(join_path(path, stage.name), "when")
            at = _entry(entries[stage.name], "when") or node
            if gate.stage not in names:
                problems.add(
                    when_path,
                    at,
                    f"the gate reads the metrics of {quote(gate.stage)}, which is not a stage "
                    "of this pipeline",
                    "the stages are: " + ", ".join(f"`{name}`" for name in names),
                )
            else:
                problems.add(
                    when_path,
                    at,
                    f"the gate reads the metrics of {quote(gate.stage)}, but "
                    f"{quote(stage.name)} does not need it (itself or through another "
                    f"stage): it could start before {quote(gate.stage)} has ended",
                    f"add {gate.stage} to the needs of {stage.name}",
                )
            holds = False
        return holds

    def json_schema(self) -> JsonSchema:
        return {
            "type": "object",
            "description": "The stages by name (lower-case letters, digits and `-`).",
            "minProperties": 1,
            "maxProperties": MAX_STAGES,
            "propertyNames": STAGE_NAME_KIND.json_schema(),
            "additionalProperties": STAGE.json_schema(),
        }


def _entry(node: Node, key: str) -> Node | None:
    if not isinstance(node, MappingNode):
        return None
    return next((value for name, value in node.entries if name.text == key), None)


def _item(node: Node | None, index: int) -> Node | None:
    if isinstance(node, SequenceNode) and index < len(node.items):
        return node.items[index]
    return None


def _circle(stages: Sequence[Stage]) -> list[str]:
    """One circle of needs (each stage in it needing the next), or [] when there is none."""
    needs = {stage.name: stage.needs for stage in stages}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str]:
        state[name] = 1
        path.append(name)
        for need in needs[name]:
            if state.get(need) == 1:
                return path[path.index(need) :]
            if need not in state:
                found = visit(need)
                if found:
                    return found
        path.pop()
        state[name] = 2
        return []

    for stage in stages:
        if stage.name not in state:
            found = visit(stage.name)
            if found:
                return found
    return []


def _pipeline_name_problem(text: str) -> str | None:
    problem = dns1035_label_problem(text, max_length=MAX_NAME_LENGTH)
    return None if problem is None else f"the name {quote(text)} {problem}"


ROOT: Final = ObjectKind(
    [
        Field(
            "schema_version",
            SchemaVersionKind(),
            "The pipeline.yaml schema version; always `1` for this version.",
            required=True,
            example="1",
        ),
        Field(
            "name",
            StringKind(
                max_length=MAX_NAME_LENGTH,
                rule=_pipeline_name_problem,
                pattern=rf"^[a-z]([-a-z0-9]{{0,{MAX_NAME_LENGTH - 2}}}[a-z0-9])?$",
                expected="a name",
            ),
            f"The pipeline's name in its workspace: a DNS-1035 label of at most "
            f"{MAX_NAME_LENGTH} characters (lower-case letters, digits and `-`, starting "
            "with a letter).",
            required=True,
            example="tiny-gpt-lifecycle",
        ),
        Field(
            "stages",
            StagesKind(),
            "The stages by name, each a tau.yaml with what it needs.",
            required=True,
            example="{train: {config: train/tau.yaml}}",
        ),
    ],
    lambda values: Pipeline(values["schema_version"], values["name"], values["stages"]),
    description="A pipeline: stages of a workload's life, each a tau.yaml run.",
)


def json_schema() -> JsonSchema:
    """The JSON Schema of pipeline.yaml (draft 2020-12), for editors."""
    schema = ROOT.json_schema()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "pipeline.yaml (TauGrid pipeline, schema version 1)",
        **schema,
    }


def load_pipeline(source: str | bytes) -> tuple[Pipeline | None, list[SpecProblem]]:
    """pipeline.yaml's text alone (its stages' files unread): the pipeline, or every problem
    in file order."""
    problems = ProblemCollector()
    root = load_yaml(source, problems)
    if root is None:
        return None, problems.sorted()
    if not isinstance(root, MappingNode):
        problems.add(
            DOCUMENT_PATH,
            root,
            "expected a mapping of keys such as `schema_version`, `name` and `stages`",
            "a pipeline.yaml starts with `schema_version: 1` and `name: …`",
        )
        return None, problems.sorted()
    checked = ROOT.check(root, "", problems)
    if isinstance(checked, Invalid) or problems:
        return None, problems.sorted()
    return checked, []


@dataclass(frozen=True)
class FileProblem:
    """A problem and the file it is in (pipeline.yaml, or a stage's tau.yaml)."""

    file: str
    problem: SpecProblem
    severity: Literal["error", "warning"] = "error"

    def format(self) -> str:
        return self.problem.format(self.file, warning=self.severity == "warning")

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, **self.problem.to_dict(), "severity": self.severity}


def _at_stage(
    label: str,
    stage: Stage,
    path: str,
    message: str,
    hint: str | None,
    severity: Literal["error", "warning"] = "error",
) -> FileProblem:
    """A problem of ``stage`` found once its files are read, placed at its name's key."""
    return FileProblem(
        label,
        SpecProblem(f"stages.{stage.name}.{path}", stage.line, stage.column, message, hint),
        severity,
    )


@dataclass(frozen=True)
class PipelineCheck:
    """What ``tau pipeline validate`` found: the pipeline and each stage's spec when all is
    well, and every problem (warnings included) of every file."""

    pipeline: Pipeline | None
    specs: Mapping[str, Spec]
    problems: tuple[FileProblem, ...]

    @property
    def ok(self) -> bool:
        """No error anywhere (:func:`check_pipeline` gives the pipeline only then)."""
        return self.pipeline is not None


def check_pipeline(path: Path, *, shown: str | None = None) -> PipelineCheck:
    """Read ``path`` and every stage's tau.yaml (module docstring). ``shown``: how files are
    named in problems (the path as given, by default); a stage's file is named relative to
    it (``pipeline/train/tau.yaml``)."""
    label = shown if shown is not None else str(path)
    found: list[FileProblem] = []
    try:
        data = path.read_bytes()[: MAX_FILE_BYTES + 1]
    except OSError as error:
        message = f"cannot read the file: {error.strerror or error}"
        return PipelineCheck(None, {}, (FileProblem(label, SpecProblem("(file)", 0, 0, message)),))
    pipeline, problems = load_pipeline(data)
    found.extend(FileProblem(label, problem) for problem in problems)
    # A pipeline.yaml with problems of its own still has its readable stages' files checked:
    # every problem is said at once.
    stages = pipeline.stages if pipeline is not None else readable_stages(data)
    folder = path.parent
    base = Path(label).parent
    specs: dict[str, Spec] = {}
    files: dict[str, tuple[str, bytes]] = {}
    for stage in stages:
        problem, data = _stage_file(folder, stage.config)
        if problem is not None:
            found.append(_at_stage(label, stage, "config", *problem))
            continue
        reading = read_source(data)
        stage_label = str(base / stage.config) if str(base) != "." else stage.config
        files[stage.name] = (stage_label, data)
        found.extend(FileProblem(stage_label, problem) for problem in reading.problems)
        found.extend(FileProblem(stage_label, warning, "warning") for warning in reading.warnings)
        if reading.spec is not None:
            specs[stage.name] = reading.spec
    found.extend(_endpoint_problems(stages, specs, label))
    found.extend(_handover_problems(stages, specs, files))
    found.extend(_unreported_metrics(stages, specs, folder, label))
    # pipeline.yaml's own in file order first, then each stage's file, in stage order.
    found.sort(
        key=lambda item: (0, item.problem.line, item.problem.column) if item.file == label else (1,)
    )
    ok = pipeline is not None and not any(problem.severity == "error" for problem in found)
    return PipelineCheck(pipeline if ok else None, specs if ok else {}, tuple(found))


def _stage_file(folder: Path, config: str) -> tuple[tuple[str, str | None] | None, bytes]:
    """The stage's tau.yaml, or why it cannot be read: (message, hint)."""
    target = folder / config
    try:
        inside = target.resolve().is_relative_to(folder.resolve())
    except OSError as error:
        return (f"cannot read {quote(config)}: {error.strerror or error}", None), b""
    if not inside:
        return (
            f"{quote(config)} leads outside the folder of pipeline.yaml (through a link)",
            "keep each stage's project inside the pipeline's folder",
        ), b""
    if not target.is_file():
        hint = "the path is relative to the folder of pipeline.yaml"
        if target.is_dir():
            return (f"{quote(config)} is a folder, not a tau.yaml", f"name {config}/tau.yaml"), b""
        return (f"there is no file {quote(config)}", hint), b""
    try:
        data = target.read_bytes()[: MAX_FILE_BYTES + 1]
    except OSError as error:
        return (f"cannot read {quote(config)}: {error.strerror or error}", None), b""
    return None, data


def readable_stages(source: str | bytes) -> list[Stage]:
    """The stages of a pipeline.yaml that has problems, as far as each can be read alone."""
    root = load_yaml(source, ProblemCollector())
    stages_node = _entry(root, "stages") if root is not None else None
    if not isinstance(stages_node, MappingNode):
        return []
    found = []
    for key, value in stages_node.entries[:MAX_STAGES]:
        checked = STAGE.check(value, key.text, ProblemCollector())
        if not isinstance(checked, Invalid):
            found.append(
                Stage(key.text, checked.config, checked.needs, checked.when, key.line, key.column)
            )
    return found


def _endpoint_problems(
    stages: Sequence[Stage], specs: Mapping[str, Spec], label: str
) -> Iterator[FileProblem]:
    """An endpoint stage (``run.workload_kind: rayservice``) runs until it is stopped: no
    stage can wait for it to succeed, and it reports no final metrics for a gate."""
    endpoints = {name for name, spec in specs.items() if spec.run.workload_kind == "rayservice"}
    for stage in stages:
        for index, need in enumerate(stage.needs):
            if need in endpoints:
                yield _at_stage(
                    label,
                    stage,
                    f"needs[{index}]",
                    f"needs {quote(need)}, an endpoint, which runs until it is stopped: "
                    f"{quote(stage.name)} would never start",
                    "an endpoint is a pipeline's last stage; let other stages need the "
                    "stage before it",
                )
        if stage.when is not None and stage.when.stage in endpoints:
            yield _at_stage(
                label,
                stage,
                "when",
                f"the gate reads the metrics of {quote(stage.when.stage)}, an endpoint, "
                "which has no final metrics",
                "gate on an evaluation stage's metrics instead",
            )


def _before(stages: Sequence[Stage], name: str) -> set[str]:
    """The stages ``name`` needs, directly or not (a circle, reported elsewhere, ends it)."""
    needs = {stage.name: stage.needs for stage in stages}
    seen: set[str] = set()
    todo = list(needs.get(name, ()))
    while todo:
        need = todo.pop()
        if need not in seen and need != name:
            seen.add(need)
            todo.extend(needs.get(need, ()))
    return seen


def _handover_problems(
    stages: Sequence[Stage], specs: Mapping[str, Spec], files: Mapping[str, tuple[str, bytes]]
) -> Iterator[FileProblem]:
    """A stage's ``{from: STAGE}`` input (or ``serve.model``) names a stage it needs (so that
    stage has ended when it starts) whose tau.yaml makes such a version (``outputs.dataset``,
    ``outputs.model``); said at the ``from`` in the stage's own tau.yaml."""
    names = {stage.name for stage in stages}
    for stage in stages:
        spec = specs.get(stage.name)
        if spec is None:
            continue
        label, source = files[stage.name]
        before = _before(stages, stage.name)
        wanted = [
            (f"inputs.datasets[{index}].from", "dataset", item.from_stage)
            for index, item in enumerate(spec.inputs.datasets)
        ] + [
            (f"inputs.models[{index}].from", "model", item.from_stage)
            for index, item in enumerate(spec.inputs.models)
        ]
        if spec.serve is not None and spec.serve.model is not None:
            wanted.append(("serve.model.from", "model", spec.serve.model.from_stage))
        for path, kind, source_stage in wanted:
            if source_stage is None:
                continue
            where = locate(source, path)
            line, column = where if where else (0, 0)
            if source_stage not in names:
                message = f"names {quote(source_stage)}, which is not a stage of this pipeline"
                hint = "the stages are: " + ", ".join(quote(name) for name in sorted(names))
            elif source_stage not in before:
                message = (
                    f"names {quote(source_stage)}, which {quote(stage.name)} does not need: it "
                    "may not have ended when this stage starts"
                )
                hint = f"add {source_stage} to the `needs` of {stage.name} in pipeline.yaml"
            elif source_stage in specs and getattr(specs[source_stage].outputs, kind) is None:
                message = (
                    f"names {quote(source_stage)}, which makes no {kind}: its tau.yaml has no "
                    f"`outputs.{kind}`"
                )
                hint = f"declare `outputs.{kind}` in the tau.yaml of {source_stage}"
            else:
                continue
            yield FileProblem(label, SpecProblem(path, line, column, message, hint))


#: How much of a stage's project is searched for the name of a metric a gate reads.
MAX_SEARCHED_FILES: Final = 500
MAX_SEARCHED_BYTES: Final = 1024 * 1024
_SKIPPED_FOLDERS: Final = frozenset({".git", ".venv", "venv", "__pycache__", "node_modules"})


def _project_mentions(project: Path, word: str) -> bool | None:
    """Whether a Python file of ``project`` names ``word`` (a whole word); None when the
    project is too large to say within the bounds above (then nothing is claimed)."""
    pattern = re.compile(rf"(?<![\w./-]){re.escape(word)}(?![\w./-])")
    searched = 0
    for path in sorted(project.rglob("*.py")):
        if _SKIPPED_FOLDERS & set(path.relative_to(project).parts) or path.is_symlink():
            continue
        searched += 1
        if searched > MAX_SEARCHED_FILES:
            return None
        try:
            text = path.read_bytes()[:MAX_SEARCHED_BYTES].decode("utf-8", "replace")
        except OSError:
            continue
        if pattern.search(text):
            return True
    return False


def _unreported_metrics(
    stages: Sequence[Stage], specs: Mapping[str, Spec], folder: Path, label: str
) -> Iterator[FileProblem]:
    """A warning for a gate on a metric its stage's code never names (a typo, most often:
    at run time the gate could not decide, and the pipeline would fail there)."""
    by_name = {stage.name: stage for stage in stages}
    for stage in stages:
        gate = stage.when
        if gate is None or gate.stage not in specs or gate.stage not in by_name:
            continue
        if specs[gate.stage].run.workload_kind == "rayservice":
            continue  # said already: an endpoint has no final metrics
        project = (folder / by_name[gate.stage].config).parent
        if _project_mentions(project, gate.metric) is False:
            yield _at_stage(
                label,
                stage,
                "when",
                f"no Python file of {quote(gate.stage)}'s project names the metric "
                f"{quote(gate.metric)}: if {gate.stage} does not report it, the gate "
                "cannot decide and the pipeline fails there",
                f"check the name against what {gate.stage} reports (tau.sdk.log_metrics)",
                "warning",
            )


def summary(check: PipelineCheck) -> str:
    """``5 stages: prepare → train → …`` for a valid pipeline."""
    assert check.pipeline is not None
    order = check.pipeline.order()
    return f"{len(order)} stage{'s' if len(order) != 1 else ''}: " + " → ".join(order)


def check_lines(check: PipelineCheck, label: str) -> list[str]:
    lines = [problem.format() for problem in check.problems if problem.severity == "error"]
    if check.ok:
        lines.append(f"{label}: ok ({summary(check)})")
    lines.extend(problem.format() for problem in check.problems if problem.severity == "warning")
    return lines


__all__ = [
    "DEFAULT_FILE",
    "MAX_STAGES",
    "FileProblem",
    "Gate",
    "Pipeline",
    "PipelineCheck",
    "Stage",
    "check_lines",
    "check_pipeline",
    "json_schema",
    "load_pipeline",
    "summary",
]
