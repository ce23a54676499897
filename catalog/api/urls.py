"""The catalog's API, under /api/v1/: ``datasets/`` and ``models/`` of a workspace."""

from django.urls import path

from catalog.api import views

urlpatterns = []
for kind, viewset, downloads in (
    ("dataset", views.DatasetViewSet, views.DatasetDownloadViewSet),
    ("model", views.ModelViewSet, views.ModelDownloadViewSet),
):
    base = f"workspaces/<slug:workspace_slug>/{kind}s/"
    version = f"{base}<str:name>/versions/<str:version>/"
    urlpatterns += [
        path(base, viewset.as_view({"get": "list", "post": "create"}), name=f"{kind}-list"),
        path(
            f"{base}<str:name>/",
            viewset.as_view({"get": "retrieve", "delete": "destroy"}),
            name=f"{kind}-detail",
        ),
        path(
            f"{base}<str:name>/versions/",
            viewset.as_view({"get": "versions", "post": "start_version"}),
            name=f"{kind}-versions",
        ),
        path(
            version,
            viewset.as_view({"get": "version", "delete": "delete_version"}),
            name=f"{kind}-version",
        ),
        path(f"{version}files/", viewset.as_view({"get": "files"}), name=f"{kind}-version-files"),
        path(
            f"{version}files/<path:file_path>",
            viewset.as_view({"put": "put_file"}),
            name=f"{kind}-version-file",
        ),
        path(
            f"{version}verify/", viewset.as_view({"post": "verify"}), name=f"{kind}-version-verify"
        ),
        path(
            f"{version}download/",
            downloads.as_view({"get": "download"}),
            name=f"{kind}-version-download",
        ),
        path(f"{base}<str:name>/best/", viewset.as_view({"get": "best"}), name=f"{kind}-best"),
        path(
            f"{base}<str:name>/aliases/<str:alias>/",
            viewset.as_view({"put": "set_alias", "delete": "delete_alias"}),
            name=f"{kind}-alias",
        ),
    ]

RUN_DATA = "workspaces/<slug:workspace_slug>/runs/<str:run_name>/data/"
urlpatterns += [
    path(RUN_DATA, views.RunDataViewSet.as_view({"get": "listing"}), name="run-data"),
    path(
        f"{RUN_DATA}blobs/<str:sha256>/",
        views.RunDataViewSet.as_view({"get": "blob"}),
        name="run-data-blob",
    ),
]
