"""REST API for pipelines under ``/api/v1/workspaces/<ws>/pipelines/`` (issue 35).

Members read a workspace's pipelines; researchers submit them; the one who submitted a
pipeline and the workspace's admins cancel it. Every route is scoped by
``WorkspaceScopedViewSet`` (an outsider gets 404) and refuses in the API's one shape.
"""

from __future__ import annotations

import os
from typing import Any

from django.db.models import QuerySet
from django.http import FileResponse, QueryDict
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, status
from rest_framework.parsers import BaseParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer

from identity.tokens import token_of
from pipelines import evidence, orchestration
from pipelines.api.serializers import (
    PipelineResumeSerializer,
    PipelineSerializer,
    PipelineSubmitSerializer,
    pipeline_fields,
)
from pipelines.models import Pipeline, PipelineStage
from portal.api import BoundedJSONParser, FileDownloadNegotiation, refusals
from portal.requests import signed_in_user
from runs import submission
from runs.api.views import RunCursorPagination
from workspaces.access import WorkspaceScopedViewSet
from workspaces.models import Role

NOT_SUBMITTED = "The pipeline was not submitted."
REFUSAL = "Only its submitter or a workspace admin can do that."


class PipelineCursorPagination(RunCursorPagination):
    """The pipelines list's pages, newest first: ``limit`` (1 to 200) each."""

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["description"] = f"Pipelines per page (default {self.page_size})."
        return parameters


class PipelineTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE

    def __init__(self, declared: int, limit: int) -> None:
        super().__init__(
            f"The upload is {declared / 2**20:.1f} MiB; a pipeline may be at most "
            f"{limit / 2**20:.1f} MiB (its zip and the form around it). Nothing was read or "
            "kept."
        )


def may_act_on(pipeline: Pipeline, *, access: Any, user_id: int | None) -> bool:
    """Cancel, resume: the one who submitted it (a researcher still) or a workspace admin."""
    if access.allows(Role.ADMIN):
        return True
    return (
        access.allows(Role.RESEARCHER) and user_id is not None and pipeline.created_by_id == user_id
    )


class PipelineViewSet(WorkspaceScopedViewSet):
    """Pipelines of one workspace: list and submit; read and cancel one."""

    pagination_class = PipelineCursorPagination
    parser_classes = [MultiPartParser, BoundedJSONParser]

    def get_parsers(self) -> list[BaseParser]:
        # Only a submission carries a file; the actions take JSON alone.
        if getattr(self, "action_map", {}).get("post") == "create":
            return [MultiPartParser()]
        return [BoundedJSONParser()]

    def get_base_queryset(self) -> QuerySet[Any]:
        return Pipeline.objects.all().order_by("-created_at", "-id")

    def get_serializer_class(self) -> type[BaseSerializer[Any]]:
        return {
            "create": PipelineSubmitSerializer,
            "resume": PipelineResumeSerializer,
        }.get(self.action or "", PipelineSerializer)

    def get_object(self) -> Pipeline:
        name = self.kwargs["name"]
        pipeline: Pipeline | None = (
            None if "\x00" in name else self.get_queryset().filter(name=name).first()
        )
        if pipeline is None:
            raise exceptions.NotFound(f"This workspace has no pipeline named {name!r}.")
        pipeline.workspace = self.workspace
        return pipeline

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        if request.method == "POST" and self.action == "create":
            # Before anything reads the body (the session's CSRF check reads a form whole).
            try:
                declared = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                declared = 0
            if declared > submission.MAX_SUBMISSION_BYTES:
                raise PipelineTooLarge(declared, submission.MAX_SUBMISSION_BYTES)
        super().initial(request, *args, **kwargs)

    def _fields(self, pipeline: Pipeline) -> dict[str, Any]:
        return pipeline_fields(pipeline, workspace_slug=self.workspace.slug)

    @extend_schema(
        description="The workspace's pipelines, newest first, each with its stages.",
        responses={200: PipelineSerializer(many=True), **refusals(400)},
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        page = self.paginate_queryset(self.get_queryset()) or []
        return self.get_paginated_response(
            PipelineSerializer([self._fields(pipeline) for pipeline in page], many=True).data
        )

    @extend_schema(
        description="Submits a pipeline: the folder of pipeline.yaml, zipped (`bundle`). It "
        "is checked whole first — pipeline.yaml, every stage's tau.yaml, and each run stage "
        "as the workspace would take it — and nothing is kept unless all of it passes; then "
        "its first stages start.",
        request={"multipart/form-data": PipelineSubmitSerializer},
        responses={
            201: PipelineSerializer,
            **refusals(
                400,
                413,
                words={
                    400: "`problems` lists every problem of every file at once: `file` "
                    "(pipeline.yaml or a stage's tau.yaml, relative to it), `path`, `line`, "
                    "`column`, `message`, `hint`.",
                    413: "The upload declares more than a project zip and its form.",
                    429: "Also: more submissions a minute than allowed with this token or by "
                    "its user (`TAU_SUBMISSIONS_PER_MINUTE`, `…_PER_USER`).",
                },
            ),
        },
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        token = token_of(request)
        try:
            submission.count_submission(
                user_id=signed_in_user(request).pk, token_key=token.key if token else None
            )
        except submission.TooManySubmissions as exc:
            raise exceptions.Throttled(wait=exc.wait, detail=str(exc)) from None
        bundle = request.FILES.get("bundle")
        if bundle is None:
            raise exceptions.ValidationError(
                {"bundle": ["Attach the zipped folder of pipeline.yaml as the form file 'bundle'."]}
            )
        given = request.data.getlist("rerun") if isinstance(request.data, QueryDict) else []
        checked = PipelineResumeSerializer(data={"rerun": given})
        checked.is_valid(raise_exception=True)
        rerun = checked.validated_data.get("rerun", [])
        try:
            pipeline = orchestration.submit_pipeline(
                workspace=self.workspace,
                user=signed_in_user(request),
                bundle=bundle,
                rerun=rerun,
            )
        except orchestration.PipelineRefused as exc:
            return Response(
                {"detail": NOT_SUBMITTED, "problems": [p.to_dict() for p in exc.problems]},
                status=status.HTTP_400_BAD_REQUEST,
            )
        return Response(self._fields(pipeline), status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: PipelineSerializer, **refusals()})
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(self._fields(self.get_object()))

    @extend_schema(
        description="Cancels the pipeline: its running stages are cancelled and no new one "
        "starts; it ends `cancelled` once they have stopped (`cancel_requested` is true "
        "meanwhile). Asking again changes nothing.",
        request=None,
        responses={
            200: PipelineSerializer,
            **refusals(
                409,
                words={
                    403: "Also: only the one who submitted it or a workspace admin cancels it.",
                    409: "Also: it has ended already (`state` says how).",
                },
            ),
        },
    )
    def cancel(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        pipeline = self.get_object()
        if not may_act_on(pipeline, access=self.access, user_id=request.user.pk):
            raise exceptions.PermissionDenied(REFUSAL)
        try:
            orchestration.cancel_pipeline(pipeline=pipeline, user=signed_in_user(request))
        except orchestration.PipelineActionRefused as exc:
            return Response(
                {"detail": str(exc), "state": pipeline.state}, status=status.HTTP_409_CONFLICT
            )
        return Response(self._fields(self.get_queryset().get(pk=pipeline.pk)))

    @extend_schema(
        description="Runs a pipeline that failed, stopped or was cancelled again from where it "
        "ended: each stage that failed or was cancelled has its run resumed (a new attempt of "
        "the same run, from its newest checkpoint), the stages that never started start as "
        "what they need succeeds, and those that succeeded keep their outputs. `rerun` names "
        "stages to run afresh (a new run, never reused), with every stage after them.",
        request=PipelineResumeSerializer,
        responses={
            200: PipelineSerializer,
            **refusals(
                400,
                409,
                words={
                    400: "Also: `rerun` names a stage the pipeline does not have.",
                    403: "Also: only the one who submitted it or a workspace admin resumes it.",
                    409: "Also: it is still running, or it succeeded (`state` says which).",
                },
            ),
        },
    )
    def resume(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        pipeline = self.get_object()
        if not may_act_on(pipeline, access=self.access, user_id=request.user.pk):
            raise exceptions.PermissionDenied(REFUSAL)
        body = PipelineResumeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        rerun = body.validated_data.get("rerun", [])
        names = set(
            PipelineStage.objects.for_workspace(self.workspace)
            .filter(pipeline=pipeline)
            .values_list("name", flat=True)
        )
        unknown = [name for name in rerun if name not in names]
        if unknown:
            raise exceptions.ValidationError(
                {"rerun": [f"{pipeline.name} has no stage {unknown[0]!r}."]}
            )
        try:
            orchestration.resume_pipeline(
                pipeline=pipeline, user=signed_in_user(request), rerun=rerun
            )
        except orchestration.PipelineActionRefused as exc:
            return Response(
                {"detail": str(exc), "state": pipeline.state}, status=status.HTTP_409_CONFLICT
            )
        return Response(self._fields(self.get_queryset().get(pk=pipeline.pk)))


class PipelineEvidenceViewSet(WorkspaceScopedViewSet):
    """A pipeline's record as one file, checked offline with ``tau evidence verify FILE``."""

    content_negotiation_class = FileDownloadNegotiation

    def get_base_queryset(self) -> QuerySet[Any]:
        return Pipeline.objects.all()

    @extend_schema(
        description="The pipeline's record, one tar: `pipeline.json` (its manifest, signed "
        "with the portal's evidence key: the pipeline, how its history ends, each stage with "
        "its state, gate decision, metrics, run or endpoint and every dataset and model "
        "version it read and made by manifest digest, the lineage graph, every member's "
        "SHA-256), `pipeline.sig`, `pipeline.yaml`, `history.jsonl` (its hash-chained "
        "history), then each stage's own record (its run's sealed record, its endpoint's "
        "history). `python -m tau.evidence verify FILE` (or `tau evidence verify FILE`) "
        "checks all of it offline, every stage's record in full.",
        responses={
            (200, "application/x-tar"): OpenApiResponse(
                OpenApiTypes.BINARY, description="`<name>.pipeline.tar`"
            ),
            **refusals(
                409,
                words={
                    409: "Also: the pipeline is still running, or a stage's run record is "
                    "still being sealed (`detail` says which; ask again in a moment)."
                },
            ),
        },
    )
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        name = kwargs["name"]
        pipeline = None if "\x00" in name else self.get_queryset().filter(name=name).first()
        if pipeline is None:
            raise exceptions.NotFound(f"This workspace has no pipeline named {name!r}.")
        try:
            handle = evidence.build_record(pipeline)
        except evidence.NotReady as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        size = os.fstat(handle.fileno()).st_size
        response = FileResponse(handle, content_type="application/x-tar")
        response["Content-Length"] = str(size)
        response["Content-Disposition"] = f'attachment; filename="{evidence.record_name(pipeline)}"'
        response["Cache-Control"] = "no-store"
        return response
