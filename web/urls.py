"""The root URLconf: the shell assembles each app's own URLs (``/w/<slug>/`` from the
workspace and run apps, the API under ``/api/v1/``)."""

from django.contrib import admin
from django.http import HttpRequest, HttpResponseRedirect
from django.templatetags.static import static
from django.urls import URLPattern, URLResolver, include, path

from accounting.urls import platform_urlpatterns as accounting_platform_urls
from gpus.urls import platform_urlpatterns as gpu_platform_urls
from identity.api import MeView
from notifications.urls import personal_urlpatterns as notification_personal_urls
from portal import health
from runs.urls import platform_urlpatterns as run_platform_urls
from web import portal_metrics as metrics
from web import views, workspace_home
from web.api_docs import ApiDocsView, ApiSchemaView
from workspaces.audit_views import PlatformAuditView


def favicon(request: HttpRequest) -> HttpResponseRedirect:
    """Browsers ask for /favicon.ico whatever a page links: send them to the icon itself
    (its hashed name in production, so a temporary redirect)."""
    return HttpResponseRedirect(static("img/favicon.svg"))


api_patterns: list[URLPattern | URLResolver] = [
    path("", include("workspaces.api.urls")),
    path("", include("runs.api.urls")),
    path("", include("catalog.api.urls")),
    path("", include("serving.api.urls")),
    path("", include("evidence.api.urls")),
    path("", include("gpus.api.urls")),
    path("", include("accounting.api.urls")),
    path("", include("notifications.api.urls")),
    path("", include("pipelines.api.urls")),
    path("me/", MeView.as_view(), name="me"),
    path("schema/", ApiSchemaView.as_view(), name="schema"),
    path("docs/", ApiDocsView.as_view(), name="docs"),
]

workspace_patterns: list[URLPattern | URLResolver] = [
    path("", workspace_home.WorkspaceHomeView.as_view(), name="workspace-home"),
    path("", include("workspaces.urls")),
    path("", include("runs.urls")),
    path("", include("catalog.urls")),
    path("", include("serving.urls")),
    path("", include("evidence.urls")),
    path("", include("gpus.urls")),
    path("", include("accounting.urls")),
    path("", include("notifications.urls")),
    path("", include("pipelines.urls")),
]

# Under /api/ a 404 is JSON, as the schema says, also where no route matches.
handler404 = "portal.api.not_found"

urlpatterns: list[URLPattern | URLResolver] = [
    path("", views.HomeView.as_view(), name="home"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.metrics, name="metrics"),
    path("favicon.ico", favicon, name="favicon"),
    path("", include("identity.urls")),
    path("audit/", PlatformAuditView.as_view(), name="audit"),
    path("", include(run_platform_urls)),
    path("", include(gpu_platform_urls)),
    path("", include(accounting_platform_urls)),
    path("", include(notification_personal_urls)),
    path("w/<slug:workspace_slug>/", include(workspace_patterns)),
    path("api/v1/", include((api_patterns, "api"))),
    path("admin/", admin.site.urls),
]
