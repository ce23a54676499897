"""The workspace app's own pages under ``/w/<slug>/`` (the shell mounts them)."""

from django.urls import path

from workspaces.audit_views import WorkspaceAuditView
from workspaces.member_views import MemberRemoveView, MemberRoleView, MembersView

urlpatterns = [
    path("audit/", WorkspaceAuditView.as_view(), name="workspace-audit"),
    path("members/", MembersView.as_view(), name="workspace-members"),
    path("members/<str:username>/role/", MemberRoleView.as_view(), name="workspace-member-role"),
    path(
        "members/<str:username>/remove/",
        MemberRemoveView.as_view(),
        name="workspace-member-remove",
    ),
]
