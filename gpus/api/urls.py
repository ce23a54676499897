from django.urls import path

from gpus.api import views

urlpatterns = [
    path("gpus/nodes/", views.GpuNodeListView.as_view(), name="gpu-nodes"),
    path(
        "workspaces/<slug:workspace_slug>/runs/<str:run_name>/gpus/",
        views.RunGpusViewSet.as_view({"get": "retrieve"}),
        name="run-gpus",
    ),
]
