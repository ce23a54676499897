"""The tenancy attack matrix: every URL of the project, every member of a fixed cast,
the exact status code each must get.

The cast: a platform admin (staff, not a member of ``alpha``), alpha's workspace admin,
researcher and viewer, an outsider (a member of ``beta`` only) and an anonymous visitor.
Outsiders get 404 (a workspace they cannot see does not exist), a viewer's write gets 403.

``test_every_route_is_in_the_matrix`` walks Django's URL resolver: a route added without
an entry here fails the suite until someone decides who may use it.
"""

from __future__ import annotations

import hashlib
import io
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.contenttypes.models import ContentType
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import override_settings
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from rest_framework.test import APIClient

from accounting.models import BudgetAlert, WorkspaceUsage
from catalog import storage
from catalog.ingest import asset_named, ingest_folder, set_alias
from catalog.uploads import start_upload
from evidence import sealing
from evidence.models import EvidenceRecord, SealRequest
from gpus.models import GpuNode
from identity import tokens
from notifications.models import NotificationDelivery, Webhook
from notifications.unsubscribe import make_token
from pipelines.models import Pipeline
from portal import audit
from portal.models import AuditEvent
from runs.artifacts import store_artifact
from runs.models import RunAttempt, RunState
from runs.run_tokens import issue_run_token
from runs.state import transition
from serving.models import Endpoint, EndpointDelivery
from serving.workload_tokens import issue_endpoint_token
from tests.conftest import CAST, World
from tests.evidence.helpers import TEST_SIGNING_KEY
from tests.pipelines.factories import make_pipeline, pipeline_zip
from tests.runs.factories import TINY_FILES, TINY_SPEC, cluster_quota, make_run, zip_bytes
from tests.serving import fakes
from tests.serving.factories import ENDPOINT_FILES, ENDPOINT_SPEC, make_endpoint
from workspaces.models import (
    Cohort,
    Membership,
    PriorityClass,
    ResourceFlavor,
    Workspace,
    WorkspaceBudget,
    WorkspaceQuota,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(module_world: World) -> World:
    """The cast, made once for the module's cases (tests/conftest.module_world)."""
    return module_world


@pytest.fixture(autouse=True)
def endpoints_run_here(settings: Any) -> None:
    """This machine's backend runs endpoints (the serving tests' fake: no executor does
    yet), so that a deployment gets as far as its answer."""
    settings.TAU_BACKEND_CLASSES = fakes.backend_classes(settings)


Kwargs = Callable[[Any], dict[str, Any]]


def codes(pa: int, wa: int, re: int, vi: int, out: int, anon: int) -> dict[str, int]:
    return dict(zip(CAST, (pa, wa, re, vi, out, anon), strict=True))


def same(code: int, *, anon: int | None = None) -> dict[str, int]:
    return codes(code, code, code, code, code, code if anon is None else anon)


@dataclass
class Route:
    methods: dict[str, dict[str, int]]
    kwargs: Kwargs = lambda world: {}
    data: dict[str, Any] | Callable[[], dict[str, Any]] = field(default_factory=dict)
    api: bool = False
    multipart: bool = False
    #: What callers get with a token (of their own, with no scopes; ``foreign_token`` too),
    #: by method, where that is not what a session gets.
    with_tokens: dict[str, dict[str, int]] = field(default_factory=dict)

    def payload(self) -> dict[str, Any]:
        return self.data() if callable(self.data) else self.data


def ALPHA(world: Any) -> dict[str, Any]:
    return {"workspace_slug": "alpha"}


def ALPHA_MEMBER(world: Any) -> dict[str, Any]:
    return {"workspace_slug": "alpha", "username": "rob"}


def NEW_COLLEAGUE() -> dict[str, Any]:
    """Someone alpha's admin may add: a member of another workspace alice belongs to (only
    such people are addable; another tenant's user reads like no user at all)."""
    users = get_user_model()._default_manager
    gamma = Workspace.unscoped_objects.create(
        slug="gamma", name="Gamma", namespace="tau-gamma", local_queue="gamma"
    )
    colleague = users.create_user(username="gus")
    Membership.objects.create(workspace=gamma, user=users.get(username="alice"), role="viewer")
    Membership.objects.create(workspace=gamma, user=colleague, role="viewer")
    return {"username": "gus", "role": "viewer"}


def RUN(world: Any) -> dict[str, Any]:
    return {"workspace_slug": "alpha", "run_name": make_run(world).name}


def FAILED_RUN(world: Any) -> dict[str, Any]:
    return {"workspace_slug": "alpha", "run_name": make_run(world, state=RunState.FAILED).name}


def RUN_WITH_BUNDLE(world: Any) -> dict[str, Any]:
    run = make_run(world, files={"main.py": "print('hello')\n"})
    return {"workspace_slug": "alpha", "run_name": run.name}


def RUN_WITH_ARTIFACT(world: Any) -> dict[str, Any]:
    run = make_run(world, spec=TINY_SPEC + b"outputs:\n  artifacts: [model/**]\n")
    store_artifact(run=run, attempt=1, name="model/w.pt", source=io.BytesIO(b"weights"))
    return {"workspace_slug": "alpha", "run_name": run.name, "artifact_path": "model/w.pt"}


def RUN_WITH_ARTIFACTS(world: Any) -> dict[str, Any]:
    return {"workspace_slug": "alpha", "run_name": RUN_WITH_ARTIFACT(world)["run_name"]}


def _asset_version(world: Any, kind: str) -> dict[str, Any]:
    """A ready version 1 of alpha's ``wiki`` dataset or model, with an alias ``train``."""
    source = Path(tempfile.mkdtemp(prefix="tau-matrix-"))
    (source / "part-0.txt").write_text("some text\n")
    version = ingest_folder(asset_named(world.alpha, kind, "wiki"), source, source="prefix")
    set_alias(version, "train")
    return {"workspace_slug": "alpha", "name": "wiki", "version": "train"}


def RUN_READING_DATA(world: Any) -> dict[str, Any]:
    """A run pinned to read alpha's ``wiki@train`` (its staging listing)."""
    _asset_version(world, "dataset")
    spec = TINY_SPEC + b"inputs:\n  datasets:\n    - {name: wiki, version: train}\n"
    return {"workspace_slug": "alpha", "run_name": make_run(world, spec=spec).name}


def RUN_DATA_BLOB(world: Any) -> dict[str, Any]:
    """The one file of the data a run reads, by its SHA-256."""
    run = RUN_READING_DATA(world)
    return {**run, "sha256": hashlib.sha256(b"some text\n").hexdigest()}


def DATASET_VERSION(world: Any) -> dict[str, Any]:
    return _asset_version(world, "dataset")


def MODEL_VERSION(world: Any) -> dict[str, Any]:
    return _asset_version(world, "model")


def DATASET_ALIAS(world: Any) -> dict[str, Any]:
    return {**DATASET(world), "alias": "train"}


def MODEL_ALIAS(world: Any) -> dict[str, Any]:
    return {**MODEL(world), "alias": "train"}


ALIAS_OF = {"dataset": DATASET_ALIAS, "model": MODEL_ALIAS}


def CATALOG_ROUTES(
    asset: Kwargs, version: Kwargs, upload: Kwargs, alias: Kwargs
) -> list[tuple[str, dict[str, dict[str, int]], Kwargs, Any]]:
    """Each catalog route of one kind: its name's end, who may call each method, its
    kwargs and the body sent."""
    return [
        ("list", {"GET": API_READ, "POST": RESEARCHER_WRITE(201)}, ALPHA, {"name": "matrix"}),
        ("detail", {"GET": API_READ, "DELETE": API_ADMIN_WRITE(204)}, asset, {}),
        ("versions", {"GET": API_READ, "POST": RESEARCHER_WRITE(201)}, asset, DECLARATION),
        ("version", {"GET": API_READ, "DELETE": API_ADMIN_WRITE(204)}, version, {}),
        ("version-files", {"GET": API_READ}, version, {}),
        ("version-file", {"PUT": RESEARCHER_WRITE(200)}, upload, {}),
        ("version-verify", {"POST": RESEARCHER_WRITE(200)}, version, {}),
        ("version-download", {"GET": API_READ}, version, {}),
        # Without ?metric= every reader gets as far as the 400 that asks for one.
        ("best", {"GET": codes(400, 400, 400, 400, 404, 401)}, asset, {}),
        (
            "alias",
            {"PUT": RESEARCHER_WRITE(200), "DELETE": RESEARCHER_WRITE(204)},
            alias,
            {"version": "1"},
        ),
    ]


def DATASET(world: Any) -> dict[str, Any]:
    return {key: value for key, value in DATASET_VERSION(world).items() if key != "version"}


def MODEL(world: Any) -> dict[str, Any]:
    return {key: value for key, value in MODEL_VERSION(world).items() if key != "version"}


def _upload_waiting(world: Any, kind: str) -> dict[str, Any]:
    """Version 1 of alpha's ``upload`` dataset or model, ingesting, declared as one file
    ``{}`` (what the matrix sends as the body of a PUT) not yet sent."""
    content = b"{}"
    sha256 = hashlib.sha256(content).hexdigest()
    storage.blob_path(world.alpha.pk, sha256).unlink(missing_ok=True)
    asset = asset_named(world.alpha, kind, "upload")
    start_upload(asset, [{"path": "data/{}.json", "size": len(content), "sha256": sha256}])
    return {
        "workspace_slug": "alpha",
        "name": "upload",
        "version": "1",
        "file_path": "data/{}.json",
    }


def DATASET_UPLOAD(world: Any) -> dict[str, Any]:
    return _upload_waiting(world, "dataset")


def MODEL_UPLOAD(world: Any) -> dict[str, Any]:
    return _upload_waiting(world, "model")


def DECLARATION() -> dict[str, Any]:
    return {
        "source": "upload",
        "files": [{"path": "a.txt", "size": 3, "sha256": hashlib.sha256(b"abc").hexdigest()}],
    }


def the_endpoint(world: Any) -> Endpoint:
    """alpha's endpoint ``chat``, deployed by the researcher (being deployed: it answers
    nothing); made once where several routes' objects are made together."""
    found = Endpoint.objects.for_workspace(world.alpha).filter(name="chat").first()
    return found if found is not None else make_endpoint(world)


def ENDPOINT(world: Any) -> dict[str, Any]:
    return {"workspace_slug": "alpha", "name": the_endpoint(world).name}


def PIPELINE(world: Any) -> dict[str, Any]:
    """A running pipeline of alpha's, submitted by the researcher (a new one for each call)."""
    return {"workspace_slug": "alpha", "name": make_pipeline(world).name}


def ENDPOINT_INVOKED(world: Any) -> dict[str, Any]:
    return {**ENDPOINT(world), "path": "generate"}


#: The one file of the model alpha's endpoint ``served`` serves: bytes no other route's
#: objects hold, so that no deletion the matrix makes (a dataset's, a model's) removes them.
SERVED_MODEL_FILE = b"served weights\n"


def ENDPOINT_SERVING_A_MODEL(world: Any) -> dict[str, Any]:
    """alpha's endpoint ``served``, serving its model ``served-model@1`` (one file)."""
    found = Endpoint.objects.for_workspace(world.alpha).filter(name="served").first()
    if found is None:
        source = Path(tempfile.mkdtemp(prefix="tau-matrix-"))
        (source / "weights.bin").write_bytes(SERVED_MODEL_FILE)
        ingest_folder(asset_named(world.alpha, "model", "served-model"), source, source="prefix")
        spec = ENDPOINT_SPEC.replace(
            b"  replicas: 1\n", b"  replicas: 1\n  model: {name: served-model, version: 1}\n"
        )
        found = make_endpoint(world, spec=spec, name="served")
    return {"workspace_slug": "alpha", "name": found.name}


def ENDPOINT_MODEL_BLOB(world: Any) -> dict[str, Any]:
    """The one file of the model ``served`` serves, by its SHA-256."""
    return {
        **ENDPOINT_SERVING_A_MODEL(world),
        "sha256": hashlib.sha256(SERVED_MODEL_FILE).hexdigest(),
    }


def SEALED_RUN(world: Any) -> dict[str, Any]:
    """A finished run whose evidence is sealed (by the test, with a throwaway key)."""
    run = make_run(world)
    transition(run, RunState.QUEUED)
    transition(run, RunState.CANCELLED)
    request = SealRequest.objects.for_workspace(world.alpha).get(run=run)
    with override_settings(TAU_EVIDENCE_SIGNING_KEY=TEST_SIGNING_KEY):
        assert sealing.seal(request.pk)
    return {"workspace_slug": "alpha", "run_name": run.name}


def SEALED_RUN_RECORD(world: Any) -> dict[str, Any]:
    """The same, with its one record named by its ending's event."""
    kwargs = SEALED_RUN(world)
    record = EvidenceRecord.objects.unscoped().get(run__name=kwargs["run_name"])
    return {**kwargs, "ending_event": record.terminal_seq}


# Reads inside alpha: members and staff see it, the outsider gets 404. Anonymous API
# callers get 401 with a WWW-Authenticate: Bearer challenge.
PAGE_READ = codes(200, 200, 200, 200, 404, 302)
API_READ = codes(200, 200, 200, 200, 404, 401)


def API_ADMIN_WRITE(ok: int) -> dict[str, int]:
    """A write only the workspace admin may make; ``ok`` is what success looks like."""
    return codes(403, ok, 403, 403, 404, 401)


def RESEARCHER_WRITE(ok: int) -> dict[str, int]:
    """A write a researcher or the workspace admin may make; ``ok`` is what success looks
    like (platform staff read a workspace as viewers)."""
    return codes(403, ok, ok, 403, 404, 401)


def STAFF_API(ok: int) -> dict[str, int]:
    """Platform staff only, whoever else asks (no workspace to hide)."""
    return codes(ok, 403, 403, 403, 403, 401)


#: Platform pages: staff only; other people signed in get 403, visitors the login page.
STAFF_PAGE = codes(200, 403, 403, 403, 403, 302)
STAFF_ACTION = codes(302, 403, 403, 403, 403, 302)


def GPU_NODE(world: Any) -> dict[str, Any]:
    """A GPU node as a fleet sync writes it, with a run of alpha on it."""
    GpuNode.objects.create(
        name="gpu-node-1",
        source="kubernetes",
        pool="h100",
        gpus_total=8,
        gpus_allocatable=8,
        gpus_in_use=2,
        ready=True,
        healthy=True,
        runs=[
            {"workspace": "alpha", "run": "r-1", "namespace": "tau-alpha", "pod": "p", "gpus": 2}
        ],
    )
    return {"node_name": "gpu-node-1"}


def GPU_RUN(world: Any) -> dict[str, Any]:
    """A run on the cluster that asks for a GPU (this machine has none for local runs)."""
    cluster_quota(world.alpha)
    with override_settings(TAU_BACKEND="kubernetes"):
        run = make_run(world, spec=TINY_SPEC.replace(b"cpus: 1", b"cpus: 1\n  gpus: 1"))
    return {"workspace_slug": "alpha", "run_name": run.name}


def WEBHOOK(world: Any) -> dict[str, Any]:
    """A webhook of alpha, with one delivery in its log (for the admin's pages)."""
    webhook = Webhook.objects.create(
        workspace=world.alpha, url="https://93.184.215.14/hook", secret="matrix-secret-0123456"
    )
    NotificationDelivery.objects.create(
        workspace=world.alpha, channel="webhook", webhook=webhook, event="run.failed"
    )
    return {"workspace_slug": "alpha", "webhook_id": webhook.pk}


def UNSUBSCRIBE(world: Any) -> dict[str, Any]:
    return {"token": make_token(user_id=world.users["researcher"].pk, event="run.failed")}


#: A webhook the API and the page accept (an address literal: no DNS in the matrix).
NEW_WEBHOOK = {"url": "https://93.184.215.14/hook", "secret": "matrix-secret-0123456"}


def NAMED(name: str) -> Kwargs:
    return lambda world: {"name": name}


MATRIX: dict[str, Route] = {
    "home": Route({"GET": same(200, anon=302)}),
    "healthz": Route({"GET": same(200)}),
    "favicon": Route({"GET": same(302)}),  # to the icon's static file, for everyone
    "readyz": Route({"GET": same(200)}),
    # Only the scrape token counts, signed in or not and from wherever (loopback included:
    # runs share it); tests/portal/test_metrics.py reads it with the token.
    "metrics": Route({"GET": same(401)}),
    "login": Route({"GET": same(302, anon=200)}),
    "logout": Route({"POST": same(302), "GET": same(405)}),
    "workspace-home": Route(
        # Staff read as viewers (403 on write); members reach the view, which has no POST.
        {"GET": PAGE_READ, "POST": codes(403, 405, 405, 403, 404, 302)},
        ALPHA,
    ),
    # Creating workspaces, flavors and cohorts is the platform team's (tokens: unscoped).
    "api:workspace-list": Route(
        {"GET": same(200, anon=401), "POST": STAFF_API(201)},
        # A workspace keeps an admin from the start.
        data={
            "slug": "made-by-matrix",
            "name": "Matrix",
            "members": [{"username": "rob", "role": "admin"}],
        },
        api=True,
    ),
    "api:workspace-detail": Route(
        # Staff change any workspace (its cohort and quotas too); its admins their details.
        {"GET": API_READ, "PATCH": codes(200, 200, 403, 403, 404, 401)},
        ALPHA,
        data={"description": "Updated by the matrix"},
        api=True,
    ),
    "api:flavor-list": Route(
        {"GET": STAFF_API(200), "POST": STAFF_API(201)}, data={"name": "matrix"}, api=True
    ),
    "api:flavor-detail": Route(
        {"GET": STAFF_API(200), "PATCH": STAFF_API(200)},
        NAMED("h100"),
        data={"description": "Updated by the matrix"},
        api=True,
    ),
    "api:cohort-list": Route(
        {"GET": STAFF_API(200), "POST": STAFF_API(201)}, data={"name": "matrix"}, api=True
    ),
    "api:cohort-detail": Route(
        {"GET": STAFF_API(200), "PATCH": STAFF_API(200)},
        NAMED("research"),
        data={"description": "Updated by the matrix"},
        api=True,
    ),
    # Read-only: the role check (staff and viewers may not write) comes before "no such method".
    "api:quota-list": Route(
        {"GET": API_READ, "POST": codes(403, 405, 405, 403, 404, 401)}, ALPHA, api=True
    ),
    "api:member-list": Route(
        {"GET": API_READ, "POST": API_ADMIN_WRITE(201)},
        ALPHA,
        data=NEW_COLLEAGUE,
        api=True,
    ),
    "api:member-detail": Route(
        {"GET": API_READ, "PATCH": API_ADMIN_WRITE(200), "DELETE": API_ADMIN_WRITE(204)},
        ALPHA_MEMBER,
        data={"role": "viewer"},
        api=True,
    ),
    "api:schema": Route({"GET": same(200, anon=401)}, api=True),
    # Who you are: anyone signed in, about themselves only.
    "api:me": Route({"GET": same(200, anon=401)}, api=True),
    # The interactive docs: a page for anyone signed in (the schema it loads is guarded).
    "api:docs": Route({"GET": same(200, anon=302)}),
    # Runs. Submitting needs the researcher role; cancel and resume are for the submitter
    # (the researcher here) and workspace admins.
    "api:run-list": Route(
        {"GET": API_READ, "POST": codes(403, 201, 201, 403, 404, 401)},
        ALPHA,
        data=lambda: {
            "spec": SimpleUploadedFile("tau.yaml", TINY_SPEC),
            "bundle": SimpleUploadedFile("project.zip", zip_bytes(TINY_FILES)),
        },
        api=True,
        multipart=True,
    ),
    "api:run-detail": Route({"GET": API_READ}, RUN, api=True),
    "api:run-cancel": Route({"POST": codes(403, 200, 200, 403, 404, 401)}, RUN, api=True),
    "api:run-resume": Route({"POST": codes(403, 200, 200, 403, 404, 401)}, FAILED_RUN, api=True),
    "api:run-events": Route({"GET": API_READ}, RUN, api=True),
    "api:run-logs": Route({"GET": API_READ}, RUN, api=True),
    "api:run-metrics": Route({"GET": API_READ}, RUN, api=True),
    "api:run-checkpoints": Route({"GET": API_READ}, RUN, api=True),
    "api:run-bundle": Route({"GET": API_READ}, RUN_WITH_BUNDLE, api=True),
    # The data a run reads: its listing and files, for its stager (tests/executors/kubernetes/
    # test_stage_data.py covers the run token) and whoever reads the workspace.
    "api:run-data": Route({"GET": API_READ}, RUN_READING_DATA, api=True),
    "api:run-data-blob": Route({"GET": API_READ}, RUN_DATA_BLOB, api=True),
    "api:run-artifacts": Route({"GET": API_READ}, RUN_WITH_ARTIFACTS, api=True),
    "api:run-artifact": Route({"GET": API_READ}, RUN_WITH_ARTIFACT, api=True),
    # Evidence: a run's export for anyone who reads the workspace; the public keys for anyone.
    "api:run-evidence": Route({"GET": API_READ}, SEALED_RUN, api=True),
    "api:run-evidence-records": Route({"GET": API_READ}, SEALED_RUN, api=True),
    "api:run-evidence-record": Route({"GET": API_READ}, SEALED_RUN_RECORD, api=True),
    "api:evidence-keys": Route({"GET": same(200)}, api=True),
    "api:gpu-nodes": Route({"GET": STAFF_API(200)}, api=True),
    "api:run-gpus": Route({"GET": API_READ}, GPU_RUN, api=True),
    # Endpoints: read by whoever reads the workspace; deployed by researchers; scaled, updated
    # and deleted by the one who deployed it (the researcher here) and workspace admins.
    "api:endpoint-list": Route(
        {"GET": API_READ, "POST": RESEARCHER_WRITE(201)},
        ALPHA,
        data=lambda: {
            "spec": SimpleUploadedFile("tau.yaml", ENDPOINT_SPEC),
            "bundle": SimpleUploadedFile("project.zip", zip_bytes(ENDPOINT_FILES)),
        },
        api=True,
        multipart=True,
    ),
    "api:endpoint-detail": Route(
        {"GET": API_READ, "PATCH": RESEARCHER_WRITE(200), "DELETE": RESEARCHER_WRITE(204)},
        ENDPOINT,
        data={"replicas": 2},
        api=True,
    ),
    "api:endpoint-evidence": Route({"GET": API_READ}, ENDPOINT, api=True),
    "api:endpoint-metrics": Route({"GET": API_READ}, ENDPOINT, api=True),
    "api:endpoint-logs": Route({"GET": API_READ}, ENDPOINT, api=True),
    # Any member may invoke, by GET or POST (the endpoint is still being deployed here: 409);
    # staff who are not members may not; a token only with the endpoints:invoke scope (these
    # have none, and are refused before their workspace is looked at).
    "api:endpoint-invoke": Route(
        {"GET": codes(403, 409, 409, 409, 404, 401), "POST": codes(403, 409, 409, 409, 404, 401)},
        ENDPOINT_INVOKED,
        data={"prompt": "hello"},
        api=True,
        with_tokens={
            method: {**codes(403, 403, 403, 403, 403, 401), "foreign_token": 403}
            for method in ("GET", "POST")
        },
    ),
    # What an endpoint's pods fetch: its project zip and its model's listing and files, for
    # its own token (tests/serving/test_workload_routes.py, and the machine-token walk below)
    # and whoever reads the workspace; the stager's report for its token only.
    "api:endpoint-bundle": Route({"GET": API_READ}, ENDPOINT, api=True),
    "api:endpoint-model": Route({"GET": API_READ}, ENDPOINT_SERVING_A_MODEL, api=True),
    "api:endpoint-model-blob": Route({"GET": API_READ}, ENDPOINT_MODEL_BLOB, api=True),
    "api:endpoint-report-model-staged": Route(
        {"POST": codes(403, 403, 403, 403, 404, 401)},
        ENDPOINT,
        data={"files": 1, "bytes": 1, "seconds": 1},
        api=True,
    ),
    # Pipelines: read by whoever reads the workspace; submitted by researchers; cancelled by
    # the one who submitted it (the researcher here) and workspace admins.
    "api:pipeline-list": Route(
        {"GET": API_READ, "POST": RESEARCHER_WRITE(201)},
        ALPHA,
        data=lambda: {"bundle": SimpleUploadedFile("pipeline.zip", pipeline_zip())},
        api=True,
        multipart=True,
    ),
    "api:pipeline-detail": Route({"GET": API_READ}, PIPELINE, api=True),
    "api:pipeline-cancel": Route({"POST": RESEARCHER_WRITE(200)}, PIPELINE, api=True),
    # A running pipeline cannot be resumed (409): who gets that far is who may resume one.
    "api:pipeline-resume": Route({"POST": RESEARCHER_WRITE(409)}, PIPELINE, api=True),
    # Its record: for whoever reads the workspace (a running pipeline has none yet: 409).
    "api:pipeline-evidence": Route(
        {"GET": codes(409, 409, 409, 409, 404, 401)}, PIPELINE, api=True
    ),
    # Usage: a workspace's for whoever reads it; every workspace's for the platform team.
    "api:workspace-usage": Route({"GET": API_READ}, ALPHA, api=True),
    # Datasets and models: read by whoever reads the workspace; made, uploaded, verified and
    # given aliases by researchers; a whole dataset or model deleted by the workspace admin.
    **{
        f"api:{kind}-{route}": Route(methods, kwargs, data=data, api=True)
        for kind, asset, version, upload in (
            ("dataset", DATASET, DATASET_VERSION, DATASET_UPLOAD),
            ("model", MODEL, MODEL_VERSION, MODEL_UPLOAD),
        )
        for route, methods, kwargs, data in CATALOG_ROUTES(asset, version, upload, ALIAS_OF[kind])
    },
    # Only a run's own token may report on it (tests/runs/test_api.py covers that token).
    "api:run-report-metrics": Route(
        {"POST": codes(403, 403, 403, 403, 404, 401)}, RUN, data={"rows": []}, api=True
    ),
    "api:run-report-checkpoints": Route(
        {"POST": codes(403, 403, 403, 403, 404, 401)}, RUN, data={"step": 1, "path": "x"}, api=True
    ),
    "api:run-report-data-staged": Route(
        {"POST": codes(403, 403, 403, 403, 404, 401)},
        RUN,
        data={"files": 1, "bytes": 1, "seconds": 1},
        api=True,
    ),
    "api:run-report-events": Route(
        {"POST": codes(403, 403, 403, 403, 404, 401)}, RUN, data={"kind": "note"}, api=True
    ),
    "api:run-report-trials": Route(
        {"POST": codes(403, 403, 403, 403, 404, 401)},
        RUN,
        data={"trials": [{"trial": 1, "config": {}, "state": "running"}]},
        api=True,
    ),
    "api:run-report-artifacts": Route(
        {"POST": codes(403, 403, 403, 403, 404, 401)}, RUN, data={"path": "x"}, api=True
    ),
    # Run pages.
    "runs": Route({"GET": PAGE_READ}, ALPHA),
    "queue": Route({"GET": PAGE_READ}, ALPHA),
    "run-page": Route({"GET": PAGE_READ}, RUN),
    "run-compare": Route({"GET": PAGE_READ}, ALPHA),
    "run-submit": Route(
        {"GET": codes(403, 200, 200, 403, 404, 302), "POST": codes(403, 302, 302, 403, 404, 302)},
        ALPHA,
        data=lambda: {
            "spec_text": TINY_SPEC.decode(),
            "bundle": SimpleUploadedFile("project.zip", zip_bytes(TINY_FILES)),
        },
    ),
    "run-validate": Route(
        {"POST": codes(403, 200, 200, 403, 404, 302), "GET": codes(403, 405, 405, 403, 404, 302)},
        ALPHA,
        data={"spec_text": TINY_SPEC.decode()},
    ),
    "run-page-cancel": Route(
        {"POST": codes(403, 302, 302, 403, 404, 302), "GET": codes(405, 405, 405, 405, 404, 302)},
        RUN,
    ),
    "run-page-resume": Route(
        {"POST": codes(403, 302, 302, 403, 404, 302), "GET": codes(405, 405, 405, 405, 404, 302)},
        FAILED_RUN,
    ),
    # Dataset and model pages: read by whoever reads the workspace (changes are the API's).
    "datasets": Route({"GET": PAGE_READ}, ALPHA),
    "dataset-detail": Route({"GET": PAGE_READ}, DATASET),
    "dataset-version": Route({"GET": PAGE_READ}, DATASET_VERSION),
    "models": Route({"GET": PAGE_READ}, ALPHA),
    "model-detail": Route({"GET": PAGE_READ}, MODEL),
    "model-version": Route({"GET": PAGE_READ}, MODEL_VERSION),
    # Endpoint pages: read by whoever reads the workspace; scaled, stopped and deleted by the
    # one who deployed it (the researcher here) and workspace admins, as in the API.
    "endpoints": Route({"GET": PAGE_READ}, ALPHA),
    "endpoint-page": Route({"GET": PAGE_READ}, ENDPOINT),
    "endpoint-page-log": Route({"GET": PAGE_READ}, ENDPOINT),
    **{
        f"endpoint-page-{action}": Route(
            {
                "POST": codes(403, 302, 302, 403, 404, 302),
                "GET": codes(405, 405, 405, 405, 404, 302),
            },
            ENDPOINT,
            data={"replicas": "2"},
        )
        for action in ("scale", "stop", "delete")
    },
    # Pipeline pages: read by whoever reads the workspace; cancelled and resumed by the one
    # who submitted it (the researcher here) and workspace admins, as in the API (a running
    # pipeline's resume is refused with a message: a redirect all the same).
    "pipelines": Route({"GET": PAGE_READ}, ALPHA),
    "pipeline-page": Route({"GET": PAGE_READ}, PIPELINE),
    **{
        f"pipeline-page-{action}": Route(
            {
                "POST": codes(403, 302, 302, 403, 404, 302),
                "GET": codes(405, 405, 405, 405, 404, 302),
            },
            PIPELINE,
        )
        for action in ("cancel", "resume")
    },
    # The evidence section: read by anyone who reads the run; a check asked for by them too
    # (it changes nothing but the check's result).
    "run-page-evidence": Route(
        {"GET": PAGE_READ, "POST": codes(302, 302, 302, 302, 404, 302)}, FAILED_RUN
    ),
    # GPUs: the fleet and its nodes are the platform team's; a workspace's GPUs and a run's
    # are read by whoever reads the workspace (they show that workspace's runs only).
    "gpu-fleet": Route({"GET": STAFF_PAGE}),
    "gpu-node": Route({"GET": STAFF_PAGE}, GPU_NODE),
    "gpu-node-telemetry": Route({"GET": STAFF_PAGE}, GPU_NODE),
    # Staff confirm (GET) and act (POST, then back to the node: there is no cluster here,
    # so the page says it could not be done).
    "gpu-node-cordon": Route({"GET": STAFF_PAGE, "POST": STAFF_ACTION}, GPU_NODE),
    "gpu-node-uncordon": Route({"GET": STAFF_PAGE, "POST": STAFF_ACTION}, GPU_NODE),
    "workspace-gpus": Route({"GET": PAGE_READ}, ALPHA),
    "workspace-gpus-usage": Route({"GET": PAGE_READ}, ALPHA),
    "run-page-gpus": Route({"GET": PAGE_READ}, GPU_RUN),
    "workspace-usage": Route({"GET": PAGE_READ}, ALPHA),
    "workspace-usage-csv": Route({"GET": PAGE_READ}, ALPHA),
    "platform-usage": Route({"GET": STAFF_PAGE}),
    "platform-usage-csv": Route({"GET": STAFF_PAGE}),
    # Webhooks are for the workspace's admins only, reading them too (a chat's webhook URL
    # is a credential); staff read workspaces as viewers, so not these.
    "api:webhook-list": Route(
        {"GET": codes(403, 200, 403, 403, 404, 401), "POST": API_ADMIN_WRITE(201)},
        ALPHA,
        data=NEW_WEBHOOK,
        api=True,
    ),
    "api:webhook-detail": Route({"DELETE": API_ADMIN_WRITE(204)}, WEBHOOK, api=True),
    "workspace-webhooks": Route(
        {"GET": codes(403, 200, 403, 403, 404, 302), "POST": codes(403, 302, 403, 403, 404, 302)},
        ALPHA,
        data=NEW_WEBHOOK,
    ),
    "workspace-webhook-delete": Route(
        {"POST": codes(403, 302, 403, 403, 404, 302), "GET": codes(403, 405, 403, 403, 404, 302)},
        WEBHOOK,
    ),
    # Your own e-mail preferences; the unsubscribe link works for anyone holding it (the
    # signed token is the proof), and its GET only asks.
    "notification-preferences": Route(
        {"GET": same(200, anon=302), "POST": same(302, anon=302)}, data={"events": ["run.failed"]}
    ),
    "notification-unsubscribe": Route({"GET": same(200), "POST": same(200)}, UNSUBSCRIBE),
    "profile": Route({"GET": same(200, anon=302)}),
    "tokens": Route(
        {"GET": same(200, anon=302), "POST": same(201, anon=302)},
        data={"name": "matrix", "expires_in_days": "30"},
    ),
    # Only the owner may revoke a token; to anyone else it does not exist.
    "token-revoke": Route(
        {"POST": codes(404, 404, 302, 404, 404, 302), "GET": same(405, anon=302)},
        lambda world: {"pk": tokens.issue_token(user=world.users["researcher"], name="m").token.pk},
    ),
    "audit": Route({"GET": codes(200, 403, 403, 403, 403, 302)}),
    "platform-queue": Route({"GET": codes(200, 403, 403, 403, 403, 302)}),
    # A workspace's audit log is for its admins; platform staff read it too, as they read
    # every workspace's pages.
    "workspace-audit": Route({"GET": codes(200, 200, 403, 403, 404, 302)}, ALPHA),
    # The members page: read by whoever reads the workspace (staff too); changed by its admins
    # only, as in the API (staff read workspaces as viewers). Changes are POSTs only.
    "workspace-members": Route(
        {"GET": PAGE_READ, "POST": codes(403, 302, 403, 403, 404, 302)},
        ALPHA,
        data=NEW_COLLEAGUE,
    ),
    "workspace-member-role": Route(
        {"POST": codes(403, 302, 403, 403, 404, 302), "GET": codes(405, 405, 405, 405, 404, 302)},
        ALPHA_MEMBER,
        data={"role": "viewer"},
    ),
    "workspace-member-remove": Route(
        {"POST": codes(403, 302, 403, 403, 404, 302), "GET": codes(405, 405, 405, 405, 404, 302)},
        ALPHA_MEMBER,
    ),
    # Single sign-on is not configured in this matrix (test_oidc_login.py covers it).
    "oidc-login": Route({"GET": same(404)}),
    "oidc-callback": Route({"GET": same(404)}),
}

# --- The admin: staff only. Everyone else is sent to the admin login page. -------------------


def STAFF_ONLY(staff_code: int) -> dict[str, int]:
    return codes(staff_code, 302, 302, 302, 302, 302)


# One object per registered model, to fill <object_id> in the admin's routes.
ADMIN_OBJECTS: dict[type, Callable[[Any], Any]] = {
    Workspace: lambda world: world.alpha,
    Membership: lambda world: Membership.objects.for_workspace(world.alpha).first(),
    WorkspaceQuota: lambda world: WorkspaceQuota.objects.for_workspace(world.alpha).first(),
    ResourceFlavor: lambda world: world.gpu_flavor,
    Cohort: lambda world: world.cohort,
    PriorityClass: lambda world: PriorityClass.objects.get(name="normal"),
    AuditEvent: lambda world: AuditEvent.objects.unscoped().first(),
    get_user_model(): lambda world: world.users["researcher"],
    Group: lambda world: Group.objects.create(name="matrix"),
    WorkspaceUsage: lambda world: WorkspaceUsage.unscoped_objects.get(pk=world.alpha.pk),
    BudgetAlert: lambda world: BudgetAlert.objects.create(
        budget=WorkspaceBudget.objects.create(workspace=world.alpha, gpu_hours=10),
        month="2026-12",
        threshold_percent=80,
        used_gpu_hours=8,
        budget_gpu_hours=10,
    ),
    Webhook: lambda world: Webhook.objects.for_workspace(world.alpha).get(
        pk=WEBHOOK(world)["webhook_id"]
    ),
    NotificationDelivery: lambda world: NotificationDelivery.objects.for_workspace(world.alpha).get(
        webhook_id=WEBHOOK(world)["webhook_id"]
    ),
    SealRequest: lambda world: SealRequest.objects.unscoped().get(
        run__name=SEALED_RUN(world)["run_name"]
    ),
    Endpoint: the_endpoint,
    Pipeline: lambda world: make_pipeline(world),
    EndpointDelivery: lambda world: (
        EndpointDelivery.objects.for_workspace(world.alpha)
        .filter(endpoint=the_endpoint(world))
        .first()
    ),
}
# The audit log is view-only even for superusers; so is usage (what runs used) and the
# budget warnings sent.
# Webhooks too (their workspace's admins manage them, on their page), and their delivery log.
# Endpoints and their outbox rows: changed through the API (their services) alone.
READ_ONLY_ADMIN_MODELS = {
    AuditEvent,
    WorkspaceUsage,
    BudgetAlert,
    Webhook,
    NotificationDelivery,
    SealRequest,
    Endpoint,
    EndpointDelivery,
    # Pipelines: changed through their services (the API, their page) alone.
    Pipeline,
}


def _object_kwargs(model: type) -> Kwargs:
    def build(world: Any) -> dict[str, Any]:
        instance = ADMIN_OBJECTS[model](world)
        assert instance is not None, f"no {model.__name__} to test the admin with"
        return {"object_id": str(instance.pk)}

    return build


def _admin_routes() -> Iterator[tuple[str, Route]]:
    yield "admin:index", Route({"GET": STAFF_ONLY(200)})
    # The admin's login form is replaced by the portal's login page (and single sign-on);
    # a logged-in non-staff user is told the admin is not for them.
    admin_login = Route({"GET": codes(302, 403, 403, 403, 403, 302)})
    yield "admin:login", admin_login
    yield "admin/login/", admin_login
    # Logging out redirects to LOGOUT_REDIRECT_URL; non-staff are sent to the admin index.
    yield "admin:logout", Route({"GET": STAFF_ONLY(405), "POST": STAFF_ONLY(302)})
    yield "admin:password_change", Route({"GET": STAFF_ONLY(200)})
    yield "admin:password_change_done", Route({"GET": STAFF_ONLY(200)})
    yield "admin:autocomplete", Route({"GET": STAFF_ONLY(403)})  # no field named: refused
    yield "admin:jsi18n", Route({"GET": STAFF_ONLY(200)})
    yield (
        "admin:view_on_site",
        Route(
            {"GET": STAFF_ONLY(302)},
            lambda world: {
                "content_type_id": str(ContentType.objects.get_for_model(Workspace).pk),
                "object_id": str(world.alpha.pk),
            },
        ),
    )
    yield (
        "admin:app_list",
        Route({"GET": STAFF_ONLY(200)}, lambda world: {"app_label": "workspaces"}),
    )
    yield (
        "admin:auth_user_password_change",
        Route({"GET": STAFF_ONLY(200)}, lambda world: {"id": str(world.users["researcher"].pk)}),
    )
    yield (
        "admin/(?P<url>.*)$",
        Route({"GET": STAFF_ONLY(404)}, lambda world: {"url": "no-such-page/"}),
    )
    for model in admin.site._registry:
        prefix = f"admin:{model._meta.app_label}_{model._meta.model_name}"
        writable = model not in READ_ONLY_ADMIN_MODELS
        by_id = _object_kwargs(model)
        yield f"{prefix}_changelist", Route({"GET": STAFF_ONLY(200)})
        yield f"{prefix}_add", Route({"GET": STAFF_ONLY(200 if writable else 403)})
        yield f"{prefix}_history", Route({"GET": STAFF_ONLY(200)}, by_id)
        yield f"{prefix}_delete", Route({"GET": STAFF_ONLY(200 if writable else 403)}, by_id)
        yield f"{prefix}_change", Route({"GET": STAFF_ONLY(200)}, by_id)
        # admin/<app>/<model>/<id>/ redirects to the change page.
        yield (
            f"admin/{model._meta.app_label}/{model._meta.model_name}/<path:object_id>/",
            Route({"GET": STAFF_ONLY(302)}, by_id),
        )


MATRIX.update(dict(_admin_routes()))


def _walk(
    patterns: list[Any], prefix: str = "", namespace: str | None = None
) -> Iterator[tuple[str, str]]:
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            inner = namespace
            if pattern.namespace:
                inner = f"{namespace}:{pattern.namespace}" if namespace else pattern.namespace
            yield from _walk(pattern.url_patterns, prefix + str(pattern.pattern), inner)
        elif isinstance(pattern, URLPattern):
            route = prefix + str(pattern.pattern)
            if pattern.name:
                yield (f"{namespace}:{pattern.name}" if namespace else pattern.name), route
            else:
                yield route, route


def project_routes() -> dict[str, str]:
    return dict(_walk(get_resolver().url_patterns))


def _url(key: str, kwargs: dict[str, Any]) -> str:
    if "/" not in key and "$" not in key:
        return reverse(key, kwargs=kwargs)
    # An unnamed route: fill its single parameter by hand.
    if key.endswith("(?P<url>.*)$"):
        return "/admin/" + str(kwargs["url"])
    if "<" not in key:
        return "/" + key
    return "/" + key.replace("<path:object_id>", str(kwargs["object_id"]))


def test_every_route_is_in_the_matrix() -> None:
    routes = project_routes()
    missing = sorted(set(routes) - set(MATRIX))
    stale = sorted(set(MATRIX) - set(routes))
    assert not missing, f"routes without a matrix entry (decide who may use them): {missing}"
    assert not stale, f"matrix entries for routes that no longer exist: {stale}"


CASES = [
    pytest.param(key, method, who, id=f"{key}-{method}-{who}")
    for key, route in MATRIX.items()
    for method in route.methods
    for who in CAST
]


@pytest.mark.parametrize(("key", "method", "who"), CASES)
def test_access(world: Any, key: str, method: str, who: str) -> None:
    route = MATRIX[key]
    # Something for the audit log's admin pages to show.
    with audit.acting_as(None, source="system"):
        audit.record(action="matrix", workspace=world.alpha)
    url = _url(key, route.kwargs(world))
    client = world.api_client_for(who) if route.api else world.client_for(who)
    send = getattr(client, method.lower())
    if route.api and method in {"POST", "PATCH", "PUT"}:
        response = send(url, route.payload(), format="multipart" if route.multipart else "json")
    elif method in {"POST", "PATCH", "PUT"}:
        response = send(url, route.payload())
    else:
        response = send(url)
    expected = route.methods[method][who]
    assert response.status_code == expected, (
        f"{method} {url} as {who}: expected {expected}, got {response.status_code}"
    )
    if expected == 302 and who == "anonymous" and key not in {"logout", "admin:logout", "favicon"}:
        location = response["Location"]
        assert "login" in location, (
            f"anonymous {method} {url} redirected to {location}, not a login page"
        )


@pytest.mark.parametrize("who", ["outsider", "researcher"])
def test_an_inaccessible_workspace_looks_like_a_missing_one(world: Any, who: str) -> None:
    """The outsider's 404 for alpha is the same as anyone's 404 for a name that does not exist."""
    client = world.api_client_for(who)
    hidden = client.get(
        reverse(
            "api:workspace-detail",
            kwargs={"workspace_slug": "beta" if who == "researcher" else "alpha"},
        )
    )
    missing = client.get(
        reverse("api:workspace-detail", kwargs={"workspace_slug": "no-such-space"})
    )
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json() == missing.json()
    page_client = world.client_for(who)
    hidden_page = page_client.get(
        reverse(
            "workspace-home", kwargs={"workspace_slug": "beta" if who == "researcher" else "alpha"}
        )
    )
    missing_page = page_client.get(
        reverse("workspace-home", kwargs={"workspace_slug": "no-such-space"})
    )
    assert hidden_page.status_code == missing_page.status_code == 404


# --- The same API routes called with API tokens -----------------------------------------------

TOKEN_CAST = (*CAST[:-1], "foreign_token")
API_CASES = [
    pytest.param(key, method, who, id=f"token-{key}-{method}-{who}")
    for key, route in MATRIX.items()
    if route.api
    for method in route.methods
    for who in TOKEN_CAST
]


@pytest.mark.parametrize(("key", "method", "who"), API_CASES)
def test_access_with_tokens(world: Any, key: str, method: str, who: str) -> None:
    """Each member calls with a token of their own (all workspaces, read-write) and gets
    exactly what a session would. ``foreign_token`` is the workspace admin's token limited
    to beta: to it, alpha does not exist."""
    route = MATRIX[key]
    kwargs = route.kwargs(world)
    if who == "foreign_token":
        admin = world.users["workspace_admin"]
        Membership.objects.create(workspace=world.beta, user=admin, role="admin")
        issued = tokens.issue_token(user=admin, name="beta only", workspace=world.beta)
        in_alpha = kwargs.get("workspace_slug") == "alpha"
        expected = 404 if in_alpha else route.methods[method]["workspace_admin"]
    else:
        issued = tokens.issue_token(user=world.users[who], name="matrix")
        expected = route.methods[method][who]
    if method in route.with_tokens:
        expected = route.with_tokens[method][who]
    client = world.api_client_for("anonymous")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.plaintext}")
    url = _url(key, kwargs)
    send = getattr(client, method.lower())
    if method in {"POST", "PATCH", "PUT"}:
        response = send(url, route.payload(), format="multipart" if route.multipart else "json")
    else:
        response = send(url)
    assert response.status_code == expected, (
        f"{method} {url} with {who}'s token: expected {expected}, got {response.status_code}"
    )


# --- Machine tokens: a run's or an endpoint's token reaches only what holds it ---------------

#: The routes a run token takes: of its own run (another run's are not there to it: 404).
RUN_TOKEN_ROUTES = {
    "api:run-bundle",
    "api:run-data",
    "api:run-data-blob",
    *(key for key in MATRIX if key.startswith("api:run-report-")),
}
#: The routes an endpoint token takes: of its own endpoint (another's: 404).
ENDPOINT_TOKEN_ROUTES = {
    "api:endpoint-bundle",
    "api:endpoint-model",
    "api:endpoint-model-blob",
    "api:endpoint-report-model-staged",
}
#: Routes that authenticate no one: a token sent there is not looked at.
UNAUTHENTICATED_ROUTES = {"api:evidence-keys"}

MACHINE_TOKEN_CASES = [
    pytest.param(key, method, kind, id=f"{kind}-token-{key}-{method}")
    for key, route in MATRIX.items()
    if route.api
    for method in route.methods
    for kind in ("run", "endpoint")
]


def _send_with_token(key: str, method: str, kwargs: dict[str, Any], plaintext: str) -> Any:
    route = MATRIX[key]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    send = getattr(client, method.lower())
    url = _url(key, kwargs)
    if method in {"POST", "PATCH", "PUT"}:
        return send(url, route.payload(), format="multipart" if route.multipart else "json")
    return send(url)


@pytest.mark.parametrize(("key", "method", "kind"), MACHINE_TOKEN_CASES)
def test_a_machine_token_reaches_only_the_routes_of_what_holds_it(
    world: Any, key: str, method: str, kind: str
) -> None:
    """A run token (of a run of alpha that is not the route's) and an endpoint token (of an
    endpoint of alpha that is not the route's), on every API route: refused (403) wherever
    its kind is not taken, not found (404) on the routes of its kind, which are another's;
    its user, alpha's researcher, could read or change most of them."""
    kwargs = MATRIX[key].kwargs(world)
    if kind == "run":
        run = make_run(world)
        attempt = RunAttempt.objects.for_workspace(world.alpha).get(run=run, number=1)
        plaintext = issue_run_token(run=run, attempt=attempt, max_runtime_seconds=None)
        own = RUN_TOKEN_ROUTES
    else:
        plaintext = issue_endpoint_token(make_endpoint(world, name="holder"))
        own = ENDPOINT_TOKEN_ROUTES
    assert plaintext is not None
    response = _send_with_token(key, method, kwargs, plaintext)
    expected = 200 if key in UNAUTHENTICATED_ROUTES else 404 if key in own else 403
    assert response.status_code == expected, (
        f"{method} {key} with another {kind}'s {kind} token: expected {expected}, got "
        f"{response.status_code}"
    )


@pytest.mark.parametrize("key", sorted(ENDPOINT_TOKEN_ROUTES))
def test_an_endpoint_token_reaches_its_own_endpoints_routes(world: Any, key: str) -> None:
    kwargs = MATRIX[key].kwargs(world)
    endpoint = Endpoint.objects.for_workspace(world.alpha).get(name=kwargs["name"])
    plaintext = issue_endpoint_token(endpoint)
    assert plaintext is not None
    (method,) = MATRIX[key].methods
    response = _send_with_token(key, method, kwargs, plaintext)
    assert response.status_code == (201 if method == "POST" else 200), response
