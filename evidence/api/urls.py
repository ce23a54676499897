from django.urls import path

from evidence.api import views

urlpatterns = [
    path("evidence/keys/", views.EvidenceKeysView.as_view(), name="evidence-keys"),
    path(
        "workspaces/<slug:workspace_slug>/runs/<str:run_name>/evidence/",
        views.RunEvidenceViewSet.as_view({"get": "retrieve"}),
        name="run-evidence",
    ),
    path(
        "workspaces/<slug:workspace_slug>/runs/<str:run_name>/evidence/records/",
        views.RunEvidenceViewSet.as_view({"get": "records"}),
        name="run-evidence-records",
    ),
    path(
        "workspaces/<slug:workspace_slug>/runs/<str:run_name>/evidence/records/<int:ending_event>/",
        views.RunEvidenceViewSet.as_view({"get": "record"}),
        name="run-evidence-record",
    ),
]
