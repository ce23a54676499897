"""REST API for runs under ``/api/v1/workspaces/<ws>/runs/``.

People (sessions, user tokens) submit, list, follow, cancel and resume runs. Workloads report
metrics, checkpoints and events with their run token, which reaches nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from django.db.models import Prefetch, Q, QuerySet
from django.http import FileResponse, Http404, HttpResponseBase, StreamingHttpResponse
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, status
from rest_framework.decorators import action
from rest_framework.pagination import CursorPagination
from rest_framework.parsers import JSONParser, MultiPartParser
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from portal.identity.tokens import token_of
from portal.models import ApiToken
from runs import bundles, selectors, services, submission
from runs.api.serializers import (
    CheckpointSerializer,
    EventSerializer,
    LogChunkSerializer,
    ReportCheckpointSerializer,
    ReportEventSerializer,
    ReportMetricsSerializer,
    ResumeSerializer,
    RunDetailSerializer,
    RunSummarySerializer,
    SubmitSerializer,
)
from runs.models import Checkpoint, MetricPoint, Run, RunAttempt, RunEvent, RunState
from workspaces.access import WorkspaceScopedViewSet
from workspaces.models import Role

MAX_METRIC_POINTS = 5000


class RunCursorPagination(CursorPagination):
    ordering = ("-created_at", "-id")
    page_size = 50
    max_page_size = 200
    page_size_query_param = "limit"


class PlainTextRenderer(BaseRenderer):
    """``text/plain`` for the logs action (``?format=text`` or ``Accept: text/plain``). The
    log itself is streamed by the action; this renders what goes wrong instead (no such
    attempt, a bad parameter) as text, for a client that asked for text."""

    media_type = "text/plain"
    format = "text"
    charset = "utf-8"

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        if data is None:
            return b""
        if isinstance(data, dict):
            lines = []
            for key, value in data.items():
                said = "; ".join(str(v) for v in value) if isinstance(value, list) else str(value)
                lines.append(said if key == "detail" else f"{key}: {said}")
            return ("\n".join(lines) + "\n").encode()
        return f"{data}\n".encode()


class RunViewSet(WorkspaceScopedViewSet):
    """Runs of one workspace. ``{run_name}`` is a run's full name, or a spec name meaning the
    newest run of that spec."""

    serializer_class = RunSummarySerializer
    pagination_class = RunCursorPagination
    base_queryset = Run.objects.select_related("workspace")
    lookup_url_kwarg = "run_name"
    parser_classes = [MultiPartParser, JSONParser]

    def get_renderers(self) -> list[BaseRenderer]:
        # urls.py writes the routes out instead of using a router, so an @action's own
        # renderer_classes (the logs' text/plain) are applied here.
        handler = getattr(self, self.action, None) if getattr(self, "action", None) else None
        classes = getattr(handler, "kwargs", {}).get("renderer_classes")
        return [renderer() for renderer in classes] if classes else super().get_renderers()

    def get_object(self) -> Run:
        try:
            return selectors.resolve_run(self.workspace, self.kwargs["run_name"])
        except Http404 as exc:
            raise exceptions.NotFound(str(exc)) from None

    def _filtered(self) -> QuerySet[Run]:
        runs = self.get_queryset()
        params = self.request.query_params
        states = [state for state in params.getlist("state") if state in RunState.values]
        if params.getlist("state") and not states:
            raise exceptions.ValidationError({"state": f"one of: {', '.join(RunState.values)}"})
        if states:
            runs = runs.filter(state__in=states)
        if name := params.get("name"):
            runs = runs.filter(Q(spec_name=name) | Q(name=name))
        if submitter := params.get("submitter"):
            runs = runs.filter(submitted_by_username=submitter)
        return runs

    @extend_schema(
        parameters=[
            OpenApiParameter("state", str, many=True, description="Only runs in these states."),
            OpenApiParameter("name", str, description="A spec name or run name."),
            OpenApiParameter("submitter", str, description="Username of who submitted."),
        ],
        responses=RunSummarySerializer(many=True),
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        page = self.paginate_queryset(self._filtered())
        return self.get_paginated_response(RunSummarySerializer(page, many=True).data)

    @extend_schema(request=SubmitSerializer, responses={201: RunDetailSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        spec_file = request.FILES.get("spec")
        if spec_file is None:
            raise exceptions.ValidationError(
                {"spec": ["Attach the tau.yaml as the file field 'spec'."]}
            )
        if spec_file.size and spec_file.size > submission.MAX_SPEC_BYTES:
            raise exceptions.ValidationError({"spec": ["tau.yaml is too large (256 KiB at most)."]})
        try:
            run = submission.submit(
                workspace=self.workspace,
                user=request.user,  # type: ignore[arg-type]
                spec_source=spec_file.read(),
                bundle=request.FILES.get("bundle"),
            )
        except submission.SubmissionRefused as exc:
            return Response(
                {
                    "detail": "The run was not submitted.",
                    "problems": [p.to_dict() for p in exc.problems],
                },
                status=status.HTTP_400_BAD_REQUEST,
            )
        # Answer from what was just written: no re-read, and a new run has no attempts yet.
        url = reverse(
            "api:run-detail", kwargs={"workspace_slug": self.workspace.slug, "run_name": run.name}
        )
        bundle = run.bundle
        return Response(
            {
                "name": run.name,
                "spec_name": run.spec_name,
                "state": run.state,
                "state_reason": run.state_reason,
                "spec_hash": run.spec_hash,
                "bundle": None
                if bundle is None
                else {"sha256": bundle.sha256, "size": bundle.size, "files": bundle.file_count},
                "priority": run.priority,
                "backend": run.backend,
                "submitted_by": run.submitted_by_username,
                "created_at": run.created_at,
                "attempts": [],
                "url": url,
            },
            status=status.HTTP_201_CREATED,
        )

    def _detail(self, run: Run) -> dict[str, Any]:
        attempts = Prefetch(
            "attempts",
            queryset=RunAttempt.objects.for_workspace(self.workspace)
            .select_related("resume_from")
            .order_by("number"),
        )
        fresh = (
            Run.objects.for_workspace(self.workspace)
            .select_related("workspace", "bundle")
            .prefetch_related(attempts)
            .get(pk=run.pk)
        )
        return dict(RunDetailSerializer(fresh).data)

    @extend_schema(responses=RunDetailSerializer)
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(self._detail(self.get_object()))

    def _check_owner_or_admin(self, run: Run) -> None:
        if run.submitted_by_id != self.request.user.pk and not self.access.allows(Role.ADMIN):
            raise exceptions.PermissionDenied(
                "Only its submitter or a workspace admin can do that."
            )

    @extend_schema(request=None, responses=RunDetailSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        run = self.get_object()
        self._check_owner_or_admin(run)
        try:
            services.cancel_run(run=run, user=request.user)  # type: ignore[arg-type]
        except services.RunActionRefused as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(self._detail(run))

    @extend_schema(request=ResumeSerializer, responses=RunDetailSerializer)
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        run = self.get_object()
        self._check_owner_or_admin(run)
        payload = ResumeSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        checkpoint = None
        if "checkpoint" in payload.validated_data:
            checkpoint = (
                Checkpoint.objects.for_workspace(self.workspace)
                .filter(run=run, pk=payload.validated_data["checkpoint"])
                .first()
            )
            if checkpoint is None:
                raise exceptions.ValidationError(
                    {"checkpoint": ["No such checkpoint of this run."]}
                )
        try:
            services.resume_run(run=run, user=request.user, checkpoint=checkpoint)  # type: ignore[arg-type]
        except services.RunActionRefused as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(self._detail(run))

    @extend_schema(responses=EventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def events(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        run = self.get_object()
        events = RunEvent.objects.for_workspace(self.workspace).filter(run=run).order_by("seq")
        after = request.query_params.get("after")
        if after and after.isdigit():
            events = events.filter(seq__gt=int(after))
        return Response(EventSerializer(events[:1000], many=True).data)

    @extend_schema(
        parameters=[
            OpenApiParameter("attempt", int, description="Attempt number; default the newest."),
            OpenApiParameter("tail", int, description="JSON: the last N lines (default 200)."),
            OpenApiParameter("offset", int, description="JSON: bytes from this offset on."),
            OpenApiParameter(
                "format",
                str,
                enum=["json", "text"],
                description="`json` (the default): a piece of the log, to follow it. `text`: "
                "the whole log of the attempt as plain UTF-8 text, as a download named "
                "`<run>-attempt-<n>.log`; the same as sending `Accept: text/plain`.",
            ),
        ],
        responses={
            (200, "application/json"): LogChunkSerializer,
            (200, "text/plain"): OpenApiTypes.STR,
        },
    )
    @action(detail=True, methods=["get"], renderer_classes=[JSONRenderer, PlainTextRenderer])
    def logs(self, request: Request, *args: Any, **kwargs: Any) -> HttpResponseBase:
        run = self.get_object()
        params = request.query_params
        attempt_number = _int_param(params, "attempt")
        if request.accepted_renderer.format == PlainTextRenderer.format:
            return _whole_log_response(run, attempt_number)
        chunk = selectors.read_log(
            run,
            attempt_number=attempt_number,
            offset=_int_param(params, "offset"),
            tail_lines=min(_int_param(params, "tail") or 200, 10000),
        )
        return Response(
            {
                "attempt": chunk.attempt,
                "offset": chunk.offset,
                "next_offset": chunk.next_offset,
                "size": chunk.size,
                "complete": chunk.complete,
                "text": chunk.text,
            }
        )

    @extend_schema(
        parameters=[
            OpenApiParameter("keys", str, description="Comma-separated metric names; default all."),
            OpenApiParameter(
                "max_points",
                int,
                description="The most points per series (1 to 5000, default 1000). A longer "
                "series keeps its first and last point and the lowest and highest point of "
                "equal step ranges between them.",
            ),
        ]
    )
    @action(detail=True, methods=["get"])
    def metrics(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        run = self.get_object()
        available = selectors.metric_keys(run)
        wanted = [key for key in (request.query_params.get("keys") or "").split(",") if key]
        keys = [key for key in wanted if key in available] if wanted else available
        asked = _int_param(request.query_params, "max_points")
        if asked == 0:
            raise exceptions.ValidationError({"max_points": ["must be at least 1"]})
        max_points = min(asked or 1000, MAX_METRIC_POINTS)
        return Response(
            {"keys": available, "series": selectors.metric_series(run, keys, max_points=max_points)}
        )

    @extend_schema(responses=CheckpointSerializer(many=True))
    @action(detail=True, methods=["get"])
    def checkpoints(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        run = self.get_object()
        rows = (
            Checkpoint.objects.for_workspace(self.workspace).filter(run=run).order_by("-step")[:500]
        )
        return Response(CheckpointSerializer(rows, many=True).data)


def _int_param(params: Any, name: str) -> int | None:
    value = params.get(name)
    if value in (None, ""):
        return None
    try:
        number = int(value)
    except ValueError:
        raise exceptions.ValidationError({name: ["must be a whole number"]}) from None
    if number < 0:
        raise exceptions.ValidationError({name: ["must not be negative"]})
    return number


def _whole_log_response(run: Run, attempt_number: int | None) -> StreamingHttpResponse:
    """The attempt's whole log as a plain-text download, streamed (logs reach 50 MiB)."""
    log = selectors.open_whole_log(run, attempt_number=attempt_number)  # Http404: DRF's 404
    name = f"{run.name}-attempt-{log.attempt}.log" if log.attempt else f"{run.name}.log"
    response = StreamingHttpResponse(log, content_type="text/plain; charset=utf-8")
    response["Content-Length"] = str(log.size)
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    response["X-Content-Type-Options"] = "nosniff"
    response["Cache-Control"] = "no-store"
    return response


class RunReportViewSet(WorkspaceScopedViewSet):
    """What a running workload reports, authenticated by its run token (and nothing else)."""

    accepts_run_tokens = True
    base_queryset = Run.objects.all()
    parser_classes = [JSONParser]

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        token = token_of(request)
        if token is None or token.kind != ApiToken.Kind.RUN:
            raise exceptions.PermissionDenied("Only a run's own token can report on it.")
        run = Run.objects.for_workspace(self.workspace).filter(name=kwargs["run_name"]).first()
        if run is None or token.run_id != run.pk:
            raise exceptions.NotFound("No such run.")
        self.run = run

    def write_role_for(self, request: Request) -> Role:
        # The run token is the authority here: a workload keeps reporting even if its
        # submitter's role changed while it ran (removal from the workspace still stops it).
        return Role.VIEWER

    @extend_schema(request=ReportMetricsSerializer, responses={202: None})
    def metrics(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = ReportMetricsSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        attempt = self.run.attempt_count
        points = []
        problems = []
        for index, row in enumerate(payload.validated_data["rows"]):
            step = row.get("step")
            if not isinstance(step, int) or isinstance(step, bool):
                problems.append(f"row {index}: 'step' must be a whole number")
                continue
            for key, value in row.items():
                if key == "step" or key == "time":
                    continue
                if (
                    isinstance(value, bool)
                    or not isinstance(value, int | float)
                    or not math.isfinite(value)
                ):
                    problems.append(f"row {index}: {key!r} must be a finite number")
                    continue
                if len(key) > 100:
                    problems.append(f"row {index}: metric names are at most 100 characters")
                    continue
                points.append(
                    MetricPoint(
                        run=self.run, attempt=attempt, key=key, step=step, value=float(value)
                    )
                )
        if problems:
            return Response(
                {"detail": "Nothing was recorded.", "problems": problems[:50]}, status=400
            )
        MetricPoint.objects.bulk_create(points)
        return Response({"recorded": len(points)}, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=ReportCheckpointSerializer, responses={201: CheckpointSerializer})
    def checkpoint(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = ReportCheckpointSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        checkpoint, _ = Checkpoint.objects.update_or_create(
            run=self.run,
            path=data["path"],
            defaults={
                "attempt": self.run.attempt_count,
                "step": data["step"],
                "complete": data["complete"],
                "size": data.get("size"),
            },
        )
        return Response(CheckpointSerializer(checkpoint).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=ReportEventSerializer, responses={201: EventSerializer})
    def event(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = ReportEventSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        from django.db import transaction

        with transaction.atomic():
            run = services.lock_run(self.run.pk)
            event = services.append_event(
                run,
                f"workload.{data['kind']}",
                message=data["message"],
                data=data.get("data") or {},
            )
        return Response(EventSerializer(event).data, status=status.HTTP_201_CREATED)


class RunBundleViewSet(WorkspaceScopedViewSet):
    """The run's code bundle: for its own workload (run token) and for workspace members."""

    accepts_run_tokens = True
    base_queryset = Run.objects.all()

    @extend_schema(responses={(200, "application/zip"): OpenApiTypes.BINARY})
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> FileResponse:
        token = token_of(request)
        run = (
            Run.objects.for_workspace(self.workspace)
            .select_related("bundle")
            .filter(name=kwargs["run_name"])
            .first()
        )
        if run is None or (
            token is not None and token.kind == ApiToken.Kind.RUN and token.run_id != run.pk
        ):
            raise exceptions.NotFound("No such run.")
        if run.bundle is None:
            raise exceptions.NotFound("This run has no code bundle.")
        path = bundles.bundle_path(run.bundle.sha256)
        # FileResponse closes the file when the response is done.
        response = FileResponse(
            open(path, "rb"),  # noqa: SIM115
            content_type="application/zip",
            as_attachment=True,
            filename=f"{run.name}.zip",
        )
        response["X-Content-SHA256"] = run.bundle.sha256
        return response
