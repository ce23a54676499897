"""The workspace app's own pages under ``/w/<slug>/`` (the shell mounts them)."""

from django.urls import path

from workspaces.audit_views import WorkspaceAuditView

urlpatterns = [
    path("audit/", WorkspaceAuditView.as_view(), name="workspace-audit"),
]
