"""The pipeline pages under ``/w/<slug>/`` (the shell mounts them)."""

from django.urls import path

from pipelines import views

urlpatterns = [
    path("pipelines/", views.PipelineListView.as_view(), name="pipelines"),
    path("pipelines/<str:name>/", views.PipelineDetailView.as_view(), name="pipeline-page"),
    path(
        "pipelines/<str:name>/cancel/",
        views.PipelineActionView.as_view(action="cancel"),
        name="pipeline-page-cancel",
    ),
    path(
        "pipelines/<str:name>/resume/",
        views.PipelineActionView.as_view(action="resume"),
        name="pipeline-page-resume",
    ),
]
