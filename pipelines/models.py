"""Pipelines: one row per submitted ``pipeline.yaml``, one per stage, the runs each stage
started, and the pipeline's own hash-chained history.

A pipeline's stages are ordinary runs (or, for a stage whose tau.yaml describes an endpoint,
an endpoint). What the pipeline does next is decided by :func:`pipelines.planning.plan` from
the stages' states, under the pipeline's row lock (:mod:`pipelines.orchestration`); a stage's
run is written in the same transaction as the stage's link to it, so no stage starts twice.
"""

from __future__ import annotations

from typing import ClassVar

from django.conf import settings
from django.db import models
from django.utils import timezone

from pipelines.planning import PipelineState, StageState
from portal.tenancy import TenantModel

#: The most stages a pipeline may have (issue 35).
MAX_STAGES = 64


class Pipeline(TenantModel):
    """A pipeline of a workspace: a ``pipeline.yaml`` and the project folders it names,
    submitted once as one zip."""

    workspace = models.ForeignKey(
        "workspaces.Workspace", on_delete=models.PROTECT, related_name="pipelines"
    )
    name = models.CharField(
        max_length=80, help_text="The file's name and a random suffix; unique in the workspace."
    )
    spec_name = models.CharField(max_length=63, help_text="``name`` in pipeline.yaml.")
    source = models.TextField(help_text="pipeline.yaml exactly as submitted.")
    #: The folder of pipeline.yaml in the zip ('' at its top): stage configs are relative to it.
    folder = models.CharField(max_length=255, blank=True)
    bundle = models.ForeignKey(
        "runs.CodeBundle", on_delete=models.PROTECT, related_name="+", help_text="The whole zip."
    )
    state = models.CharField(
        max_length=20,
        choices=[(state.value, state.value.capitalize()) for state in PipelineState],
        default=PipelineState.RUNNING.value,
    )
    state_reason = models.TextField(blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    #: Stages never reused from an earlier run, whatever it matched (``--rerun``): each starts
    #: a run of its own, and so does every stage after it.
    rerun = models.JSONField(default=list, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    created_by_username = models.CharField(max_length=150)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta(TenantModel.Meta):
        constraints = [
            models.UniqueConstraint(fields=["workspace", "name"], name="pipeline_name_unique")
        ]
        indexes = [
            models.Index(fields=["workspace", "-created_at", "-id"], name="pipeline_list"),
            models.Index(fields=["state"], name="pipeline_state"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_running(self) -> bool:
        return self.state == PipelineState.RUNNING


class PipelineStage(TenantModel):
    """One stage of a pipeline, in the file's order: what it needs, its gate, and what it
    did — the run (or endpoint) that stands for it now."""

    tenant_path: ClassVar[str | None] = "pipeline__workspace"

    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="stages")
    name = models.CharField(max_length=63)
    position = models.PositiveSmallIntegerField()
    config = models.CharField(max_length=255, help_text="Its tau.yaml, relative to pipeline.yaml.")
    needs = models.JSONField(default=list, blank=True)
    gate = models.CharField(max_length=255, blank=True, help_text="``when``, as written.")
    state = models.CharField(
        max_length=20,
        choices=[(state.value, state.value.capitalize()) for state in StageState],
        default=StageState.PENDING.value,
    )
    #: Why it has not started (held by a gate or a stage before it), or why it failed to start.
    reason = models.TextField(blank=True)
    #: What its gate read and decided: ``{"value": 0.91, "passed": true}``; empty before.
    gate_decision = models.JSONField(default=dict, blank=True)
    #: The final value of each metric its run reported, kept when the stage ended (or was
    #: reused): what gates read and its box shows.
    metrics = models.JSONField(default=dict, blank=True)
    #: The run that stands for it: its own, or (``reused``) an earlier pipeline's run of the
    #: same stage with the same spec, code and pinned inputs.
    run = models.ForeignKey(
        "runs.Run", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    endpoint = models.ForeignKey(
        "serving.Endpoint", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta(TenantModel.Meta):
        ordering = ["pipeline", "position"]
        constraints = [
            models.UniqueConstraint(fields=["pipeline", "name"], name="pipeline_stage_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.pipeline_id}:{self.name}"


class StageRun(TenantModel):
    """Every run a pipeline's stage started, a resume's included: how a run's page finds its
    pipeline, and the record of what ran for each stage."""

    tenant_path: ClassVar[str | None] = "pipeline__workspace"

    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="stage_runs")
    stage = models.CharField(max_length=63)
    run = models.OneToOneField("runs.Run", on_delete=models.PROTECT, related_name="pipeline_stage")
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.pipeline_id}:{self.stage} → {self.run_id}"


class PipelineEvent(TenantModel):
    """Append-only history of a pipeline (stage starts and ends, gate decisions with the
    values they read, cancels, who did what), in a hash chain as a run's (``portal.event_chain``;
    the content names the pipeline as ``pipeline``)."""

    tenant_path: ClassVar[str | None] = "pipeline__workspace"

    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField()
    time = models.DateTimeField(default=timezone.now)
    kind = models.CharField(max_length=40)
    old_state = models.CharField(max_length=20, blank=True)
    new_state = models.CharField(max_length=20, blank=True)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    class Meta(TenantModel.Meta):
        ordering = ["pipeline", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["pipeline", "seq"], name="pipeline_event_unique_seq")
        ]

    def __str__(self) -> str:
        return f"{self.pipeline_id}#{self.seq} {self.kind}"
