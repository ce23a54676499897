"""The API's schema at ``/api/v1/schema/`` and its interactive documentation at
``/api/v1/docs/``: Swagger UI over that schema, every file from here.

The schema is served to a signed-in user or an API token, like the rest of the API: it holds
no data, but building it costs a few hundred milliseconds of CPU, which an anonymous client
could ask for in a loop. A caller without credentials is told how to send them.

Swagger UI comes from PyPI (``drf-spectacular-sidecar``, a copy of the ``swagger-ui-dist``
npm package) and is served as our own static files (``portal.staticfiles``), never from a
CDN. Within the portal's CSP (``script-src 'self'``, no inline styles): the page's script is
drf-spectacular's initialiser, answered as JavaScript from this same address (``?script``),
and the page's own styles are a file (``static/css/api-docs.css``).

The page asks who is signed in; a visitor who is not is sent to sign in first (the schema,
and every call "Try it out" makes, needs the session or a token).
"""

from __future__ import annotations

from typing import Any, NoReturn

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.templatetags.static import static
from drf_spectacular.utils import extend_schema
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.exceptions import NotAuthenticated
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response

from identity import schema as _token_scheme  # noqa: F401 - registers the tokens' scheme
from identity.tokens import TokenScopePermission

#: Where the Swagger UI files are served from (``portal.staticfiles.PACKAGED_ASSETS``).
SWAGGER_UI_STATIC = "vendor/swagger-ui"


#: What a caller without credentials is told at /api/v1/schema/.
SCHEMA_NEEDS_CREDENTIALS = (
    "The API schema is served to signed-in users and API tokens: send "
    '"Authorization: Bearer <token>" (tokens are made on the API tokens page, or with '
    "`manage.py create_token`), or open /api/v1/docs/ in a browser after signing in."
)


class ApiSchemaView(SpectacularAPIView):
    """The OpenAPI schema (``SPECTACULAR_SETTINGS["SERVE_PERMISSIONS"]`` decides who)."""

    def permission_denied(
        self, request: Request, message: str | None = None, code: str | None = None
    ) -> NoReturn:
        if not request.user.is_authenticated and request.successful_authenticator is None:
            raise NotAuthenticated(SCHEMA_NEEDS_CREDENTIALS)
        super().permission_denied(request, message=message, code=code)


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
