"""The endpoints API: the fields (exact names), deployment as a form or as JSON, changes,
deletion, logs and metrics from the backend, who may do what, and a list whose query count
does not grow with its length."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from catalog import storage
from catalog.models import AssetFile, AssetVersion
from serving import services
from serving.models import Endpoint, EndpointState
from tests.runs.factories import make_run, zip_bytes
from tests.serving import fakes
from tests.serving.factories import (
    AUTOSCALING_SPEC,
    ENDPOINT_FILES,
    ENDPOINT_SPEC,
    MODEL_SPEC,
    RUN_SPEC,
    make_endpoint,
    model_version,
)
from workspaces.models import Membership

pytestmark = pytest.mark.django_db

ENDPOINTS = "/api/v1/workspaces/alpha/endpoints/"
FIELDS = {
    "name",
    "state",
    "state_reason",
    "url",
    "invoke_url",
    "replicas_ready",
    "replicas_desired",
    "autoscaling",
    "model",
    "generation",
    "backend",
    "created_by",
    "created_at",
    "updated_at",
    "requests_per_second",
    "latency_p95_ms",
    "error_rate",
}


def deploy_form(client: APIClient, spec: bytes = ENDPOINT_SPEC, **extra: Any) -> Any:
    return client.post(
        ENDPOINTS,
        {
            "spec": SimpleUploadedFile("tau.yaml", spec),
            "bundle": SimpleUploadedFile("project.zip", zip_bytes(ENDPOINT_FILES)),
            **extra,
        },
        format="multipart",
    )


def test_deploy_as_a_form(world: Any) -> None:
    response = deploy_form(world.api_client_for("researcher"))
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == FIELDS
    assert body["name"] == "chat"
    assert body["state"] == "deploying"
    assert body["generation"] == 1
    assert (body["replicas_desired"], body["replicas_ready"]) == (1, 0)
    assert body["model"] is None
    assert body["autoscaling"] is None
    assert body["backend"] == "local"
    assert body["created_by"] == "rob"
    assert body["url"] == ""
    assert body["invoke_url"] == ENDPOINTS + "chat/invoke/"
    assert body["requests_per_second"] is body["latency_p95_ms"] is body["error_rate"] is None
    assert world.api_client_for("viewer").get(ENDPOINTS + "chat/").json() == body


def test_deploy_from_a_model_as_json(world: Any, tmp_path: Path) -> None:
    model_version(world, tmp_path)
    client = world.api_client_for("researcher")
    as_text = client.post(
        ENDPOINTS,
        {"config": ENDPOINT_SPEC.decode(), "model": {"name": "tiny-gpt", "version": "production"}},
        format="json",
    )
    assert as_text.status_code == 201, as_text.content
    assert as_text.json()["model"] == {"name": "tiny-gpt", "version": 1}
    import yaml

    as_json = client.post(
        ENDPOINTS,
        {
            "config": yaml.safe_load(ENDPOINT_SPEC),
            "model": {"name": "tiny-gpt", "version": 1},
            "name": "chat-two",
        },
        format="json",
    )
    assert as_json.status_code == 201, as_json.content
    assert as_json.json()["name"] == "chat-two"


def test_a_refused_deployment_lists_its_problems(world: Any) -> None:
    response = deploy_form(world.api_client_for("researcher"), RUN_SPEC)
    assert response.status_code == 400
    assert response.json() == {
        "detail": "The endpoint was not deployed.",
        "problems": [
            {
                "path": "run.workload_kind",
                "line": 5,
                "column": 3,
                "message": "this tau.yaml describes a run; submit it with `tau run`",
                "hint": None,
            }
        ],
    }
    missing = world.api_client_for("researcher").post(
        ENDPOINTS,
        {"config": ENDPOINT_SPEC.decode(), "model": {"name": "nope", "version": "1"}},
        format="json",
    )
    assert missing.status_code == 400
    assert [p["path"] for p in missing.json()["problems"]] == ["model.name"]
    assert Endpoint.objects.for_workspace(world.alpha).count() == 0


def test_a_backend_without_endpoints_is_a_409_and_creates_nothing(
    world: Any, settings: Any
) -> None:
    settings.TAU_BACKEND_CLASSES = fakes.without_endpoints(settings)
    response = deploy_form(world.api_client_for("researcher"))
    assert response.status_code == 409
    assert response.json() == {
        "detail": "endpoints are not available on the local backend of this installation yet"
    }
    assert Endpoint.objects.for_workspace(world.alpha).count() == 0


def test_a_name_in_use_is_a_409(world: Any) -> None:
    make_endpoint(world)
    response = deploy_form(world.api_client_for("researcher"))
    assert response.status_code == 409
    assert response.json()["detail"] == "This workspace has an endpoint named 'chat' already."


def test_a_deployment_too_large_is_refused_unread(world: Any) -> None:
    response = world.api_client_for("researcher").post(
        ENDPOINTS, b"x", content_type="multipart/form-data; boundary=x", CONTENT_LENGTH=str(2**30)
    )
    assert response.status_code == 413
    assert "Nothing was read or kept." in response.json()["detail"]


def test_scale_update_and_delete(world: Any, tmp_path: Path) -> None:
    make_endpoint(world, state=EndpointState.READY)
    client = world.api_client_for("researcher")
    scaled = client.patch(ENDPOINTS + "chat/", {"replicas": 3}, format="json")
    assert scaled.status_code == 200
    assert (scaled.json()["replicas_desired"], scaled.json()["generation"]) == (3, 2)
    model_version(world, tmp_path)
    updated = client.patch(
        ENDPOINTS + "chat/",
        {"model": {"name": "tiny-gpt", "version": "production"}, "replicas": 2},
        format="json",
    )
    assert updated.status_code == 200, updated.content
    body = updated.json()
    assert (body["state"], body["generation"], body["replicas_desired"]) == ("updating", 3, 2)
    assert body["model"] == {"name": "tiny-gpt", "version": 1}
    assert client.patch(ENDPOINTS + "chat/", {}, format="json").status_code == 400
    assert client.patch(ENDPOINTS + "chat/", {"replicas": 65}, format="json").status_code == 400
    assert client.delete(ENDPOINTS + "chat/").status_code == 204
    assert client.get(ENDPOINTS + "chat/").status_code == 404
    assert client.get(ENDPOINTS).json()["results"] == []


def test_scaling_an_endpoint_that_autoscales_is_a_409(world: Any) -> None:
    make_endpoint(world, spec=AUTOSCALING_SPEC)
    response = world.api_client_for("researcher").patch(
        ENDPOINTS + "chat/", {"replicas": 2}, format="json"
    )
    assert response.status_code == 409
    assert response.json()["state"] == "deploying"
    assert "scales itself" in response.json()["detail"]


def test_only_its_deployer_or_an_admin_changes_it(world: Any, django_user_model: Any) -> None:
    make_endpoint(world)
    other = django_user_model.objects.create_user(username="ruth")
    Membership.objects.create(workspace=world.alpha, user=other, role="researcher")
    client = APIClient()
    client.force_authenticate(other)
    assert client.patch(ENDPOINTS + "chat/", {"replicas": 2}, format="json").status_code == 403
    assert client.delete(ENDPOINTS + "chat/").status_code == 403
    assert client.get(ENDPOINTS + "chat/").status_code == 200
    admin = world.api_client_for("workspace_admin")
    assert admin.patch(ENDPOINTS + "chat/", {"replicas": 2}, format="json").status_code == 200
    assert world.api_client_for("viewer").delete(ENDPOINTS + "chat/").status_code == 403
    assert admin.delete(ENDPOINTS + "chat/").status_code == 204


def test_the_model_version_an_endpoint_serves_is_kept(world: Any, tmp_path: Path) -> None:
    """Deleting the model an endpoint serves, or that version of it, is a 409 that names the
    endpoint (it was a 500: the endpoint's record protects the version); nothing of it goes,
    files and aliases included, where the record of the run that made it would have kept the
    version's row alone (its files gone from under the endpoint's pods) and after the
    endpoint is deleted too (its record still names the version)."""
    version = model_version(world, tmp_path)
    AssetVersion.objects.for_workspace(world.alpha).filter(pk=version.pk).update(
        produced_by=make_run(world)
    )
    make_endpoint(world, spec=MODEL_SPEC)
    admin = world.api_client_for("workspace_admin")
    model = "/api/v1/workspaces/alpha/models/tiny-gpt/"
    for deleted_endpoint in (False, True):
        if deleted_endpoint:
            assert world.api_client_for("researcher").delete(ENDPOINTS + "chat/").status_code == 204
        for url in (f"{model}versions/1/", model):
            refused = admin.delete(url)
            assert refused.status_code == 409, refused.content
            assert "is named by the endpoint chat" in refused.json()["detail"]
        version.refresh_from_db()
        assert version.state == AssetVersion.State.READY
        assert admin.get(f"{model}versions/production/").status_code == 200  # its alias too
        (stored,) = AssetFile.objects.for_workspace(world.alpha).filter(version=version)
        assert storage.blob_path(world.alpha.pk, stored.sha256).exists()


def test_another_workspaces_endpoint_is_not_found(world: Any) -> None:
    make_endpoint(world, who="outsider", workspace=world.beta)
    client = world.api_client_for("researcher")
    assert client.get(ENDPOINTS + "chat/").status_code == 404
    assert client.get("/api/v1/workspaces/beta/endpoints/chat/").status_code == 404
    assert client.get(ENDPOINTS).json()["results"] == []


def test_logs_and_metrics_come_from_the_backend(world: Any) -> None:
    make_endpoint(world, state=EndpointState.READY)
    client = world.api_client_for("viewer")
    logs = client.get(ENDPOINTS + "chat/logs/", {"replica": "replica-1", "tail": 50})
    assert logs.status_code == 200
    assert logs.json() == {
        "offset": 0,
        "next_offset": 17,
        "size": 17,
        "text": "serving requests\n",
        "replica": "replica-1",
        "replicas": ["replica-0", "replica-1"],
        "note": "",
    }
    metrics = client.get(ENDPOINTS + "chat/metrics/")
    assert metrics.status_code == 200
    assert metrics.json()["requests_per_second"] == 12.5
    assert metrics.json()["latency_p95_ms"] == 21.0
    assert client.get(ENDPOINTS + "chat/logs/", {"replica": "../x"}).status_code == 400
    assert client.get(ENDPOINTS + "chat/logs/", {"tail": "-1"}).status_code == 400


@pytest.mark.parametrize("state", [EndpointState.STOPPED, EndpointState.FAILED])
def test_logs_and_metrics_of_what_does_not_run_are_a_409(world: Any, state: EndpointState) -> None:
    make_endpoint(world, state=state)
    client = world.api_client_for("viewer")
    for route in ("logs/", "metrics/"):
        response = client.get(ENDPOINTS + "chat/" + route)
        assert response.status_code == 409
        assert response.json()["state"] == state


def test_a_backend_that_does_not_answer_is_a_502(world: Any) -> None:
    make_endpoint(world, state=EndpointState.READY)
    fakes.BEHAVIOUR.metrics_error = ConnectionError("prometheus is away")
    response = world.api_client_for("viewer").get(ENDPOINTS + "chat/metrics/")
    assert response.status_code == 502
    assert "prometheus is away" in response.json()["detail"]


def test_reported_metrics_show_in_the_list(world: Any) -> None:
    endpoint = make_endpoint(world)
    services.record_metrics(endpoint, requests_per_second=2.0, latency_p95_ms=30.5, error_rate=0.0)
    (row,) = world.api_client_for("viewer").get(ENDPOINTS).json()["results"]
    assert (row["requests_per_second"], row["latency_p95_ms"], row["error_rate"]) == (
        2.0,
        30.5,
        0.0,
    )


def test_the_list_costs_the_same_queries_for_one_or_many(world: Any, tmp_path: Path) -> None:
    model_version(world, tmp_path)
    from tests.serving.factories import MODEL_SPEC

    client = world.api_client_for("viewer")
    make_endpoint(world, name="first", spec=MODEL_SPEC)
    with CaptureQueriesContext(connection) as one:
        assert client.get(ENDPOINTS).status_code == 200
    for number in range(6):
        make_endpoint(
            world, name=f"more-{number}", spec=MODEL_SPEC if number % 2 else ENDPOINT_SPEC
        )
    with CaptureQueriesContext(connection) as many:
        page = client.get(ENDPOINTS).json()
    assert len(page["results"]) == 7
    assert len(one) == len(many) == 2  # the caller's workspace and role; the page
    newest_first = [row["name"] for row in page["results"]]
    assert newest_first[0] == "more-5"
    assert newest_first[-1] == "first"
    paged = client.get(ENDPOINTS, {"limit": 3}).json()
    assert len(paged["results"]) == 3
    assert paged["next"]


def test_a_json_deployment_is_held_to_the_json_limit(world: Any, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = world.api_client_for("researcher").post(
        ENDPOINTS, {"config": "x" * 2000}, format="json"
    )
    assert response.status_code == 413
    assert "as JSON: the tau.yaml" in response.json()["detail"]


def test_make_runs_server_takes_a_deployments_zip(settings: Any) -> None:
    """Under ASGI the body is refused past its route's limit before the view: a deployment's
    is a submission's, not Django's 2.5 MiB for forms and JSON."""
    from runs.submission import MAX_SUBMISSION_BYTES
    from web.asgi import body_limit

    assert body_limit("api:endpoint-list", "POST") == MAX_SUBMISSION_BYTES
    assert body_limit("api:endpoint-invoke", "POST") == settings.TAU_ENDPOINT_MAX_BODY_BYTES
