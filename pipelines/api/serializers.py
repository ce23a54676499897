"""JSON shapes of pipelines in the REST API (issue 35: the names are a contract)."""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from pipelines.models import MAX_STAGES, Pipeline, PipelineStage
from pipelines.planning import PipelineState, StageState
from pipelines.selectors import produced, stages_of
from runs.api.serializers import UploadField
from tau.pipeline import MAX_STAGE_NAME_LENGTH


def stage_name() -> serializers.RegexField:
    """A stage's name, as pipeline.yaml allows it."""
    return serializers.RegexField(
        rf"^[a-z]([-a-z0-9]{{0,{MAX_STAGE_NAME_LENGTH - 2}}}[a-z0-9])?$",
        max_length=MAX_STAGE_NAME_LENGTH,
    )


class PipelineSubmitSerializer(serializers.Serializer[Any]):
    """A pipeline, as `curl -F bundle=@pipeline.zip` sends it."""

    bundle = UploadField(
        help_text="The folder of pipeline.yaml, zipped (pipeline.yaml at the zip's top, or "
        "inside its single top-level folder), with every stage's project folder in it. The "
        "same limits as a run's project zip."
    )
    rerun = serializers.ListField(
        child=stage_name(),
        required=False,
        max_length=MAX_STAGES,
        help_text="Stages never reused from an earlier pipeline's run (nor those after them): "
        "a form field given once per stage.",
    )


class PipelineResumeSerializer(serializers.Serializer[Any]):
    rerun = serializers.ListField(
        child=stage_name(),
        required=False,
        max_length=MAX_STAGES,
        help_text="Stages to run afresh (a new run, never reused), with every stage after them; "
        "the others resume where they ended.",
    )


#: A stage's gate, inline and nullable (a $ref cannot be nullable in OpenAPI 3.0).
GATE_SCHEMA = {
    "type": "object",
    "nullable": True,
    "description": "Its `when`; null: it has none.",
    "properties": {
        "when": {
            "type": "string",
            "description": "The gate as written: `STAGE.metrics.NAME OP VALUE`.",
        },
        "value": {
            "type": "number",
            "nullable": True,
            "description": "The final value it read; null until it decided.",
        },
        "passed": {"type": "boolean", "nullable": True, "description": "Null until it decided."},
    },
    "required": ["when", "value", "passed"],
}


@extend_schema_field(GATE_SCHEMA)
class GateField(serializers.JSONField):
    pass


class StageSerializer(serializers.Serializer[Any]):
    name = serializers.CharField()
    state = serializers.ChoiceField(choices=[state.value for state in StageState])
    reason = serializers.CharField(
        help_text="Why it has not started (a gate, a stage before it), or why it could not "
        "start; empty otherwise."
    )
    needs = serializers.ListField(child=serializers.CharField())
    config = serializers.CharField(help_text="Its tau.yaml, relative to pipeline.yaml.")
    run = serializers.CharField(
        allow_null=True, help_text="The name of the run that stands for it now; null: none."
    )
    run_url = serializers.CharField(allow_null=True, help_text="That run in the API.")
    endpoint = serializers.CharField(
        allow_null=True, help_text="An endpoint stage: the endpoint's name; null otherwise."
    )
    produced = serializers.ListField(
        child=serializers.DictField(),
        help_text="What it made: the dataset and model versions its run produced "
        "(`{kind, name, version}`), or its endpoint.",
    )
    metrics = serializers.DictField(
        child=serializers.FloatField(),
        help_text="The final value of each metric its run reported, kept when it ended.",
    )
    gate = GateField(allow_null=True)
    started_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)


class PipelineSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(help_text="Unique in the workspace: the file's name + a suffix.")
    spec_name = serializers.CharField(help_text="`name` in pipeline.yaml.")
    state = serializers.ChoiceField(choices=[state.value for state in PipelineState])
    state_reason = serializers.CharField(
        help_text="Why it failed (naming the stage), stopped (the gate and the value it read) "
        "or was cancelled; empty while running and when it succeeded."
    )
    cancel_requested = serializers.BooleanField()
    rerun = serializers.ListField(
        child=serializers.CharField(), help_text="Stages run afresh, never reused (`--rerun`)."
    )
    created_by = serializers.CharField()
    created_at = serializers.DateTimeField()
    ended_at = serializers.DateTimeField(allow_null=True)
    url = serializers.CharField()
    stages = StageSerializer(many=True)


def stage_fields(
    stage: PipelineStage, produced: list[dict[str, Any]], *, workspace_slug: str
) -> dict[str, Any]:
    run = stage.run
    return {
        "name": stage.name,
        "state": stage.state,
        "reason": stage.reason,
        "needs": list(stage.needs),
        "config": stage.config,
        "run": run.name if run is not None else None,
        "run_url": reverse("api:run-detail", args=[workspace_slug, run.name]) if run else None,
        "endpoint": stage.endpoint.name if stage.endpoint is not None else None,
        "produced": produced,
        "metrics": dict(stage.metrics),
        "gate": {
            "when": stage.gate,
            "value": stage.gate_decision.get("value"),
            "passed": stage.gate_decision.get("passed"),
        }
        if stage.gate
        else None,
        "started_at": stage.started_at,
        "ended_at": stage.ended_at,
    }


def pipeline_fields(pipeline: Pipeline, *, workspace_slug: str) -> dict[str, Any]:
    """The pipeline with its stages (two queries: the stages with their runs and endpoints,
    and what their runs produced)."""
    stages = stages_of(pipeline)
    made = produced(pipeline, stages)
    return {
        "name": pipeline.name,
        "spec_name": pipeline.spec_name,
        "state": pipeline.state,
        "state_reason": pipeline.state_reason,
        "cancel_requested": pipeline.cancel_requested_at is not None,
        "rerun": list(pipeline.rerun),
        "created_by": pipeline.created_by_username,
        "created_at": pipeline.created_at,
        "ended_at": pipeline.ended_at,
        "url": reverse("api:pipeline-detail", args=[workspace_slug, pipeline.name]),
        "stages": [
            stage_fields(stage, made.get(stage.name, []), workspace_slug=workspace_slug)
            for stage in stages
        ],
    }
