"""What pages below the pipelines app show of pipelines (the run page's link to the pipeline
a run is a stage of, the workspace home's recent pipelines): loaded by name in their
templates, so the apps below never import this one."""

from __future__ import annotations

from typing import Any

from django import template

from pipelines.models import Pipeline, StageRun
from pipelines.planning import PipelineState

register = template.Library()


@register.simple_tag
def stage_of(run: Any) -> StageRun | None:
    """The pipeline stage ``run`` was started for (with its pipeline), or None: one query."""
    return (
        StageRun.objects.for_workspace(run.workspace_id)
        .select_related("pipeline")
        .filter(run_id=run.pk)
        .first()
    )


@register.filter
def short_number(value: Any) -> str:
    """A metric's value with up to six significant digits (``0.42``, ``1.23457e+06``)."""
    try:
        return f"{float(value):g}"
    except (TypeError, ValueError):
        return ""


@register.simple_tag
def running_pipelines(workspace: Any) -> list[Pipeline]:
    """Up to six of the workspace's running pipelines, newest first (the runs list shows
    five and says when there are more): one query."""
    return list(
        Pipeline.objects.for_workspace(workspace)
        .filter(state=PipelineState.RUNNING)
        .order_by("-created_at", "-id")[:6]
    )
