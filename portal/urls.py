from django.contrib import admin
from django.http import HttpRequest, HttpResponseRedirect
from django.templatetags.static import static
from django.urls import URLPattern, URLResolver, include, path
from drf_spectacular.views import SpectacularAPIView

from portal import health, views
from portal.identity import oidc
from portal.identity import views as identity_views
from runs import views as run_views


def favicon(request: HttpRequest) -> HttpResponseRedirect:
    """Browsers ask for /favicon.ico whatever a page links: send them to the icon itself
    (its hashed name in production, so a temporary redirect)."""
    return HttpResponseRedirect(static("img/favicon.svg"))


api_patterns: list[URLPattern | URLResolver] = [
    path("", include("workspaces.api.urls")),
    path("", include("runs.api.urls")),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
]

urlpatterns = [
    path("", views.HomeView.as_view(), name="home"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("favicon.ico", favicon, name="favicon"),
    path("login/", identity_views.LoginView.as_view(), name="login"),
    path("logout/", identity_views.logout_view, name="logout"),
    path("oidc/login/", oidc.OIDCLoginView.as_view(), name="oidc-login"),
    path("oidc/callback/", oidc.OIDCCallbackView.as_view(), name="oidc-callback"),
    path("profile/", identity_views.ProfileView.as_view(), name="profile"),
    path("tokens/", identity_views.TokensView.as_view(), name="tokens"),
    path("tokens/<int:pk>/revoke/", identity_views.TokenRevokeView.as_view(), name="token-revoke"),
    path("audit/", identity_views.PlatformAuditView.as_view(), name="audit"),
    path("queue/", run_views.PlatformQueueView.as_view(), name="platform-queue"),
    path("w/<slug:workspace_slug>/", include("workspaces.urls")),
    path("api/v1/", include((api_patterns, "api"))),
    # One login page for everything: the admin's own login form would bypass single sign-on.
    path("admin/login/", identity_views.admin_login),
    path("admin/", admin.site.urls),
]
