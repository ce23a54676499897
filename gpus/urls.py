"""The GPU pages: the fleet at the root (platform staff), a workspace's GPUs under
``/w/<slug>/`` (the shell mounts both)."""

from django.urls import path

from gpus import views

urlpatterns = [
    path("gpus/", views.WorkspaceGpusView.as_view(), name="workspace-gpus"),
    path("gpus/usage/", views.WorkspaceGpuUsageView.as_view(), name="workspace-gpus-usage"),
    path("runs/<str:run_name>/gpus/", views.RunGpusView.as_view(), name="run-page-gpus"),
]

#: Pages outside any workspace (the shell mounts them at the root).
platform_urlpatterns = [
    path("gpus/", views.FleetView.as_view(), name="gpu-fleet"),
    path("gpus/nodes/<str:node_name>/", views.NodeView.as_view(), name="gpu-node"),
    path(
        "gpus/nodes/<str:node_name>/telemetry/",
        views.NodeTelemetryView.as_view(),
        name="gpu-node-telemetry",
    ),
    path(
        "gpus/nodes/<str:node_name>/cordon/",
        views.NodeActionView.as_view(action="cordon"),
        name="gpu-node-cordon",
    ),
    path(
        "gpus/nodes/<str:node_name>/uncordon/",
        views.NodeActionView.as_view(action="uncordon"),
        name="gpu-node-uncordon",
    ),
]
