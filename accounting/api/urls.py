"""The usage API, under /api/v1/."""

from django.urls import path

from accounting.api import views

urlpatterns = [
    path(
        "workspaces/<slug:workspace_slug>/usage/",
        views.UsageViewSet.as_view({"get": "retrieve"}),
        name="workspace-usage",
    ),
]
