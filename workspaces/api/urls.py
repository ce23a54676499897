from django.urls import path

from workspaces.api import platform, views

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
    path("flavors/", platform.FlavorListView.as_view(), name="flavor-list"),
    path("flavors/<str:name>/", platform.FlavorDetailView.as_view(), name="flavor-detail"),
    path("cohorts/", platform.CohortListView.as_view(), name="cohort-list"),
    path("cohorts/<str:name>/", platform.CohortDetailView.as_view(), name="cohort-detail"),
]
