"""The catalog's pages under ``/w/<slug>/`` (the shell mounts them): ``datasets/`` and
``models/``, one of them, one version (a number, an alias or ``latest``)."""

from django.urls import URLPattern, path

from catalog import views

urlpatterns: list[URLPattern] = []
for kind in ("dataset", "model"):
    urlpatterns += [
        path(f"{kind}s/", views.AssetListView.as_view(kind=kind), name=f"{kind}s"),
        path(
            f"{kind}s/<str:name>/",
            views.AssetDetailView.as_view(kind=kind),
            name=f"{kind}-detail",
        ),
        path(
            f"{kind}s/<str:name>/versions/<str:version>/",
            views.VersionView.as_view(kind=kind),
            name=f"{kind}-version",
        ),
    ]
