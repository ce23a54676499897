"""Every answer of the REST API agrees with its OpenAPI schema (the one served at
``/api/v1/schema/``): status code documented, content type documented, body valid against
the declared schema with its components resolved (nullable fields, enums, required fields,
paginated envelopes). Validated with openapi-core, an OpenAPI 3.0 validator independent of
drf-spectacular, which writes the schema.

``CALLS`` holds one or more real calls per operation, successes and the refusals clients are
told to expect (400, 401, 403, 404, 409, 413, 429). ``test_every_operation_is_called`` fails
when the schema grows an operation that no call here exercises.
"""

from __future__ import annotations

import hashlib
import io
import json
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.http import HttpResponseBase
from django.urls import resolve
from django.utils import timezone
from openapi_core import OpenAPI
from openapi_core.contrib.django import DjangoOpenAPIRequest, DjangoOpenAPIResponse
from openapi_core.exceptions import OpenAPIError
from rest_framework.test import APIClient

from evidence import sealing
from evidence.models import SealRequest
from gpus.models import GpuNode
from identity import tokens
from runs import submission
from runs.artifacts import store_artifact
from runs.models import Checkpoint, MetricPoint, RunEvent, RunState
from runs.state import transition
from serving.models import EndpointState
from serving.workload_tokens import issue_endpoint_token
from tests.conftest import World
from tests.evidence.helpers import TEST_SIGNING_KEY
from tests.pipelines.factories import PIPELINE, make_pipeline, pipeline_zip
from tests.runs.factories import TINY_SPEC, cluster_quota, make_run, zip_bytes
from tests.runs.test_api import attempt_with_log, bearer, run_token
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
from tests.serving.upstream import upstream_server
from workspaces.models import Membership, Workspace

pytestmark = pytest.mark.django_db

API = "/api/v1/workspaces"
WS = f"{API}/{{workspace_slug}}"
RUN = f"{WS}/runs/{{run_name}}"


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    """The schema as the API serves it (to any authenticated caller; no database needed)."""
    client = APIClient()
    client.force_authenticate(get_user_model()(username="schema-reader"))
    response = client.get("/api/v1/schema/", {"format": "json"})
    assert response.status_code == 200
    document: dict[str, Any] = response.json()
    return document


@pytest.fixture(scope="module")
def openapi(schema: dict[str, Any]) -> OpenAPI:
    return OpenAPI.from_dict(schema)


@pytest.fixture
def world(module_world: World) -> World:
    """The cast, made once for the module's cases (tests/conftest.module_world)."""
    return module_world


def test_the_schema_describes_the_api_tokens(schema: dict[str, Any]) -> None:
    """identity/schema.py's scheme is registered by the schema's own views (not at start-up,
    test_startup.py): the served schema still names it."""
    assert schema["components"]["securitySchemes"]["tauToken"] == {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "tau_<key>_<secret>",
        "description": "An API token from the portal's API tokens page or manage.py create_token.",
    }


def operations(schema: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (method.upper(), path)
        for path, item in schema["paths"].items()
        for method in item
        if method in {"get", "put", "post", "patch", "delete"}
    }


class AnsweredRequest(DjangoOpenAPIRequest):
    """The request as openapi-core needs it to find the operation an answer belongs to. Its
    body is not needed (and is gone once a view has read a form); its route is Django's,
    also for an answer a middleware gave before the URL was resolved."""

    @property
    def body(self) -> bytes:
        return b""

    @property
    def path_pattern(self) -> str | None:
        if self.request.resolver_match is None:
            self.request.resolver_match = resolve(self.request.path)
        return super().path_pattern


def conforms(openapi: OpenAPI, response: HttpResponseBase) -> None:
    """Fail with every problem openapi-core finds in the response."""
    request = response.wsgi_request  # type: ignore[attr-defined]
    try:
        answer = DjangoOpenAPIResponse(response)  # type: ignore[arg-type]  # streamed ones too
        openapi.validate_response(AnsweredRequest(request), answer)
    except OpenAPIError as exc:
        details = [str(exc)]
        cause = exc.__cause__
        for error in getattr(cause, "schema_errors", None) or []:
            where = "/".join(str(part) for part in error.absolute_path) or "(body)"
            details.append(f"  at {where}: {error.message}")
        if cause is not None and not getattr(cause, "schema_errors", None):
            details.append(f"  {cause!r}")
        raise AssertionError(
            f"{request.method} {request.get_full_path()} answered {response.status_code}, "
            "which the schema does not describe:\n" + "\n".join(details)
        ) from None


# --- The calls ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    method: str
    path: str  # the operation's path in the schema
    status: int
    make: Callable[[Any, Path, Any], HttpResponseBase]
    name: str


CALLS: list[Call] = []


def call(method: str, path: str, status: int) -> Callable[[Callable[..., Any]], Any]:
    def register(make: Callable[[Any, Path, Any], HttpResponseBase]) -> Any:
        CALLS.append(Call(method, path, status, make, make.__name__))
        return make

    return register


def client(world: Any, who: str = "researcher") -> APIClient:
    return world.api_client_for(who)  # type: ignore[no-any-return]


def run_path(name: str, action: str = "") -> str:
    return f"{API}/alpha/runs/{name}/{action}"


def finished_run(world: Any) -> Any:
    return make_run(world, state=RunState.FAILED)


@call("GET", f"{API}/", 200)
def workspaces(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world).get(f"{API}/")


@call("GET", f"{API}/", 401)
def workspaces_anonymous(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "anonymous").get(f"{API}/")


@call("GET", "/api/v1/me/", 200)
def me_with_a_token(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    token = tokens.issue_token(
        user=world.users["researcher"], name="laptop", workspace=world.alpha, read_only=True
    )
    return bearer(token.plaintext).get("/api/v1/me/")


@call("GET", "/api/v1/me/", 200)
def me_signed_in(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "platform_admin").get("/api/v1/me/")


@call("GET", "/api/v1/me/", 401)
def me_anonymous(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "anonymous").get("/api/v1/me/")


@call("GET", "/api/v1/me/", 403)
def me_with_a_run_token(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    _, caller = reporter(world, tmp)
    return caller.get("/api/v1/me/")


def guesser() -> APIClient:
    """A caller with a token that does not exist, from an address of its own (failures are
    counted per address and key in the shared cache, across tests)."""
    address = ".".join(str(secrets.randbelow(250) + 1) for _ in range(4))
    caller = APIClient(REMOTE_ADDR=address)
    key = "".join(secrets.choice(string.ascii_lowercase) for _ in range(12))
    caller.credentials(HTTP_AUTHORIZATION=f"Bearer tau_{key}_{'x' * 40}")
    return caller


@call("GET", f"{API}/", 401)
def workspaces_bad_token(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return guesser().get(f"{API}/")


@call("GET", f"{API}/", 429)
def workspaces_too_many_bad_tokens(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    settings.TAU_AUTH_FAILURES_PER_ADDRESS = 1
    caller = guesser()
    assert caller.get(f"{API}/").status_code == 401
    return caller.get(f"{API}/")


@call("GET", f"{WS}/", 200)
def workspace(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world).get(f"{API}/alpha/")


@call("GET", f"{WS}/", 200)
def workspace_as_staff(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "platform_admin").get(f"{API}/alpha/")


@call("GET", f"{WS}/", 404)
def workspace_of_others(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "outsider").get(f"{API}/alpha/")


@call("PATCH", f"{WS}/", 200)
def workspace_change(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "workspace_admin").patch(
        f"{API}/alpha/", {"description": "Vision research"}, format="json"
    )


@call("PATCH", f"{WS}/", 400)
def workspace_change_refused(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "workspace_admin").patch(
        f"{API}/alpha/", {"name": "x" * 1000}, format="json"
    )


@call("PATCH", f"{WS}/", 403)
def workspace_change_by_a_researcher(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world).patch(f"{API}/alpha/", {"description": "mine"}, format="json")


@call("PATCH", f"{WS}/", 413)
def workspace_change_too_large(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "workspace_admin").generic(
        "PATCH",
        f"{API}/alpha/",
        "{}",
        content_type="application/json",
        CONTENT_LENGTH=str(50 * 2**20),
    )


def staff(world: Any) -> APIClient:
    return client(world, "platform_admin")


NEW_WORKSPACE = {
    "slug": "gamma",
    "name": "Gamma",
    "cohort": "research",
    "members": [{"username": "alice", "role": "admin"}],
    "quotas": [
        {"flavor": "h100", "resource": "nvidia.com/gpu", "nominal": "4", "lending_limit": "2"}
    ],
}


@call("POST", f"{API}/", 201)
def workspace_create(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return staff(world).post(f"{API}/", NEW_WORKSPACE, format="json")


@call("POST", f"{API}/", 400)
def workspace_create_refused(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    wrong = {**NEW_WORKSPACE, "quotas": [{"flavor": "nope", "resource": "cpu", "nominal": "1"}]}
    return staff(world).post(f"{API}/", wrong, format="json")


@call("POST", f"{API}/", 401)
def workspace_create_anonymous(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "anonymous").post(f"{API}/", NEW_WORKSPACE, format="json")


@call("POST", f"{API}/", 403)
def workspace_create_by_a_researcher(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world).post(f"{API}/", NEW_WORKSPACE, format="json")


@call("POST", f"{API}/", 413)
def workspace_create_too_large(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return staff(world).generic(
        "POST", f"{API}/", "{}", content_type="application/json", CONTENT_LENGTH=str(50 * 2**20)
    )


@call("PATCH", f"{WS}/", 200)
def workspace_quotas_replaced_by_staff(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    quotas = [{"flavor": "h100", "resource": "nvidia.com/gpu", "nominal": "16"}]
    return staff(world).patch(f"{API}/alpha/", {"quotas": quotas}, format="json")


FLAVORS = "/api/v1/flavors"
COHORTS = "/api/v1/cohorts"


@call("GET", f"{FLAVORS}/", 200)
def flavors(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return staff(world).get(f"{FLAVORS}/")


@call("GET", f"{FLAVORS}/", 401)
def flavors_anonymous(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "anonymous").get(f"{FLAVORS}/")


@call("GET", f"{FLAVORS}/", 403)
def flavors_for_a_researcher(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world).get(f"{FLAVORS}/")


@call("POST", f"{FLAVORS}/", 201)
def flavor_create(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    body = {"name": "cpu", "node_labels": {"pool": "cpu"}, "tolerations": []}
    return staff(world).post(f"{FLAVORS}/", body, format="json")


@call("POST", f"{FLAVORS}/", 400)
def flavor_create_refused(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return staff(world).post(f"{FLAVORS}/", {"name": "h100"}, format="json")


@call("GET", f"{FLAVORS}/{{name}}/", 200)
def flavor(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return staff(world).get(f"{FLAVORS}/h100/")


@call("GET", f"{FLAVORS}/{{name}}/", 404)
def flavor_missing(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return staff(world).get(f"{FLAVORS}/nope/")


@call("PATCH", f"{FLAVORS}/{{name}}/", 200)
def flavor_change(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return staff(world).patch(f"{FLAVORS}/h100/", {"gpu_model": "H100"}, format="json")


@call("PATCH", f"{FLAVORS}/{{name}}/", 400)
def flavor_change_refused(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    wrong = {"tolerations": [{"operator": "Sometimes"}]}
    return staff(world).patch(f"{FLAVORS}/h100/", wrong, format="json")


@call("GET", f"{COHORTS}/", 200)
def cohorts(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return staff(world).get(f"{COHORTS}/")


@call("POST", f"{COHORTS}/", 201)
def cohort_create(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return staff(world).post(f"{COHORTS}/", {"name": "vision"}, format="json")


@call("POST", f"{COHORTS}/", 403)
def cohort_create_by_a_researcher(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world).post(f"{COHORTS}/", {"name": "vision"}, format="json")


@call("GET", f"{COHORTS}/{{name}}/", 200)
def cohort(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return staff(world).get(f"{COHORTS}/research/")


@call("PATCH", f"{COHORTS}/{{name}}/", 200)
def cohort_change(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return staff(world).patch(f"{COHORTS}/research/", {"description": "All labs"}, format="json")


@call("PATCH", f"{COHORTS}/{{name}}/", 400)
def cohort_change_refused(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return staff(world).patch(f"{COHORTS}/research/", {"name": "Not A Name"}, format="json")


@call("GET", f"{WS}/quota/", 200)
def quota(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(f"{API}/alpha/quota/")


@call("GET", f"{WS}/members/", 200)
def members(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(f"{API}/alpha/members/")


@call("POST", f"{WS}/members/", 201)
def member_add(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    users = get_user_model()._default_manager
    gamma = Workspace.unscoped_objects.create(
        slug="gamma", name="Gamma", namespace="tau-gamma", local_queue="gamma"
    )
    colleague = users.create_user(username="gus")
    Membership.objects.create(workspace=gamma, user=world.users["workspace_admin"], role="viewer")
    Membership.objects.create(workspace=gamma, user=colleague, role="viewer")
    return client(world, "workspace_admin").post(
        f"{API}/alpha/members/", {"username": "gus", "role": "viewer"}, format="json"
    )


@call("POST", f"{WS}/members/", 400)
def member_add_unknown(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "workspace_admin").post(
        f"{API}/alpha/members/", {"username": "nobody", "role": "viewer"}, format="json"
    )


@call("GET", f"{WS}/members/{{username}}/", 200)
def member(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(f"{API}/alpha/members/rob/")


@call("GET", f"{WS}/members/{{username}}/", 404)
def member_unknown(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(f"{API}/alpha/members/nobody/")


@call("PATCH", f"{WS}/members/{{username}}/", 200)
def member_change(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "workspace_admin").patch(
        f"{API}/alpha/members/rob/", {"role": "viewer"}, format="json"
    )


@call("PATCH", f"{WS}/members/{{username}}/", 400)
def member_change_last_admin(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "workspace_admin").patch(
        f"{API}/alpha/members/alice/", {"role": "viewer"}, format="json"
    )


@call("DELETE", f"{WS}/members/{{username}}/", 204)
def member_remove(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "workspace_admin").delete(f"{API}/alpha/members/vera/")


@call("DELETE", f"{WS}/members/{{username}}/", 403)
def member_remove_by_a_viewer(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").delete(f"{API}/alpha/members/rob/")


@call("GET", f"{WS}/runs/", 200)
def runs(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    make_run(world)
    finished_run(world)
    return client(world, "viewer").get(f"{API}/alpha/runs/", {"limit": 1})


@call("GET", f"{WS}/runs/", 200)
def runs_second_page(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    make_run(world)
    make_run(world)
    caller = client(world, "viewer")
    first = caller.get(f"{API}/alpha/runs/", {"limit": 1}).json()
    return caller.get(first["next"])


@call("GET", f"{WS}/runs/", 400)
def runs_bad_state(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(f"{API}/alpha/runs/", {"state": "bogus"})


@call("GET", f"{WS}/runs/", 400)
def runs_bad_limit(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(f"{API}/alpha/runs/", {"limit": "many"})


@call("GET", f"{WS}/runs/", 404)
def runs_bad_cursor(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(f"{API}/alpha/runs/", {"cursor": "cD1ub3QtYS10aW1l"})


@call("POST", f"{WS}/runs/", 201)
def submit(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world).post(
        f"{API}/alpha/runs/",
        {"spec": SimpleUploadedFile("tau.yaml", TINY_SPEC.replace(b"main.py", b"echo hi"))},
        format="multipart",
    )


@call("POST", f"{WS}/runs/", 400)
def submit_refused(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world).post(
        f"{API}/alpha/runs/",
        {"spec": SimpleUploadedFile("tau.yaml", b"schema_version: 1\nname: Bad_Name\n")},
        format="multipart",
    )


@call("POST", f"{WS}/runs/", 201)
def submit_spec_as_text(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world).post(
        f"{API}/alpha/runs/",
        {"spec": TINY_SPEC.replace(b"main.py", b"echo hi").decode()},
        format="multipart",
    )


@call("POST", f"{WS}/runs/", 400)
def submit_without_spec(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world).post(f"{API}/alpha/runs/", {}, format="multipart")


@call("POST", f"{WS}/runs/", 403)
def submit_by_a_viewer(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").post(
        f"{API}/alpha/runs/", {"spec": SimpleUploadedFile("tau.yaml", TINY_SPEC)}
    )


@call("POST", f"{WS}/runs/", 413)
def submit_too_large(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world).generic(
        "POST",
        f"{API}/alpha/runs/",
        "",
        content_type="multipart/form-data; boundary=x",
        CONTENT_LENGTH=str(2**30),
    )


@call("GET", f"{RUN}/", 200)
def run(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(run_path(make_run(world).name))


@call("GET", f"{RUN}/", 200)
def run_with_attempts(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran = finished_run(world)
    attempt_with_log(ran, 1, b"hello\n", tmp)
    return client(world, "viewer").get(run_path(ran.name))


@call("GET", f"{RUN}/", 404)
def run_unknown(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(run_path("nosuchrun"))


@call("POST", f"{RUN}/cancel/", 200)
def cancel(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world).post(run_path(make_run(world).name, "cancel/"))


@call("POST", f"{RUN}/cancel/", 409)
def cancel_finished(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world).post(run_path(finished_run(world).name, "cancel/"))


@call("POST", f"{RUN}/cancel/", 403)
def cancel_by_a_viewer(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").post(run_path(make_run(world).name, "cancel/"))


@call("POST", f"{RUN}/resume/", 200)
def resume(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world).post(run_path(finished_run(world).name, "resume/"), {}, format="json")


@call("POST", f"{RUN}/resume/", 409)
def resume_live(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world).post(run_path(make_run(world).name, "resume/"), {}, format="json")


@call("POST", f"{RUN}/resume/", 415)
def resume_with_a_form(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world).post(
        run_path(finished_run(world).name, "resume/"), {"checkpoint": "1"}, format="multipart"
    )


@call("POST", f"{RUN}/resume/", 404)
def resume_from_no_checkpoint(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world).post(
        run_path(finished_run(world).name, "resume/"), {"checkpoint": 999999}, format="json"
    )


@call("GET", f"{RUN}/events/", 200)
def events(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran = make_run(world)
    client(world).post(run_path(ran.name, "cancel/"))
    return client(world, "viewer").get(run_path(ran.name, "events/"), {"limit": 1})


@call("GET", f"{RUN}/events/", 400)
def events_bad_limit(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(run_path(make_run(world).name, "events/"), {"limit": 0})


@call("GET", f"{RUN}/logs/", 200)
def logs(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran = make_run(world)
    attempt_with_log(ran, 1, b"line 1\nline 2\n", tmp)
    return client(world, "viewer").get(run_path(ran.name, "logs/"), {"tail": 1})


@call("GET", f"{RUN}/logs/", 200)
def logs_before_any_attempt(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(run_path(make_run(world).name, "logs/"))


@call("GET", f"{RUN}/logs/", 200)
def logs_as_text(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran = make_run(world)
    attempt_with_log(ran, 1, b"line 1\nline 2\n", tmp)
    return client(world, "viewer").get(run_path(ran.name, "logs/"), {"format": "text"})


@call("GET", f"{RUN}/logs/", 404)
def logs_of_no_such_attempt(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(run_path(make_run(world).name, "logs/"), {"attempt": 9})


@call("GET", f"{RUN}/logs/", 404)
def logs_as_text_of_no_such_attempt(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(
        run_path(make_run(world).name, "logs/"), {"attempt": "9", "format": "text"}
    )


@call("GET", f"{RUN}/logs/", 400)
def logs_bad_offset(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(run_path(make_run(world).name, "logs/"), {"offset": "x"})


@call("GET", f"{RUN}/metrics/", 200)
def metrics(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran = make_run(world)
    MetricPoint.objects.bulk_create(
        MetricPoint(run=ran, attempt=1, key="loss", step=step, value=1 / (step + 1))
        for step in range(20)
    )
    return client(world, "viewer").get(run_path(ran.name, "metrics/"), {"max_points": 5})


@call("GET", f"{RUN}/metrics/", 400)
def metrics_bad_max_points(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(
        run_path(make_run(world).name, "metrics/"), {"max_points": 0}
    )


@call("GET", f"{RUN}/checkpoints/", 200)
def checkpoints(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran = finished_run(world)
    Checkpoint.objects.create(run=ran, attempt=1, step=10, path="/somewhere/step-10")
    Checkpoint.objects.create(run=ran, attempt=1, step=20, path="/somewhere/step-20", size=7)
    return client(world, "viewer").get(run_path(ran.name, "checkpoints/"))


@call("GET", f"{RUN}/bundle/", 200)
def bundle(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(run_path(make_run(world).name, "bundle/"))


@call("GET", f"{RUN}/bundle/", 404)
def bundle_of_a_run_without_one(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran = make_run(world, spec=TINY_SPEC.replace(b"main.py", b"echo hi"), files=None)
    return client(world, "viewer").get(run_path(ran.name, "bundle/"))


def reporter(world: Any, tmp: Path) -> tuple[Any, APIClient]:
    ran = make_run(world)
    return ran, bearer(run_token(world, ran))


@call("POST", f"{RUN}/report/metrics/", 202)
def report_metrics(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran, caller = reporter(world, tmp)
    return caller.post(
        run_path(ran.name, "report/metrics/"), {"rows": [{"step": 1, "loss": 0.5}]}, format="json"
    )


@call("POST", f"{RUN}/report/metrics/", 400)
def report_metrics_refused(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran, caller = reporter(world, tmp)
    return caller.post(
        run_path(ran.name, "report/metrics/"), {"rows": [{"step": "x"}]}, format="json"
    )


@call("POST", f"{RUN}/report/metrics/", 400)
def report_metrics_not_json(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran, caller = reporter(world, tmp)
    return caller.post(run_path(ran.name, "report/metrics/"), "{", content_type="application/json")


@call("POST", f"{RUN}/report/metrics/", 403)
def report_metrics_as_a_person(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world).post(
        run_path(make_run(world).name, "report/metrics/"), {"rows": []}, format="json"
    )


@call("POST", f"{RUN}/report/metrics/", 429)
def report_metrics_too_often(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    from runs.api import views

    ran, caller = reporter(world, tmp)
    limit = views.REPORTS_PER_MINUTE
    views.REPORTS_PER_MINUTE = 0
    try:
        return caller.post(run_path(ran.name, "report/metrics/"), {"rows": []}, format="json")
    finally:
        views.REPORTS_PER_MINUTE = limit


@call("POST", f"{RUN}/report/checkpoints/", 201)
def report_checkpoint(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran, caller = reporter(world, tmp)
    return caller.post(
        run_path(ran.name, "report/checkpoints/"), {"step": 3, "path": "step-3"}, format="json"
    )


@call("POST", f"{RUN}/report/checkpoints/", 400)
def report_checkpoint_elsewhere(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran, caller = reporter(world, tmp)
    return caller.post(
        run_path(ran.name, "report/checkpoints/"), {"step": 3, "path": "/etc"}, format="json"
    )


@call("POST", f"{RUN}/report/trials/", 202)
def report_trials(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran, caller = reporter(world, tmp)
    trial = {"trial": 1, "config": {"lr": 0.1}, "state": "succeeded", "exit_code": 0}
    return caller.post(run_path(ran.name, "report/trials/"), {"trials": [trial]}, format="json")


@call("POST", f"{RUN}/report/trials/", 400)
def report_trials_refused(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran, caller = reporter(world, tmp)
    trial = {"trial": 1, "config": {}, "state": "exploded"}
    return caller.post(run_path(ran.name, "report/trials/"), {"trials": [trial]}, format="json")


@call("POST", f"{RUN}/report/events/", 201)
def report_event(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran, caller = reporter(world, tmp)
    return caller.post(
        run_path(ran.name, "report/events/"),
        {"kind": "epoch", "message": "epoch 1", "data": {"epoch": 1}},
        format="json",
    )


@call("POST", f"{RUN}/report/events/", 400)
def report_event_refused(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran, caller = reporter(world, tmp)
    return caller.post(run_path(ran.name, "report/events/"), {"kind": "Bad Kind"}, format="json")


@call("POST", f"{RUN}/report/events/", 404)
def report_event_for_another_run(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    _, caller = reporter(world, tmp)
    return caller.post(
        run_path(make_run(world).name, "report/events/"), {"kind": "epoch"}, format="json"
    )


@call("POST", f"{RUN}/report/data-staged/", 201)
def report_data_staged(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran, caller = reporter(world, tmp)
    body = {"files": 3, "bytes": 1024, "seconds": 0.5}
    return caller.post(run_path(ran.name, "report/data-staged/"), body, format="json")


@call("POST", f"{RUN}/report/data-staged/", 400)
def report_data_staged_refused(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran, caller = reporter(world, tmp)
    body = {"files": -1, "bytes": 1024, "seconds": 0.5}
    return caller.post(run_path(ran.name, "report/data-staged/"), body, format="json")


def run_reading_wiki(world: Any, tmp: Path, settings: Any) -> Any:
    """A run pinned to read alpha's dataset ``wiki@train`` (one file, ``text\n``)."""
    catalog_version(world, tmp, settings, "dataset")
    return make_run(world, spec=TINY_SPEC + b"inputs:\n  datasets:\n    - {name: wiki}\n")


@call("GET", f"{RUN}/data/", 200)
def run_data_listing(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran = run_reading_wiki(world, tmp, settings)
    return client(world, "viewer").get(run_path(ran.name, "data/"))


@call("GET", f"{RUN}/data/", 404)
def run_data_listing_of_another_run(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran = run_reading_wiki(world, tmp, settings)
    _, caller = reporter(world, tmp)
    return caller.get(run_path(ran.name, "data/"))


@call("GET", f"{RUN}/data/blobs/{{sha256}}/", 200)
def run_data_blob(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran = run_reading_wiki(world, tmp, settings)
    sha = hashlib.sha256(b"text\n").hexdigest()
    return client(world, "viewer").get(run_path(ran.name, f"data/blobs/{sha}/"))


@call("GET", f"{RUN}/data/blobs/{{sha256}}/", 404)
def run_data_blob_it_does_not_read(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran = run_reading_wiki(world, tmp, settings)
    sha = hashlib.sha256(b"other\n").hexdigest()
    return client(world, "viewer").get(run_path(ran.name, f"data/blobs/{sha}/"))


ARTIFACT_SPEC = TINY_SPEC + b"outputs:\n  artifacts: [model/**]\n"


def artifact_reporter(world: Any) -> tuple[Any, APIClient]:
    ran = make_run(world, spec=ARTIFACT_SPEC)
    return ran, bearer(run_token(world, ran))


def upload_artifact(caller: APIClient, ran: Any, path: str, body: bytes) -> HttpResponseBase:
    return caller.post(
        run_path(ran.name, f"report/artifacts/?path={path}"),
        body,
        content_type="application/octet-stream",
    )


@call("POST", f"{RUN}/report/artifacts/", 201)
def report_artifact(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran, caller = artifact_reporter(world)
    return upload_artifact(caller, ran, "model/w.pt", b"weights")


@call("POST", f"{RUN}/report/artifacts/", 400)
def report_artifact_undeclared(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran, caller = artifact_reporter(world)
    return upload_artifact(caller, ran, "notes.txt", b"x")


@call("POST", f"{RUN}/report/artifacts/", 413)
def report_artifact_over_the_limit(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    settings.TAU_ARTIFACT_MAX_BYTES_PER_RUN = 3
    ran, caller = artifact_reporter(world)
    return upload_artifact(caller, ran, "model/w.pt", b"weights")


@call("GET", f"{RUN}/artifacts/", 200)
def artifacts_list(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran = make_run(world, spec=ARTIFACT_SPEC)
    store_artifact(run=ran, attempt=1, name="model/w.pt", source=io.BytesIO(b"w"))
    return client(world, "viewer").get(run_path(ran.name, "artifacts/"))


@call("GET", f"{RUN}/artifacts/{{artifact_path}}", 200)
def artifact_download(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran = make_run(world, spec=ARTIFACT_SPEC)
    store_artifact(run=ran, attempt=1, name="model/w.pt", source=io.BytesIO(b"w"))
    return client(world, "viewer").get(run_path(ran.name, "artifacts/model/w.pt"))


@call("GET", f"{RUN}/artifacts/{{artifact_path}}", 404)
def artifact_not_kept(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(run_path(make_run(world).name, "artifacts/model/w.pt"))


def sealed_run(world: Any, settings: Any) -> Any:
    settings.TAU_EVIDENCE_SIGNING_KEY = TEST_SIGNING_KEY
    ran = make_run(world)
    transition(ran, RunState.QUEUED)
    transition(ran, RunState.CANCELLED)
    assert sealing.seal(SealRequest.objects.for_workspace(world.alpha).get(run=ran).pk)
    return ran


# --- Pipelines (issue 35) ---------------------------------------------------------------------

PIPELINES = f"{API}/alpha/pipelines"
PL = f"{WS}/pipelines/{{name}}"


def pipeline_form(data: bytes | None = None) -> dict[str, Any]:
    return {"bundle": SimpleUploadedFile("pipeline.zip", data or pipeline_zip())}


@call("GET", f"{WS}/pipelines/", 200)
def pipeline_list(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    make_pipeline(world)
    return client(world, "viewer").get(f"{PIPELINES}/")


@call("POST", f"{WS}/pipelines/", 201)
def pipeline_submit(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world).post(f"{PIPELINES}/", pipeline_form(), format="multipart")


@call("POST", f"{WS}/pipelines/", 400)
def pipeline_submit_with_problems(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    broken = pipeline_zip(PIPELINE.replace("needs: [prepare]}", "needs: [nothing]}"))
    return client(world).post(f"{PIPELINES}/", pipeline_form(broken), format="multipart")


@call("POST", f"{WS}/pipelines/", 403)
def pipeline_submit_as_a_viewer(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").post(f"{PIPELINES}/", pipeline_form(), format="multipart")


@call("POST", f"{WS}/pipelines/", 413)
def pipeline_submit_too_large(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world).post(
        f"{PIPELINES}/",
        pipeline_form(),
        format="multipart",
        CONTENT_LENGTH=str(submission.MAX_SUBMISSION_BYTES + 1),
    )


@call("GET", f"{PL}/", 200)
def pipeline_detail(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(f"{PIPELINES}/{make_pipeline(world).name}/")


@call("GET", f"{PL}/", 404)
def pipeline_detail_missing(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(f"{PIPELINES}/nothing-here/")


@call("POST", f"{PL}/cancel/", 200)
def pipeline_cancel(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world).post(f"{PIPELINES}/{make_pipeline(world).name}/cancel/")


@call("POST", f"{PL}/cancel/", 403)
def pipeline_cancel_as_a_viewer(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").post(f"{PIPELINES}/{make_pipeline(world).name}/cancel/")


@call("POST", f"{PL}/cancel/", 409)
def pipeline_cancel_of_one_ended(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    name = make_pipeline(world).name
    client(world).post(f"{PIPELINES}/{name}/cancel/")  # prepare had not started: it ends now
    return client(world).post(f"{PIPELINES}/{name}/cancel/")


@call("GET", f"{PL}/evidence/", 200)
def pipeline_evidence(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    settings.TAU_EVIDENCE_SIGNING_KEY = TEST_SIGNING_KEY
    pipeline = make_pipeline(world)
    client(world).post(f"{PIPELINES}/{pipeline.name}/cancel/")
    for request in SealRequest.objects.unscoped().filter(sealed_at__isnull=True):
        assert sealing.seal(request.pk)
    return client(world, "viewer").get(f"{PIPELINES}/{pipeline.name}/evidence/")


@call("GET", f"{PL}/evidence/", 409)
def pipeline_evidence_while_running(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(f"{PIPELINES}/{make_pipeline(world).name}/evidence/")


@call("POST", f"{PL}/resume/", 200)
def pipeline_resume(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    name = make_pipeline(world).name
    client(world).post(f"{PIPELINES}/{name}/cancel/")
    return client(world).post(f"{PIPELINES}/{name}/resume/", {"rerun": ["train"]}, format="json")


@call("POST", f"{PL}/resume/", 400)
def pipeline_resume_of_a_stage_it_lacks(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    name = make_pipeline(world).name
    return client(world).post(f"{PIPELINES}/{name}/resume/", {"rerun": ["nope"]}, format="json")


@call("POST", f"{PL}/resume/", 403)
def pipeline_resume_as_a_viewer(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    name = make_pipeline(world).name
    return client(world, "viewer").post(f"{PIPELINES}/{name}/resume/", {}, format="json")


@call("POST", f"{PL}/resume/", 409)
def pipeline_resume_of_one_running(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    name = make_pipeline(world).name
    return client(world).post(f"{PIPELINES}/{name}/resume/", {}, format="json")


# --- Endpoints (issue 34) ---------------------------------------------------------------------

ENDPOINTS = f"{API}/alpha/endpoints"
EP = f"{WS}/endpoints/{{name}}"


def endpoints_here(settings: Any) -> None:
    """This machine's backend runs endpoints (the serving tests' fake; no executor does yet)."""
    settings.TAU_BACKEND_CLASSES = fakes.backend_classes(settings)
    fakes.reset()


def endpoint(world: Any, settings: Any, **kwargs: Any) -> Any:
    endpoints_here(settings)
    return make_endpoint(world, **kwargs)


def deployment_form(spec: bytes = ENDPOINT_SPEC) -> dict[str, Any]:
    return {
        "spec": SimpleUploadedFile("tau.yaml", spec),
        "bundle": SimpleUploadedFile("project.zip", zip_bytes(ENDPOINT_FILES)),
    }


@call("GET", f"{WS}/endpoints/", 200)
def endpoint_list(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    endpoint(world, settings)
    return client(world, "viewer").get(f"{ENDPOINTS}/")


@call("POST", f"{WS}/endpoints/", 201)
def endpoint_deploy(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    endpoints_here(settings)
    return client(world).post(f"{ENDPOINTS}/", deployment_form(), format="multipart")


@call("POST", f"{WS}/endpoints/", 201)
def endpoint_deploy_as_json(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    endpoints_here(settings)
    return client(world).post(
        f"{ENDPOINTS}/", {"config": ENDPOINT_SPEC.decode(), "name": "from-json"}, format="json"
    )


@call("POST", f"{WS}/endpoints/", 400)
def endpoint_deploy_of_a_run(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    endpoints_here(settings)
    return client(world).post(f"{ENDPOINTS}/", deployment_form(RUN_SPEC), format="multipart")


@call("POST", f"{WS}/endpoints/", 409)
def endpoint_deploy_without_a_backend(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    settings.TAU_BACKEND_CLASSES = fakes.without_endpoints(settings)
    return client(world).post(f"{ENDPOINTS}/", deployment_form(), format="multipart")


@call("POST", f"{WS}/endpoints/", 403)
def endpoint_deploy_as_a_viewer(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").post(f"{ENDPOINTS}/", deployment_form(), format="multipart")


@call("GET", f"{EP}/", 200)
def endpoint_detail(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(f"{ENDPOINTS}/{endpoint(world, settings).name}/")


@call("GET", f"{EP}/", 404)
def endpoint_detail_missing(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(f"{ENDPOINTS}/nothing-here/")


@call("PATCH", f"{EP}/", 200)
def endpoint_scale(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    name = endpoint(world, settings, state=EndpointState.READY).name
    return client(world).patch(f"{ENDPOINTS}/{name}/", {"replicas": 2}, format="json")


@call("PATCH", f"{EP}/", 400)
def endpoint_update_with_a_missing_model(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    name = endpoint(world, settings).name
    return client(world).patch(
        f"{ENDPOINTS}/{name}/", {"model": {"name": "nope", "version": "1"}}, format="json"
    )


@call("PATCH", f"{EP}/", 409)
def endpoint_scale_that_autoscales(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    name = endpoint(world, settings, spec=AUTOSCALING_SPEC).name
    return client(world).patch(f"{ENDPOINTS}/{name}/", {"replicas": 2}, format="json")


@call("PATCH", f"{EP}/", 403)
def endpoint_scale_as_a_viewer(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    name = endpoint(world, settings).name
    return client(world, "viewer").patch(f"{ENDPOINTS}/{name}/", {"replicas": 2}, format="json")


@call("DELETE", f"{EP}/", 204)
def endpoint_delete(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world).delete(f"{ENDPOINTS}/{endpoint(world, settings).name}/")


@call("GET", f"{EP}/evidence/", 200)
def endpoint_evidence(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    name = endpoint(world, settings).name
    return client(world, "viewer").get(f"{ENDPOINTS}/{name}/evidence/")


@call("GET", f"{EP}/logs/", 200)
def endpoint_logs(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    name = endpoint(world, settings, state=EndpointState.READY).name
    return client(world, "viewer").get(f"{ENDPOINTS}/{name}/logs/", {"tail": 10})


@call("GET", f"{EP}/logs/", 409)
def endpoint_logs_when_stopped(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    name = endpoint(world, settings, state=EndpointState.STOPPED).name
    return client(world, "viewer").get(f"{ENDPOINTS}/{name}/logs/")


@call("GET", f"{EP}/logs/", 400)
def endpoint_logs_of_an_odd_replica(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    name = endpoint(world, settings, state=EndpointState.READY).name
    return client(world, "viewer").get(f"{ENDPOINTS}/{name}/logs/", {"replica": "../x"})


@call("GET", f"{EP}/metrics/", 200)
def endpoint_metrics(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    name = endpoint(world, settings, state=EndpointState.READY).name
    return client(world, "viewer").get(f"{ENDPOINTS}/{name}/metrics/")


@call("GET", f"{EP}/metrics/", 409)
def endpoint_metrics_when_failed(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    name = endpoint(world, settings, state=EndpointState.FAILED).name
    return client(world, "viewer").get(f"{ENDPOINTS}/{name}/metrics/")


@call("GET", f"{EP}/metrics/", 502)
def endpoint_metrics_unanswered(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    name = endpoint(world, settings, state=EndpointState.READY).name
    fakes.BEHAVIOUR.metrics_error = ConnectionError("no answer")
    return client(world, "viewer").get(f"{ENDPOINTS}/{name}/metrics/")


def invoker(world: Any) -> APIClient:
    issued = tokens.issue_token(
        user=world.users["viewer"], name="invoker", scopes=["endpoints:invoke"]
    )
    return bearer(issued.plaintext)


@call("POST", f"{EP}/invoke/{{path}}", 200)
def endpoint_invoke(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    name = endpoint(world, settings, state=EndpointState.READY).name
    with upstream_server() as upstream:
        fakes.BEHAVIOUR.address = upstream.address
        response = invoker(world).post(
            f"{ENDPOINTS}/{name}/invoke/echo", {"prompt": "hi"}, format="json"
        )
        # Read while the endpoint is there; the check below reads it again.
        content = b"".join(response.streaming_content)  # type: ignore[attr-defined]
    response.streaming_content = [content]  # type: ignore[attr-defined]
    return response


@call("POST", f"{EP}/invoke/{{path}}", 409)
def endpoint_invoke_while_deploying(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    name = endpoint(world, settings).name
    return invoker(world).post(f"{ENDPOINTS}/{name}/invoke/echo", {}, format="json")


@call("POST", f"{EP}/invoke/{{path}}", 403)
def endpoint_invoke_without_the_scope(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    name = endpoint(world, settings, state=EndpointState.READY).name
    plain = tokens.issue_token(user=world.users["viewer"], name="plain")
    return bearer(plain.plaintext).post(f"{ENDPOINTS}/{name}/invoke/echo", {}, format="json")


@call("POST", f"{EP}/invoke/{{path}}", 413)
def endpoint_invoke_too_large(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    settings.TAU_ENDPOINT_MAX_BODY_BYTES = 10
    name = endpoint(world, settings, state=EndpointState.READY).name
    return invoker(world).post(
        f"{ENDPOINTS}/{name}/invoke/echo", b"x" * 11, content_type="application/octet-stream"
    )


@call("POST", f"{EP}/invoke/{{path}}", 502)
def endpoint_invoke_without_an_address(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    name = endpoint(world, settings, state=EndpointState.READY).name
    return invoker(world).post(f"{ENDPOINTS}/{name}/invoke/echo", {}, format="json")


@call("GET", f"{EP}/invoke/{{path}}", 200)
def endpoint_invoke_by_get(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    name = endpoint(world, settings, state=EndpointState.READY).name
    with upstream_server() as upstream:
        fakes.BEHAVIOUR.address = upstream.address
        response = invoker(world).get(f"{ENDPOINTS}/{name}/invoke/v1/models")
        content = b"".join(response.streaming_content)  # type: ignore[attr-defined]
    response.streaming_content = [content]  # type: ignore[attr-defined]
    return response


@call("GET", f"{EP}/invoke/{{path}}", 409)
def endpoint_invoke_by_get_while_deploying(
    world: Any, tmp: Path, settings: Any
) -> HttpResponseBase:
    name = endpoint(world, settings).name
    return invoker(world).get(f"{ENDPOINTS}/{name}/invoke/v1/models")


@call("GET", f"{EP}/invoke/{{path}}", 403)
def endpoint_invoke_by_get_without_the_scope(
    world: Any, tmp: Path, settings: Any
) -> HttpResponseBase:
    name = endpoint(world, settings, state=EndpointState.READY).name
    plain = tokens.issue_token(user=world.users["viewer"], name="plain")
    return bearer(plain.plaintext).get(f"{ENDPOINTS}/{name}/invoke/v1/models")


@call("GET", f"{EP}/invoke/{{path}}", 502)
def endpoint_invoke_by_get_without_an_address(
    world: Any, tmp: Path, settings: Any
) -> HttpResponseBase:
    name = endpoint(world, settings, state=EndpointState.READY).name
    return invoker(world).get(f"{ENDPOINTS}/{name}/invoke/v1/models")


def endpoint_pod(world: Any, tmp: Path, settings: Any, **kwargs: Any) -> tuple[Any, APIClient]:
    """An endpoint and its own pods' client (its endpoint token)."""
    made = endpoint(world, settings, **kwargs)
    token = issue_endpoint_token(made)
    assert token is not None
    return made, bearer(token)


def endpoint_serving_a_model(world: Any, tmp: Path, settings: Any) -> tuple[Any, APIClient]:
    """alpha's tiny-gpt@production (one file, ``0123456789``) served by an endpoint."""
    settings.TAU_STORAGE_URL = f"file://{tmp / 'store'}"
    model_version(world, tmp)
    return endpoint_pod(world, tmp, settings, spec=MODEL_SPEC)


@call("GET", f"{EP}/bundle/", 200)
def endpoint_bundle(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    made, pod = endpoint_pod(world, tmp, settings)
    return pod.get(f"{ENDPOINTS}/{made.name}/bundle/")


@call("GET", f"{EP}/bundle/", 404)
def endpoint_bundle_without_a_zip(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    made = endpoint(world, settings, files=None)
    return client(world, "viewer").get(f"{ENDPOINTS}/{made.name}/bundle/")


@call("GET", f"{EP}/bundle/", 403)
def endpoint_bundle_with_a_run_token(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    made = endpoint(world, settings)
    _, caller = reporter(world, tmp)
    return caller.get(f"{ENDPOINTS}/{made.name}/bundle/")


@call("GET", f"{EP}/model/", 200)
def endpoint_model_listing(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    made, pod = endpoint_serving_a_model(world, tmp, settings)
    return pod.get(f"{ENDPOINTS}/{made.name}/model/")


@call("GET", f"{EP}/model/", 404)
def endpoint_model_listing_of_another(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    made, _ = endpoint_serving_a_model(world, tmp, settings)
    _, other = endpoint_pod(world, tmp, settings, name="other")
    return other.get(f"{ENDPOINTS}/{made.name}/model/")


@call("GET", f"{EP}/model/blobs/{{sha256}}/", 200)
def endpoint_model_blob(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    made, pod = endpoint_serving_a_model(world, tmp, settings)
    sha = hashlib.sha256(b"0123456789").hexdigest()
    return pod.get(f"{ENDPOINTS}/{made.name}/model/blobs/{sha}/")


@call("GET", f"{EP}/model/blobs/{{sha256}}/", 404)
def endpoint_model_blob_not_its(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    made, pod = endpoint_serving_a_model(world, tmp, settings)
    return pod.get(f"{ENDPOINTS}/{made.name}/model/blobs/{'0' * 64}/")


MODEL_STAGED = {"files": 1, "bytes": 10, "seconds": 0.5}


@call("POST", f"{EP}/report/model-staged/", 201)
def endpoint_report_model_staged(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    made, pod = endpoint_serving_a_model(world, tmp, settings)
    return pod.post(f"{ENDPOINTS}/{made.name}/report/model-staged/", MODEL_STAGED, format="json")


@call("POST", f"{EP}/report/model-staged/", 400)
def endpoint_report_model_staged_refused(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    made, pod = endpoint_pod(world, tmp, settings)
    body = {**MODEL_STAGED, "seconds": -1}
    return pod.post(f"{ENDPOINTS}/{made.name}/report/model-staged/", body, format="json")


@call("POST", f"{EP}/report/model-staged/", 403)
def endpoint_report_model_staged_by_a_member(
    world: Any, tmp: Path, settings: Any
) -> HttpResponseBase:
    made = endpoint(world, settings)
    return client(world).post(
        f"{ENDPOINTS}/{made.name}/report/model-staged/", MODEL_STAGED, format="json"
    )


@call("POST", f"{EP}/report/model-staged/", 404)
def endpoint_report_model_staged_for_another(
    world: Any, tmp: Path, settings: Any
) -> HttpResponseBase:
    made = endpoint(world, settings)
    _, other = endpoint_pod(world, tmp, settings, name="other")
    return other.post(f"{ENDPOINTS}/{made.name}/report/model-staged/", MODEL_STAGED, format="json")


@call("POST", f"{EP}/report/model-staged/", 429)
def endpoint_report_model_staged_too_often(
    world: Any, tmp: Path, settings: Any
) -> HttpResponseBase:
    from serving.api import workload

    made, pod = endpoint_pod(world, tmp, settings)
    limit = workload.REPORTS_PER_MINUTE
    workload.REPORTS_PER_MINUTE = 0
    try:
        return pod.post(
            f"{ENDPOINTS}/{made.name}/report/model-staged/", MODEL_STAGED, format="json"
        )
    finally:
        workload.REPORTS_PER_MINUTE = limit


@call("GET", f"{RUN}/evidence/", 200)
def evidence_export(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(run_path(sealed_run(world, settings).name, "evidence/"))


@call("GET", f"{RUN}/evidence/", 409)
def evidence_of_a_live_run(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(run_path(make_run(world).name, "evidence/"))


@call("GET", f"{RUN}/evidence/", 403)
def evidence_with_a_run_token(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran = sealed_run(world, settings)
    return bearer(run_token(world, ran)).get(run_path(ran.name, "evidence/"))


@call("GET", f"{RUN}/evidence/records/", 200)
def evidence_records(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran = sealed_run(world, settings)
    return client(world, "viewer").get(run_path(ran.name, "evidence/records/"))


@call("GET", f"{RUN}/evidence/records/{{ending_event}}/", 200)
def evidence_record(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    ran = sealed_run(world, settings)
    listed = client(world, "viewer").get(run_path(ran.name, "evidence/records/")).json()
    return client(world, "viewer").get(
        run_path(ran.name, f"evidence/records/{listed[0]['ending_event']}/")
    )


@call("GET", f"{RUN}/evidence/records/{{ending_event}}/", 404)
def evidence_record_not_sealed(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(run_path(make_run(world).name, "evidence/records/9/"))


@call("GET", "/api/v1/evidence/keys/", 200)
def evidence_keys(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    settings.TAU_EVIDENCE_SIGNING_KEY = TEST_SIGNING_KEY
    return APIClient().get("/api/v1/evidence/keys/")


def gpu_node(**fields: Any) -> GpuNode:
    return GpuNode.objects.create(
        **{
            "name": "gpu-h100-1",
            "source": "kubernetes",
            "pool": "gpu-h100",
            "gpus_total": 8,
            "gpus_allocatable": 7,
            "gpus_in_use": 4,
            "ready": True,
            "healthy": False,
            "problems": ["XIDErrors since 12:03 UTC: XID 79 — GPU has fallen off the bus"],
            "unhealthy_since": timezone.now(),
            "conditions": [
                {
                    "type": "XIDErrors",
                    "status": "True",
                    "reason": "",
                    "message": "XID 79",
                    "last_transition_time": "2026-12-01T12:03:07Z",
                    "gpu": True,
                    "problem": True,
                }
            ],
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
            "runs": [
                {"workspace": "alpha", "run": "r", "namespace": "tau-alpha", "pod": "p", "gpus": 4}
            ],
            **fields,
        }
    )


@call("GET", "/api/v1/gpus/nodes/", 200)
def gpu_nodes(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    gpu_node()
    gpu_node(name="gpu-h100-2", healthy=True, problems=[], unhealthy_since=None, runs=[])
    return client(world, "platform_admin").get("/api/v1/gpus/nodes/")


@call("GET", "/api/v1/gpus/nodes/", 403)
def gpu_nodes_for_a_researcher(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world).get("/api/v1/gpus/nodes/")


@call("GET", f"{RUN}/gpus/", 200)
def run_gpus(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    settings.TAU_BACKEND = "kubernetes"
    cluster_quota(world.alpha)
    run = make_run(world, spec=TINY_SPEC.replace(b"cpus: 1", b"cpus: 1\n  gpus: 2"))
    return client(world, "viewer").get(run_path(run.name, "gpus/"))


@call("GET", f"{RUN}/gpus/", 404)
def run_gpus_of_another_workspace(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "outsider").get(run_path(make_run(world).name, "gpus/"))


@call("GET", f"{WS}/usage/", 200)
def workspace_usage(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    from datetime import UTC, datetime
    from decimal import Decimal

    from tests.accounting.helpers import PREEMPTED, attempt_at
    from workspaces.models import WorkspaceBudget

    WorkspaceBudget.objects.create(workspace=world.alpha, gpu_hours=Decimal("40"))
    run = make_run(world)
    attempt_at(
        run, 1, datetime(2026, 11, 2, tzinfo=UTC), datetime(2026, 11, 2, 1, tzinfo=UTC), **PREEMPTED
    )
    return client(world, "viewer").get(f"{API}/alpha/usage/", {"month": "2026-11"})


def catalog_version(world: Any, tmp: Path, settings: Any, kind: str) -> None:
    """alpha's ``wiki`` (a dataset or a model): version 1 ready, aliased ``train``, made from
    version 1 of the dataset ``raw``; version 2 failed."""
    from catalog.ingest import asset_named, ingest_folder, set_alias

    settings.TAU_STORAGE_URL = f"file://{tmp / 'store'}"
    (tmp / "files").mkdir()
    (tmp / "files" / "part-0.txt").write_text("text\n")
    raw = ingest_folder(asset_named(world.alpha, "dataset", "raw"), tmp / "files", source="url")
    wiki = asset_named(world.alpha, kind, "wiki")
    set_alias(ingest_folder(wiki, tmp / "files", source="run", derived_from=[raw]), "train")
    (tmp / "files" / "link").symlink_to(tmp / "files" / "part-0.txt")
    ingest_folder(wiki, tmp / "files", source="prefix")


def catalog_read(kind: str, path: str, name: str, version: str, status: int, made: bool) -> None:
    """Register a GET of ``path`` (a catalog route under ``{kind}s/``) naming ``name`` and
    ``version``, on alpha with its catalog furnished (``made``) or empty."""

    def read(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
        if made:
            catalog_version(world, tmp, settings, kind)
        concrete = path.replace("{name}", name).replace("{version}", version)
        return client(world, "viewer").get(f"{API}/alpha/{kind}s/{concrete}")

    read.__name__ = f"{kind}_{path or 'list'}_{name}_{version}"
    call("GET", f"{WS}/{kind}s/{path}", status)(read)


for _kind in ("dataset", "model"):
    for _path in (
        "",
        "{name}/",
        "{name}/versions/",
        "{name}/versions/{version}/",
        "{name}/versions/{version}/files/",
    ):
        catalog_read(_kind, _path, "wiki", "train", 200, made=True)
        if "{version}" in _path:
            catalog_read(_kind, _path, "wiki", "2", 200, made=True)  # the failed version
        if _path:
            catalog_read(_kind, _path, "nothing", "1", 404, made=False)


def catalog_upload(world: Any, tmp: Path, settings: Any, kind: str) -> None:
    """alpha's ``wiki`` as :func:`catalog_version` makes it, and version 3: an upload
    declared as ``new.txt`` (``new\\n``) and ``other.txt``, nothing of them sent."""
    from catalog.ingest import asset_named
    from catalog.uploads import start_upload

    catalog_version(world, tmp, settings, kind)
    start_upload(asset_named(world.alpha, kind, "wiki"), declaration(b"new\n", b"other\n"))


def declaration(*contents: bytes) -> list[dict[str, Any]]:
    names = ["new.txt", "other.txt"]
    return [
        {"path": names[n], "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        for n, data in enumerate(contents)
    ]


def catalog_write(
    kind: str,
    method: str,
    path: str,
    status: int,
    *,
    concrete: str,
    who: str = "researcher",
    body: dict[str, Any] | bytes | None = None,
    headers: dict[str, str] | None = None,
    furnish: str = "version",
    label: str,
    settings_given: dict[str, Any] | None = None,
    content_type: str = "application/octet-stream",
) -> None:
    """Register a write to a catalog route (``path`` under ``{kind}s/``; ``concrete`` with
    its names filled in) on alpha, furnished with :func:`catalog_version` (``version``),
    :func:`catalog_upload` (``upload``) or nothing."""

    def write(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
        for name, value in (settings_given or {}).items():
            setattr(settings, name, value)
        if furnish == "version":
            catalog_version(world, tmp, settings, kind)
        elif furnish == "upload":
            catalog_upload(world, tmp, settings, kind)
        else:
            settings.TAU_STORAGE_URL = f"file://{tmp / 'store'}"
        url = f"{API}/alpha/{kind}s/{concrete}"
        send = getattr(client(world, who), method.lower())
        if isinstance(body, bytes):
            return send(  # type: ignore[no-any-return]
                url, body, content_type=content_type, headers=headers or {}
            )
        if body is None:
            return send(url)  # type: ignore[no-any-return]
        return send(url, body, format="json")  # type: ignore[no-any-return]

    write.__name__ = f"{kind}_{method.lower()}_{label}"
    call(method, f"{WS}/{kind}s/{path}", status)(write)


FILE = "{name}/versions/{version}/files/{file_path}"
for _kind in ("dataset", "model"):
    for _status, _body, _label in (
        (201, {"name": "fresh", "description": "made here"}, "create"),
        (409, {"name": "wiki"}, "create_existing"),
        (400, {"name": "Not a name!"}, "create_bad_name"),
    ):
        catalog_write(_kind, "POST", "", _status, concrete="", body=_body, label=_label)
    catalog_write(
        _kind, "DELETE", "{name}/", 204, concrete="wiki/", who="workspace_admin", label="delete"
    )
    catalog_write(_kind, "DELETE", "{name}/", 403, concrete="wiki/", label="delete_researcher")
    _version = "{name}/versions/{version}/"
    catalog_write(
        _kind,
        "DELETE",
        _version,
        204,
        concrete="wiki/versions/1/",
        who="workspace_admin",
        label="delete_version",
    )
    catalog_write(
        _kind,
        "DELETE",
        _version,
        409,
        concrete="wiki/versions/3/",
        who="workspace_admin",
        furnish="upload",
        label="delete_version_uploading",
    )
    catalog_write(
        _kind,
        "DELETE",
        _version,
        403,
        concrete="wiki/versions/1/",
        label="delete_version_researcher",
    )
# A version another was made from stays as a record, its files gone (200).
catalog_write(
    "dataset",
    "DELETE",
    "{name}/versions/{version}/",
    200,
    concrete="raw/versions/1/",
    who="workspace_admin",
    label="delete_version_kept",
)
for _kind in ("dataset", "model"):
    for _status, _files, _furnish, _label in (
        (201, declaration(b"brand new\n"), "version", "declare"),
        (200, declaration(b"new\n", b"other\n"), "upload", "declare_again"),
        (400, [{"path": "../up", "size": 1, "sha256": "0" * 64}], "version", "declare_bad"),
    ):
        catalog_write(
            _kind,
            "POST",
            "{name}/versions/",
            _status,
            concrete="wiki/versions/",
            body={"source": "upload", "files": _files},
            furnish=_furnish,
            label=_label,
        )
    for _status, _lines, _label in (
        (201, declaration(b"brand new\n"), "declare_streamed"),
        (400, [{"path": "up/../..", "size": 1, "sha256": "0" * 64}], "declare_streamed_bad"),
    ):
        catalog_write(
            _kind,
            "POST",
            "{name}/versions/",
            _status,
            concrete="wiki/versions/",
            body=b"".join(
                json.dumps(line).encode() + b"\n"
                for line in [{"source": "upload", "files_count": len(_lines)}, *_lines]
            ),
            content_type="application/x-ndjson",
            label=_label,
        )
    for _status, _at, _data, _headers, _label, _given in (
        (200, "new.txt", b"new\n", {}, "piece", {}),
        (200, "new.txt", b"ne", {"Content-Range": "bytes 0-1/4"}, "first_piece", {}),
        (409, "new.txt", b"w\n", {"Content-Range": "bytes 2-3/4"}, "piece_out_of_order", {}),
        (400, "new.txt", b"old\n", {}, "piece_not_matching", {}),
        (404, "nothing.txt", b"x", {}, "piece_of_no_file", {}),
        (
            413,
            "new.txt",
            b"n" * 65537,
            {},
            "piece_too_large",
            {"TAU_DATA_UPLOAD_PIECE_BYTES": 65536},
        ),
    ):
        catalog_write(
            _kind,
            "PUT",
            FILE,
            _status,
            concrete=f"wiki/versions/3/files/{_at}",
            body=_data,
            headers=_headers,
            furnish="upload",
            label=_label,
            settings_given=_given,
        )
    catalog_write(
        _kind,
        "PUT",
        FILE,
        409,
        concrete="wiki/versions/1/files/part-0.txt",
        body=b"text\n",
        label="piece_for_a_ready_version",
    )
    for _status, _version, _label in ((200, "train", "verify"), (409, "2", "verify_failed")):
        catalog_write(
            _kind,
            "POST",
            "{name}/versions/{version}/verify/",
            _status,
            concrete=f"wiki/versions/{_version}/verify/",
            label=_label,
        )
    _alias_body: dict[str, str] | None
    for _method, _status, _alias, _alias_body, _label in (
        ("PUT", 200, "eval", {"version": "1"}, "alias_set"),
        ("PUT", 400, "latest", {"version": "1"}, "alias_latest"),
        ("PUT", 400, "eval", {"version": "9"}, "alias_of_no_version"),
        ("DELETE", 204, "train", None, "alias_delete"),
        ("DELETE", 404, "eval", None, "alias_delete_missing"),
    ):
        catalog_write(
            _kind,
            _method,
            "{name}/aliases/{alias}/",
            _status,
            concrete=f"wiki/aliases/{_alias}/",
            body=_alias_body,
            label=_label,
        )


def catalog_from_run(world: Any, tmp: Path, settings: Any, kind: str, state: Any) -> Any:
    """:func:`catalog_version`, and a run in ``state`` that kept ``model/w.bin`` (and a metric
    ``val_loss``)."""
    from runs.artifacts import store_artifact
    from runs.models import MetricPoint

    catalog_version(world, tmp, settings, kind)
    run = make_run(world, spec=TINY_SPEC + b"outputs:\n  artifacts: [model/**]\n", state=state)
    store_artifact(run=run, attempt=1, name="model/w.bin", source=io.BytesIO(b"weights"))
    MetricPoint.objects.create(run=run, attempt=1, key="val_loss", step=1, value=0.5)
    return run


for _kind in ("dataset", "model"):
    for _status, _state, _path, _label in (
        (201, RunState.SUCCEEDED, "model/", "register_from_run"),
        (400, RunState.FAILED, "model/", "register_from_a_failed_run"),
        (400, RunState.SUCCEEDED, "nothing/", "register_nothing"),
    ):

        def _register(
            world: Any,
            tmp: Path,
            settings: Any,
            kind: str = _kind,
            state: Any = _state,
            path: str = _path,
        ) -> HttpResponseBase:
            run = catalog_from_run(world, tmp, settings, kind, state)
            body = {"source": "run", "run": run.name, "path": path}
            return client(world).post(f"{API}/alpha/{kind}s/wiki/versions/", body, format="json")

        _register.__name__ = f"{_kind}_{_label}"
        call("POST", f"{WS}/{_kind}s/{{name}}/versions/", _status)(_register)

    for _status, _query, _label in (
        (200, {"metric": "val_loss", "mode": "min"}, "best"),
        (400, {"mode": "min"}, "best_of_no_metric"),
        (404, {"metric": "accuracy"}, "best_of_an_unrecorded_metric"),
    ):

        def _best(
            world: Any, tmp: Path, settings: Any, kind: str = _kind, query: Any = _query
        ) -> HttpResponseBase:
            run = catalog_from_run(world, tmp, settings, kind, RunState.SUCCEEDED)
            body = {"source": "run", "run": run.name, "path": "model"}
            made = client(world).post(f"{API}/alpha/{kind}s/wiki/versions/", body, format="json")
            assert made.status_code == 201, made.content
            return client(world, "viewer").get(f"{API}/alpha/{kind}s/wiki/best/", query)

        _best.__name__ = f"{_kind}_{_label}"
        call("GET", f"{WS}/{_kind}s/{{name}}/best/", _status)(_best)

    for _status, _version, _label in ((200, "train", "download"), (409, "2", "download_failed")):

        def _download(
            world: Any, tmp: Path, settings: Any, kind: str = _kind, version: str = _version
        ) -> HttpResponseBase:
            catalog_version(world, tmp, settings, kind)
            url = f"{API}/alpha/{kind}s/wiki/versions/{version}/download/"
            return client(world, "viewer").get(url)

        _download.__name__ = f"{_kind}_{_label}"
        call("GET", f"{WS}/{_kind}s/{{name}}/versions/{{version}}/download/", _status)(_download)


@call("GET", f"{WS}/usage/", 400)
def workspace_usage_of_no_month(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(f"{API}/alpha/usage/", {"month": "someday"})


@call("GET", f"{WS}/usage/", 404)
def workspace_usage_of_another_workspace(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "outsider").get(f"{API}/alpha/usage/")


# Webhooks: the workspace's admins list, add and remove them; the secret never comes back.
WEBHOOKS = f"{WS}/webhooks/"
NEW_WEBHOOK = {"url": "https://93.184.215.14/hook", "secret": "schema-secret-0123456789"}


def alpha_webhook(world: Any) -> Any:
    from notifications.models import Webhook

    return Webhook.objects.create(
        workspace=world.alpha, url=NEW_WEBHOOK["url"], secret=NEW_WEBHOOK["secret"]
    )


@call("GET", WEBHOOKS, 200)
def webhooks(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    alpha_webhook(world)
    return client(world, "workspace_admin").get(f"{API}/alpha/webhooks/")


@call("GET", WEBHOOKS, 403)
def webhooks_for_a_researcher(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world).get(f"{API}/alpha/webhooks/")


@call("GET", WEBHOOKS, 404)
def webhooks_of_another_workspace(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "outsider").get(f"{API}/alpha/webhooks/")


@call("POST", WEBHOOKS, 201)
def webhook_create(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    body = {**NEW_WEBHOOK, "events": ["run.failed"], "format": "slack"}
    return client(world, "workspace_admin").post(f"{API}/alpha/webhooks/", body, format="json")


@call("POST", WEBHOOKS, 400)
def webhook_create_refused(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    body = {**NEW_WEBHOOK, "url": "http://10.0.0.1/hook", "events": ["run.done"]}
    return client(world, "workspace_admin").post(f"{API}/alpha/webhooks/", body, format="json")


@call("DELETE", f"{WEBHOOKS}{{webhook_id}}/", 204)
def webhook_delete(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    webhook = alpha_webhook(world)
    return client(world, "workspace_admin").delete(f"{API}/alpha/webhooks/{webhook.pk}/")


@call("DELETE", f"{WEBHOOKS}{{webhook_id}}/", 404)
def webhook_delete_missing(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "workspace_admin").delete(f"{API}/alpha/webhooks/999999/")


# --- Requests a client could believe valid (issue 30) ---------------------------------------


@call("PATCH", f"{FLAVORS}/{{name}}/", 415)
def flavor_change_as_a_form(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    """A form cannot carry a mapping: the same change as JSON is validated, as a form it was
    answered 200 with ``node_labels`` silently left out."""
    return staff(world).patch(
        f"{FLAVORS}/h100/", {"node_labels": '{"pool": "big"}'}, format="multipart"
    )


@call("POST", f"{COHORTS}/", 415)
def cohort_create_as_a_form(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    """A form's empty ``parent`` used to become null, a cohort without a parent."""
    return staff(world).post(f"{COHORTS}/", {"name": "vision", "parent": ""}, format="multipart")


@call("POST", f"{API}/", 400)
def workspace_create_with_a_blank_cohort(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return staff(world).post(f"{API}/", {**NEW_WORKSPACE, "cohort": ""}, format="json")


@call("POST", f"{API}/", 415)
def workspace_create_as_a_form(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    """As a form, ``cohort: ""`` became null and the workspace was created."""
    form = {"slug": "gamma", "name": "Gamma", "cohort": ""}
    return staff(world).post(f"{API}/", form, format="multipart")


@call("GET", f"{WS}/usage/", 400)
def workspace_usage_of_an_empty_month(world: Any, tmp: Path, settings: Any) -> HttpResponseBase:
    return client(world, "viewer").get(f"{API}/alpha/usage/", {"month": ""})


def test_a_write_sent_as_a_form_changes_nothing(world: Any, tmp_path: Path, settings: Any) -> None:
    flavor_change_as_a_form(world, tmp_path, settings)
    cohort_create_as_a_form(world, tmp_path, settings)
    answer = workspace_create_as_a_form(world, tmp_path, settings)
    assert answer.json()["detail"] == (
        "This route reads application/json, not multipart/form-data; nothing was changed."
    )
    assert staff(world).get(f"{FLAVORS}/h100/").json()["node_labels"] != {"pool": "big"}
    assert not Workspace.unscoped_objects.filter(slug="gamma").exists()
    assert staff(world).get(f"{COHORTS}/vision/").status_code == 404
    refused = workspace_create_with_a_blank_cohort(world, tmp_path, settings)
    assert "cohort" in refused.json()
    assert not Workspace.unscoped_objects.filter(slug="gamma").exists()


def test_only_submissions_and_artifacts_take_anything_but_json(schema: dict[str, Any]) -> None:
    taken = {
        (method.upper(), path, media)
        for path, item in schema["paths"].items()
        for method, operation in item.items()
        for media in operation.get("requestBody", {}).get("content", {})
        if media != "application/json"
    }
    assert taken == {
        ("POST", f"{WS}/runs/", "multipart/form-data"),
        ("POST", f"{RUN}/report/artifacts/", "application/octet-stream"),
        # A deployment takes the same form as a submission; the proxy passes any body on.
        ("POST", f"{WS}/endpoints/", "multipart/form-data"),
        ("POST", f"{WS}/endpoints/{{name}}/invoke/{{path}}", "*/*"),
        # A pipeline is its folder, zipped, as a form.
        ("POST", f"{WS}/pipelines/", "multipart/form-data"),
        # An upload's files, declared as JSON lines (catalog.uploads).
        ("POST", f"{WS}/datasets/{{name}}/versions/", "application/x-ndjson"),
        ("POST", f"{WS}/models/{{name}}/versions/", "application/x-ndjson"),
    }
    # And each says what else it answers.
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if "requestBody" in operation:
                assert "415" in operation["responses"], (method, path)


def test_every_query_parameter_given_empty_is_refused(
    world: Any, schema: dict[str, Any], openapi: OpenAPI, tmp_path: Path, settings: Any
) -> None:
    """``?month=``, ``?name=``, ``?after=``: an empty value is a 400 naming the parameter,
    never "any" or the default, on every operation, as the schema says (``minLength``)."""
    settings.VAR_DIR = tmp_path
    run = make_run(world)
    attempt_with_log(run, 1, b"line\n", tmp_path)
    asked = 0
    for path, item in schema["paths"].items():
        operation = item.get("get")
        if operation is None or "{" in path.replace("{workspace_slug}", "").replace(
            "{run_name}", ""
        ):
            continue
        url = path.replace("{workspace_slug}", "alpha").replace("{run_name}", run.name)
        for parameter in operation.get("parameters", []):
            if parameter["in"] != "query":
                continue
            if parameter["schema"].get("type") == "string":
                assert parameter["schema"].get("minLength", 0) >= 1, (path, parameter["name"])
            response = client(world, "viewer").get(url, {parameter["name"]: ""})
            assert response.status_code == 400, (path, parameter["name"], response.content)
            assert parameter["name"] in response.json(), response.json()
            conforms(openapi, response)
            asked += 1
    assert asked >= 15


def test_every_string_a_client_sends_says_it_may_not_hold_nul(schema: dict[str, Any]) -> None:
    """The server refuses NUL in every text it reads; the schema says so, so that a request
    valid by it is not refused."""
    components = schema["components"]["schemas"]
    unsaid = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            reference = node.get("$ref", "")
            if reference:
                walk(components[reference.rsplit("/", 1)[-1]], reference)
            if node.get("type") == "string" and not {"pattern", "enum", "format"} & node.keys():
                unsaid.append(where)
            for key, value in node.items():
                if key != "$ref":
                    walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, f"{where}[{index}]")

    for path, item in schema["paths"].items():
        for method, operation in item.items():
            for media, body in operation.get("requestBody", {}).get("content", {}).items():
                walk(body["schema"], f"{method} {path} {media}")
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "query":
                    walk(parameter["schema"], f"{method} {path} ?{parameter['name']}")
    assert unsaid == []


# --- The tests ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CALLS, ids=[c.name for c in CALLS])
def test_the_answer_is_what_the_schema_says(
    case: Call, world: Any, tmp_path: Path, settings: Any, openapi: OpenAPI
) -> None:
    settings.VAR_DIR = tmp_path
    response = case.make(world, tmp_path, settings)
    assert response.status_code == case.status, getattr(response, "content", b"")[:500]
    request = AnsweredRequest(response.wsgi_request)  # type: ignore[attr-defined]
    assert (response.wsgi_request.method, request.path_pattern) == (  # type: ignore[attr-defined]
        case.method,
        case.path,
    )
    conforms(openapi, response)


def test_every_operation_is_called(schema: dict[str, Any]) -> None:
    called = {(c.method, c.path) for c in CALLS if 200 <= c.status < 300}
    assert operations(schema) - called == set()
    assert called - operations(schema) == set()


def test_the_validator_catches_a_wrong_answer(world: Any, openapi: OpenAPI) -> None:
    """The check above is not vacuous: an answer missing a field the schema requires, or
    with a wrong type, or a status the operation does not document, fails it."""
    from django.http import JsonResponse

    good = client(world, "viewer").get(f"{API}/alpha/quota/")
    conforms(openapi, good)
    for body, status in (
        ([{"flavor": "h100"}], 200),  # required fields missing
        ([{**good.json()[0], "nominal": 8}], 200),  # a number where text is declared
        (good.json(), 418),
    ):
        wrong = JsonResponse(body, status=status, safe=False)
        wrong.wsgi_request = good.wsgi_request  # type: ignore[attr-defined]
        with pytest.raises(AssertionError):
            conforms(openapi, wrong)
    assert RunEvent.objects.for_workspace(world.alpha).count() == 0
