from django.urls import path

from workspaces import views

urlpatterns = [
    path("", views.WorkspaceHomeView.as_view(), name="workspace-home"),
]
