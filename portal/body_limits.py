"""Bodies within bounds before anything reads them: Django's limit for JSON
(``DATA_UPLOAD_MAX_MEMORY_SIZE``) and the limits routes set for themselves.

Apart from :mod:`portal.api` (DRF's parsers and refusals) so that registering a route's
limit in ``AppConfig.ready()`` costs a process nothing it does not use: every Django process
(Celery workers, the local executor's agent, a ``manage.py`` command) runs those, and only
the web server reads a body.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse


class JSONBodySizeMiddleware:
    """A JSON body declaring more than ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (or its route's own
    limit, :data:`BODY_LIMITS`) gets a 413 that says so, unread (Django would refuse it once
    read, as a bare 400). Checked in ``process_view``, the first of the stack's: the URL is
    resolved by then (once, by Django), and no view has read the body. A path that resolves
    to nothing is a 404, its body unread too. Multipart bodies are sized by
    ``runs.submission.SubmissionSizeMiddleware``."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_view(
        self,
        request: HttpRequest,
        view_func: Callable[..., HttpResponse],
        view_args: tuple[Any, ...],
        view_kwargs: dict[str, Any],
    ) -> HttpResponse | None:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is None or request.content_type != "application/json":
            return None
        match = request.resolver_match
        own = own_body_limit(match.view_name, request.method or "GET") if match else None
        limit = own if own is not None else limit
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
        return None


#: Routes whose views accept bodies of another size than Django's limit for forms and JSON
#: (``DATA_UPLOAD_MAX_MEMORY_SIZE``): view name → ``limit(method)``, None where the method
#: keeps Django's. Apps register their routes' limits in ``AppConfig.ready()``; the body is
#: refused past it, unread, by :class:`JSONBodySizeMiddleware` (WSGI) and by
#: ``web.asgi.RequestGuard`` (ASGI).
BODY_LIMITS: dict[str, Callable[[str], int | None]] = {}


def own_body_limit(view_name: str, method: str) -> int | None:
    """The limit the route ``view_name`` sets for a ``method`` body, if it sets one."""
    limit = BODY_LIMITS.get(view_name)
    return limit(method.upper()) if limit is not None else None
