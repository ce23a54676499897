from django.urls import path

from runs.api import views

RUN = "workspaces/<slug:workspace_slug>/runs/<str:run_name>/"

urlpatterns = [
    path(
        "workspaces/<slug:workspace_slug>/runs/",
        views.RunViewSet.as_view({"get": "list", "post": "create"}),
        name="run-list",
    ),
    path(RUN, views.RunViewSet.as_view({"get": "retrieve"}), name="run-detail"),
    path(f"{RUN}cancel/", views.RunViewSet.as_view({"post": "cancel"}), name="run-cancel"),
    path(f"{RUN}resume/", views.RunViewSet.as_view({"post": "resume"}), name="run-resume"),
    path(f"{RUN}events/", views.RunViewSet.as_view({"get": "events"}), name="run-events"),
    path(f"{RUN}logs/", views.RunViewSet.as_view({"get": "logs"}), name="run-logs"),
    path(f"{RUN}metrics/", views.RunViewSet.as_view({"get": "metrics"}), name="run-metrics"),
    path(
        f"{RUN}checkpoints/",
        views.RunViewSet.as_view({"get": "checkpoints"}),
        name="run-checkpoints",
    ),
    path(
        f"{RUN}artifacts/",
        views.RunArtifactViewSet.as_view({"get": "list"}),
        name="run-artifacts",
    ),
    path(
        f"{RUN}artifacts/<path:artifact_path>",
        views.RunArtifactViewSet.as_view({"get": "retrieve"}),
        name="run-artifact",
    ),
    path(f"{RUN}bundle/", views.RunBundleViewSet.as_view({"get": "retrieve"}), name="run-bundle"),
    path(
        f"{RUN}report/metrics/",
        views.RunReportViewSet.as_view({"post": "metrics"}),
        name="run-report-metrics",
    ),
    path(
        f"{RUN}report/checkpoints/",
        views.RunReportViewSet.as_view({"post": "checkpoint"}),
        name="run-report-checkpoints",
    ),
    path(
        f"{RUN}report/trials/",
        views.RunReportViewSet.as_view({"post": "trials"}),
        name="run-report-trials",
    ),
    path(
        f"{RUN}report/events/",
        views.RunReportViewSet.as_view({"post": "event"}),
        name="run-report-events",
    ),
    path(
        f"{RUN}report/data-staged/",
        views.RunReportViewSet.as_view({"post": "data_staged"}),
        name="run-report-data-staged",
    ),
    path(
        f"{RUN}report/artifacts/",
        views.RunArtifactUploadViewSet.as_view({"post": "upload"}),
        name="run-report-artifacts",
    ),
]
