"""What pipeline pages and the API read, in a fixed number of queries."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from catalog.models import AssetVersion
from pipelines.models import Pipeline, PipelineStage


def stages_of(pipeline: Pipeline) -> list[PipelineStage]:
    """The pipeline's stages in the file's order, each with its run and endpoint."""
    return list(
        PipelineStage.objects.for_workspace(pipeline.workspace_id)
        .filter(pipeline=pipeline)
        .select_related("run", "endpoint")
        .order_by("position")
    )


def produced(pipeline: Pipeline, stages: list[PipelineStage]) -> dict[str, list[dict[str, Any]]]:
    """What each stage made, by stage name: the dataset and model versions its run produced
    (``{kind, name, version}``, oldest first), or its endpoint (``{kind: endpoint, name}``)."""
    made: dict[str, list[dict[str, Any]]] = defaultdict(list)
    by_run = {stage.run_id: stage.name for stage in stages if stage.run_id is not None}
    if by_run:
        versions = (
            AssetVersion.objects.for_workspace(pipeline.workspace_id)
            .filter(produced_by_id__in=by_run)
            .select_related("asset")
            .order_by("produced_by_id", "asset__kind", "asset__name", "number")
        )
        for version in versions:
            assert version.produced_by_id is not None  # filtered on it
            made[by_run[version.produced_by_id]].append(
                {"kind": version.asset.kind, "name": version.asset.name, "version": version.number}
            )
    for stage in stages:
        if stage.endpoint is not None:
            made[stage.name].append({"kind": "endpoint", "name": stage.endpoint.name})
    return dict(made)
