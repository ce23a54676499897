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
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, Any

from celery import current_app
from django.db import IntegrityError, transaction
from django.utils import timezone

from catalog.runs import LATER, handing_over
from pipelines.events import PipelineEventKind, append_event
from pipelines.models import Pipeline, PipelineStage, StageRun
from pipelines.planning import DONE, ENDED_BADLY, PipelineState, Plan, StageState, plan
from runs import bundles, lifecycle, submission
from runs.models import Run, RunState
from runs.state import RunActionRefused
from tau.pipeline import FileProblem, check_pipeline, load_pipeline
from tau.pipeline import Pipeline as PipelineFile
from tau.spec.model import spec_hash
from tau.spec.problems import SpecProblem
from workspaces.models import Membership, Role

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from catalog.models import AssetVersion
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
        # What the stages before it make is not there yet: its `from` inputs are taken as they
        # are (check_pipeline held each to a stage before it that makes such a version).
        with handing_over(LATER):
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
    *,
    workspace: Workspace,
    user: User,
    bundle: IO[bytes],
    config: str = PIPELINE_FILE,
    rerun: Sequence[str] = (),
) -> Pipeline:
    """Check a pipeline's zip whole (pipeline.yaml, every stage's tau.yaml, and each run
    stage against the workspace) and, if all is well, keep it and write the pipeline, its
    stages and its ``submitted`` event; its first step is asked for once that commits.
    ``rerun``: stages never reused from an earlier pipeline's run (nor those after them).
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
        names = [stage.name for stage in pipeline_file.stages]
        problems = [
            FileProblem(
                label,
                SpecProblem(
                    "rerun",
                    0,
                    0,
                    f"--rerun names {name!r}, which is not a stage of this pipeline",
                    f"its stages: {', '.join(names)}",
                ),
            )
            for name in rerun
            if name not in names
        ]
        problems += _stage_problems(stage_sources, workspace)
        if problems:
            raise PipelineRefused(problems)
        kept = bundles.keep(staged, workspace=workspace)
    finally:
        bundles.discard(staged)
    return _create(workspace, user, pipeline_file, source, folder, kept, sorted(set(rerun)))


def _create(
    workspace: Workspace,
    user: User,
    pipeline_file: PipelineFile,
    source: str,
    folder: str,
    bundle: CodeBundle,
    rerun: list[str],
) -> Pipeline:
    with transaction.atomic():
        pipeline = Pipeline(
            workspace=workspace,
            rerun=rerun,
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
                **({"rerun": rerun} if rerun else {}),
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
    if stage.state == StageState.REUSED:
        return StageState.REUSED  # an earlier pipeline's run, which succeeded
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
        started: list[str] = []
        # A stage reused or refused at its start has ended already: what follows from that is
        # decided in this same step (one more pass for each, at most one per stage).
        for _ in range(len(stages) + 1):
            decided = _decide(pipeline, pipeline_file, stages)
            for name in decided.start:
                _start(pipeline, by_name[name], pipeline_file, now)
            running = [name for name in decided.start if by_name[name].state == StageState.RUNNING]
            started += running
            if len(running) == len(decided.start):
                break
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


def _decide(pipeline: Pipeline, pipeline_file: PipelineFile, stages: list[PipelineStage]) -> Plan:
    """:func:`plan` on the stages as they are, and what it decided of gates and held stages
    written (each once: a decision already recorded is not recorded again)."""
    by_name = {stage.name: stage for stage in stages}
    metrics = {stage.name: stage.metrics for stage in stages if stage.state in DONE}
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
    return decided


def _stage_ended(pipeline: Pipeline, stage: PipelineStage, observed: StageState, now: Any) -> None:
    old = stage.state
    stage.state = observed
    fields = ["state"]
    if observed in DONE or observed in ENDED_BADLY:
        stage.ended_at = now
        fields.append("ended_at")
        if stage.run is not None:
            stage.metrics = _final_metrics(stage.run)
            fields.append("metrics")
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
            **({"metrics": stage.metrics} if stage.metrics else {}),
        },
    )


def _stage_folder(pipeline: Pipeline, config: str) -> str:
    """The stage's project: the folder of its tau.yaml, as a path inside the pipeline's zip."""
    path = PurePosixPath(pipeline.folder or ".") / PurePosixPath(config).parent
    folder = str(PurePosixPath(*[part for part in path.parts if part != "."]))
    return "" if folder == "." else folder


def _stage_source(pipeline: Pipeline, config: str) -> tuple[bytes, str | None]:
    """The stage's tau.yaml from the pipeline's zip; or why it cannot be read: the store lost
    the zip (a volume replaced, a file removed by hand), and no later step could read it
    either."""
    name = str(PurePosixPath(pipeline.folder or ".") / config).removeprefix("./")
    try:
        with zipfile.ZipFile(bundles.bundle_path(pipeline.bundle.sha256)) as archive:
            return archive.read(name), None
    except (OSError, KeyError, zipfile.BadZipFile) as error:
        return b"", (
            f"the pipeline's files ({pipeline.bundle.sha256[:12]}) are no longer in the bundle "
            f"store: {error}"
        )


def _start(pipeline: Pipeline, stage: PipelineStage, pipeline_file: PipelineFile, now: Any) -> None:
    """Start the stage: reuse an earlier run of it that matches (:func:`_reusable`), or submit
    its run (or deploy its endpoint) as the pipeline's submitter, and link it; or, when that
    is refused now (the quota changed, the submitter left), fail the stage with the reasons."""
    user = pipeline.created_by
    folder = _stage_folder(pipeline, stage.config)
    problems: list[str] = []
    made: Run | Endpoint | None = None
    source, why = _stage_source(pipeline, stage.config)
    if why is not None or (why := _submitter_gone(pipeline, user)) is not None:
        problems.append(why)
    else:
        assert user is not None
        with (
            _stage_zip(pipeline, folder) as stage_zip,
            handing_over(_made_before(pipeline, pipeline_file, stage.name)),
        ):
            forced = _forced(pipeline, pipeline_file, stage.name)
            reused = None if forced else _reusable(pipeline, stage, source, stage_zip)
            if reused is not None:
                _reuse(pipeline, stage, reused, now)
                return
            try:
                made = _submit_stage(pipeline, stage, user, source, stage_zip)
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
        return
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


def _made_before(
    pipeline: Pipeline, pipeline_file: PipelineFile, name: str
) -> dict[tuple[str, str], AssetVersion]:
    """What each stage before ``name`` made, ``(stage, kind) → version``: the newest ready
    dataset and model version its run produced (what a ``{from: STAGE}`` input reads)."""
    from catalog.models import AssetVersion

    runs = {
        stage.run_id: stage.name
        for stage in PipelineStage.objects.unscoped().filter(
            pipeline=pipeline,
            name__in=pipeline_file.upstream(name),
            state__in=[StageState.SUCCEEDED, StageState.REUSED],
            run__isnull=False,
        )
    }
    made: dict[tuple[str, str], AssetVersion] = {}
    versions = (
        AssetVersion.objects.for_workspace(pipeline.workspace_id)
        .filter(produced_by_id__in=runs, state=AssetVersion.State.READY)
        .select_related("asset")
        .order_by("number")
    )
    for version in versions:
        assert version.produced_by_id is not None  # filtered on it
        made[(runs[version.produced_by_id], version.asset.kind)] = version
    return made


@contextlib.contextmanager
def _stage_zip(pipeline: Pipeline, folder: str) -> Iterator[Path]:
    """The stage's project zip: its folder of the pipeline's zip (removed after), or the
    whole zip for a stage whose tau.yaml is at its top."""
    if not folder:
        yield bundles.bundle_path(pipeline.bundle.sha256)
        return
    made = bundles.folder_zip(pipeline.bundle.sha256, folder)
    try:
        yield made
    finally:
        made.unlink(missing_ok=True)


def _forced(pipeline: Pipeline, pipeline_file: PipelineFile, name: str) -> bool:
    """Whether the stage must run afresh: it is named by ``--rerun``, or comes after one that
    is (what it would reuse was made from the outputs being made again)."""
    rerun = set(pipeline.rerun)
    return name in rerun or bool(rerun & pipeline_file.upstream(name))


def _reusable(
    pipeline: Pipeline, stage: PipelineStage, source: bytes, stage_zip: Path
) -> Run | None:
    """An earlier run of this stage (of any of the workspace's pipelines) that succeeded with
    the same spec (as the workspace takes it now: the same hash), the same code (the stage's
    zip's digest) and the same pinned inputs (each dataset and model version, where it is
    read): its outputs stand for the stage's. The newest such run; None if there is none, or
    the stage is an endpoint (an endpoint is deployed every time)."""
    from catalog.models import RunInput
    from catalog.runs import check_inputs

    reading = submission.reading_of(source)
    if reading.spec is None or reading.spec.is_endpoint:
        return None
    try:
        placement = submission.check_spec(source, workspace=pipeline.workspace)
    except submission.SubmissionRefused:
        return None  # the submission says why
    problems, pinned = check_inputs(placement.spec, pipeline.workspace)
    if problems:
        return None
    wanted = {(item.version.pk, item.path) for item in pinned}
    code = bundles.inspect_zip(stage_zip).sha256
    candidates = (
        Run.objects.for_workspace(pipeline.workspace_id)
        .filter(
            state=RunState.SUCCEEDED,
            spec_hash=spec_hash(placement.spec),
            bundle__sha256=code,
            pipeline_stage__stage=stage.name,
        )
        .order_by("-finished_at", "-id")[:20]
    )
    for run in candidates:
        read = set(
            RunInput.objects.for_workspace(pipeline.workspace_id)
            .filter(run=run)
            .values_list("version_id", "path")
        )
        if read == wanted:
            return run
    return None


def _reuse(pipeline: Pipeline, stage: PipelineStage, run: Run, now: Any) -> None:
    stage.state = StageState.REUSED
    stage.reason = ""
    stage.run = run
    stage.metrics = _final_metrics(run)
    stage.started_at = now
    stage.ended_at = now
    stage.save(update_fields=["state", "reason", "run", "metrics", "started_at", "ended_at"])
    origin = StageRun.objects.for_workspace(pipeline.workspace_id).get(run=run)
    append_event(
        pipeline,
        PipelineEventKind.STAGE_REUSED,
        old_state=StageState.PENDING,
        new_state=StageState.REUSED,
        message=f"{stage.name}: reused {run.name} (the same spec, code and inputs succeeded "
        "before); not run again",
        data={
            "stage": stage.name,
            "run": run.name,
            "spec_hash": run.spec_hash,
            "bundle": run.bundle.sha256 if run.bundle else None,
            "pipeline": origin.pipeline.name,
        },
    )


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
    pipeline: Pipeline, stage: PipelineStage, user: User, source: bytes, stage_zip: Path
) -> Run | Endpoint:
    """The stage's run (or endpoint), from its project zip."""
    reading = submission.reading_of(source)
    is_endpoint = reading.spec is not None and reading.spec.is_endpoint
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


#: The states a pipeline may be resumed from: it ended, and not by succeeding.
RESUMABLE = frozenset({PipelineState.FAILED, PipelineState.STOPPED, PipelineState.CANCELLED})


def resume_pipeline(
    *, pipeline: Pipeline, user: User | None, rerun: Sequence[str] = ()
) -> Pipeline:
    """Run a pipeline that failed, stopped or was cancelled again from where it ended: each
    stage that failed or was cancelled has its run resumed (a new attempt of the same run, from
    its newest checkpoint), the stages that never started start as what they need succeeds,
    and those that succeeded keep their outputs. ``rerun``: stages to run afresh (a new run,
    never reused), with every stage after them. Refused for one still running or that
    succeeded, and for a stage name it does not have."""
    who = user.get_username() if user is not None else "the system"
    with transaction.atomic():
        locked = lock_pipeline(pipeline.pk)
        if locked.state not in RESUMABLE:
            said = "is still running" if locked.is_running else f"has {locked.state}"
            raise PipelineActionRefused(
                f"{locked.name} {said}: only a pipeline that failed, stopped or was cancelled "
                "is resumed."
            )
        pipeline_file, _ = load_pipeline(locked.source)
        assert pipeline_file is not None, "a kept pipeline.yaml was checked at submission"
        names = [stage.name for stage in pipeline_file.stages]
        unknown = [name for name in rerun if name not in names]
        if unknown:
            raise PipelineActionRefused(
                f"{locked.name} has no stage {unknown[0]!r} (its stages: {', '.join(names)})."
            )
        locked.rerun = sorted(set(rerun))
        stages = list(
            PipelineStage.objects.unscoped()
            .filter(pipeline=locked)
            .select_related("run")
            .order_by("position")
        )
        afresh = {name for name in names if _forced(locked, pipeline_file, name)}
        resumed: list[str] = []
        for stage in stages:
            if stage.name in afresh:
                _reset(stage)
            elif stage.state in (StageState.FAILED, StageState.CANCELLED):
                if stage.run is not None and _resume_run(stage.run, user):
                    stage.state = StageState.RUNNING
                    stage.reason = ""
                    stage.metrics = {}
                    stage.ended_at = None
                    stage.save(update_fields=["state", "reason", "metrics", "ended_at"])
                    resumed.append(stage.name)
                else:
                    _reset(stage)
            elif stage.state == StageState.PENDING and (stage.reason or stage.gate_decision):
                _reset(stage)  # held by what is now being run again: decided afresh
        old = locked.state
        locked.state = PipelineState.RUNNING
        locked.state_reason = ""
        locked.ended_at = None
        locked.cancel_requested_at = None
        locked.save(
            update_fields=[
                "state",
                "state_reason",
                "ended_at",
                "cancel_requested_at",
                "rerun",
                "updated_at",
            ]
        )
        append_event(
            locked,
            PipelineEventKind.RESUMED,
            old_state=old,
            new_state=PipelineState.RUNNING,
            message=f"Resumed by {who}"
            + (f"; run afresh: {', '.join(locked.rerun)}" if locked.rerun else ""),
            data={"by": who, "rerun": locked.rerun, "resumed": resumed},
        )
        for name in resumed:
            run = next(stage.run for stage in stages if stage.name == name)
            append_event(
                locked,
                PipelineEventKind.STAGE_RESUMED,
                new_state=StageState.RUNNING,
                message=f"{name}: {run.name if run else ''} resumed (a new attempt)",
                data={"stage": name, "run": run.name if run else None},
            )
    advance(locked.pk)
    locked.refresh_from_db()
    return locked


def _reset(stage: PipelineStage) -> None:
    """The stage as if it had never started (its runs stay in the record: ``StageRun``)."""
    stage.state = StageState.PENDING
    stage.reason = ""
    stage.gate_decision = {}
    stage.metrics = {}
    stage.run = None
    stage.endpoint = None
    stage.started_at = None
    stage.ended_at = None
    stage.save(
        update_fields=[
            "state",
            "reason",
            "gate_decision",
            "metrics",
            "run",
            "endpoint",
            "started_at",
            "ended_at",
        ]
    )


def _resume_run(run: Run, user: User | None) -> bool:
    """A new attempt of the stage's run (from its newest checkpoint); False when it cannot be
    (then the stage starts a new run)."""
    try:
        lifecycle.resume_run(run=run, user=user)
    except RunActionRefused:
        return False
    return True
