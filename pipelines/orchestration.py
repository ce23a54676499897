"""What happens to a pipeline: it is submitted (checked whole, kept, its stages written), it
takes steps (:func:`advance`), it is cancelled.

Durable, like run delivery
==========================

A pipeline's next step is decided by :func:`pipelines.planning.plan` from what the database
holds, under the pipeline's row lock, and everything it decides is written in that same
transaction — a stage's run (through the ordinary submission, with its delivery), the stage's
link to it, the events. So:

* a crash before the commit leaves nothing: the next step decides the same again;
* a crash after it leaves the run written and linked: the next step sees the stage running
  and starts it no second time;
* nothing has to be remembered between steps: a step is asked for when a stage's run ends
  (``run_ended``, once that commits), and the reconciler (every ``TAU_RECONCILE_SECONDS``)
  takes one for every running pipeline, so a lost message (the broker down, a worker killed)
  delays a step by one round at most. An endpoint's stage is seen ready by that round.

Nothing here waits on the cluster or the network: a stage's submission writes rows and a file
of the bundle store (content-addressed: one left by a rolled-back step is the same file the
next one keeps).
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, Any

from celery import current_app
from django.db import IntegrityError, transaction
from django.utils import timezone

from pipelines.events import PipelineEventKind, append_event
from pipelines.models import Pipeline, PipelineStage, StageRun
from pipelines.planning import DONE, ENDED_BADLY, PipelineState, Plan, StageState, plan
from runs import bundles, lifecycle, submission
from runs.models import Run, RunState
from runs.state import RunActionRefused
from tau.pipeline import FileProblem, check_pipeline, load_pipeline
from tau.pipeline import Pipeline as PipelineFile
from tau.spec.problems import SpecProblem
from workspaces.models import Membership, Role

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from runs.models import CodeBundle, RunEvent
    from serving.models import Endpoint
    from workspaces.models import Workspace

logger = logging.getLogger(__name__)

ADVANCE_TASK = "pipelines.tasks.advance"
#: What the CLI sends: the folder of pipeline.yaml, zipped (or that folder inside one zip).
PIPELINE_FILE = "pipeline.yaml"


class PipelineRefused(ValueError):
    """A pipeline that cannot be submitted: every problem, each with its file (nothing is
    written)."""

    def __init__(self, problems: list[FileProblem]) -> None:
        super().__init__("; ".join(problem.format() for problem in problems))
        self.problems = problems


class PipelineActionRefused(ValueError):
    """Cancel (or resume) asked of a pipeline in a state that does not allow it."""


# --- Submission ----------------------------------------------------------------------------


def _refusal(file: str, message: str, path: str = "(file)") -> PipelineRefused:
    return PipelineRefused([FileProblem(file, SpecProblem(path, 0, 0, message))])


def _pipeline_folder(listing: bundles.BundleListing, config: str) -> str | None:
    """Where ``config`` lies in the zip: at its top (''), or inside its single top-level
    folder (a zip of the folder itself). None: not in it."""
    if config in listing.files:
        return ""
    if listing.wrapper is not None and f"{listing.wrapper}/{config}" in listing.files:
        return listing.wrapper
    return None


def _stage_problems(
    check_specs: Iterable[tuple[str, bytes, bool]], workspace: Workspace
) -> list[FileProblem]:
    """What the workspace refuses in each run stage's tau.yaml (its queue, its quota, the
    dataset versions it reads), as a run's submission would: (file label, source, whether
    it is an endpoint's)."""
    found: list[FileProblem] = []
    for label, source, is_endpoint in check_specs:
        if is_endpoint:
            continue  # an endpoint's own checks run when it is deployed
        try:
            placement = submission.check_spec(source, workspace=workspace)
        except submission.SubmissionRefused as exc:
            found += [_file_problem(label, problem) for problem in exc.problems]
            continue
        problems, _ = submission.check_extensions(source, placement.spec, workspace)
        found += [_file_problem(label, problem) for problem in problems]
    return found


def _file_problem(label: str, problem: submission.SubmissionProblem) -> FileProblem:
    where = SpecProblem(
        problem.path, problem.line or 0, problem.column or 0, problem.message, problem.hint
    )
    return FileProblem(label, where)


def submit_pipeline(
    *, workspace: Workspace, user: User, bundle: IO[bytes], config: str = PIPELINE_FILE
) -> Pipeline:
    """Check a pipeline's zip whole (pipeline.yaml, every stage's tau.yaml, and each run
    stage against the workspace) and, if all is well, keep it and write the pipeline, its
    stages and its ``submitted`` event; its first step is asked for once that commits.
    ``PipelineRefused`` with every problem otherwise, and nothing is written."""
    try:
        staged = bundles.stage_upload(bundle)
    except bundles.BundleRejected as exc:
        raise _refusal("(zip)", str(exc)) from None
    try:
        folder = _pipeline_folder(staged.listing, config)
        if folder is None:
            raise _refusal(
                "(zip)",
                f"the zip holds no {config}: zip the folder that has {config} at its top",
            )
        label = config
        with tempfile.TemporaryDirectory(prefix="pipeline-") as temporary:
            root = Path(temporary) / "zip"
            bundles.unpack_checked(staged.path, root)
            path = root / folder / config
            check = check_pipeline(path, shown=label)
            errors = [problem for problem in check.problems if problem.severity == "error"]
            if errors or check.pipeline is None:
                raise PipelineRefused(errors)
            pipeline_file = check.pipeline
            source = path.read_text(encoding="utf-8")
            stage_sources = [
                (
                    stage.config,
                    (path.parent / stage.config).read_bytes(),
                    check.specs[stage.name].is_endpoint,
                )
                for stage in pipeline_file.stages
            ]
        problems = _stage_problems(stage_sources, workspace)
        if problems:
            raise PipelineRefused(problems)
        kept = bundles.keep(staged, workspace=workspace)
    finally:
        bundles.discard(staged)
    return _create(workspace, user, pipeline_file, source, folder, kept)


def _create(
    workspace: Workspace,
    user: User,
    pipeline_file: PipelineFile,
    source: str,
    folder: str,
    bundle: CodeBundle,
) -> Pipeline:
    with transaction.atomic():
        pipeline = Pipeline(
            workspace=workspace,
            spec_name=pipeline_file.name,
            source=source,
            folder=folder,
            bundle=bundle,
            created_by=user,
            created_by_username=user.get_username(),
        )
        # As a run's name: the constraint, not a prior read, decides a (rare) clash.
        for attempt in range(5):
            pipeline.name = lifecycle.new_run_name(pipeline_file.name)
            try:
                with transaction.atomic():
                    pipeline.save(force_insert=True)
                break
            except IntegrityError:
                if attempt == 4:
                    raise
        PipelineStage.objects.bulk_create(
            PipelineStage(
                pipeline=pipeline,
                name=stage.name,
                position=position,
                config=stage.config,
                needs=list(stage.needs),
                gate=str(stage.when) if stage.when is not None else "",
            )
            for position, stage in enumerate(pipeline_file.stages)
        )
        append_event(
            pipeline,
            PipelineEventKind.SUBMITTED,
            new_state=PipelineState.RUNNING,
            message=f"Submitted by {user.get_username()}",
            data={
                "bundle": bundle.sha256,
                "folder": folder,
                "stages": [stage.to_dict() for stage in pipeline_file.stages],
            },
            first=True,
        )
        transaction.on_commit(lambda: publish(pipeline.pk))
    return pipeline


# --- Steps ---------------------------------------------------------------------------------


def publish(pipeline_id: int) -> None:
    """Ask a worker for the pipeline's next step. Failing is fine: the reconciler will."""
    try:
        current_app.send_task(ADVANCE_TASK, args=(pipeline_id,), retry=False)
    except Exception as exc:  # the broker is down: the pipeline's rows are the durable record
        logger.warning("could not enqueue pipeline %s (%s); the reconciler will", pipeline_id, exc)


def on_run_ended(sender: Any, *, run: Run, event: RunEvent, **_: Any) -> None:
    """``run_ended`` receiver: a stage's run ended, so its pipeline has a step to take once
    that commits (only then can the step read the run's final state)."""
    stage_run = (
        StageRun.objects.for_workspace(run.workspace_id)
        .filter(run_id=run.pk)
        .values_list("pipeline_id", flat=True)
        .first()
    )
    if stage_run is not None:
        transaction.on_commit(lambda: publish(stage_run))


def lock_pipeline(pipeline_id: int) -> Pipeline:
    return Pipeline.objects.unscoped().select_for_update().get(pk=pipeline_id)


def running_pipelines(limit: int = 500) -> list[int]:
    """The pipelines the reconciler takes a step for: those still running, least recently
    changed first."""
    return list(
        Pipeline.objects.unscoped()
        .filter(state=PipelineState.RUNNING)
        .order_by("updated_at")
        .values_list("pk", flat=True)[:limit]
    )


RUN_STAGE_STATES = {
    RunState.SUCCEEDED: StageState.SUCCEEDED,
    RunState.FAILED: StageState.FAILED,
    RunState.CANCELLED: StageState.CANCELLED,
}


def _endpoint_stage_state(endpoint: Endpoint) -> StageState:
    from serving.models import EndpointState

    if endpoint.state in (EndpointState.READY, EndpointState.UPDATING):
        return StageState.SUCCEEDED  # an endpoint stage is done once it answers requests
    if endpoint.state == EndpointState.FAILED:
        return StageState.FAILED
    if endpoint.state == EndpointState.STOPPED:
        return StageState.CANCELLED
    return StageState.RUNNING


def _observed(stage: PipelineStage) -> StageState:
    """The stage's state as its run (or endpoint) says it now."""
    if stage.run is not None:
        return RUN_STAGE_STATES.get(RunState(stage.run.state), StageState.RUNNING)
    if stage.endpoint is not None:
        return _endpoint_stage_state(stage.endpoint)
    return StageState(stage.state)


def _final_metrics(run: Run) -> dict[str, float]:
    from catalog.ingest import final_metrics

    return final_metrics(run)


@dataclass(frozen=True)
class Step:
    """What one step did: the plan it followed and the stages it started."""

    plan: Plan
    started: tuple[str, ...]


def advance(pipeline_id: int) -> Step | None:
    """Take the pipeline's next step (module docstring): note the stages that ended, decide
    with :func:`plan`, start what it says, hold what it holds, and end the pipeline when it
    says so — in one transaction under the pipeline's lock. None: the pipeline had ended
    already (nothing to do)."""
    with transaction.atomic():
        pipeline = lock_pipeline(pipeline_id)
        if pipeline.state != PipelineState.RUNNING:
            return None
        pipeline_file, _ = load_pipeline(pipeline.source)
        assert pipeline_file is not None, "a kept pipeline.yaml was checked at submission"
        stages = list(
            PipelineStage.objects.unscoped()
            .filter(pipeline=pipeline)
            .select_related("run", "endpoint")
            .order_by("position")
        )
        by_name = {stage.name: stage for stage in stages}
        now = timezone.now()
        for stage in stages:
            observed = _observed(stage)
            if observed != stage.state:
                _stage_ended(pipeline, stage, observed, now)
        metrics = {
            stage.name: _final_metrics(stage.run)
            for stage in stages
            if stage.run is not None and stage.state in DONE and _gated_on(pipeline_file, stage)
        }
        decided = plan(
            pipeline_file,
            {stage.name: StageState(stage.state) for stage in stages},
            metrics,
            cancelled=pipeline.cancel_requested_at is not None,
        )
        for name, (value, passed) in decided.gates.items():
            stage = by_name[name]
            if stage.gate_decision == {"value": value, "passed": passed}:
                continue
            stage.gate_decision = {"value": value, "passed": passed}
            stage.save(update_fields=["gate_decision"])
            append_event(
                pipeline,
                PipelineEventKind.GATE,
                message=f"{stage.gate}: {value:g} — {'passed' if passed else 'not passed'}",
                data={"stage": name, "gate": stage.gate, "value": value, "passed": passed},
            )
        for held in decided.held:
            stage = by_name[held.stage]
            if stage.reason == held.why:
                continue
            stage.reason = held.why
            stage.save(update_fields=["reason"])
            append_event(
                pipeline,
                PipelineEventKind.STAGE_HELD,
                message=f"{held.stage} {held.why}",
                data={"stage": held.stage, "kind": held.kind},
            )
        started = []
        for name in decided.start:
            if _start(pipeline, by_name[name], pipeline_file, now):
                started.append(name)
        if not started and decided.start:
            # A stage refused at its start ended badly: what follows from that is decided now,
            # not a round later.
            transaction.on_commit(lambda: publish(pipeline.pk))
        if decided.state != PipelineState.RUNNING:
            old = pipeline.state
            pipeline.state = decided.state
            pipeline.state_reason = decided.reason
            pipeline.ended_at = now
            pipeline.save(update_fields=["state", "state_reason", "ended_at", "updated_at"])
            append_event(
                pipeline,
                PipelineEventKind.ENDED,
                old_state=old,
                new_state=decided.state,
                message=decided.reason or f"The pipeline {decided.state.value}.",
            )
        else:
            pipeline.save(update_fields=["updated_at"])
        return Step(decided, tuple(started))


def _gated_on(pipeline_file: PipelineFile, stage: PipelineStage) -> bool:
    """Whether some gate reads this stage's metrics (only those are read from the database)."""
    return any(
        other.when is not None and other.when.stage == stage.name for other in pipeline_file.stages
    )


def _stage_ended(pipeline: Pipeline, stage: PipelineStage, observed: StageState, now: Any) -> None:
    old = stage.state
    stage.state = observed
    fields = ["state"]
    if observed in DONE or observed in ENDED_BADLY:
        stage.ended_at = now
        fields.append("ended_at")
    stage.save(update_fields=fields)
    subject = stage.run.name if stage.run is not None else stage.endpoint.name  # type: ignore[union-attr]
    append_event(
        pipeline,
        PipelineEventKind.STAGE_ENDED,
        old_state=old,
        new_state=observed,
        message=f"{stage.name}: {subject} {observed.value}",
        data={
            "stage": stage.name,
            **({"run": stage.run.name} if stage.run is not None else {}),
            **({"endpoint": stage.endpoint.name} if stage.endpoint is not None else {}),
        },
    )


def _stage_folder(pipeline: Pipeline, config: str) -> str:
    """The stage's project: the folder of its tau.yaml, as a path inside the pipeline's zip."""
    path = PurePosixPath(pipeline.folder or ".") / PurePosixPath(config).parent
    folder = str(PurePosixPath(*[part for part in path.parts if part != "."]))
    return "" if folder == "." else folder


def _stage_source(pipeline: Pipeline, config: str) -> bytes:
    name = str(PurePosixPath(pipeline.folder or ".") / config).removeprefix("./")
    with zipfile.ZipFile(bundles.bundle_path(pipeline.bundle.sha256)) as archive:
        return archive.read(name)


def _start(pipeline: Pipeline, stage: PipelineStage, pipeline_file: PipelineFile, now: Any) -> bool:
    """Submit the stage's run (or deploy its endpoint) as the pipeline's submitter, and link
    it; or, when that is refused now (the quota changed, the submitter left), fail the stage
    with the reasons. True if it started."""
    user = pipeline.created_by
    source = _stage_source(pipeline, stage.config)
    folder = _stage_folder(pipeline, stage.config)
    problems: list[str] = []
    made: Run | Endpoint | None = None
    if (why := _submitter_gone(pipeline, user)) is not None:
        problems.append(why)
    else:
        assert user is not None
        try:
            made = _submit_stage(pipeline, stage, user, source, folder)
        except submission.SubmissionRefused as exc:
            problems += [f"{problem.path}: {problem.message}" for problem in exc.problems]
        except Exception as exc:
            from serving.backends import EndpointsUnavailable
            from serving.services import DeployRefused, NameTaken

            if isinstance(exc, DeployRefused):
                problems += [f"{problem.path}: {problem.message}" for problem in exc.problems]
            elif isinstance(exc, NameTaken | EndpointsUnavailable | bundles.BundleRejected):
                problems.append(str(exc))
            else:
                raise
    if made is None:
        stage.state = StageState.FAILED
        stage.reason = "could not start: " + "; ".join(problems)
        stage.ended_at = now
        stage.save(update_fields=["state", "reason", "ended_at"])
        append_event(
            pipeline,
            PipelineEventKind.STAGE_NOT_STARTED,
            old_state=StageState.PENDING,
            new_state=StageState.FAILED,
            message=f"{stage.name} {stage.reason}",
            data={"stage": stage.name, "problems": problems},
        )
        return False
    stage.state = StageState.RUNNING
    stage.reason = ""
    stage.started_at = now
    if isinstance(made, Run):
        stage.run = made
        StageRun.objects.create(pipeline=pipeline, stage=stage.name, run=made)
        what = {"run": made.name, "spec_hash": made.spec_hash}
    else:
        stage.endpoint = made
        what = {"endpoint": made.name, "spec_hash": made.spec_hash}
    stage.save(update_fields=["state", "reason", "started_at", "run", "endpoint"])
    append_event(
        pipeline,
        PipelineEventKind.STAGE_STARTED,
        old_state=StageState.PENDING,
        new_state=StageState.RUNNING,
        message=f"{stage.name}: {what.get('run') or what.get('endpoint')} submitted",
        data={"stage": stage.name, "folder": folder, **what},
    )
    return True


def _submitter_gone(pipeline: Pipeline, user: User | None) -> str | None:
    """Why the pipeline's stages can no longer be submitted as the one who submitted it (the
    account is gone or deactivated, or no longer a researcher of the workspace); None: they
    can. A stage runs as its pipeline's submitter, never as more than they may now do."""
    who = pipeline.created_by_username
    if user is None or not user.is_active:
        return f"{who}, who submitted the pipeline, has no active account any more"
    role = (
        Membership.objects.filter(workspace_id=pipeline.workspace_id, user=user)
        .values_list("role", flat=True)
        .first()
    )
    if role is None or not Role(role).includes(Role.RESEARCHER):
        return f"{who}, who submitted the pipeline, may no longer submit runs in this workspace"
    return None


def _submit_stage(
    pipeline: Pipeline, stage: PipelineStage, user: User, source: bytes, folder: str
) -> Run | Endpoint:
    """The stage's run (or endpoint), from its folder of the pipeline's zip."""
    reading = submission.reading_of(source)
    is_endpoint = reading.spec is not None and reading.spec.is_endpoint
    stage_zip = (
        bundles.folder_zip(pipeline.bundle.sha256, folder)
        if folder
        else bundles.bundle_path(pipeline.bundle.sha256)
    )
    try:
        with open(stage_zip, "rb") as handle:
            if is_endpoint:
                from serving.services import deploy_endpoint

                return deploy_endpoint(
                    workspace=pipeline.workspace, user=user, spec_source=source, bundle=handle
                )
            return submission.submit(
                workspace=pipeline.workspace,
                user=user,
                spec_source=source,
                bundle=handle,
                note={"pipeline": pipeline.name, "stage": stage.name},
            )
    finally:
        if folder:
            Path(stage_zip).unlink(missing_ok=True)


# --- What people do ------------------------------------------------------------------------


def cancel_pipeline(*, pipeline: Pipeline, user: User | None) -> Pipeline:
    """Cancel the running stages and start no new ones; the pipeline ends ``cancelled`` once
    they have stopped. Refused when it has ended already."""
    who = user.get_username() if user is not None else "the system"
    with transaction.atomic():
        locked = lock_pipeline(pipeline.pk)
        if locked.state != PipelineState.RUNNING:
            raise PipelineActionRefused(f"{locked.name} has already {locked.state}.")
        if locked.cancel_requested_at is not None:
            return locked
        locked.cancel_requested_at = timezone.now()
        locked.save(update_fields=["cancel_requested_at", "updated_at"])
        append_event(
            locked,
            PipelineEventKind.CANCEL_REQUESTED,
            message=f"Cancelled by {who}",
            data={"by": who},
        )
        running = (
            PipelineStage.objects.unscoped()
            .filter(pipeline=locked, state=StageState.RUNNING)
            .select_related("run", "endpoint")
        )
        for stage in running:
            if stage.run is not None:
                # One that ended meanwhile is refused: the step below sees how it ended.
                with contextlib.suppress(RunActionRefused):
                    lifecycle.cancel_run(run=stage.run, user=user)
            elif stage.endpoint is not None:
                from serving.services import stop_endpoint

                stop_endpoint(endpoint=stage.endpoint, user=user)
        transaction.on_commit(lambda: publish(locked.pk))
    advance(locked.pk)
    locked.refresh_from_db()
    return locked
