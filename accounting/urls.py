"""Usage pages: a workspace's under ``/w/<slug>/``, every workspace's at the root (staff)."""

from django.urls import URLPattern, path

from accounting import views

urlpatterns: list[URLPattern] = [
    path("usage/", views.WorkspaceUsageView.as_view(), name="workspace-usage"),
    path("usage.csv", views.WorkspaceUsageCsvView.as_view(), name="workspace-usage-csv"),
]

#: Staff pages, at the top level.
platform_urlpatterns: list[URLPattern] = [
    path("usage/", views.PlatformUsageView.as_view(), name="platform-usage"),
    path("usage.csv", views.PlatformUsageCsvView.as_view(), name="platform-usage-csv"),
]
