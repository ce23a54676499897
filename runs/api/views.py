"""REST API for runs under ``/api/v1/workspaces/<ws>/runs/``.

People (sessions, user tokens) submit, list, follow, cancel and resume runs. Workloads report
metrics, checkpoints and events with their run token, which reaches nothing else.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from datetime import UTC
from typing import Any

from django.db.models import Prefetch, Q, QuerySet, prefetch_related_objects
from django.http import (
    FileResponse,
    Http404,
    HttpRequest,
    HttpResponseBase,
    StreamingHttpResponse,
)
from django.utils.dateparse import parse_datetime
from django.utils.http import urlencode
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, status
from rest_framework.decorators import action
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.parsers import BaseParser, MultiPartParser
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer

from identity.models import ApiToken
from identity.tokens import token_of
from portal.api import (
    INVALID_REQUEST,
    BoundedJSONParser,
    FileDownloadNegotiation,
    RawBodyMetadata,
    query_text,
    refusals,
)
from portal.rate_limits import window_wait
from portal.requests import signed_in_user
from runs import (
    artifacts,
    bundles,
    checkpoints,
    lifecycle,
    queueing,
    run_tokens,
    selectors,
    state,
    submission,
    trials,
)
from runs import metric_points as metrics
from runs.access import REFUSAL, may_act_on
from runs.api.serializers import (
    SUMMARY_COLUMNS,
    ArtifactSerializer,
    CheckpointSerializer,
    EventSerializer,
    LogChunkSerializer,
    MetricsRecordedSerializer,
    MetricsSerializer,
    ReportCheckpointSerializer,
    ReportDataStagedSerializer,
    ReportEventSerializer,
    ReportMetricsSerializer,
    ReportTrialsSerializer,
    ResumeSerializer,
    RunCreatedSerializer,
    RunDetailSerializer,
    RunSummarySerializer,
    SubmitSerializer,
    TrialsRecordedSerializer,
)
from runs.checkpoint_paths import CheckpointPathRefused
from runs.metric_rules import MAX_KEYS_PER_RUN, MetricRow
from runs.models import Artifact, Checkpoint, Run, RunAttempt, RunEvent, RunState
from runs.selectors import EXPERIMENT_FILTERS
from workspaces.access import WorkspaceScopedViewSet
from workspaces.models import Role

logger = logging.getLogger(__name__)

MAX_METRIC_POINTS = 5000
#: The most points one metrics answer holds, over all its series: with many series, each
#: gets fewer than ``max_points`` (200 series of 1,000 points, the run page's ask, fit).
MAX_METRIC_POINTS_PER_ANSWER = 200_000
#: Events per page of the events route, and the most bytes of events (messages and data)
#: one page carries: a page ends early, with a ``Link`` to the next, when it would exceed it.
MAX_EVENTS_PER_PAGE = 1000
MAX_EVENT_PAGE_BYTES = 1024 * 1024
#: Reports (metrics, checkpoints and events together) one run token may send per minute.
#: Rows go in batches (up to 5,000 per metrics report), so this is plenty for any workload.
REPORTS_PER_MINUTE = 120
REPORTS_429 = (
    f"Also: more than {REPORTS_PER_MINUTE} reports a minute with this run token "
    "(`Retry-After` says when the next is taken)."
)


#: A pod's name (a DNS-1123 subdomain).
_POD_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


class RunCursorPagination(CursorPagination):
    """The runs list's pages: ``limit`` (1 to 200) runs each, ``cursor`` one this API gave
    out in ``next``/``previous``. A ``limit`` that is not such a number is a 400; a cursor
    this API did not give out names no page: a 404, as DRF answers an invalid cursor."""

    ordering = ("-created_at", "-id")
    page_size = 50
    max_page_size = 200
    page_size_query_param = "limit"
    invalid_cursor_message = "Not a cursor this API gave out; start again from the first page."

    def get_page_size(self, request: Request) -> int:
        given = request.query_params.getlist(self.page_size_query_param)
        if not given:
            return self.page_size
        try:
            size = int(given[-1])
        except ValueError:
            size = 0
        if len(given) > 1 or not 1 <= size <= self.max_page_size:
            raise exceptions.ValidationError(
                {"limit": [f"must be one whole number from 1 to {self.max_page_size}"]}
            )
        return size

    def decode_cursor(self, request: Request) -> Cursor | None:
        """The cursor, or a 404 when it is not one this API gave out: DRF checks how it is
        encoded, not that its position is a time, and the database would be asked with it."""
        refused = exceptions.NotFound(self.invalid_cursor_message)
        query_text(request.query_params, self.cursor_query_param)  # given empty: a 400
        cursor = super().decode_cursor(request)
        if cursor is not None and cursor.position is not None:
            try:
                position = parse_datetime(str(cursor.position))
                if position is None or position.tzinfo is None:
                    raise refused
                position.astimezone(UTC)  # a time a database can hold
            except (ValueError, OverflowError):
                raise refused from None
        return cursor

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        return [
            {
                "name": self.cursor_query_param,
                "required": False,
                "in": "query",
                "description": "Where to continue: the `cursor` of a `next` or `previous` "
                "link of an earlier page (any other value is a 404).",
                "schema": {"type": "string"},
            },
            {
                "name": self.page_size_query_param,
                "required": False,
                "in": "query",
                "description": f"Runs per page (default {self.page_size}).",
                "schema": {"type": "integer", "minimum": 1, "maximum": self.max_page_size},
            },
        ]


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
                if key == "detail" and value == INVALID_REQUEST and len(data) > 1:
                    continue  # the fields at fault say it better
                said = "; ".join(str(v) for v in value) if isinstance(value, list) else str(value)
                lines.append(said if key == "detail" else f"{key}: {said}")
            return ("\n".join(lines) + "\n").encode()
        return f"{data}\n".encode()


class RunViewSet(WorkspaceScopedViewSet):
    """Runs of one workspace. ``{run_name}`` is a run's full name, or a spec name meaning the
    newest run of that spec."""

    serializer_class = RunSummarySerializer
    pagination_class = RunCursorPagination
    base_queryset = Run.objects.all()
    lookup_url_kwarg = "run_name"
    parser_classes = [MultiPartParser, BoundedJSONParser]

    def get_renderers(self) -> list[BaseRenderer]:
        # urls.py writes the routes out instead of using a router, so an @action's own
        # renderer_classes (the logs' text/plain) are applied here.
        handler = getattr(self, self.action, None) if getattr(self, "action", None) else None
        classes = getattr(handler, "kwargs", {}).get("renderer_classes")
        return [renderer() for renderer in classes] if classes else super().get_renderers()

    def get_parsers(self) -> list[BaseParser]:
        # Only a submission carries files; every other route takes JSON alone, so that a form
        # it could not read whole is a 415, not a change with something left out.
        # (Asked before DRF sets self.action; the list route maps POST to create.)
        if getattr(self, "action_map", {}).get("post") == "create":
            return super().get_parsers()
        return [BoundedJSONParser()]

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
        if name := _text_param(params, "name"):
            runs = runs.filter(Q(spec_name=name) | Q(name=name))
        if submitter := _text_param(params, "submitter"):
            runs = runs.filter(submitted_by_username=submitter)
        for name, column in EXPERIMENT_FILTERS.items():
            if value := _text_param(params, name):
                runs = runs.filter(**{column: value})
        return runs

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "state",
                str,
                many=True,
                enum=RunState.values,
                description="Only runs in these states.",
            ),
            OpenApiParameter("name", str, description="A spec name or run name."),
            OpenApiParameter("submitter", str, description="Username of who submitted."),
            OpenApiParameter("project", str, description="Only runs of this experiment.project."),
            OpenApiParameter("experiment", str, description="Only runs of this experiment.name."),
            OpenApiParameter("group", str, description="Only runs of this experiment.group."),
        ],
        responses={200: RunSummarySerializer(many=True), **refusals(400)},
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        # Rows of the summary's columns, not runs: no spec read, no model built per row.
        page = self.paginate_queryset(self._filtered().values(*SUMMARY_COLUMNS)) or []
        # A queued run's position is its backend's (Kueue's: one call for the page, at most).
        queueing.apply_to_rows(page, queueing.read_positions(self.workspace, page))
        summaries = RunSummarySerializer(page, many=True, context={"workspace": self.workspace})
        return self.get_paginated_response(summaries.data)

    @extend_schema(
        # Files only: a JSON body cannot carry them.
        request={"multipart/form-data": SubmitSerializer},
        responses={
            201: RunCreatedSerializer,
            **refusals(
                400,
                413,
                words={
                    400: "`problems` lists every problem at once, with its line in tau.yaml.",
                    413: "The submission declares more than a bundle, a spec and their form.",
                    429: "Also: more submissions a minute than allowed with this token or by "
                    "its user (`TAU_SUBMISSIONS_PER_MINUTE`, `…_PER_USER`); nothing was read.",
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
        spec_source = _spec_source(request)
        try:
            run = submission.submit(
                workspace=self.workspace,
                user=signed_in_user(request),
                spec_source=spec_source,
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
        # The run as just written, in the detail's shape: the run, its bundle and its
        # workspace are in memory; its attempts are read only if submission wrote any.
        prefetch_related_objects([run], self._attempts(new=True))
        return Response(RunCreatedSerializer(run).data, status=status.HTTP_201_CREATED)

    def _attempts(self, *, new: bool = False) -> Prefetch[Any]:
        """A run's attempts with the checkpoints they resume from; for a ``new`` run, the one
        attempt submission wrote, read alone (the first attempt resumes from nothing)."""
        attempts = RunAttempt.objects.for_workspace(self.workspace).order_by("number")
        if not new:
            attempts = attempts.select_related("resume_from")
        return Prefetch("attempts", queryset=attempts)

    def _detail(self, run: Run) -> dict[str, Any]:
        fresh = (
            Run.objects.for_workspace(self.workspace)
            .select_related("workspace", "bundle")
            .prefetch_related(self._attempts())
            .get(pk=run.pk)
        )
        queueing.apply_positions([fresh], queueing.read_positions(self.workspace, [fresh]))
        return dict(RunDetailSerializer(fresh).data)

    @extend_schema(responses={200: RunDetailSerializer, **refusals()})
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(self._detail(self.get_object()))

    def _check_owner_or_admin(self, run: Run) -> None:
        if not may_act_on(run, access=self.access, user_id=self.request.user.pk):
            raise exceptions.PermissionDenied(REFUSAL)

    @extend_schema(request=None, responses={200: RunDetailSerializer, **refusals(409)})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        run = self.get_object()
        self._check_owner_or_admin(run)
        try:
            lifecycle.cancel_run(run=run, user=signed_in_user(request))
        except state.RunActionRefused as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(self._detail(run))

    @extend_schema(
        request={"application/json": ResumeSerializer},
        responses={
            200: RunDetailSerializer,
            **refusals(400, 409, 413, 415, words={404: "Also: the run has no such checkpoint."}),
        },
    )
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
                raise exceptions.NotFound("No such checkpoint of this run.")
        try:
            lifecycle.resume_run(run=run, user=signed_in_user(request), checkpoint=checkpoint)
        except state.RunActionRefused as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(self._detail(run))

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "after",
                {"type": "integer", "minimum": 0},
                description="Only events after this `seq` (default: from the first).",
            ),
            OpenApiParameter(
                "limit",
                {"type": "integer", "minimum": 1},
                description=f"The most events to return (1 to {MAX_EVENTS_PER_PAGE}, the "
                "default). A page also ends before it would carry more than "
                f"{MAX_EVENT_PAGE_BYTES // 1024} KiB of messages and data.",
            ),
            OpenApiParameter(
                "Link",
                str,
                OpenApiParameter.HEADER,
                response=[200],
                description='`<…/events/?after=N&limit=M>; rel="next"` when more events may '
                "follow this page. The body is a plain list in `seq` order either way: to "
                "page, ask again with `after` set to the last `seq` received, until a page "
                "comes back empty (or without this header).",
            ),
        ],
        responses={200: EventSerializer(many=True), **refusals(400)},
    )
    @action(detail=True, methods=["get"])
    def events(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        run = self.get_object()
        params = request.query_params
        after = _int_param(params, "after") or 0
        limit = _int_param(params, "limit")
        if limit == 0:
            raise exceptions.ValidationError({"limit": ["must be at least 1"]})
        limit = min(limit or MAX_EVENTS_PER_PAGE, MAX_EVENTS_PER_PAGE)
        events = (
            RunEvent.objects.for_workspace(self.workspace)
            .filter(run=run, seq__gt=after)
            .order_by("seq")
        )
        page: list[RunEvent] = []
        size = 0
        more = False
        # Read in small chunks and stop at the byte budget: a page never holds (or loads)
        # a thousand of the largest events.
        for event in events[: limit + 1].iterator(chunk_size=50):
            if len(page) == limit:
                more = True
                break
            weight = len(event.message) + len(json.dumps(event.data))
            if page and size + weight > MAX_EVENT_PAGE_BYTES:
                more = True
                break
            page.append(event)
            size += weight
        response = Response(EventSerializer(page, many=True).data)
        if more:
            following = (
                request.build_absolute_uri(request.path)
                + "?"
                + urlencode({"after": page[-1].seq, "limit": limit})
            )
            response["Link"] = f'<{following}>; rel="next"'
        return response

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "attempt",
                {"type": "integer", "minimum": 0},
                description="Attempt number; default the newest.",
            ),
            OpenApiParameter(
                "pod",
                {"type": "string", "pattern": f"^{_POD_NAME.pattern}$"},
                description="Which of the attempt's pods (on Kubernetes) or worker processes "
                "(a multi-worker run on the local executor: `worker-0`, `worker-1`, …) the log "
                "is of; the answer's `pods` lists them. Default: a RayJob's driver log (its "
                "submitter pod), a Job's first worker.",
            ),
            OpenApiParameter(
                "tail",
                {"type": "integer", "minimum": 0},
                description="JSON: the last N lines (default 200, at most 10000).",
            ),
            OpenApiParameter(
                "offset",
                {"type": "integer", "minimum": 0},
                description="JSON: bytes from this offset on.",
            ),
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
            **refusals(
                400,
                media_types=("application/json", "text/plain"),
                words={404: "Also: the run has no such attempt."},
            ),
        },
    )
    @action(detail=True, methods=["get"], renderer_classes=[JSONRenderer, PlainTextRenderer])
    def logs(self, request: Request, *args: Any, **kwargs: Any) -> HttpResponseBase:
        run = self.get_object()
        params = request.query_params
        query_text(params, "format")  # DRF reads it (json or text); given empty: a 400
        attempt_number = _int_param(params, "attempt")
        pod = _pod_param(params)
        if request.accepted_renderer.format == PlainTextRenderer.format:
            return _whole_log_response(run, attempt_number, pod)
        chunk = selectors.read_log(
            run,
            attempt_number=attempt_number,
            offset=_int_param(params, "offset"),
            tail_lines=min(_int_param(params, "tail") or 200, 10000),
            pod=pod,
        )
        return Response(
            {
                "attempt": chunk.attempt,
                "offset": chunk.offset,
                "next_offset": chunk.next_offset,
                "size": chunk.size,
                "complete": chunk.complete,
                "text": chunk.text,
                "pod": chunk.pod,
                "pods": list(chunk.pods),
                "note": chunk.note,
            }
        )

    @extend_schema(
        parameters=[
            OpenApiParameter("keys", str, description="Comma-separated metric names; default all."),
            OpenApiParameter(
                "max_points",
                {"type": "integer", "minimum": 1},
                description="The most points per series (1 to 5000, default 1000). A longer "
                "series keeps its first and last point and the lowest and highest point of "
                "equal step ranges between them. One answer holds at most "
                f"{MAX_METRIC_POINTS_PER_ANSWER:,} points: with many series, each gets "
                "fewer. A run has at most "
                f"{MAX_KEYS_PER_RUN} metric names (`keys` lists them).",
            ),
        ],
        responses={200: MetricsSerializer, **refusals(400)},
    )
    @action(detail=True, methods=["get"])
    def metrics(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        run = self.get_object()
        available = selectors.metric_keys(run)
        wanted = [key for key in _text_param(request.query_params, "keys").split(",") if key]
        keys = [key for key in wanted if key in available] if wanted else available
        asked = _int_param(request.query_params, "max_points")
        if asked == 0:
            raise exceptions.ValidationError({"max_points": ["must be at least 1"]})
        max_points = min(
            asked or 1000,
            MAX_METRIC_POINTS,
            max(1, MAX_METRIC_POINTS_PER_ANSWER // max(1, len(keys))),
        )
        return Response(
            {"keys": available, "series": selectors.metric_series(run, keys, max_points=max_points)}
        )

    @extend_schema(responses={200: CheckpointSerializer(many=True), **refusals()})
    @action(detail=True, methods=["get"])
    def checkpoints(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        run = self.get_object()
        rows = (
            Checkpoint.objects.for_workspace(self.workspace).filter(run=run).order_by("-step")[:500]
        )
        return Response(CheckpointSerializer(rows, many=True).data)


SPEC_TOO_LARGE = f"tau.yaml is too large ({submission.MAX_SPEC_BYTES // 1024} KiB at most)."


def _spec_source(request: Request) -> bytes:
    """The tau.yaml of a submission: the ``spec`` part of the form, a file (``curl -F
    spec=@tau.yaml``) or text (``curl -F spec=<tau.yaml``)."""
    spec_file = request.FILES.get("spec")
    if spec_file is not None:
        if spec_file.size and spec_file.size > submission.MAX_SPEC_BYTES:
            raise exceptions.ValidationError({"spec": [SPEC_TOO_LARGE]})
        source: bytes = spec_file.read()
        return source
    text = request.data.get("spec") if hasattr(request.data, "get") else None
    if not isinstance(text, str) or not text:
        raise exceptions.ValidationError(
            {"spec": ["Attach the tau.yaml as the form field 'spec' (a file or text)."]}
        )
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) > submission.MAX_SPEC_BYTES:
        raise exceptions.ValidationError({"spec": [SPEC_TOO_LARGE]})
    return encoded


def _text_param(params: Any, name: str) -> str:
    """The parameter's text, "" when it is not given (given empty, or with NUL: a 400)."""
    return query_text(params, name) or ""


def _pod_param(params: Any) -> str | None:
    value = _text_param(params, "pod")
    if not value:
        return None
    if not _POD_NAME.fullmatch(value):
        raise exceptions.ValidationError({"pod": ["must be a pod's name"]})
    return value


def _int_param(params: Any, name: str) -> int | None:
    value = query_text(params, name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise exceptions.ValidationError({name: ["must be a whole number"]}) from None
    if number < 0:
        raise exceptions.ValidationError({name: ["must not be negative"]})
    return number


def _whole_log_response(
    run: Run, attempt_number: int | None, pod: str | None = None
) -> StreamingHttpResponse:
    """The attempt's whole log as a plain-text download, streamed (logs reach 50 MiB)."""
    log = selectors.open_whole_log(run, attempt_number=attempt_number, pod=pod)  # Http404
    name = f"{run.name}-attempt-{log.attempt}.log" if log.attempt else f"{run.name}.log"
    if pod:
        name = f"{pod}.log"
    response = StreamingHttpResponse(log, content_type="text/plain; charset=utf-8")
    response["Content-Length"] = str(log.size)
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    response["X-Content-Type-Options"] = "nosniff"
    response["Cache-Control"] = "no-store"
    return response


def _report_wait(token: ApiToken) -> int | None:
    """Seconds until the run token may report again, or None when it may now: at most
    REPORTS_PER_MINUTE reports per token in each minute, counted in the shared cache."""
    return window_wait(f"runreports:{token.key}", REPORTS_PER_MINUTE, 60)


#: The body of each report (``RunReportViewSet``'s actions), what OPTIONS describes.
REPORT_BODIES: dict[str, type[BaseSerializer[Any]]] = {
    "metrics": ReportMetricsSerializer,
    "checkpoint": ReportCheckpointSerializer,
    "trials": ReportTrialsSerializer,
    "event": ReportEventSerializer,
    "data_staged": ReportDataStagedSerializer,
}


class RunReportViewSet(WorkspaceScopedViewSet):
    """What a running workload reports, authenticated by its run token (and nothing else).

    Every report is bounded: REPORTS_PER_MINUTE per token (429 with ``Retry-After``), JSON
    bodies by BoundedJSONParser, metric points by ``runs.metric_points`` (the rules the metrics
    file follows too), events by size and depth, checkpoints to the run's own folder
    (``runs.checkpoints``). What is reported is kept for the attempt that holds the token."""

    accepts_run_tokens = True
    base_queryset = Run.objects.all()
    parser_classes = [BoundedJSONParser]

    def get_serializer_class(self) -> type[BaseSerializer[Any]]:
        # What OPTIONS describes to the run's token: each report's body.
        return REPORT_BODIES[self.action or ""]

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        token = token_of(request)
        if token is None or token.kind != ApiToken.Kind.RUN:
            raise exceptions.PermissionDenied("Only a run's own token can report on it.")
        name = kwargs["run_name"]
        # The attempt that holds this token, of the run named: a token reaches its own run.
        attempt = (
            None
            if "\x00" in name
            else RunAttempt.objects.for_workspace(self.workspace)
            .select_related("run", "run__workspace")
            .filter(token=token, run__name=name)
            .first()
        )
        if attempt is None:
            raise exceptions.NotFound("No such run.")
        wait = _report_wait(token)
        if wait is not None:
            raise exceptions.Throttled(
                wait=wait,
                detail=f"A run may report at most {REPORTS_PER_MINUTE} times a minute; send "
                "metric rows in batches.",
            )
        self.run = attempt.run
        self.attempt_number = attempt.number

    def write_role_for(self, request: Request) -> Role:
        # The run token is the authority here: a workload keeps reporting even if its
        # submitter's role changed while it ran (removal from the workspace still stops it).
        return Role.VIEWER

    @extend_schema(
        request=ReportMetricsSerializer,
        responses={
            202: MetricsRecordedSerializer,
            **refusals(
                400,
                413,
                words={400: "`problems` says what is wrong, row by row.", 429: REPORTS_429},
            ),
        },
    )
    def metrics(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = ReportMetricsSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        rows = [
            MetricRow(
                step=row.get("step"),
                values=[(key, value) for key, value in row.items() if key not in {"step", "time"}],
                where=f"row {index}",
            )
            for index, row in enumerate(payload.validated_data["rows"])
        ]
        try:
            recorded = metrics.record_metrics(
                run=self.run, attempt=self.attempt_number, rows=rows, all_or_nothing=True
            )
        except metrics.MetricsRefused as exc:
            return Response(
                {"detail": "Nothing was recorded.", "problems": exc.problems}, status=400
            )
        return Response({"recorded": recorded.recorded}, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        request=ReportCheckpointSerializer,
        responses={201: CheckpointSerializer, **refusals(400, 413, words={429: REPORTS_429})},
    )
    def checkpoint(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = ReportCheckpointSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        try:
            checkpoint = checkpoints.record_checkpoint(
                run=self.run,
                attempt=self.attempt_number,
                report=checkpoints.CheckpointReport(
                    step=data["step"],
                    path=data["path"],
                    complete=data["complete"],
                    size=data.get("size"),
                ),
            )
        except CheckpointPathRefused as exc:
            raise exceptions.ValidationError({"path": [str(exc)]}) from None
        return Response(CheckpointSerializer(checkpoint).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request=ReportTrialsSerializer,
        responses={
            202: TrialsRecordedSerializer,
            **refusals(400, 413, words={429: REPORTS_429}),
        },
    )
    def trials(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """A sweep's trials: their values, states and exit codes, kept for the attempt."""
        payload = ReportTrialsSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        records = trials.records_from_reports(payload.validated_data["trials"])
        changed = trials.record_trials(run=self.run, attempt=self.attempt_number, records=records)
        return Response({"recorded": changed}, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        request=ReportEventSerializer,
        responses={201: EventSerializer, **refusals(400, 413, words={429: REPORTS_429})},
    )
    def event(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = ReportEventSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        event = state.record_workload_event(
            self.run, data["kind"], message=data["message"], data=data.get("data") or {}
        )
        return Response(EventSerializer(event).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request=ReportDataStagedSerializer,
        responses={201: EventSerializer, **refusals(400, 413, words={429: REPORTS_429})},
    )
    def data_staged(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """The attempt's ``inputs.datasets`` are in place: how many files and bytes, how long
        it took (a cluster's stager says so; the run page shows it)."""
        payload = ReportDataStagedSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        event = state.record_data_staged(
            self.run, attempt=self.attempt_number, **payload.validated_data
        )
        return Response(EventSerializer(event).data, status=status.HTTP_201_CREATED)


class RunBundleViewSet(WorkspaceScopedViewSet):
    """The run's code bundle: for its own workload (run token) and for workspace members."""

    accepts_run_tokens = True
    base_queryset = Run.objects.all()
    content_negotiation_class = FileDownloadNegotiation

    @extend_schema(
        responses={
            (200, "application/zip"): OpenApiResponse(
                OpenApiTypes.BINARY,
                description="The zip as submitted; `X-Content-SHA256` is its SHA-256.",
            ),
            **refusals(words={404: "Also: the run has no code bundle."}),
        }
    )
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> FileResponse:
        token = token_of(request)
        name = kwargs["run_name"]
        run = (
            None
            if "\x00" in name
            else Run.objects.for_workspace(self.workspace)
            .select_related("bundle")
            .filter(name=name)
            .first()
        )
        if run is None or (
            token is not None
            and token.kind == ApiToken.Kind.RUN
            and run_tokens.run_id_of(token) != run.pk
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


class ArtifactBodyParser(BaseParser):
    """An artifact upload's body: the file's bytes as they are. Declared so that the route
    takes ``application/octet-stream``; the view reads the request's stream itself, in
    chunks, so no upload is ever held in memory whole."""

    media_type = "application/octet-stream"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        return stream


CHUNKED_UNREADABLE = (
    "The body was sent in chunks (Transfer-Encoding: chunked), which this web server does not "
    "pass on; send the file with a Content-Length. Nothing was kept."
)


def _upload_body(request: HttpRequest) -> artifacts.Readable | None:
    """Where an upload's bytes are read from; None when they cannot be read at all.

    Django reads a WSGI request's body only as far as its ``Content-Length``: a chunked
    upload has none, so it read nothing and an empty file was kept (answered 201). gunicorn
    and every server that decodes chunks itself say so (``wsgi.input_terminated``): their
    input ends where the body ends, and is read directly. Under ASGI the server has decoded
    the body into the request's own stream. Any other WSGI server: no body can be read."""
    meta = request.META
    chunked = "chunked" in str(meta.get("HTTP_TRANSFER_ENCODING", "")).lower()
    if not chunked or meta.get("CONTENT_LENGTH") or "wsgi.input" not in meta:
        return request
    if meta.get("wsgi.input_terminated"):
        source: artifacts.Readable = meta["wsgi.input"]
        return source
    return None


class RunArtifactUploadViewSet(RunReportViewSet):
    """A workload saves an artifact with its run token (``tau.save_artifact``): the body is
    the file, ``?path=`` its name under the run's output folder. The run token reaches its
    own run only; the name must match the run's ``outputs.artifacts`` and the file fit the
    artifact limits (``runs.artifacts``)."""

    parser_classes = [ArtifactBodyParser]
    # The body is the file's bytes: OPTIONS describes no fields (``parses`` says what it takes).
    metadata_class = RawBodyMetadata  # type: ignore[assignment]  # a class, as DRF's own

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "path",
                str,
                required=True,
                description="The file's path relative to the run's output folder "
                "(`TAU_OUTPUT_DIR`); it must match one of the run's `outputs.artifacts`.",
            )
        ],
        request={"application/octet-stream": OpenApiTypes.BINARY},
        responses={
            201: ArtifactSerializer,
            **refusals(
                400,
                411,
                413,
                words={
                    400: "Also: the path is not acceptable or matches no declared pattern.",
                    411: CHUNKED_UNREADABLE,
                    413: "Also: the file would pass the run's or the workspace's artifact "
                    "limit; nothing was kept and the run's history says so.",
                    429: REPORTS_429,
                },
            ),
        },
    )
    def upload(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        name = request.query_params.get("path", "")
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0) or None
        except ValueError:
            declared = None
        body = _upload_body(request._request)
        if body is None:
            return Response({"detail": CHUNKED_UNREADABLE}, status=411)
        try:
            artifact = artifacts.store_artifact(
                run=self.run,
                attempt=self.attempt_number,
                name=name,
                source=body,  # read in chunks
                declared_size=declared,
            )
        except artifacts.ArtifactRefused as exc:
            if exc.too_large:
                return Response({"detail": str(exc)}, status=413)
            raise exceptions.ValidationError({"path": [str(exc)]}) from None
        return Response(
            ArtifactSerializer(artifact, context={"run": self.run}).data,
            status=status.HTTP_201_CREATED,
        )


class RunArtifactViewSet(WorkspaceScopedViewSet):
    """A run's kept artifacts, for the workspace's members: the list, and each file."""

    base_queryset = Artifact.objects.all()
    content_negotiation_class = FileDownloadNegotiation

    def _run(self) -> Run:
        try:
            return selectors.resolve_run(self.workspace, self.kwargs["run_name"])
        except Http404 as exc:
            raise exceptions.NotFound(str(exc)) from None

    @extend_schema(responses={200: ArtifactSerializer(many=True), **refusals()})
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        run = self._run()
        rows = self.get_queryset().filter(run=run).order_by("path")
        return Response(ArtifactSerializer(rows, many=True, context={"run": run}).data)

    @extend_schema(
        responses={
            (200, "application/octet-stream"): OpenApiResponse(
                OpenApiTypes.BINARY,
                description="The file as kept; `X-Content-SHA256` is its SHA-256.",
            ),
            **refusals(words={404: "Also: the run kept no artifact of that path."}),
        }
    )
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> FileResponse:
        run = self._run()
        path = kwargs["artifact_path"]
        artifact = (
            None if "\x00" in path else self.get_queryset().filter(run=run, path=path).first()
        )
        if artifact is None:
            raise exceptions.NotFound("This run kept no such artifact.")
        try:
            handle = artifacts.open_artifact(artifact)
        except FileNotFoundError:
            logger.error("artifact %s of %s is missing from the store", artifact.path, run.name)
            raise exceptions.NotFound("This artifact's file is missing.") from None
        # Always a download of bytes: an HTML artifact must not run as this site's page.
        response = FileResponse(
            handle,
            content_type="application/octet-stream",
            as_attachment=True,
            filename=artifact.path.rsplit("/", 1)[-1],
        )
        response["X-Content-SHA256"] = artifact.sha256
        return response
