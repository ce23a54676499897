"""What every app's REST API shares: JSON bodies within bounds, and refusals in one shape
(``{"detail": "…"}``, the ``Problem`` component of the OpenAPI schema), 404s included.

DRF's JSONParser reads whatever it is sent: a body nested a thousand levels deep ends in a
RecursionError (a 500), and text no database column can store (NUL, lone surrogates) fails
later, in the database. ``BoundedJSONParser`` is the project's default parser
(``REST_FRAMEWORK["DEFAULT_PARSER_CLASSES"]``), so every API route gets a 400 that says what
is wrong instead. A JSON body larger than Django will read is refused before anything reads
it (``portal.body_limits.JSONBodySizeMiddleware``: DRF reads the whole body before any parser
sees it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import IO, TYPE_CHECKING, Any, cast

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse
from rest_framework import exceptions
from rest_framework.metadata import SimpleMetadata
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import BaseParser, JSONParser
from rest_framework.renderers import BaseRenderer
from rest_framework.request import clone_request

if TYPE_CHECKING:
    from rest_framework.generics import GenericAPIView
    from rest_framework.request import Request
    from rest_framework.response import Response
    from rest_framework.views import APIView

#: JSON bodies nested deeper than this are refused (the API's own shapes need 3 levels).
MAX_JSON_DEPTH = 32


def json_problem(data: Any) -> str | None:
    """What makes a parsed JSON body unusable, looked at without recursion: nesting deeper
    than MAX_JSON_DEPTH, or text no database column can store (NUL, which jsonb refuses, and
    lone surrogates, which ``\\ud800`` escapes can spell and UTF-8 cannot)."""
    pending: list[tuple[Any, int]] = [(data, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, dict | list):
            if depth > MAX_JSON_DEPTH:
                return f"JSON nested deeper than {MAX_JSON_DEPTH} levels is not accepted."
            if isinstance(value, dict):
                pending.extend((key, depth) for key in value)
                pending.extend((item, depth + 1) for item in value.values())
            else:
                pending.extend((item, depth + 1) for item in value)
        elif isinstance(value, str):
            if "\x00" in value:
                return "Text may not contain NUL characters (\\u0000)."
            try:
                value.encode()
            except UnicodeEncodeError:
                return "Text may not contain lone surrogates (\\ud800 to \\udfff)."
    return None


class BoundedJSONParser(JSONParser):
    """JSON bodies within bounds: one nested so deep that the parser gives up, deeper than
    MAX_JSON_DEPTH, or holding text no database can store is a 400 that says which. Every
    operation of the API takes an object, so a body that is not one (``null``, a list, a
    number) is a 400 too, before any view reads fields from it."""

    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise exceptions.ParseError(
                f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels."
            ) from None
        if not isinstance(data, dict):
            raise exceptions.ParseError(
                f"JSON parse error - the body must be a JSON object, not {_json_kind(data)}."
            )
        problem = json_problem(data)
        if problem is not None:
            raise exceptions.ParseError(f"JSON parse error - {problem}")
        return data


class ApiMetadata(SimpleMetadata):
    """What OPTIONS answers on every API route (``REST_FRAMEWORK["DEFAULT_METADATA_CLASS"]``):
    DRF's description, each write (POST, PUT) the caller may make described by the serializer
    the view names for that write's action.

    DRF asks the view with ``view.action`` set to ``"metadata"``, so a view that names its
    serializers by action (``get_serializer_class``) described every write with its default
    one; here the view is asked as for the write itself. A view names a serializer for each of
    its writes, or, where a write's body is no serializer's (a file's bytes, a request passed
    on to an endpoint), answers with :class:`RawBodyMetadata`: DRF's answer for a view that
    names none is a 500 (``tests/test_no_server_errors.py`` asks every route)."""

    def determine_actions(self, request: Request, view: APIView) -> dict[str, Any]:
        actions: dict[str, Any] = {}
        action_map: dict[str, str] = getattr(view, "action_map", {})
        asked_as = getattr(view, "action", None)
        for method in sorted({"PUT", "POST"} & set(view.allowed_methods)):
            view.request = clone_request(request, method)
            if hasattr(view, "action"):
                view.action = action_map.get(method.lower(), asked_as)
            try:
                if _may_write(view, method):
                    serializer = cast("GenericAPIView[Any]", view).get_serializer()
                    actions[method] = self.get_serializer_info(serializer)
            finally:
                view.request = request
                if hasattr(view, "action"):
                    view.action = asked_as
        return actions


def _may_write(view: APIView, method: str) -> bool:
    """What DRF asks before it describes a write: the view's permissions, and for a PUT the
    object it would change."""
    try:
        view.check_permissions(view.request)
        if method == "PUT" and hasattr(view, "get_object"):
            view.get_object()
    except (exceptions.APIException, PermissionDenied, Http404):
        return False
    return True


class RawBodyMetadata(ApiMetadata):
    """OPTIONS for a route whose write takes raw bytes, which no serializer describes (an
    artifact's file, a request passed on to an endpoint): the description without
    ``actions`` (``parses`` names what it reads)."""

    def determine_actions(self, request: Request, view: APIView) -> dict[str, Any]:
        return {}


class FileDownloadNegotiation(BaseContentNegotiation):
    """For routes that answer a file (an export, a bundle, an artifact): the file is sent
    whatever the client's ``Accept`` says (``Accept: application/x-tar`` is a fair thing to
    send for a tar), and what goes wrong is the API's JSON problem. DRF's own negotiation
    would answer 406 to such a client, since JSON is the only renderer."""

    def select_parser(self, request: Request, parsers: Iterable[BaseParser]) -> BaseParser | None:
        return next(iter(parsers), None)

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        renderer = next(iter(renderers))
        return renderer, renderer.media_type


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list"


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """The site's 404 (``handler404``): under ``/api/`` the API's own ``{"detail": "…"}`` as
    JSON, as its schema documents, also for an address no route matches (a workspace slug
    with a character a slug cannot hold); elsewhere the HTML page."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=404)
    return defaults.page_not_found(request, exception)


# --- Refusals: one shape -------------------------------------------------------------------

#: What a refused request whose fields are wrong says in ``detail``.
INVALID_REQUEST = "The request is not valid; nothing was changed."


def query_text(params: Any, name: str) -> str | None:
    """A query parameter as given (its last value), or None when it is not given.

    Given empty (``?month=``) is a 400, never "any" or "the default": a client that sends a
    parameter means a value, and an empty one is a mistake to be told about (the schema says
    so with ``minLength``). So is text with NUL, which no column can be compared with."""
    values = params.getlist(name) if hasattr(params, "getlist") else [params.get(name)]
    if not values or values[-1] is None:
        return None
    value = str(values[-1])
    if not value:
        raise exceptions.ValidationError(
            {name: ["is empty: give a value, or leave the parameter out"]}
        )
    if "\x00" in value:
        raise exceptions.ValidationError({name: ["must not contain NUL characters"]})
    return value


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's answers to its exceptions, every one in the API's one problem shape
    (:data:`PROBLEM_SCHEMA`): a ``detail`` in words always; a 400 about fields keeps the
    field names beside it. (``REST_FRAMEWORK["EXCEPTION_HANDLER"]``.)"""
    # Imported here: rest_framework.views reads REST_FRAMEWORK, which names this module.
    from rest_framework.views import exception_handler as drf_exception_handler

    if isinstance(exc, exceptions.UnsupportedMediaType):
        # Say what to send: a form or multipart body would lose every field that is not
        # plain text (a mapping, a list, null), so the API reads what it documents only.
        view = context.get("view")
        request = context.get("request")
        readable = sorted(
            {parser.media_type for parser in view.get_parsers()} if view is not None else set()
        )
        sent = request.content_type.split(";")[0] if request is not None else "this body"
        exc = exceptions.UnsupportedMediaType(
            sent,
            detail=f"This route reads {' or '.join(readable) or 'no body'}, not {sent}; "
            "nothing was changed.",
        )
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    data = response.data
    if isinstance(data, list):
        data = {"non_field_errors": data}
    if isinstance(data, dict):
        detail = data.get("detail")
        if isinstance(detail, list):
            detail = " ".join(str(message) for message in detail)
        response.data = {
            "detail": str(detail) if detail else INVALID_REQUEST,
            **{key: value for key, value in data.items() if key != "detail"},
        }
    return response


#: A problem of a refused submission, pointed at its place in tau.yaml.
SPEC_PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "One problem of a refused submission, pointed at its place in tau.yaml.",
    "properties": {
        "path": {"type": "string", "description": "e.g. `compute.gpus`, or `bundle`."},
        "line": {"type": "integer", "nullable": True},
        "column": {"type": "integer", "nullable": True},
        "message": {"type": "string"},
        "hint": {"type": "string", "nullable": True},
    },
    "required": ["path", "line", "column", "message", "hint"],
}

#: How the API says no, whatever the status: the ``Problem`` component of the schema.
PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "How the API says no, on every refusal (4xx): `detail` says what went "
    "wrong, in words. A 400 about the request's fields adds each field's name with what is "
    'wrong with it (`{"detail": "…", "role": [""x" is not a valid choice."]}`; '
    "`non_field_errors` for the whole). A refused submission or metrics report adds "
    "`problems`: every problem at once (for a submission, each with its place in tau.yaml).",
    "properties": {
        "detail": {"type": "string", "description": "What went wrong, in words."},
        "problems": {
            "type": "array",
            "items": {
                "oneOf": [
                    {"type": "string"},
                    {"$ref": "#/components/schemas/SpecProblem"},
                ]
            },
            "description": "Every problem at once, where a refusal lists them.",
        },
    },
    "required": ["detail"],
    "additionalProperties": {
        "description": "A field of the request, with what is wrong with it (a list of "
        "messages; for a list or an object, the same per item or key)."
    },
}

PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}


def add_problem_components(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular post-processing hook: the ``Problem`` and ``SpecProblem`` components
    that :func:`refusals` refer to (``SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]``)."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas["Problem"] = PROBLEM_SCHEMA
    schemas["SpecProblem"] = SPEC_PROBLEM_SCHEMA
    return result


#: Text the API reads never holds NUL (no database column stores it): every string a client
#: sends says so in the schema, and the server refuses it (BoundedJSONParser, query_text).
WITHOUT_NUL = "^[^\\u0000]*$"


def describe_refusals(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular post-processing hook: the schema says what the server refuses, so that
    a request valid by the schema is not refused (``SPECTACULAR_SETTINGS``, whose
    ``COMPONENT_SPLIT_REQUEST`` gives the fields that may not be blank ``minLength: 1``):

    * a query parameter given empty is a 400 (:func:`query_text`): ``minLength: 1``;
    * text with NUL is a 400: every string of a request body (and query parameter) without
      a pattern, format or enum of its own gets the pattern :data:`WITHOUT_NUL`;
    * a body of a media type the route does not read is a 415: documented on every
      operation that takes a body (each reads only the media types its schema lists)."""
    schemas = result.get("components", {}).get("schemas", {})
    requested: set[str] = set()
    for item in result.get("paths", {}).values():
        for method, operation in item.items():
            if not isinstance(operation, dict) or method == "parameters":
                continue
            for parameter in operation.get("parameters", []):
                schema = parameter.get("schema", {})
                if parameter.get("in") == "query" and schema.get("type") == "string":
                    schema.setdefault("minLength", 1)
                    _without_nul(schema)
            body = operation.get("requestBody")
            if body is None:
                continue
            for media in body.get("content", {}).values():
                _collect_references(media.get("schema", {}), schemas, requested)
            operation.setdefault("responses", {}).setdefault(
                "415", {"description": REFUSAL_WORDS[415], "content": _problem_content()}
            )
    for name in requested:
        _walk_strings(schemas[name], _without_nul)
    return result


def _problem_content() -> dict[str, Any]:
    return {"application/json": {"schema": PROBLEM_REF}}


def _without_nul(schema: dict[str, Any]) -> None:
    if not ({"pattern", "format", "enum"} & schema.keys()):
        schema["pattern"] = WITHOUT_NUL


def _collect_references(schema: Any, schemas: dict[str, Any], found: set[str]) -> None:
    """The components ``schema`` refers to, transitively."""
    pending = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            reference = node.get("$ref", "")
            name = (
                reference.rpartition("/")[2]
                if reference.startswith("#/components/schemas/")
                else ""
            )
            if name and name not in found and name in schemas:
                found.add(name)
                pending.append(schemas[name])
            pending.extend(value for key, value in node.items() if key != "$ref")
        elif isinstance(node, list):
            pending.extend(node)


def _walk_strings(schema: Any, change: Callable[[dict[str, Any]], None]) -> None:
    """Apply ``change`` to every string schema inside ``schema`` (not through references:
    each component is walked on its own)."""
    pending = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            if node.get("type") == "string":
                change(node)
            pending.extend(value for key, value in node.items() if isinstance(value, dict | list))
        elif isinstance(node, list):
            pending.extend(node)


REFUSAL_WORDS = {
    400: "The request is not valid; nothing was changed.",
    401: "No credentials, or a token that does not verify (unknown, wrong secret, expired, "
    "revoked, inactive user): every such token gets the same answer. `WWW-Authenticate` says "
    "how to authenticate.",
    403: "Authenticated, but not allowed: the role in this workspace is too low, the token is "
    "read-only, or a run token reaches only its own run's reports.",
    404: "No such workspace (one the caller may not see looks the same), or no such object in it.",
    409: "Not possible in the run's present state.",
    411: "The body came without a length this server can read.",
    413: "The body declares more than this route accepts; none of it was read.",
    415: "The body is not of a media type this route reads (the request body says which).",
    429: "Too many failed token checks from this address or for this token key within the "
    "window; `Retry-After` says when to try again. A token that verifies is never refused.",
    502: "A service the answer comes from (a backend, an endpoint) did not answer; the "
    "message says which.",
    503: "A service the portal needs (its data store) did not answer or refused it; the "
    "message says which. Nothing was lost: send the same request again later.",
}


def refusals(
    *codes: int,
    in_workspace: bool = True,
    words: Mapping[int, str] | None = None,
    media_types: tuple[str, ...] = (),
) -> dict[Any, OpenApiResponse]:
    """The refusals an API operation documents, for ``extend_schema(responses=…)``: 401, 403
    and 429 on every route (authentication and permissions run first everywhere), 404 on the
    routes inside a workspace, and ``codes``; every body the one ``Problem`` shape.
    ``words`` adds to a code's description. With ``media_types`` (a route that also answers
    ``text/plain``), each refusal is declared for each of them, as text for ``text/plain``."""
    answers: dict[Any, OpenApiResponse] = {}
    for code in sorted({401, 403, 429, *((404,) if in_workspace else ()), *codes}):
        description = " ".join(filter(None, [REFUSAL_WORDS[code], (words or {}).get(code)]))
        if not media_types:
            answers[code] = OpenApiResponse(response=PROBLEM_REF, description=description)
        for media_type in media_types:
            answers[(code, media_type)] = OpenApiResponse(
                response=OpenApiTypes.STR if media_type == "text/plain" else PROBLEM_REF,
                description=description,
            )
    return answers
