"""What every app's REST API shares: JSON bodies within bounds, and how refusals are
described in the OpenAPI schema.

DRF's JSONParser reads whatever it is sent: a body nested a thousand levels deep ends in a
RecursionError (a 500), and text no database column can store (NUL, lone surrogates) fails
later, in the database. ``BoundedJSONParser`` is the project's default parser
(``REST_FRAMEWORK["DEFAULT_PARSER_CLASSES"]``), so every API route gets a 400 that says what
is wrong instead. A JSON body larger than Django will read is refused before anything reads
it (``JSONBodySizeMiddleware``: DRF reads the whole body before any parser sees it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import IO, Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse
from rest_framework import exceptions, serializers
from rest_framework.parsers import JSONParser

#: JSON bodies nested deeper than this are refused (the API's own shapes need 3 levels).
MAX_JSON_DEPTH = 32


class JSONBodySizeMiddleware:
    """A JSON body declaring more than ``DATA_UPLOAD_MAX_MEMORY_SIZE`` gets a 413 that says
    so, unread (Django would refuse it once read, as a bare 400). Multipart bodies are sized
    by ``runs.submission.SubmissionSizeMiddleware``."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is not None and request.content_type == "application/json":
            try:
                declared = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                declared = 0
            if declared > limit:
                return JsonResponse(
                    {
                        "detail": f"The body is {declared} bytes; a JSON body may be at most "
                        f"{limit} bytes."
                    },
                    status=413,
                )
        return self.get_response(request)


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
    MAX_JSON_DEPTH, or holding text no database can store is a 400 that says which."""

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
        problem = json_problem(data)
        if problem is not None:
            raise exceptions.ParseError(f"JSON parse error - {problem}")
        return data


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """The site's 404 (``handler404``): under ``/api/`` the API's own ``{"detail": "…"}`` as
    JSON, as its schema documents, also for an address no route matches (a workspace slug
    with a character a slug cannot hold); elsewhere the HTML page."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=404)
    return defaults.page_not_found(request, exception)


# --- The schema ------------------------------------------------------------------------------


class ErrorSerializer(serializers.Serializer[Any]):
    """How the API says no: ``{"detail": "…"}`` (DRF's answer for 401, 403, 404, 405, 409,
    413, 415 and 429)."""

    detail = serializers.CharField(read_only=True, help_text="What went wrong, in words.")


#: DRF's answer to input it refuses: field names (``non_field_errors`` for the whole, or
#: ``detail`` for a body that is not JSON at all) mapped to what is wrong with them.
FIELD_ERRORS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": {},
    "description": 'Field names mapped to what is wrong with them, e.g. `{"role": [""x" is '
    'not a valid choice."]}`; `{"detail": "…"}` for a body that is not JSON.',
}

REFUSAL_WORDS = {
    400: "The request is not valid; nothing was changed.",
    401: "No credentials, or a token that does not verify (unknown, wrong secret, expired, "
    "revoked, inactive user): every such token gets the same answer. `WWW-Authenticate` says "
    "how to authenticate.",
    403: "Authenticated, but not allowed: the role in this workspace is too low, the token is "
    "read-only, or a run token reaches only its own run's reports.",
    404: "No such workspace (one the caller may not see looks the same), or no such object in it.",
    409: "Not possible in the run's present state.",
    413: "The body declares more than this route accepts; none of it was read.",
    415: "The body is not of a media type this route reads (the request body says which).",
    429: "Too many failed token checks from this address or for this token key within the "
    "window; `Retry-After` says when to try again. A token that verifies is never refused.",
}


def refusals(
    *codes: int,
    in_workspace: bool = True,
    shapes: Mapping[int, Any] | None = None,
    words: Mapping[int, str] | None = None,
    media_types: tuple[str, ...] = (),
) -> dict[Any, OpenApiResponse]:
    """The refusals an API operation documents, for ``extend_schema(responses=…)``: 401, 403
    and 429 on every route (authentication and permissions run first everywhere), 404 on the
    routes inside a workspace, and ``codes``. Bodies are :class:`ErrorSerializer`'s, 400's
    :data:`FIELD_ERRORS_SCHEMA`, unless ``shapes`` names another for a code; ``words`` adds
    to a code's description. With ``media_types`` (a route that also answers
    ``text/plain``), each refusal is declared for each of them, as text for ``text/plain``."""
    answers: dict[Any, OpenApiResponse] = {}
    for code in sorted({401, 403, 429, *((404,) if in_workspace else ()), *codes}):
        default = FIELD_ERRORS_SCHEMA if code == 400 else ErrorSerializer
        shape = (shapes or {}).get(code, default)
        description = " ".join(filter(None, [REFUSAL_WORDS[code], (words or {}).get(code)]))
        if not media_types:
            answers[code] = OpenApiResponse(response=shape, description=description)
        for media_type in media_types:
            answers[(code, media_type)] = OpenApiResponse(
                response=OpenApiTypes.STR if media_type == "text/plain" else shape,
                description=description,
            )
    return answers
