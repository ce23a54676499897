"""The catalog's API, under /api/v1/: ``datasets/`` and ``models/`` of a workspace."""

from django.urls import path

from catalog.api import views

urlpatterns = []
for kind, viewset in (("dataset", views.DatasetViewSet), ("model", views.ModelViewSet)):
    base = f"workspaces/<slug:workspace_slug>/{kind}s/"
    urlpatterns += [
        path(base, viewset.as_view({"get": "list"}), name=f"{kind}-list"),
        path(f"{base}<str:name>/", viewset.as_view({"get": "retrieve"}), name=f"{kind}-detail"),
        path(
            f"{base}<str:name>/versions/",
            viewset.as_view({"get": "versions"}),
            name=f"{kind}-versions",
        ),
        path(
            f"{base}<str:name>/versions/<str:version>/",
            viewset.as_view({"get": "version"}),
            name=f"{kind}-version",
        ),
        path(
            f"{base}<str:name>/versions/<str:version>/files/",
            viewset.as_view({"get": "files"}),
            name=f"{kind}-version-files",
        ),
    ]
