"""The API's routes, under /api/v1/."""

from django.urls import path

from notifications.api import views

WEBHOOKS = "workspaces/<slug:workspace_slug>/webhooks/"

urlpatterns = [
    path(
        WEBHOOKS,
        views.WebhookViewSet.as_view({"get": "list", "post": "create"}),
        name="webhook-list",
    ),
    path(
        f"{WEBHOOKS}<int:webhook_id>/",
        views.WebhookViewSet.as_view({"delete": "destroy"}),
        name="webhook-detail",
    ),
]
