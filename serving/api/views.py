"""REST API for endpoints under ``/api/v1/workspaces/<ws>/endpoints/`` (issue 34).

Members read a workspace's endpoints; researchers deploy them; the one who deployed an
endpoint and the workspace's admins scale, update and delete it. Every route is scoped by
``WorkspaceScopedViewSet`` (an outsider gets 404) and refuses in the API's one shape. The
invoke route is the portal's proxy to a running endpoint: any member may use it, a token only
with the ``endpoints:invoke`` scope.
"""

from __future__ import annotations

import functools
import http.cookiejar
import io
import json
import logging
import threading
from collections.abc import AsyncIterator, Generator, Iterator
from typing import Any

import httpx
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.db import connection
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponseBase, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, status
from rest_framework.parsers import BaseParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer

from identity.models import ApiToken
from identity.tokens import token_of
from portal.api import (
    BoundedJSONParser,
    FileDownloadNegotiation,
    RawBodyMetadata,
    query_text,
    refusals,
)
from portal.requests import signed_in_user
from runs import submission
from runs.api.views import RunCursorPagination
from serving import services
from serving.access import REFUSAL, may_act_on
from serving.api.serializers import (
    DeployFormSerializer,
    DeployJSONSerializer,
    EndpointChangeSerializer,
    EndpointLogSerializer,
    EndpointMetricsSerializer,
    EndpointSerializer,
    endpoint_fields,
)
from serving.backends import REPLICA_NAME, EndpointsUnavailable, backend_for_endpoint
from serving.history import history_export
from serving.models import LIVE_STATES, SERVING_STATES, Endpoint
from workspaces.access import WorkspaceScopedViewSet
from workspaces.models import Role

logger = logging.getLogger(__name__)

NOT_DEPLOYED = "The endpoint was not deployed."
NOT_CHANGED = "The endpoint was not changed."
ACT_REFUSAL = REFUSAL
#: Words for the refusals particular to endpoints.
WORDS_409 = "Also: not possible in the endpoint's present state (`state` says it)."
UNAVAILABLE_409 = (
    "Also: this installation's backend does not run endpoints yet ('endpoints are not "
    "available on the <name> backend of this installation yet'); nothing was created."
)
#: The most a deployment may declare: a whole bundle, a whole spec and their form.
MAX_DEPLOY_BYTES = submission.MAX_SUBMISSION_BYTES


class EndpointCursorPagination(RunCursorPagination):
    """The endpoints list's pages, newest first: ``limit`` (1 to 200) each, ``cursor`` one
    this API gave out (any other is a 404)."""

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["description"] = f"Endpoints per page (default {self.page_size})."
        return parameters


class EndpointScopedViewSet(WorkspaceScopedViewSet):
    """What every endpoints route shares: the workspace's endpoints that are not deleted, and
    the one named in the URL (404 for another workspace's, as for one never made)."""

    base_queryset = Endpoint.objects.all()

    def get_base_queryset(self) -> QuerySet[Any]:
        return (
            Endpoint.objects.filter(deleted_at__isnull=True)
            .select_related("model_version__asset")
            .order_by("-created_at", "-id")
        )

    def get_object(self) -> Endpoint:
        name = self.kwargs["name"]
        endpoint: Endpoint | None = (
            None if "\x00" in name else self.get_queryset().filter(name=name).first()
        )
        if endpoint is None:
            raise exceptions.NotFound(f"This workspace has no endpoint named {name!r}.")
        endpoint.workspace = self.workspace
        return endpoint

    def _fields(self, endpoint: Endpoint) -> dict[str, Any]:
        return dict(
            EndpointSerializer(endpoint_fields(endpoint, workspace_slug=self.workspace.slug)).data
        )


def _state_conflict(endpoint: Endpoint, what: str) -> Response:
    """409: not possible in the endpoint's state, which the answer names."""
    return Response(
        {
            "detail": f"{endpoint.name} is {endpoint.state}: {what}",
            "state": endpoint.state,
        },
        status=status.HTTP_409_CONFLICT,
    )


def _unavailable(exc: EndpointsUnavailable) -> Response:
    return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)


class EndpointViewSet(EndpointScopedViewSet):
    """Endpoints of one workspace: list and deploy; read, change and delete one."""

    pagination_class = EndpointCursorPagination
    parser_classes = [MultiPartParser, BoundedJSONParser]

    def get_serializer_class(self) -> type[BaseSerializer[Any]]:
        # What OPTIONS describes for each write: a deployment by its form (the JSON body is
        # the other way, from a model: the schema says both), a change by its fields.
        return {
            "create": DeployFormSerializer,
            "partial_update": EndpointChangeSerializer,
        }.get(self.action or "", EndpointSerializer)

    def get_parsers(self) -> list[BaseParser]:
        # Only a deployment carries files; a change takes JSON alone.
        if getattr(self, "action_map", {}).get("post") == "create":
            return super().get_parsers()
        return [BoundedJSONParser()]

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        if request.method == "POST":
            # Before anything reads the body (the session's CSRF check reads a form whole).
            try:
                declared = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                declared = 0
            # A form may carry a project zip; JSON carries the tau.yaml alone, and is held to
            # Django's limit for JSON, as the API's other JSON bodies are.
            limit = (
                int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
                if request.content_type.startswith("application/json")
                else MAX_DEPLOY_BYTES
            )
            if declared > limit:
                raise DeploymentTooLarge(declared, limit)
        super().initial(request, *args, **kwargs)

    def _check_may_act(self, endpoint: Endpoint) -> None:
        """Scale, update, delete: the one who deployed it (a researcher still) or an admin."""
        if not may_act_on(endpoint, access=self.access, user_id=self.request.user.pk):
            raise exceptions.PermissionDenied(ACT_REFUSAL)

    @extend_schema(responses={200: EndpointSerializer(many=True), **refusals(400)})
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        page = self.paginate_queryset(self.get_queryset()) or []
        slug = self.workspace.slug
        return self.get_paginated_response(
            EndpointSerializer(
                [endpoint_fields(endpoint, workspace_slug=slug) for endpoint in page], many=True
            ).data
        )

    @extend_schema(
        description="Deploys an endpoint: a tau.yaml with `run.workload_kind: rayservice` and "
        "a `serve` block, as a form (`spec` and an optional project zip `bundle`, as a run is "
        "submitted), or as JSON (`config`, the tau.yaml as text or JSON, and `model`, the "
        "model version to serve instead of its own: a redeploy from a model). It is checked "
        "whole first (the workspace's policy, its model version, the backend), and nothing "
        "is created unless all of it passes.",
        request={
            "multipart/form-data": DeployFormSerializer,
            "application/json": DeployJSONSerializer,
        },
        responses={
            201: EndpointSerializer,
            **refusals(
                400,
                409,
                413,
                words={
                    400: "`problems` lists every problem at once, with its line in tau.yaml "
                    "(a run's tau.yaml: at `run.workload_kind`; a model or version the "
                    "workspace does not have: at `serve.model`, or `model` when the request "
                    "named it).",
                    409: "Also: the workspace has an endpoint of that name. " + UNAVAILABLE_409,
                    413: "The deployment declares more than a bundle, a spec and their form.",
                    429: "Also: more deployments and submissions a minute than allowed with "
                    "this token or by its user (`TAU_SUBMISSIONS_PER_MINUTE`, `…_PER_USER`).",
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
        if request.content_type.startswith("application/json"):
            body = DeployJSONSerializer(data=request.data)
            body.is_valid(raise_exception=True)
            data = body.validated_data
            source = _config_source(data["config"])
            bundle = None
            model = services.ModelChoice(**data["model"]) if "model" in data else None
            name = data.get("name")
        else:
            source = _spec_source(request)
            bundle = request.FILES.get("bundle")
            model = None
            name = _form_text(request, "name")
        try:
            endpoint = services.deploy_endpoint(
                workspace=self.workspace,
                user=signed_in_user(request),
                spec_source=source,
                bundle=bundle,
                model=model,
                name=name,
            )
        except services.EndpointsUnavailable as exc:
            return _unavailable(exc)
        except services.DeployRefused as exc:
            return Response(
                {"detail": NOT_DEPLOYED, "problems": [p.to_dict() for p in exc.problems]},
                status=status.HTTP_400_BAD_REQUEST,
            )
        except services.NameTaken as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        fresh = self.get_queryset().get(pk=endpoint.pk)
        return Response(self._fields(fresh), status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: EndpointSerializer, **refusals()})
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(self._fields(self.get_object()))

    @extend_schema(
        description="Changes an endpoint: `replicas` scales it, `model` serves another model "
        "version, `config` a new tau.yaml; together, one new generation. A running endpoint "
        "rolls it out (`updating`: the generation before answers until the new one is "
        "ready); a stopped or failed one is deployed again.",
        request=EndpointChangeSerializer,
        responses={
            200: EndpointSerializer,
            **refusals(
                400,
                409,
                words={
                    400: "Also: `problems` lists what is wrong with the new model version or "
                    "tau.yaml.",
                    403: "Also: only the one who deployed it or a workspace admin changes it.",
                    409: "Also: it autoscales (its replicas are not set). " + UNAVAILABLE_409,
                },
            ),
        },
    )
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        endpoint = self.get_object()
        self._check_may_act(endpoint)
        body = EndpointChangeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        user = signed_in_user(request)
        try:
            if "model" in data or "config" in data:
                services.update_endpoint(
                    endpoint=endpoint,
                    user=user,
                    model=services.ModelChoice(**data["model"]) if "model" in data else None,
                    spec_source=_config_source(data["config"]) if "config" in data else None,
                    replicas=data.get("replicas"),
                )
            else:
                services.scale_endpoint(endpoint=endpoint, user=user, replicas=data["replicas"])
        except services.EndpointsUnavailable as exc:
            return _unavailable(exc)
        except services.DeployRefused as exc:
            return Response(
                {"detail": NOT_CHANGED, "problems": [p.to_dict() for p in exc.problems]},
                status=status.HTTP_400_BAD_REQUEST,
            )
        except services.EndpointActionRefused as exc:
            return Response(
                {"detail": str(exc), "state": endpoint.state}, status=status.HTTP_409_CONFLICT
            )
        return Response(self._fields(self.get_queryset().get(pk=endpoint.pk)))

    @extend_schema(
        description="Stops the endpoint (its resources freed) and deletes it: its name is "
        "free again; its record and history are kept.",
        request=None,
        responses={
            204: None,
            **refusals(
                words={403: "Also: only the one who deployed it or a workspace admin deletes it."}
            ),
        },
    )
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        endpoint = self.get_object()
        self._check_may_act(endpoint)
        services.delete_endpoint(endpoint=endpoint, user=signed_in_user(request))
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "replica",
                {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$"},
                description="Which replica's log (the answer's `replicas` lists them); "
                "default: the one that says most.",
            ),
            OpenApiParameter(
                "tail",
                {"type": "integer", "minimum": 0},
                description="The last N lines (default 200, at most 10000).",
            ),
            OpenApiParameter(
                "offset",
                {"type": "integer", "minimum": 0},
                description="Bytes from this offset on (to follow it).",
            ),
        ],
        responses={
            200: EndpointLogSerializer,
            **refusals(
                400,
                409,
                502,
                words={
                    409: "Also: nothing of it runs (it is stopped or failed), or its "
                    "backend does not run endpoints. `state` says its state.",
                },
            ),
        },
    )
    def logs(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        endpoint = self.get_object()
        params = request.query_params
        replica = query_text(params, "replica")
        if replica is not None and (len(replica) > 253 or not REPLICA_NAME.fullmatch(replica)):
            raise exceptions.ValidationError({"replica": ["must be one of its replicas' names"]})
        offset = _int_param(params, "offset")
        tail = _int_param(params, "tail")
        if endpoint.state not in LIVE_STATES:
            return _state_conflict(endpoint, "nothing of it runs, so it has no log to read.")
        try:
            piece = backend_for_endpoint(endpoint).read_log(
                endpoint,
                offset=offset,
                tail_lines=min(tail if tail is not None else 200, 10000),
                replica=replica,
            )
        except EndpointsUnavailable as exc:
            return _unavailable(exc)
        except Exception as exc:
            return _backend_silent(endpoint, exc)
        return Response(
            EndpointLogSerializer(
                {
                    "offset": piece.offset,
                    "next_offset": piece.next_offset,
                    "size": piece.size,
                    "text": piece.text,
                    "replica": piece.replica,
                    "replicas": list(piece.replicas),
                    "note": piece.note,
                }
            ).data
        )

    @extend_schema(
        responses={
            200: EndpointMetricsSerializer,
            **refusals(
                409,
                502,
                words={
                    409: "Also: nothing of it runs (it is stopped or failed), or its "
                    "backend does not run endpoints. `state` says its state.",
                },
            ),
        }
    )
    def metrics(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        endpoint = self.get_object()
        if endpoint.state not in LIVE_STATES:
            return _state_conflict(endpoint, "nothing of it runs, so it serves no traffic.")
        try:
            measured = backend_for_endpoint(endpoint).metrics(endpoint)
        except EndpointsUnavailable as exc:
            return _unavailable(exc)
        except Exception as exc:
            return _backend_silent(endpoint, exc)
        return Response(
            EndpointMetricsSerializer(
                {
                    "requests_per_second": measured.requests_per_second,
                    "latency_p50_ms": measured.latency_p50_ms,
                    "latency_p95_ms": measured.latency_p95_ms,
                    "error_rate": measured.error_rate,
                    "replicas_ready": measured.replicas_ready,
                    "replicas_desired": measured.replicas_desired,
                    "gpu_utilization": measured.gpu_utilization,
                    "window_seconds": measured.window_seconds,
                    "note": measured.note,
                }
            ).data
        )


class DeploymentTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE

    def __init__(self, declared: int, limit: int) -> None:
        super().__init__(
            f"The upload is {declared / 2**20:.1f} MiB; a deployment may be at most "
            f"{limit / 2**20:.1f} MiB (as a form: a project zip and a tau.yaml; as JSON: the "
            "tau.yaml). Nothing was read or kept."
        )


def _backend_silent(endpoint: Endpoint, exc: Exception) -> Response:
    logger.warning("the %s backend did not answer for %s: %s", endpoint.backend, endpoint, exc)
    return Response(
        {"detail": f"The {endpoint.backend} backend did not answer about {endpoint.name}: {exc}"},
        status=status.HTTP_502_BAD_GATEWAY,
    )


def _int_param(params: Any, name: str) -> int | None:
    value = query_text(params, name)
    if value is None:
        return None
    if not value.isascii() or not value.isdigit() or len(value) > 18:
        raise exceptions.ValidationError({name: ["must be a whole number, 0 or more"]})
    return int(value)


def _form_text(request: Request, name: str) -> str | None:
    value = request.data.get(name) if hasattr(request.data, "get") else None
    if value is None:
        return None
    if not isinstance(value, str) or "\x00" in value:
        raise exceptions.ValidationError({name: ["must be text"]})
    return value


def _spec_source(request: Request) -> bytes:
    """The tau.yaml of a deployment form: the ``spec`` part, a file or text."""
    spec_file = request.FILES.get("spec")
    too_large = f"tau.yaml is too large ({submission.MAX_SPEC_BYTES // 1024} KiB at most)."
    if spec_file is not None:
        if spec_file.size and spec_file.size > submission.MAX_SPEC_BYTES:
            raise exceptions.ValidationError({"spec": [too_large]})
        source: bytes = spec_file.read()
        return source
    text = request.data.get("spec") if hasattr(request.data, "get") else None
    if not isinstance(text, str) or not text:
        raise exceptions.ValidationError(
            {"spec": ["Attach the tau.yaml as the form field 'spec' (a file or text)."]}
        )
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) > submission.MAX_SPEC_BYTES:
        raise exceptions.ValidationError({"spec": [too_large]})
    return encoded


def _config_source(config: Any) -> bytes:
    """The tau.yaml a JSON body carries: its text, or the JSON document (JSON is YAML)."""
    if isinstance(config, str):
        return config.encode("utf-8", "surrogatepass")
    return json.dumps(config, ensure_ascii=False).encode("utf-8")


class EndpointEvidenceViewSet(EndpointScopedViewSet):
    """An endpoint's history as a file, checked offline with ``tau evidence verify FILE``."""

    content_negotiation_class = FileDownloadNegotiation

    @extend_schema(
        description="The endpoint's sealed history as JSON lines: a header, then every event "
        "with the hash before it and its own (a chain, as a run's history), in the one form "
        "`python -m tau.evidence verify FILE` (or `tau evidence verify FILE`) checks offline: "
        "any changed byte, or an event edited, dropped, inserted or reordered, is found. Not "
        "signed yet (a run's record is).",
        responses={
            (200, "application/x-ndjson"): OpenApiResponse(
                OpenApiTypes.BINARY, description="`<name>.history.jsonl`"
            ),
            **refusals(),
        },
    )
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> StreamingHttpResponse:
        endpoint = self.get_object()
        response = StreamingHttpResponse(
            history_export(endpoint), content_type="application/x-ndjson"
        )
        response["Content-Disposition"] = f'attachment; filename="{endpoint.name}.history.jsonl"'
        response["Cache-Control"] = "no-store"
        response["X-Content-Type-Options"] = "nosniff"
        return response


# --- The proxy -------------------------------------------------------------------------------

#: Headers of the request the endpoint is sent (never the caller's credentials or cookies).
FORWARDED_REQUEST_HEADERS = ("Accept", "Accept-Encoding", "Accept-Language", "X-Request-Id")
#: Headers of the endpoint's answer passed back.
RELAYED_RESPONSE_HEADERS = ("Content-Type", "Content-Encoding", "Cache-Control")

_client: httpx.Client | None = None
_client_lock = threading.Lock()


def _jar_keeping_no_cookies() -> http.cookiejar.CookieJar:
    """A cookie jar that keeps none: the client is shared by every caller, so a cookie an
    endpoint set in one caller's answer would otherwise go with everyone's next request."""
    return http.cookiejar.CookieJar(policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))


def proxy_client() -> httpx.Client:
    """One client per process, so connections to endpoints are kept and reused (the proxy's
    cost per request is what ``make bench`` measures). Never the environment's proxies: the
    address is the endpoint's own. Made on first use, after gunicorn forks (a pool made
    before would share its sockets between workers); its pool is thread-safe, so a worker's
    threads share it, and the lock keeps them from each making one on the first requests."""
    global _client
    if _client is None:
        with _client_lock:
            if _client is None:
                _client = httpx.Client(
                    trust_env=False,
                    follow_redirects=False,
                    limits=httpx.Limits(max_connections=200, max_keepalive_connections=50),
                    cookies=_jar_keeping_no_cookies(),
                )
    return _client


def serving_endpoint(workspace_id: int, name: str) -> Endpoint | None:
    """The workspace's endpoint named ``name`` that is not deleted (at most one: the names
    of those are unique in a workspace), every column and nothing joined: what
    ``EndpointScopedViewSet.get_object`` finds, from one SQL statement written out once per
    process. The proxy asks on every request, and building the ORM's query each time (with
    the model version the other routes show, and their ordering) cost more than the request
    it relays; tests/serving/test_invoke_costs.py holds the two to the same answer."""
    if "\x00" in name:
        return None
    sql = _serving_endpoint_sql(connection.vendor)
    # Scoped by the workspace's id in the statement itself (its first parameter).
    return next(iter(Endpoint.unscoped_objects.raw(sql, [workspace_id, name])), None)


@functools.cache
def _serving_endpoint_sql(vendor: str) -> str:
    quote = connection.ops.quote_name
    meta = Endpoint._meta

    def column(name: str) -> str:
        return quote(str(meta.get_field(name).column))  # type: ignore[union-attr]

    columns = ", ".join(quote(str(field.column)) for field in meta.concrete_fields)
    # Names come from the model's own metadata only; values go as parameters.
    return (
        f"SELECT {columns} FROM {quote(meta.db_table)} "  # noqa: S608
        f"WHERE {column('workspace')} = %s AND {column('name')} = %s "
        f"AND {column('deleted_at')} IS NULL"
    )


class BodyTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"A request to an endpoint may be at most {limit} bytes "
            "(TAU_ENDPOINT_MAX_BODY_BYTES); nothing was sent to it."
        )


INVOKE_PATH = OpenApiParameter(
    "path",
    {"type": "string", "pattern": "^[^\\u0000]*$"},
    OpenApiParameter.PATH,
    description="The path on the endpoint (after its route prefix); may be empty.",
)
INVOKE_ANSWERS: dict[Any, OpenApiResponse] = {
    (200, "*/*"): OpenApiResponse(
        OpenApiTypes.BINARY,
        description="The endpoint's answer, streamed, with its content type.",
    ),
    ("default", "*/*"): OpenApiResponse(
        OpenApiTypes.BINARY,
        description="The endpoint's answer with another status: passed on as the "
        "endpoint gave it (its own refusals and errors are its, not the portal's).",
    ),
}
INVOKE_REFUSALS = {
    403: "Also: a token without the `endpoints:invoke` scope; platform staff who are not members.",
    409: "The endpoint is not `ready` or `updating`; `state` says what it is.",
    502: "The endpoint did not answer (its backend names no address yet, it refused the "
    "connection, or it took longer than `TAU_ENDPOINT_INVOKE_TIMEOUT_SECONDS`).",
}


class EndpointInvokeViewSet(EndpointScopedViewSet):
    """``POST …/endpoints/{name}/invoke/{path}``: the request's body and content type sent on
    to the endpoint's address plus ``path`` (and the query string), and its answer streamed
    back as it comes, its status and content type as it gave them. ``GET`` the same without
    a body (an OpenAI-compatible endpoint's ``GET /v1/models``, a health check): a body sent
    with it is neither read nor passed on.

    Any member of the workspace may invoke (a viewer too: it reads the endpoint, it changes
    nothing of it); a token only with the ``endpoints:invoke`` scope, which a read-only
    token may have. The body is read whole first, at most ``TAU_ENDPOINT_MAX_BODY_BYTES``
    (413 past it, from its declared length before any of it is read); the answer is never
    held whole."""

    token_scope = ApiToken.Scope.ENDPOINTS_INVOKE.value
    # HEAD is not passed on: DRF would answer it with the GET action, sending a GET.
    http_method_names = ["get", "post", "options"]
    content_negotiation_class = FileDownloadNegotiation
    # Its body is the endpoint's to read, not a serializer's: OPTIONS describes no fields.
    metadata_class = RawBodyMetadata  # type: ignore[assignment]  # a class, as DRF's own

    def write_role_for(self, request: Request) -> Role:
        return Role.VIEWER

    def get_object(self) -> Endpoint:
        """As every endpoints route finds it (after the base class has resolved the
        workspace and the caller's role in it), without what only the other routes show."""
        name = self.kwargs["name"]
        endpoint = serving_endpoint(self.workspace.pk, name)
        if endpoint is None:
            raise exceptions.NotFound(f"This workspace has no endpoint named {name!r}.")
        endpoint.workspace = self.workspace
        return endpoint

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        limit = int(settings.TAU_ENDPOINT_MAX_BODY_BYTES)
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        super().initial(request, *args, **kwargs)
        if not self.access.is_member:
            # Platform staff read every workspace; sending its endpoints requests is not reading.
            raise exceptions.PermissionDenied("Only the workspace's members invoke its endpoints.")
        if declared > limit and request.method == "POST":
            raise BodyTooLarge(limit)

    @extend_schema(
        methods=["GET"],
        operation_id="workspaces_endpoints_invoke_retrieve",
        description="The same as `POST` without a body (an OpenAI-compatible endpoint's "
        "`GET /v1/models`, a health check): the query string passed on.",
        parameters=[INVOKE_PATH],
        responses={**INVOKE_ANSWERS, **refusals(400, 409, 502, words=INVOKE_REFUSALS)},
    )
    @extend_schema(
        methods=["POST"],
        operation_id="workspaces_endpoints_invoke_create",
        parameters=[INVOKE_PATH],
        request={"*/*": OpenApiTypes.BINARY},
        responses={
            **INVOKE_ANSWERS,
            **refusals(
                400,
                409,
                413,
                502,
                words={
                    **INVOKE_REFUSALS,
                    413: "Also: the body is larger than `TAU_ENDPOINT_MAX_BODY_BYTES`.",
                },
            ),
        },
    )
    def invoke(self, request: Request, *args: Any, **kwargs: Any) -> HttpResponseBase:
        endpoint = self.get_object()
        path = str(kwargs.get("path") or "")
        if "\x00" in path or any(part in {".", ".."} for part in path.split("/")):
            raise exceptions.ValidationError({"path": ["must not hold '.' or '..' segments"]})
        if endpoint.state not in SERVING_STATES:
            return _state_conflict(endpoint, "it answers no requests now.")
        sends_body = request.method == "POST"
        body = (
            _read_body(request._request, int(settings.TAU_ENDPOINT_MAX_BODY_BYTES))
            if sends_body
            else b""
        )
        services.note_request(endpoint)  # what "idle" is read from (a write a minute at most)
        try:
            address = backend_for_endpoint(endpoint).invoke_address(endpoint)
        except EndpointsUnavailable as exc:
            return _bad_gateway(f"{endpoint.name} cannot be reached: {exc}.")
        except Exception as exc:
            logger.warning(
                "the %s backend gave no address for %s: %s", endpoint.backend, endpoint, exc
            )
            return _bad_gateway(
                f"The {endpoint.backend} backend did not say where {endpoint.name} is."
            )
        if not address:
            return _bad_gateway(f"{endpoint.name} has no address yet; try again in a moment.")
        target = f"{address.rstrip('/')}/{path}"
        query = request._request.META.get("QUERY_STRING", "")
        headers = {
            name: value
            for name in FORWARDED_REQUEST_HEADERS
            if (value := request._request.headers.get(name)) is not None
        }
        if sends_body and request.content_type:
            headers["Content-Type"] = request.content_type
        client = proxy_client()
        try:
            upstream = client.send(
                client.build_request(
                    "POST" if sends_body else "GET",
                    f"{target}?{query}" if query else target,
                    content=body if sends_body else None,
                    headers=headers,
                    timeout=float(settings.TAU_ENDPOINT_INVOKE_TIMEOUT_SECONDS),
                ),
                stream=True,
            )
        except httpx.TimeoutException:
            return _bad_gateway(
                f"{endpoint.name} did not answer within "
                f"{settings.TAU_ENDPOINT_INVOKE_TIMEOUT_SECONDS} s."
            )
        except httpx.HTTPError as exc:
            return _bad_gateway(f"{endpoint.name} did not answer ({type(exc).__name__}).")
        relayed: Iterator[bytes] | AsyncIterator[bytes]
        if isinstance(request._request, ASGIRequest):
            relayed = _async_chunks(upstream)
        else:
            relayed = _chunks(upstream)
        response = StreamingHttpResponse(relayed, status=upstream.status_code)
        for name in RELAYED_RESPONSE_HEADERS:
            if name in upstream.headers:
                response[name] = upstream.headers[name]
        if "Content-Type" not in upstream.headers:
            del response["Content-Type"]
        # Streamed answers (server-sent events, tokens as generated) pass through unbuffered.
        response["X-Accel-Buffering"] = "no"
        response["X-Content-Type-Options"] = "nosniff"
        # The endpoint's own answer, not the portal's refusal (a client tells them apart).
        response[RELAYED_MARK] = endpoint.name
        return response


#: The header on every answer the proxy passes on from an endpoint (its name): what tells an
#: endpoint's own 4xx or 5xx from the portal's refusal (``tau serve invoke`` reads it).
RELAYED_MARK = "X-Tau-Endpoint"


def _bad_gateway(detail: str) -> Response:
    return Response({"detail": detail}, status=status.HTTP_502_BAD_GATEWAY)


def _read_body(request: HttpRequest, limit: int) -> bytes:
    """The request's body, at most ``limit`` bytes (``BodyTooLarge`` past it): read from its
    stream, so that Django's limit for forms and JSON does not apply. A chunked body (no
    length) is read where the server says it ends it (``wsgi.input_terminated``)."""
    meta = request.META
    chunked = "chunked" in str(meta.get("HTTP_TRANSFER_ENCODING", "")).lower()
    source: Any = request
    if chunked and not meta.get("CONTENT_LENGTH") and meta.get("wsgi.input_terminated"):
        source = meta["wsgi.input"]
    buffer = io.BytesIO()
    while True:
        chunk = source.read(min(65536, limit + 1 - buffer.tell()))
        if not chunk:
            break
        buffer.write(chunk)
        if buffer.tell() > limit:
            raise BodyTooLarge(limit)
    return buffer.getvalue()


def _chunks(upstream: httpx.Response) -> Generator[bytes]:
    try:
        yield from upstream.iter_raw()
    except httpx.HTTPError as exc:  # the endpoint went away mid-answer: the answer ends
        logger.warning("an endpoint's answer was cut short: %s", exc)
    finally:
        upstream.close()


async def _async_chunks(upstream: httpx.Response) -> AsyncIterator[bytes]:
    """The same under ASGI (make run's server): each piece read in a worker thread, so the
    event loop is never blocked and the answer is never gathered whole."""
    pieces = _chunks(upstream)

    def step() -> bytes | None:
        return next(pieces, None)

    read = sync_to_async(step, thread_sensitive=False)
    try:
        while (piece := await read()) is not None:
            yield piece
    finally:
        await sync_to_async(upstream.close, thread_sensitive=False)()
