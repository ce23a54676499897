"""A pipeline's life in the portal (issue 35): submitted whole or not at all, its stages
started as ordinary runs when what they need has succeeded, its gate deciding from a stage's
final metrics, a failed stage stopping what follows it while another branch finishes, cancel,
and steps taken again (a crash, a lost message) starting no stage twice.

The stages' runs are moved through their states here as a backend would (``finish``); the run
itself on each backend is the runs tests' and the example's (tests/pipelines/test_lifecycle*)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from catalog.ingest import asset_named, ingest_folder
from catalog.models import RunInput
from pipelines import orchestration
from pipelines.events import append_event, verify_event_chain
from pipelines.models import Pipeline, PipelineEvent, PipelineStage, StageRun
from pipelines.orchestration import PipelineActionRefused, PipelineRefused
from runs.models import MetricPoint, Run, RunEvent, RunState
from runs.state import transition
from tests.notifications.helpers import finish
from tests.pipelines.factories import PIPELINE, make_pipeline, pipeline_zip, stage_spec
from tests.runs.factories import zip_bytes
from workspaces.models import Membership, Role

pytestmark = pytest.mark.django_db


def submit(world: Any, data: bytes | None = None) -> Pipeline:
    return make_pipeline(world, data, started=False)


def stage(pipeline: Pipeline, name: str) -> PipelineStage:
    return PipelineStage.objects.unscoped().select_related("run").get(pipeline=pipeline, name=name)


def states(pipeline: Pipeline) -> dict[str, str]:
    return dict(
        PipelineStage.objects.unscoped()
        .filter(pipeline=pipeline)
        .order_by("position")
        .values_list("name", "state")
    )


def run_of(pipeline: Pipeline, name: str) -> Run:
    run = stage(pipeline, name).run
    assert run is not None, f"{name} has no run"
    return run


def report(run: Run, key: str, value: float) -> None:
    MetricPoint.objects.create(run=run, attempt=1, key=key, step=10, value=value)


def end(pipeline: Pipeline, name: str, state: RunState = RunState.SUCCEEDED) -> None:
    """The stage's run ends as a backend would end it; the step it asks for is taken here."""
    finish(run_of(pipeline, name), state)
    orchestration.advance(pipeline.pk)


def test_a_pipeline_runs_its_stages_in_order_and_branches_side_by_side(world: Any) -> None:
    pipeline = submit(world)
    assert pipeline.name.startswith("lifecycle-")
    assert states(pipeline) == dict.fromkeys(
        ["prepare", "train", "report", "evaluate", "publish"], "pending"
    )
    step = orchestration.advance(pipeline.pk)
    assert step is not None
    assert step.started == ("prepare",)
    prepare = run_of(pipeline, "prepare")
    # An ordinary run of the workspace, from the stage's own folder, and it says whose it is.
    assert (prepare.workspace, prepare.spec_name, prepare.state) == (
        world.alpha,
        "prepare",
        RunState.PENDING,
    )
    submitted = RunEvent.objects.unscoped().get(run=prepare, kind="submitted")
    assert submitted.data["pipeline"] == pipeline.name
    assert submitted.data["stage"] == "prepare"
    assert StageRun.objects.unscoped().get(run=prepare).pipeline == pipeline

    end(pipeline, "prepare")
    # Both branches after prepare start together.
    assert states(pipeline)["train"] == states(pipeline)["report"] == "running"
    end(pipeline, "report")
    assert states(pipeline)["evaluate"] == "pending"  # it needs train, still running
    end(pipeline, "train")
    report(run_of(pipeline, "evaluate"), "accuracy", 0.91)
    end(pipeline, "evaluate")
    publish = stage(pipeline, "publish")
    assert publish.state == "running"
    assert publish.gate_decision == {"value": 0.91, "passed": True}
    end(pipeline, "publish")
    pipeline.refresh_from_db()
    assert (pipeline.state, pipeline.state_reason) == ("succeeded", "")
    assert pipeline.ended_at is not None
    kinds = list(
        PipelineEvent.objects.unscoped().filter(pipeline=pipeline).values_list("kind", flat=True)
    )
    assert kinds[0] == "submitted"
    assert kinds[-1] == "ended"
    assert kinds.count("stage_started") == 5
    assert kinds.count("stage_ended") == 5
    assert "gate" in kinds
    assert verify_event_chain(pipeline)


def test_a_gate_that_says_no_stops_the_pipeline_with_the_value_it_read(world: Any) -> None:
    pipeline = submit(world)
    orchestration.advance(pipeline.pk)
    for name in ("prepare", "train", "report"):
        end(pipeline, name)
    report(run_of(pipeline, "evaluate"), "accuracy", 0.42)
    end(pipeline, "evaluate")
    pipeline.refresh_from_db()
    assert pipeline.state == "stopped"
    assert "0.42" in pipeline.state_reason
    assert "publish" in pipeline.state_reason
    publish = stage(pipeline, "publish")
    assert publish.run is None
    assert publish.state == "pending"
    assert publish.gate_decision == {"value": 0.42, "passed": False}
    assert "0.42" in publish.reason
    assert not Run.objects.unscoped().filter(spec_name="publish").exists()
    assert verify_event_chain(pipeline)


def test_a_failed_stage_holds_what_needs_it_and_the_other_branch_finishes(world: Any) -> None:
    pipeline = submit(world)
    orchestration.advance(pipeline.pk)
    end(pipeline, "prepare")
    end(pipeline, "train", RunState.FAILED)
    pipeline.refresh_from_db()
    assert pipeline.state == "running"  # report still runs
    assert stage(pipeline, "evaluate").reason == "not started: train failed"
    assert stage(pipeline, "publish").reason == "not started: evaluate will not run"
    end(pipeline, "report")
    pipeline.refresh_from_db()
    assert (pipeline.state, pipeline.state_reason) == ("failed", "stage train failed")
    assert states(pipeline) == {
        "prepare": "succeeded",
        "train": "failed",
        "report": "succeeded",
        "evaluate": "pending",
        "publish": "pending",
    }


def test_steps_taken_again_start_no_stage_twice(world: Any) -> None:
    """A step is taken on every message and every reconcile round; a repeated one (a message
    delivered twice, a reconcile beside it, a crash after the commit) changes nothing."""
    pipeline = submit(world)
    orchestration.advance(pipeline.pk)
    for _ in range(3):
        step = orchestration.advance(pipeline.pk)
        assert step is not None
        assert step.started == ()
    assert Run.objects.unscoped().filter(workspace=world.alpha).count() == 1
    end(pipeline, "prepare")
    for _ in range(3):
        orchestration.advance(pipeline.pk)
    assert sorted(Run.objects.unscoped().values_list("spec_name", flat=True)) == [
        "prepare",
        "report",
        "train",
    ]
    events = PipelineEvent.objects.unscoped().filter(pipeline=pipeline)
    assert events.filter(kind="stage_started").count() == 3
    assert events.filter(kind="stage_ended").count() == 1


def test_a_step_that_fails_halfway_leaves_nothing_and_the_next_one_starts_the_stage(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline = submit(world)
    real = append_event

    def crash(pipeline: Pipeline, kind: str, **kwargs: Any) -> Any:
        if kind == "stage_started":
            raise RuntimeError("the portal died here")
        return real(pipeline, kind, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(orchestration, "append_event", crash)
    with pytest.raises(RuntimeError):
        orchestration.advance(pipeline.pk)
    # The run was written in the step's transaction: it went with it.
    assert not Run.objects.unscoped().exists()
    assert stage(pipeline, "prepare").state == "pending"
    monkeypatch.setattr(orchestration, "append_event", real)
    step = orchestration.advance(pipeline.pk)
    assert step is not None
    assert step.started == ("prepare",)
    assert Run.objects.unscoped().count() == 1


def test_cancel_stops_the_running_stages_and_starts_no_more(world: Any) -> None:
    pipeline = submit(world)
    orchestration.advance(pipeline.pk)
    end(pipeline, "prepare")
    train, side = run_of(pipeline, "train"), run_of(pipeline, "report")
    finish(train, RunState.RUNNING)  # one holds resources, the other waits in the queue
    cancelled = orchestration.cancel_pipeline(pipeline=pipeline, user=world.users["researcher"])
    train.refresh_from_db()
    side.refresh_from_db()
    assert train.state == RunState.CANCELLING  # the backend stops it, then says so
    assert side.state == RunState.CANCELLED  # nothing ran yet: cancelled at once
    assert cancelled.state == "running"  # until train has stopped
    transition(Run.objects.unscoped().get(pk=train.pk), RunState.CANCELLED)
    orchestration.advance(pipeline.pk)
    pipeline.refresh_from_db()
    assert pipeline.state == "cancelled"
    assert set(Run.objects.unscoped().values_list("spec_name", flat=True)) == {
        "prepare",
        "train",
        "report",
    }
    with pytest.raises(PipelineActionRefused, match="already cancelled"):
        orchestration.cancel_pipeline(pipeline=pipeline, user=None)


def test_a_stage_refused_when_it_starts_fails_with_the_reason(world: Any) -> None:
    """Checked at submission, a stage can still be refused when its turn comes (here: its
    submitter was deactivated meanwhile); it fails, naming why, and its dependents are held."""
    pipeline = submit(world)
    researcher = world.users["researcher"]
    researcher.is_active = False
    researcher.save()
    orchestration.advance(pipeline.pk)
    prepare = stage(pipeline, "prepare")
    assert prepare.state == "failed"
    assert prepare.run is None
    assert prepare.reason == (
        f"could not start: {researcher.username}, who submitted the pipeline, has no active "
        "account any more"
    )
    # What follows from it is decided in the same step: nothing else can start.
    pipeline.refresh_from_db()
    assert (pipeline.state, pipeline.state_reason) == ("failed", "stage prepare failed")


def test_a_stage_does_not_start_for_a_submitter_no_longer_a_researcher_there(world: Any) -> None:
    pipeline = submit(world)
    Membership.objects.filter(workspace=world.alpha, user=world.users["researcher"]).update(
        role=Role.VIEWER
    )
    orchestration.advance(pipeline.pk)
    prepare = stage(pipeline, "prepare")
    assert prepare.run is None
    assert "may no longer submit runs" in prepare.reason
    assert not Run.objects.unscoped().exists()


# --- Submission: checked whole, nothing written when refused --------------------------------


def refused(world: Any, data: bytes) -> list[str]:
    with pytest.raises(PipelineRefused) as caught:
        submit(world, data)
    assert not Pipeline.objects.unscoped().exists()
    assert not Run.objects.unscoped().exists()
    return [problem.format() for problem in caught.value.problems]


def test_every_problem_of_every_file_is_said_at_once(world: Any) -> None:
    broken = PIPELINE.replace("needs: [train]}", "needs: [trian]}")
    problems = refused(
        world,
        pipeline_zip(broken, **{"report/tau.yaml": stage_spec("report").replace("cpus", "cpu")}),
    )
    assert any("pipeline.yaml" in line and "trian" in line for line in problems), problems
    assert any(line.startswith("report/tau.yaml") for line in problems), problems


def test_the_workspace_refuses_what_it_would_refuse_in_a_run(world: Any) -> None:
    """Beyond the files themselves: each run stage as the workspace would take it (here: more
    CPUs than its quota gives a run), before anything is kept."""
    problems = refused(
        world, pipeline_zip(**{"train/tau.yaml": stage_spec("train", cpus="100000")})
    )
    assert problems
    assert all(line.startswith("train/tau.yaml") for line in problems), problems


def test_a_zip_without_pipeline_yaml_or_a_bad_zip_is_refused(world: Any) -> None:
    assert "no pipeline.yaml" in refused(world, zip_bytes({"prepare/tau.yaml": "x"}))[0]
    assert refused(world, b"not a zip at all")


def test_a_zip_of_the_folder_itself_is_read_inside_it(world: Any) -> None:
    wrapped = {
        f"lifecycle/{name}": body
        for name, body in {
            "pipeline.yaml": "schema_version: 1\nname: one\nstages:\n  only: {config: a/t.yaml}\n",
            "a/t.yaml": stage_spec("only"),
            "a/main.py": "print(1)\n",
        }.items()
    }
    pipeline = submit(world, zip_bytes(wrapped))
    assert pipeline.folder == "lifecycle"
    orchestration.advance(pipeline.pk)
    run = run_of(pipeline, "only")
    assert run.bundle is not None
    assert run.bundle.file_count == 2


def test_run_ended_asks_for_the_pipelines_step(
    world: Any, django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[int] = []
    monkeypatch.setattr(orchestration, "publish", asked.append)
    pipeline = submit(world)
    orchestration.advance(pipeline.pk)
    asked.clear()
    with django_capture_on_commit_callbacks(execute=True):
        finish(run_of(pipeline, "prepare"))
    assert asked == [pipeline.pk]


# --- Resume and reuse ----------------------------------------------------------------------


def runs_of(spec_name: str) -> list[Run]:
    return list(Run.objects.unscoped().filter(spec_name=spec_name).order_by("id"))


def test_resume_resumes_the_failed_stage_and_keeps_what_succeeded(world: Any) -> None:
    pipeline = submit(world)
    orchestration.advance(pipeline.pk)
    end(pipeline, "prepare")
    end(pipeline, "report")
    end(pipeline, "train", RunState.FAILED)
    pipeline.refresh_from_db()
    assert pipeline.state == "failed"
    with pytest.raises(PipelineActionRefused, match="no stage 'trian'"):
        orchestration.resume_pipeline(pipeline=pipeline, user=None, rerun=["trian"])

    resumed = orchestration.resume_pipeline(pipeline=pipeline, user=world.users["researcher"])
    assert resumed.state == "running"
    train = run_of(pipeline, "train")
    # The same run, a new attempt (from its newest checkpoint, had it written one).
    assert [run.pk for run in runs_of("train")] == [train.pk]
    assert (train.state, train.attempt_count) == (RunState.QUEUED, 2)
    assert len(runs_of("prepare")) == len(runs_of("report")) == 1  # not run again
    assert states(pipeline)["evaluate"] == "pending"
    assert stage(pipeline, "evaluate").reason == ""  # held no more: it waits for train
    with pytest.raises(PipelineActionRefused, match="still running"):
        orchestration.resume_pipeline(pipeline=pipeline, user=None)

    end(pipeline, "train")
    report(run_of(pipeline, "evaluate"), "accuracy", 0.95)
    end(pipeline, "evaluate")
    end(pipeline, "publish")
    pipeline.refresh_from_db()
    assert pipeline.state == "succeeded"
    kinds = list(
        PipelineEvent.objects.unscoped().filter(pipeline=pipeline).values_list("kind", flat=True)
    )
    assert kinds.count("ended") == 2
    assert "resumed" in kinds
    assert "stage_resumed" in kinds
    assert verify_event_chain(pipeline)
    with pytest.raises(PipelineActionRefused, match="has succeeded"):
        orchestration.resume_pipeline(pipeline=pipeline, user=None)


def test_resume_after_a_gate_said_no_decides_again_and_rerun_runs_the_stage_afresh(
    world: Any,
) -> None:
    pipeline = submit(world)
    orchestration.advance(pipeline.pk)
    for name in ("prepare", "train", "report"):
        end(pipeline, name)
    first_evaluation = run_of(pipeline, "evaluate")
    report(first_evaluation, "accuracy", 0.42)
    end(pipeline, "evaluate")
    pipeline.refresh_from_db()
    assert pipeline.state == "stopped"
    # Resumed as it is: the same value, the same answer.
    again = orchestration.resume_pipeline(pipeline=pipeline, user=None)
    assert again.state == "stopped"
    # --rerun evaluate: a new run of it, and a new decision from what that one reports.
    again = orchestration.resume_pipeline(pipeline=pipeline, user=None, rerun=["evaluate"])
    assert again.state == "running"
    assert again.rerun == ["evaluate"]
    second = run_of(pipeline, "evaluate")
    assert second.pk != first_evaluation.pk
    assert len(runs_of("train")) == 1
    report(second, "accuracy", 0.85)
    end(pipeline, "evaluate")
    assert stage(pipeline, "publish").gate_decision == {"value": 0.85, "passed": True}


def succeed_all(pipeline: Pipeline) -> None:
    orchestration.advance(pipeline.pk)
    for name in ("prepare", "train", "report"):
        end(pipeline, name)
    report(run_of(pipeline, "evaluate"), "accuracy", 0.9)
    end(pipeline, "evaluate")
    end(pipeline, "publish")
    pipeline.refresh_from_db()
    assert pipeline.state == "succeeded"


def test_a_stage_whose_spec_code_and_inputs_succeeded_before_is_reused(world: Any) -> None:
    succeed_all(submit(world))
    # The same files again, but train's code changed: prepare and report are reused (and so
    # is nothing after train, whose inputs are a new train's outputs... its code changed).
    changed = pipeline_zip(**{"train/main.py": "print('a better model')\n"})
    second = submit(world, changed)
    orchestration.advance(second.pk)
    assert states(second) == {
        "prepare": "reused",
        "train": "running",
        "report": "reused",
        "evaluate": "pending",
        "publish": "pending",
    }
    assert len(runs_of("prepare")) == 1
    assert len(runs_of("train")) == 2
    assert stage(second, "prepare").run == runs_of("prepare")[0]
    reused = PipelineEvent.objects.unscoped().filter(pipeline=second, kind="stage_reused")
    assert sorted(event.data["stage"] for event in reused) == ["prepare", "report"]
    assert all("not run again" in event.message for event in reused)
    # evaluate's spec and code are the same as before, and it is reused once train is done
    # (the inputs TauGrid compares are the pinned dataset and model versions each reads).
    end(second, "train")
    assert states(second)["evaluate"] == "reused"
    assert stage(second, "publish").gate_decision == {"value": 0.9, "passed": True}


def test_rerun_runs_a_stage_and_everything_after_it_afresh(world: Any) -> None:
    succeed_all(submit(world))
    second = orchestration.submit_pipeline(
        workspace=world.alpha,
        user=world.users["researcher"],
        bundle=io.BytesIO(pipeline_zip()),
        rerun=["train"],
    )
    orchestration.advance(second.pk)
    end(second, "train")
    assert states(second) == {
        "prepare": "reused",
        "train": "succeeded",
        "report": "reused",
        "evaluate": "running",
        "publish": "pending",
    }
    with pytest.raises(PipelineRefused) as caught:
        orchestration.submit_pipeline(
            workspace=world.alpha,
            user=world.users["researcher"],
            bundle=io.BytesIO(pipeline_zip()),
            rerun=["trian"],
        )
    assert "'trian'" in caught.value.problems[0].format()


def test_a_reused_run_must_have_been_the_same_stage(world: Any) -> None:
    """Another pipeline's stage of another name with the same files is not this stage."""
    data = pipeline_zip(
        PIPELINE.replace("prepare:", "prep:").replace("[prepare]", "[prep]"),
        **{"prep/tau.yaml": stage_spec("prepare"), "prep/main.py": "print('ok')\n"},
    )
    first = submit(world, data)
    orchestration.advance(first.pk)
    finish(run_of(first, "prep"))
    second = submit(world)
    orchestration.advance(second.pk)
    assert states(second)["prepare"] == "running"


def test_a_dataset_moved_on_under_the_same_name_is_other_inputs(world: Any, tmp_path: Path) -> None:
    """``latest`` is pinned when a stage starts: the version it resolves to is what is
    compared, so a new version of the dataset runs the stage again."""
    files = tmp_path / "wiki"
    files.mkdir()
    (files / "part-0.txt").write_text("one\n")
    wiki = asset_named(world.alpha, "dataset", "wiki")
    ingest_folder(wiki, files, source="prefix")
    reads = stage_spec("prepare") + "inputs:\n  datasets:\n    - {name: wiki, version: latest}\n"
    data = pipeline_zip(**{"prepare/tau.yaml": reads})
    first = submit(world, data)
    orchestration.advance(first.pk)
    end(first, "prepare")
    again = submit(world, data)
    orchestration.advance(again.pk)
    assert states(again)["prepare"] == "reused"
    (files / "part-0.txt").write_text("two\n")
    ingest_folder(wiki, files, source="prefix")
    third = submit(world, data)
    orchestration.advance(third.pk)
    assert states(third)["prepare"] == "running"
    assert len(runs_of("prepare")) == 2


def test_a_pipeline_whose_files_left_the_store_fails_saying_so(world: Any) -> None:
    """Rather than a step that fails every round and a pipeline running for ever."""
    from runs import bundles

    pipeline = submit(world)
    bundles.bundle_path(pipeline.bundle.sha256).unlink()
    orchestration.advance(pipeline.pk)
    pipeline.refresh_from_db()
    assert (pipeline.state, pipeline.state_reason) == ("failed", "stage prepare failed")
    assert "no longer in the bundle store" in stage(pipeline, "prepare").reason


# --- Hand-over: `{from: STAGE}` ---------------------------------------------------------------

HANDOVER = """\
schema_version: 1
name: handover
stages:
  prepare: {config: prepare/tau.yaml}
  train: {config: train/tau.yaml, needs: [prepare]}
"""


def test_a_from_input_reads_the_version_the_stage_before_made(world: Any, tmp_path: Path) -> None:
    makes = stage_spec("prepare") + "outputs:\n  dataset: {name: corpus, path: out}\n"
    reads = stage_spec("train") + "inputs:\n  datasets:\n    - {from: prepare}\n"
    data = pipeline_zip(HANDOVER, **{"prepare/tau.yaml": makes, "train/tau.yaml": reads})
    pipeline = submit(world, data)  # accepted: prepare has made nothing yet, and will
    orchestration.advance(pipeline.pk)
    prepare = run_of(pipeline, "prepare")
    # What prepare's run made (as keep_outputs registers it when it succeeds), and an older
    # version of the same dataset that it did not make.
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "part-0.txt").write_text("old\n")
    corpus = asset_named(world.alpha, "dataset", "corpus")
    ingest_folder(corpus, folder, source="prefix")
    (folder / "part-0.txt").write_text("clean\n")
    made = ingest_folder(corpus, folder, source="prefix")
    made.produced_by = prepare
    made.save(update_fields=["produced_by"])
    (folder / "part-0.txt").write_text("newer, not prepare's\n")
    ingest_folder(corpus, folder, source="prefix")
    end(pipeline, "prepare")
    train = run_of(pipeline, "train")
    (pinned,) = RunInput.objects.unscoped().filter(run=train)
    assert (pinned.version, pinned.asked, pinned.path) == (made, "from:prepare", "prepare")
    submitted = RunEvent.objects.unscoped().get(run=train, kind="submitted")
    assert submitted.data["datasets"] == [
        {
            "ref": "corpus@2",
            "asked": "from:prepare",
            "manifest_digest": made.manifest_digest,
            "path": "prepare",
        }
    ]


def test_a_from_input_outside_a_pipeline_is_refused(world: Any) -> None:
    from runs import submission

    reads = stage_spec("train") + "inputs:\n  datasets:\n    - {from: prepare}\n"
    with pytest.raises(submission.SubmissionRefused) as caught:
        submission.submit(
            workspace=world.alpha,
            user=world.users["researcher"],
            spec_source=reads.encode(),
            bundle=io.BytesIO(zip_bytes({"main.py": "print(1)\n"})),
        )
    (problem,) = caught.value.problems
    assert problem.path == "inputs.datasets[0].from"
    assert "only when it runs as a stage of a pipeline" in problem.message
    assert problem.line == 11


def test_an_endpoint_stage_serves_the_model_the_stage_before_made(
    world: Any, tmp_path: Path, settings: Any
) -> None:
    from serving.models import Endpoint
    from tests.serving import fakes
    from tests.serving.factories import ENDPOINT_FILES, ENDPOINT_SPEC, model_version

    settings.TAU_BACKEND_CLASSES = fakes.backend_classes(settings)
    fakes.reset()
    pipeline_yaml = HANDOVER.replace(
        "  train: {config: train/tau.yaml, needs: [prepare]}\n",
        "  serve: {config: serve/tau.yaml, needs: [prepare]}\n",
    )
    makes = stage_spec("prepare") + "outputs:\n  model: {name: tiny-gpt, path: model}\n"
    serves = ENDPOINT_SPEC.decode().replace(
        "  replicas: 1\n", "  replicas: 1\n  model: {from: prepare}\n"
    )
    files = {
        "pipeline.yaml": pipeline_yaml,
        "prepare/tau.yaml": makes,
        "prepare/main.py": "print(1)\n",
        "serve/tau.yaml": serves,
        **{f"serve/{name}": body for name, body in ENDPOINT_FILES.items()},
    }
    pipeline = submit(world, zip_bytes(files))
    orchestration.advance(pipeline.pk)
    model_version(world, tmp_path)  # an older version, made by no stage
    weights = tmp_path / "made"
    weights.mkdir()
    (weights / "weights.bin").write_bytes(b"prepared weights")
    made = ingest_folder(asset_named(world.alpha, "model", "tiny-gpt"), weights, source="prefix")
    made.produced_by = run_of(pipeline, "prepare")
    made.save(update_fields=["produced_by"])
    end(pipeline, "prepare")
    endpoint = Endpoint.objects.for_workspace(world.alpha).get(name="chat")
    assert stage(pipeline, "serve").endpoint == endpoint
    assert (endpoint.model_version, endpoint.model_asked) == (made, "from:prepare")
