"""The runs app's pages under ``/w/<slug>/`` (the shell mounts them)."""

from django.urls import path

from runs import views

urlpatterns = [
    path("queue/", views.QueueView.as_view(), name="queue"),
    path("runs/", views.RunListView.as_view(), name="runs"),
    path("runs/new/", views.SubmitView.as_view(), name="run-submit"),
    path("runs/validate/", views.ValidateView.as_view(), name="run-validate"),
    path("runs/compare/", views.RunCompareView.as_view(), name="run-compare"),
    path("runs/<str:run_name>/", views.RunDetailView.as_view(), name="run-page"),
    path(
        "runs/<str:run_name>/cancel/",
        views.RunActionView.as_view(action="cancel"),
        name="run-page-cancel",
    ),
    path(
        "runs/<str:run_name>/resume/",
        views.RunActionView.as_view(action="resume"),
        name="run-page-resume",
    ),
]

#: Pages outside any workspace (the shell mounts them at the root).
platform_urlpatterns = [
    path("queue/", views.PlatformQueueView.as_view(), name="platform-queue"),
]
