"""The endpoints API, under /api/v1/ (issue 34: the names are a contract)."""

from django.urls import path, re_path

from serving.api import views, workload

BASE = "workspaces/<slug:workspace_slug>/endpoints/"
ENDPOINT = f"{BASE}<str:name>/"

urlpatterns = [
    path(
        BASE, views.EndpointViewSet.as_view({"get": "list", "post": "create"}), name="endpoint-list"
    ),
    path(
        ENDPOINT,
        views.EndpointViewSet.as_view(
            {"get": "retrieve", "patch": "partial_update", "delete": "destroy"}
        ),
        name="endpoint-detail",
    ),
    path(
        f"{ENDPOINT}evidence/",
        views.EndpointEvidenceViewSet.as_view({"get": "retrieve"}),
        name="endpoint-evidence",
    ),
    path(
        f"{ENDPOINT}metrics/",
        views.EndpointViewSet.as_view({"get": "metrics"}),
        name="endpoint-metrics",
    ),
    path(f"{ENDPOINT}logs/", views.EndpointViewSet.as_view({"get": "logs"}), name="endpoint-logs"),
    # What the endpoint's own pods fetch and report, with its token (serving.api.workload).
    path(
        f"{ENDPOINT}bundle/",
        workload.EndpointBundleViewSet.as_view({"get": "retrieve"}),
        name="endpoint-bundle",
    ),
    path(
        f"{ENDPOINT}model/",
        workload.EndpointModelViewSet.as_view({"get": "listing"}),
        name="endpoint-model",
    ),
    path(
        f"{ENDPOINT}model/blobs/<str:sha256>/",
        workload.EndpointModelViewSet.as_view({"get": "blob"}),
        name="endpoint-model-blob",
    ),
    path(
        f"{ENDPOINT}report/model-staged/",
        workload.EndpointReportViewSet.as_view({"post": "model_staged"}),
        name="endpoint-report-model-staged",
    ),
    # {path} may be empty (the endpoint's route prefix itself) and hold slashes. GET too: an
    # OpenAI-compatible endpoint's `GET /v1/models`, health checks.
    re_path(
        r"^workspaces/(?P<workspace_slug>[-a-zA-Z0-9_]+)/endpoints/(?P<name>[^/]+)/invoke/(?P<path>.*)$",
        views.EndpointInvokeViewSet.as_view({"get": "invoke", "post": "invoke"}),
        name="endpoint-invoke",
    ),
]
