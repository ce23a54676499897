"""The endpoint pages under ``/w/<slug>/`` (the shell mounts them), beside the runs'."""

from django.urls import path

from serving import views

urlpatterns = [
    path("endpoints/", views.EndpointListView.as_view(), name="endpoints"),
    path("endpoints/<str:name>/", views.EndpointDetailView.as_view(), name="endpoint-page"),
    path("endpoints/<str:name>/log/", views.EndpointLogView.as_view(), name="endpoint-page-log"),
    path(
        "endpoints/<str:name>/scale/",
        views.EndpointActionView.as_view(action="scale"),
        name="endpoint-page-scale",
    ),
    path(
        "endpoints/<str:name>/stop/",
        views.EndpointActionView.as_view(action="stop"),
        name="endpoint-page-stop",
    ),
    path(
        "endpoints/<str:name>/delete/",
        views.EndpointActionView.as_view(action="delete"),
        name="endpoint-page-delete",
    ),
]
