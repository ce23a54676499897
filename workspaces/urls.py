from django.urls import path

from portal.identity.views import WorkspaceAuditView
from runs import views as run_views
from workspaces import views

urlpatterns = [
    path("", views.WorkspaceHomeView.as_view(), name="workspace-home"),
    path("audit/", WorkspaceAuditView.as_view(), name="workspace-audit"),
    path("queue/", run_views.QueueView.as_view(), name="queue"),
    path("runs/", run_views.RunListView.as_view(), name="runs"),
    path("runs/new/", run_views.SubmitView.as_view(), name="run-submit"),
    path("runs/validate/", run_views.ValidateView.as_view(), name="run-validate"),
    path("runs/<str:run_name>/", run_views.RunDetailView.as_view(), name="run-page"),
    path(
        "runs/<str:run_name>/cancel/",
        run_views.RunActionView.as_view(action="cancel"),
        name="run-page-cancel",
    ),
    path(
        "runs/<str:run_name>/resume/",
        run_views.RunActionView.as_view(action="resume"),
        name="run-page-resume",
    ),
]
