from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import URLPattern, URLResolver, include, path
from drf_spectacular.views import SpectacularAPIView

from portal import health, views

admin.site.site_header = "TauGrid platform admin"
admin.site.site_title = "TauGrid admin"
admin.site.index_title = "Workspaces, members, quotas and audit"

api_patterns: list[URLPattern | URLResolver] = [
    path("", include("workspaces.api.urls")),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
]

urlpatterns = [
    path("", views.HomeView.as_view(), name="home"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path(
        "login/",
        auth_views.LoginView.as_view(redirect_authenticated_user=True),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("w/<slug:workspace_slug>/", include("workspaces.urls")),
    path("api/v1/", include((api_patterns, "api"))),
    path("admin/", admin.site.urls),
]
