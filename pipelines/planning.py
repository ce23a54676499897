"""What a pipeline does next, decided from its stages' states alone (issue 35).

One pure function, :func:`plan`, is the whole orchestration rule: given each stage's state
(and the final metrics of those that ended), which stages start now, which will never start
and why, and the pipeline's own state. The portal calls it again after every change it
records (a stage's run ended, a resume, a cancel), in the transaction that records the
change, and writes what it says; so a crash anywhere loses no stage and starts none twice:
the next call, from durable state, decides the same again. It never looks at the clock, the
cluster or the database, and its tests are a table.

The rules, in words:

* a stage starts when every stage it ``needs`` has succeeded (or was reused: its outputs are
  those of an earlier run of the same spec, code and inputs) and its gate, if it has one,
  passes on the final value of the metric it reads;
* a gate that does not pass *stops* the stage and those after it (``gated``): not a failure;
* a gate whose stage did not report the metric cannot decide: the stage is ``blocked`` and the
  pipeline fails, naming the stage and the metric;
* a stage that failed or was cancelled blocks what needs it, directly or not; stages on other
  branches go on and finish;
* the pipeline is ``running`` while a stage runs or can start; then ``cancelled`` if it was
  cancelled, ``failed`` if a stage failed (the first, in the file's order) or a gate could not
  decide, ``stopped`` if a gate said no, else ``succeeded``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from tau.pipeline import Pipeline


class StageState(StrEnum):
    PENDING = "pending"  # not started (yet)
    RUNNING = "running"  # its run (or endpoint) is queued, admitted or running
    SUCCEEDED = "succeeded"  # its run succeeded; an endpoint stage: the endpoint is ready
    REUSED = "reused"  # an earlier run of the same spec, code and inputs stands for it
    FAILED = "failed"
    CANCELLED = "cancelled"


DONE = frozenset({StageState.SUCCEEDED, StageState.REUSED})
ENDED_BADLY = frozenset({StageState.FAILED, StageState.CANCELLED})


class PipelineState(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class Held:
    """A stage that will not start, and why, in words for its page."""

    stage: str
    why: str
    #: ``gated``: a gate said no (the pipeline stops, not a failure); ``blocked``: something
    #: before it failed, was cancelled, or a gate could not decide.
    kind: str


@dataclass(frozen=True)
class Plan:
    state: PipelineState
    #: Stages to start now, in the file's order.
    start: tuple[str, ...] = ()
    #: Stages that will never start in this pass of the pipeline (a resume may start them).
    held: tuple[Held, ...] = ()
    #: Why the pipeline is in its state (for failed, stopped and cancelled).
    reason: str = ""
    #: Gate decisions made now: stage → (value read, passed), for the record.
    gates: Mapping[str, tuple[float, bool]] = field(default_factory=dict)


def plan(
    pipeline: Pipeline,
    states: Mapping[str, StageState],
    metrics: Mapping[str, Mapping[str, float]],
    *,
    cancelled: bool = False,
) -> Plan:
    """The next step (module docstring). ``states``: each stage's state (missing: pending);
    ``metrics``: the final metrics of stages that ended (missing: none reported)."""
    state = {stage.name: states.get(stage.name, StageState.PENDING) for stage in pipeline.stages}
    held: dict[str, Held] = {}
    gates: dict[str, tuple[float, bool]] = {}
    undecided = ""
    for name in pipeline.order():
        if state[name] != StageState.PENDING:
            continue
        stage = pipeline.stage(name)
        before = [need for need in stage.needs if need in held or state[need] in ENDED_BADLY]
        if before:
            need = before[0]
            # Held itself (it never started, so it did not end badly): what held it holds
            # this one too, gated or blocked.
            if need in held:
                held[name] = Held(name, f"not started: {need} will not run", held[need].kind)
            else:
                held[name] = Held(name, f"not started: {need} {state[need].value}", "blocked")
            continue
        if any(state[need] not in DONE for need in stage.needs):
            continue  # waits for what it needs
        gate = stage.when
        if gate is None or cancelled:
            continue
        value = metrics.get(gate.stage, {}).get(gate.metric)
        if value is None or not math.isfinite(value):
            why = (
                f"its gate reads {gate.stage}.metrics.{gate.metric}, which {gate.stage} did not "
                "report"
            )
            held[name] = Held(name, f"not started: {why}", "blocked")
            undecided = undecided or f"the gate of {name} could not decide: {why}"
            continue
        passed = gate.passes(value)
        gates[name] = (value, passed)
        if not passed:
            held[name] = Held(name, f"not started: {gate} was false ({value:g})", "gated")
    if cancelled:
        start: tuple[str, ...] = ()
    else:
        start = tuple(
            stage.name
            for stage in pipeline.stages
            if state[stage.name] == StageState.PENDING
            and stage.name not in held
            and all(state[need] in DONE for need in stage.needs)
        )
    running = any(value == StageState.RUNNING for value in state.values())
    ordered_held = tuple(held[stage.name] for stage in pipeline.stages if stage.name in held)
    if running or start:
        return Plan(PipelineState.RUNNING, start, ordered_held, "", gates)
    if cancelled:
        return Plan(PipelineState.CANCELLED, (), ordered_held, "the pipeline was cancelled", gates)
    failed = next(
        (stage.name for stage in pipeline.stages if state[stage.name] in ENDED_BADLY), None
    )
    if failed is not None:
        reason = f"stage {failed} {state[failed].value}"
        return Plan(PipelineState.FAILED, (), ordered_held, reason, gates)
    if undecided:
        return Plan(PipelineState.FAILED, (), ordered_held, undecided, gates)
    gated = next((item for item in ordered_held if item.kind == "gated"), None)
    if gated is not None:
        reason = f"stopped before {gated.stage}: " + gated.why.removeprefix("not started: ")
        return Plan(PipelineState.STOPPED, (), ordered_held, reason, gates)
    return Plan(PipelineState.SUCCEEDED, (), ordered_held, "", gates)
