from django.urls import path

from portal.identity.views import WorkspaceAuditView
from workspaces import views

urlpatterns = [
    path("", views.WorkspaceHomeView.as_view(), name="workspace-home"),
    path("audit/", WorkspaceAuditView.as_view(), name="workspace-audit"),
]
