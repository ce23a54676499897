"""The pipelines API, under /api/v1/ (issue 35: the names are a contract)."""

from django.urls import path

from pipelines.api import views

BASE = "workspaces/<slug:workspace_slug>/pipelines/"
PIPELINE = f"{BASE}<str:name>/"

urlpatterns = [
    path(
        BASE, views.PipelineViewSet.as_view({"get": "list", "post": "create"}), name="pipeline-list"
    ),
    path(PIPELINE, views.PipelineViewSet.as_view({"get": "retrieve"}), name="pipeline-detail"),
    path(
        f"{PIPELINE}cancel/",
        views.PipelineViewSet.as_view({"post": "cancel"}),
        name="pipeline-cancel",
    ),
    path(
        f"{PIPELINE}resume/",
        views.PipelineViewSet.as_view({"post": "resume"}),
        name="pipeline-resume",
    ),
    path(
        f"{PIPELINE}evidence/",
        views.PipelineEvidenceViewSet.as_view({"get": "retrieve"}),
        name="pipeline-evidence",
    ),
]
