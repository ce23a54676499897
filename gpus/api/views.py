"""REST API of GPUs: the fleet (platform staff) and a run's GPUs (the run's readers)."""

from __future__ import annotations

from typing import Any

from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gpus import readings as telemetry
from gpus import run_gpus
from gpus.api.serializers import GpuNodeSerializer, RunGpusSerializer
from gpus.models import GpuNode
from portal.api import refusals
from runs import selectors as run_selectors
from runs.models import Run
from workspaces.access import WorkspaceScopedViewSet
from workspaces.api.platform import IsPlatformStaff


def node_dict(node: GpuNode, gpus: list[dict[str, Any]], telemetry_notice: str) -> dict[str, Any]:
    return {
        "name": node.name,
        "source": node.source,
        "pool": node.pool,
        "flavor": node.flavor.name if node.flavor is not None else None,
        "gpu_model": node.gpu_model,
        "gpus_total": node.gpus_total,
        "gpus_allocatable": node.gpus_allocatable,
        "gpus_in_use": node.gpus_in_use,
        "ready": node.ready,
        "healthy": node.healthy,
        "problems": node.problems,
        "unhealthy_since": node.unhealthy_since,
        "cordoned": node.cordoned,
        "conditions": node.conditions,
        "taints": node.taints,
        "runs": node.runs,
        "gpus": gpus,
        "telemetry_notice": telemetry_notice,
        "updated_at": node.updated_at,
    }


class GpuNodeListView(APIView):
    """Every GPU node as the last fleet sync saw it, with each GPU's telemetry now."""

    permission_classes = [*APIView.permission_classes, IsPlatformStaff]

    @extend_schema(
        responses={200: GpuNodeSerializer(many=True), **refusals(in_workspace=False)},
    )
    def get(self, request: Request) -> Response:
        reading = telemetry.fleet_gpus()
        by_host = reading.value or {}
        rows = [
            node_dict(
                node,
                [run_gpus.gpu_dict(sample) for sample in by_host.get(node.name, [])],
                reading.notice,
            )
            for node in GpuNode.objects.select_related("flavor").order_by("pool", "name")
        ]
        return Response(GpuNodeSerializer(rows, many=True).data)


class RunGpusViewSet(WorkspaceScopedViewSet):
    """A run's GPUs now and its GPU efficiency over its life."""

    base_queryset = Run.objects.all()

    @extend_schema(responses={200: RunGpusSerializer, **refusals()})
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        try:
            run = run_selectors.resolve_run(self.workspace, kwargs["run_name"])
        except Http404 as exc:  # the selector's, in the API's own shape
            raise exceptions.NotFound(str(exc)) from None
        report = run_gpus.report(run)
        return Response(RunGpusSerializer({"run": run.name, **report.as_dict()}).data)
