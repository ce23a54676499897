"""Pages under /w/<slug>/, and the person's own pages at the top level."""

from django.urls import path

from notifications import views

urlpatterns = [
    path("settings/webhooks/", views.WebhooksView.as_view(), name="workspace-webhooks"),
    path(
        "settings/webhooks/<int:webhook_id>/delete/",
        views.WebhookDeleteView.as_view(),
        name="workspace-webhook-delete",
    ),
]

#: Your e-mail preferences and the unsubscribe link, at the top level (web/urls.py).
personal_urlpatterns = [
    path(
        "profile/notifications/",
        views.EmailPreferencesView.as_view(),
        name="notification-preferences",
    ),
    path(
        "notifications/unsubscribe/<str:token>/",
        views.UnsubscribeView.as_view(),
        name="notification-unsubscribe",
    ),
]
