"""The evidence app's pages under ``/w/<slug>/`` (the shell mounts them)."""

from django.urls import path

from evidence import views

urlpatterns = [
    path(
        "runs/<str:run_name>/evidence/",
        views.RunEvidenceView.as_view(),
        name="run-page-evidence",
    ),
]
