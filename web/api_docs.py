"""The API's interactive documentation at ``/api/v1/docs/``: Swagger UI over the schema this
installation serves (``/api/v1/schema/``), every file from here.

Swagger UI comes from PyPI (``drf-spectacular-sidecar``, a copy of the ``swagger-ui-dist``
npm package) and is served as our own static files (``portal.staticfiles``), never from a
CDN. Within the portal's CSP (``script-src 'self'``, no inline styles): the page's script is
drf-spectacular's initialiser, answered as JavaScript from this same address (``?script``),
and the page's own styles are a file (``static/css/api-docs.css``).

The page asks who is signed in; a visitor who is not is sent to sign in first (the schema,
and every call "Try it out" makes, needs the session or a token).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.templatetags.static import static
from drf_spectacular.utils import extend_schema
from drf_spectacular.views import SpectacularSwaggerSplitView
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response

from identity.tokens import TokenScopePermission

#: Where the Swagger UI files are served from (``portal.staticfiles.PACKAGED_ASSETS``).
SWAGGER_UI_STATIC = "vendor/swagger-ui"


class ApiDocsView(SpectacularSwaggerSplitView):
    title = "TauGrid API"
    template_name = "api/docs.html"
    # The page is a shell (the schema it loads is what needs a caller); anonymous visitors
    # are sent to sign in below rather than shown a JSON 401. A run token reaches only its
    # run's reports, here as everywhere (TokenScopePermission).
    permission_classes = [AllowAny, TokenScopePermission]
    url_name = "api:schema"

    @extend_schema(exclude=True)
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path(), settings.LOGIN_URL)
        response: Response = super().get(request, *args, **kwargs)  # type: ignore[no-untyped-call]
        return response

    @staticmethod
    def _swagger_ui_resource(filename: str) -> str:
        return static(f"{SWAGGER_UI_STATIC}/{filename}")

    @staticmethod
    def _swagger_ui_favicon() -> str:
        return static("img/favicon.svg")
