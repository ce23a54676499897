"""Request-scoped context: a request id for logs and responses, and who is acting for audit."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from urllib.parse import urlsplit

from csp.middleware import CSPMiddleware, PolicyParts
from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase

from portal import audit
from portal.request_id import current_request_id

_REQUEST_ID_PATTERN = re.compile(r"^[A-Za-z0-9._-]{8,64}$")


class RequestIdMiddleware:
    """Give every request an id (a proxy's ``X-Request-ID`` if well-formed) and echo it back."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        incoming = request.headers.get("X-Request-ID", "")
        request_id = incoming if _REQUEST_ID_PATTERN.match(incoming) else uuid.uuid4().hex
        request.request_id = request_id  # type: ignore[attr-defined]
        token = current_request_id.set(request_id)
        try:
            response = self.get_response(request)
        finally:
            current_request_id.reset(token)
        response["X-Request-ID"] = request_id
        return response


class AuditContextMiddleware:
    """Make the acting user, request id and client address available to audit records.

    The user is read when an event is written, not now, so API authentication that runs
    later inside the view (tokens) is what the record shows.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        source = (
            "admin"
            if request.path.startswith("/admin/")
            else ("api" if request.path.startswith("/api/") else "web")
        )
        with audit.request_context(request, source=source):
            return self.get_response(request)


class PortalCSPMiddleware(CSPMiddleware):
    """The Content Security Policy from settings, plus the identity provider as a form
    target: logging out posts to the portal, which redirects to the provider to end its
    session, and browsers apply ``form-action`` to that redirect too."""

    def get_policy_parts(
        self, request: HttpRequest, response: HttpResponseBase, report_only: bool = False
    ) -> PolicyParts:
        parts = super().get_policy_parts(request, response, report_only)
        if settings.TAU_OIDC_ENABLED and not report_only:
            issuer = urlsplit(settings.TAU_OIDC_ISSUER)
            update = dict(parts.update or {})
            update["form-action"] = [
                *update.get("form-action", []),
                f"{issuer.scheme}://{issuer.netloc}",
            ]
            parts.update = update
        return parts
