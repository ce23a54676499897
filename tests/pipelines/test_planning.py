"""What a pipeline does next (pipelines/planning.py): a table of stage states in, the stages
to start, those held and the pipeline's state out (issue 35)."""

from __future__ import annotations

import pytest

from pipelines.planning import Held, PipelineState, StageState, plan
from tau.pipeline import Pipeline, load_pipeline

# prepare → train → finetune → evaluate → serve (gated), and report beside the fine-tuning.
LIFECYCLE = """\
schema_version: 1
name: lifecycle
stages:
  prepare:  {config: a/tau.yaml}
  train:    {config: a/tau.yaml, needs: [prepare]}
  finetune: {config: a/tau.yaml, needs: [train]}
  report:   {config: a/tau.yaml, needs: [train]}
  evaluate: {config: a/tau.yaml, needs: [finetune]}
  serve:    {config: a/tau.yaml, needs: [evaluate], when: "evaluate.metrics.accuracy >= 0.8"}
"""
S = StageState
PASSED = {"evaluate": {"accuracy": 0.91, "loss": 0.2}}
#: Every stage but the endpoint succeeded.
UP_TO_EVALUATE = dict.fromkeys(("prepare", "train", "finetune", "report", "evaluate"), S.SUCCEEDED)


@pytest.fixture(scope="module")
def lifecycle() -> Pipeline:
    pipeline, problems = load_pipeline(LIFECYCLE)
    assert pipeline is not None, problems
    return pipeline


def states(**given: StageState) -> dict[str, StageState]:
    return dict(given)


def test_a_new_pipeline_starts_its_first_stage(lifecycle: Pipeline) -> None:
    step = plan(lifecycle, {}, {})
    assert (step.state, step.start, step.held) == (PipelineState.RUNNING, ("prepare",), ())


def test_branches_that_need_nothing_of_each_other_start_together(lifecycle: Pipeline) -> None:
    step = plan(lifecycle, states(prepare=S.SUCCEEDED, train=S.REUSED), {})
    assert step.start == ("finetune", "report")


def test_a_running_stage_is_not_started_again_and_what_waits_waits(lifecycle: Pipeline) -> None:
    step = plan(lifecycle, states(prepare=S.SUCCEEDED, train=S.RUNNING), {})
    assert (step.state, step.start, step.held) == (PipelineState.RUNNING, (), ())


def test_the_gate_passes_and_the_endpoint_is_deployed(lifecycle: Pipeline) -> None:
    done = states(prepare=S.SUCCEEDED, train=S.SUCCEEDED, finetune=S.SUCCEEDED, report=S.SUCCEEDED)
    step = plan(lifecycle, {**done, "evaluate": S.SUCCEEDED}, PASSED)
    assert step.start == ("serve",)
    assert step.gates == {"serve": (0.91, True)}
    ended = plan(lifecycle, {**done, "evaluate": S.SUCCEEDED, "serve": S.SUCCEEDED}, PASSED)
    assert (ended.state, ended.start, ended.reason) == (PipelineState.SUCCEEDED, (), "")


def test_a_gate_that_says_no_stops_the_pipeline_without_failing_it(lifecycle: Pipeline) -> None:
    done = dict(UP_TO_EVALUATE)
    step = plan(lifecycle, done, {"evaluate": {"accuracy": 0.72}})
    assert step.state == PipelineState.STOPPED
    assert step.start == ()
    assert step.held == (
        Held("serve", "not started: evaluate.metrics.accuracy >= 0.8 was false (0.72)", "gated"),
    )
    assert step.reason == "stopped before serve: evaluate.metrics.accuracy >= 0.8 was false (0.72)"
    assert step.gates == {"serve": (0.72, False)}


def test_a_gate_that_cannot_read_its_metric_fails_the_pipeline_naming_it(
    lifecycle: Pipeline,
) -> None:
    done = dict(UP_TO_EVALUATE)
    for reported in ({}, {"evaluate": {"loss": 0.1}}, {"evaluate": {"accuracy": float("nan")}}):
        step = plan(lifecycle, done, reported)
        assert step.state == PipelineState.FAILED
        assert step.reason == (
            "the gate of serve could not decide: its gate reads evaluate.metrics.accuracy, "
            "which evaluate did not report"
        )
        assert [held.kind for held in step.held] == ["blocked"]


def test_a_failed_stage_blocks_what_follows_and_the_other_branch_finishes(
    lifecycle: Pipeline,
) -> None:
    running = plan(
        lifecycle,
        states(prepare=S.SUCCEEDED, train=S.SUCCEEDED, finetune=S.FAILED, report=S.RUNNING),
        {},
    )
    assert running.state == PipelineState.RUNNING  # report goes on
    assert running.held == (
        Held("evaluate", "not started: finetune failed", "blocked"),
        Held("serve", "not started: evaluate will not run", "blocked"),
    )
    ended = plan(
        lifecycle,
        states(prepare=S.SUCCEEDED, train=S.SUCCEEDED, finetune=S.FAILED, report=S.SUCCEEDED),
        {},
    )
    assert (ended.state, ended.reason) == (PipelineState.FAILED, "stage finetune failed")


def test_a_resume_starts_again_from_the_failed_stage(lifecycle: Pipeline) -> None:
    """A resume makes the failed stage pending again (keeping what succeeded): the plan then
    starts it, and nothing before it."""
    resumed = states(prepare=S.SUCCEEDED, train=S.SUCCEEDED, finetune=S.PENDING, report=S.SUCCEEDED)
    step = plan(lifecycle, resumed, {})
    assert (step.state, step.start, step.held) == (PipelineState.RUNNING, ("finetune",), ())


def test_cancelling_starts_nothing_and_ends_once_nothing_runs(lifecycle: Pipeline) -> None:
    running = states(prepare=S.SUCCEEDED, train=S.RUNNING)
    step = plan(lifecycle, running, {}, cancelled=True)
    assert (step.state, step.start) == (PipelineState.RUNNING, ())  # train is being stopped
    ended = plan(lifecycle, states(prepare=S.SUCCEEDED, train=S.CANCELLED), {}, cancelled=True)
    assert (ended.state, ended.start, ended.reason) == (
        PipelineState.CANCELLED,
        (),
        "the pipeline was cancelled",
    )


def test_the_same_states_always_give_the_same_plan(lifecycle: Pipeline) -> None:
    """Decided from durable state only: after a crash, the next call decides the same, so no
    stage is started twice and none is lost."""
    given = states(prepare=S.SUCCEEDED, train=S.SUCCEEDED)
    assert plan(lifecycle, given, {}) == plan(lifecycle, dict(reversed(given.items())), {})


def test_what_a_gated_stage_holds_back_is_gated_too() -> None:
    pipeline, _ = load_pipeline(LIFECYCLE + "  notify:   {config: a/tau.yaml, needs: [serve]}\n")
    assert pipeline is not None
    done = dict(UP_TO_EVALUATE)
    step = plan(pipeline, done, {"evaluate": {"accuracy": 0.5}})
    assert [(held.stage, held.kind) for held in step.held] == [
        ("serve", "gated"),
        ("notify", "gated"),
    ]
    assert step.state == PipelineState.STOPPED
