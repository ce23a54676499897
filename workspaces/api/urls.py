from django.urls import path

from workspaces.api import views

urlpatterns = [
    path("workspaces/", views.WorkspaceListView.as_view(), name="workspace-list"),
    path(
        "workspaces/<slug:workspace_slug>/",
        views.WorkspaceDetailViewSet.as_view({"get": "retrieve", "patch": "partial_update"}),
        name="workspace-detail",
    ),
    path(
        "workspaces/<slug:workspace_slug>/quota/",
        views.QuotaViewSet.as_view({"get": "list"}),
        name="quota-list",
    ),
    path(
        "workspaces/<slug:workspace_slug>/members/",
        views.MemberViewSet.as_view({"get": "list", "post": "create"}),
        name="member-list",
    ),
    path(
        "workspaces/<slug:workspace_slug>/members/<str:username>/",
        views.MemberViewSet.as_view(
            {"get": "retrieve", "patch": "partial_update", "delete": "destroy"}
        ),
        name="member-detail",
    ),
]
