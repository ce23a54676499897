"""The usage API: ``GET /api/v1/workspaces/{ws}/usage/?month=YYYY-MM`` (the workspace's
members; a token for another workspace sees none)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.response import Response

from accounting import reports
from accounting.api.serializers import UsageSerializer
from portal.api import query_text, refusals
from runs.accounting import MonthRefused
from workspaces.access import WorkspaceScopedViewSet
from workspaces.models import WorkspaceBudget


class UsageViewSet(WorkspaceScopedViewSet):
    """GPU-, CPU- and memory-hours a workspace used in a month, by user, flavor, outcome and
    day, and where its GPU-hour budgets stand."""

    base_queryset = WorkspaceBudget.objects.all()

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "month",
                str,
                description="YYYY-MM in the portal's accounting time zone; default: this month.",
                pattern=r"^2[0-9]{3}-(0[1-9]|1[0-2])$",
            )
        ],
        responses={200: UsageSerializer, **refusals(400)},
    )
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        try:
            period = reports.period_from(query_text(request.query_params, "month"))
        except MonthRefused as exc:
            raise exceptions.ValidationError({"month": [str(exc)]}) from None
        report = reports.workspace_report(self.workspace, period)
        return Response(UsageSerializer(report.as_dict()).data)
