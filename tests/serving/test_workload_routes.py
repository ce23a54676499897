"""An endpoint's token and the routes its pods call (``serving.workload_tokens``,
``serving.api.workload``): the project zip, the model's listing and files, the stager's
report. The token is issued audited, held by its endpoint, one live at a time, and revoked
when the endpoint stops or is deleted; it reaches its own endpoint's routes and nothing else
(tests/test_access_matrix.py walks every other route with it). The listing is the one the
real stager reads (``render.STAGE_SCRIPT``, run here against a live portal) and the zip the
one the real fetcher checks and unpacks (``render.FETCH_SCRIPT``)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from catalog.ingest import asset_named, ingest_folder, set_alias
from catalog.models import AssetVersion
from executors.kubernetes.render import FETCH_SCRIPT, MAX_BUNDLE_BYTES, STAGE_SCRIPT
from identity.models import ApiToken
from identity.tokens import issue_token
from portal.models import AuditEvent
from runs.models import RunAttempt
from runs.run_tokens import issue_run_token
from serving import services
from serving.events import verify_event_chain
from serving.models import Endpoint, EndpointEvent, EndpointEventKind, EndpointState
from serving.workload_tokens import issue_endpoint_token, revoke_endpoint_tokens
from tests.runs.factories import make_run
from tests.serving.factories import ENDPOINT_FILES, MODEL_SPEC, make_endpoint, model_version
from workspaces.models import Membership

pytestmark = pytest.mark.django_db

API = "/api/v1/workspaces"


def routes(name: str, workspace: str = "alpha") -> dict[str, str]:
    base = f"{API}/{workspace}/endpoints/{name}/"
    return {
        "bundle": f"{base}bundle/",
        "model": f"{base}model/",
        "blob": f"{base}model/blobs/{hashlib.sha256(b'0123456789').hexdigest()}/",
        "report": f"{base}report/model-staged/",
    }


REPORT = {"files": 1, "bytes": 10, "seconds": 0.25}


@pytest.fixture(autouse=True)
def revoked_tokens_get_401(settings: Any) -> None:
    """A revoked token is a failed authentication, which the portal counts per client
    address (every test's is 127.0.0.1) and per key, answering 429 past a limit: what these
    tests check is the 401 before it, whatever the tests before them failed."""
    settings.TAU_AUTH_FAILURES_PER_ADDRESS = 10**6
    settings.TAU_AUTH_FAILURES_PER_KEY = 10**6


def bearer(plaintext: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    return client


def token_for(endpoint: Endpoint) -> str:
    token = issue_endpoint_token(endpoint)
    assert token is not None
    return token


def body(response: Any) -> bytes:
    """A streamed (or plain) answer's bytes."""
    if getattr(response, "streaming", False):
        return b"".join(response.streaming_content)
    return bytes(response.content)


def serving_a_model(world: Any, tmp_path: Path, name: str = "chat") -> Endpoint:
    """``name`` in alpha, serving alpha's tiny-gpt@production (one file, ``weights.bin``)."""
    if not AssetVersion.objects.for_workspace(world.alpha).exists():
        model_version(world, tmp_path)
    return make_endpoint(world, spec=MODEL_SPEC, name=name)


# --- The token ------------------------------------------------------------------------------


def test_the_token_is_issued_audited_and_held_by_its_endpoint(world: Any, settings: Any) -> None:
    settings.TAU_TOKEN_MAX_DAYS = 90
    endpoint = make_endpoint(world)
    first = token_for(endpoint)
    endpoint.refresh_from_db()
    assert endpoint.token is not None
    held = endpoint.token
    assert (held.kind, held.workspace_id, held.user_id) == (
        ApiToken.Kind.ENDPOINT,
        world.alpha.pk,
        world.users["researcher"].pk,
    )
    assert held.name == "endpoint chat generation 1"
    assert not held.read_only
    # It lasts as long as the policy allows: an endpoint runs until it is stopped.
    lasts = held.expires_at - held.created_at
    assert timedelta(days=89) < lasts <= timedelta(days=90)
    created = AuditEvent.objects.unscoped().get(action="token.create", object_id=str(held.pk))
    assert created.after is not None
    assert (created.after["kind"], created.after["endpoint"]) == ("endpoint", "chat")
    assert created.workspace_id == world.alpha.pk
    assert first not in json.dumps(created.after)  # the plaintext is never recorded

    # One live token per endpoint: the next one revokes it, audited.
    second = token_for(endpoint)
    held.refresh_from_db()
    assert held.revoked_at is not None
    revoked = AuditEvent.objects.unscoped().get(action="token.revoke", object_id=str(held.pk))
    assert revoked.after == {"kind": "endpoint"}
    assert bearer(first).get(routes("chat")["bundle"]).status_code == 401
    assert bearer(second).get(routes("chat")["bundle"]).status_code == 200
    assert revoke_endpoint_tokens(endpoint) == 1
    assert revoke_endpoint_tokens(endpoint) == 0
    assert bearer(second).get(routes("chat")["bundle"]).status_code == 401


def test_no_token_when_its_deployer_cannot_act_or_it_is_stopped(world: Any) -> None:
    endpoint = make_endpoint(world)
    researcher = world.users["researcher"]
    researcher.is_active = False
    researcher.save(update_fields=["is_active"])
    assert issue_endpoint_token(endpoint) is None
    researcher.is_active = True
    researcher.save(update_fields=["is_active"])

    services.stop_endpoint(endpoint=endpoint, user=researcher)
    assert issue_endpoint_token(endpoint) is None
    services.delete_endpoint(endpoint=endpoint, user=researcher)
    assert issue_endpoint_token(endpoint) is None
    assert not ApiToken.objects.filter(kind=ApiToken.Kind.ENDPOINT).exists()


@pytest.mark.parametrize("how", ["stop", "delete", "observed-stopped"])
def test_the_token_is_revoked_when_the_endpoint_stops(world: Any, how: str) -> None:
    endpoint = make_endpoint(world, state=EndpointState.READY)
    client = bearer(token_for(endpoint))
    assert client.get(routes("chat")["bundle"]).status_code == 200
    if how == "stop":
        services.stop_endpoint(endpoint=endpoint, user=world.users["researcher"])
    elif how == "delete":
        services.delete_endpoint(endpoint=endpoint, user=world.users["researcher"])
    else:
        assert services.observe(endpoint, state=EndpointState.STOPPED, reason="Gone.")
    for route in routes("chat").values():
        answer = client.post(route, REPORT) if route.endswith("staged/") else client.get(route)
        assert answer.status_code == 401, route
    token = ApiToken.objects.get(kind=ApiToken.Kind.ENDPOINT)
    assert token.revoked_at is not None


# --- Its routes -----------------------------------------------------------------------------


def test_the_token_reaches_its_own_endpoints_routes(world: Any, tmp_path: Path) -> None:
    endpoint = serving_a_model(world, tmp_path)
    client = bearer(token_for(endpoint))
    paths = routes("chat")

    zipped = client.get(paths["bundle"])
    assert zipped.status_code == 200
    assert zipped["Content-Type"] == "application/zip"
    content = body(zipped)
    assert endpoint.bundle is not None
    assert (
        zipped["X-Content-SHA256"] == endpoint.bundle.sha256 == hashlib.sha256(content).hexdigest()
    )
    with zipfile.ZipFile(io.BytesIO(content)) as archive:
        assert {name: archive.read(name).decode() for name in archive.namelist()} == ENDPOINT_FILES

    listing = client.get(paths["model"])
    assert listing.status_code == 200
    assert listing["Content-Type"] == "application/x-ndjson"
    head, *files = (json.loads(line) for line in body(listing).splitlines())
    version = endpoint.model_version
    assert version is not None
    assert head == {
        "files": 1,
        "bytes": 10,
        "model": {
            "ref": "tiny-gpt@1",
            "name": "tiny-gpt",
            "version": 1,
            "manifest_digest": version.manifest_digest,
        },
    }
    sha = hashlib.sha256(b"0123456789").hexdigest()
    # No dataset folder: the file goes under the model's folder as it is in the version.
    assert files == [
        {
            "path": "weights.bin",
            "ref": "tiny-gpt@1",
            "file": "weights.bin",
            "size": 10,
            "sha256": sha,
            "url": f"blobs/{sha}/",
        }
    ]
    blob = client.get(paths["blob"])
    assert (blob.status_code, body(blob)) == (200, b"0123456789")
    assert client.get(paths["blob"].replace(sha, "0" * 64)).status_code == 404

    reported = client.post(paths["report"], REPORT, format="json")
    assert reported.status_code == 201
    assert reported.json()["kind"] == "model_staged"
    event = EndpointEvent.objects.for_workspace(world.alpha).get(
        endpoint=endpoint, kind=EndpointEventKind.MODEL_STAGED
    )
    assert event.data == {
        "generation": 1,
        "model": "tiny-gpt@1",
        "files": 1,
        "bytes": 10,
        "seconds": 0.25,
    }
    assert event.message == "Generation 1 staged its model tiny-gpt@1: 1 files, 10 bytes in 0.2 s."
    assert verify_event_chain(endpoint)
    assert client.post(paths["report"], {**REPORT, "files": -1}, format="json").status_code == 400


def test_an_endpoint_without_a_model_lists_nothing_and_one_without_a_zip_has_no_bundle(
    world: Any,
) -> None:
    endpoint = make_endpoint(world, files=None)
    client = bearer(token_for(endpoint))
    listing = client.get(routes("chat")["model"])
    assert listing.status_code == 200
    assert [json.loads(line) for line in body(listing).splitlines()] == [
        {"files": 0, "bytes": 0, "model": None}
    ]
    assert client.get(routes("chat")["blob"]).status_code == 404
    missing = client.get(routes("chat")["bundle"], HTTP_ACCEPT="application/zip")
    assert missing.status_code == 404
    assert missing.json()["detail"] == (
        "This endpoint has no project zip: its code comes with its image."
    )


def test_another_endpoints_routes_do_not_exist_for_the_token(world: Any, tmp_path: Path) -> None:
    mine = serving_a_model(world, tmp_path, name="mine")
    serving_a_model(world, tmp_path, name="theirs")
    client = bearer(token_for(mine))
    for route in routes("theirs").values():
        if route.endswith("staged/"):
            answer = client.post(route, REPORT, format="json")
        else:
            answer = client.get(route, HTTP_ACCEPT="application/json")
        assert answer.status_code == 404, route
        assert answer.json()["detail"] == "This workspace has no endpoint named 'theirs'."
    # Nor one of another workspace, even of the same name: its workspace does not exist.
    Membership.objects.create(workspace=world.beta, user=world.users["researcher"], role="admin")
    make_endpoint(world, workspace=world.beta, name="mine")
    for route in routes("mine", workspace="beta").values():
        if route.endswith("staged/"):
            answer = client.post(route, REPORT, format="json")
        else:
            answer = client.get(route)
        assert answer.status_code == 404, route
        assert answer.json()["detail"] == "No such workspace."
    # Nor anything else of its own endpoint, nor any other route (the access matrix walks
    # every route: tests/test_access_matrix.py).
    for route in ("", "evidence/", "logs/", "metrics/"):
        assert client.get(f"{API}/alpha/endpoints/mine/{route}").status_code == 403
    assert client.post(f"{API}/alpha/endpoints/mine/invoke/x", {}).status_code == 403
    assert client.delete(f"{API}/alpha/endpoints/mine/").status_code == 403
    assert client.get(f"{API}/alpha/models/tiny-gpt/").status_code == 403
    assert client.get("/api/v1/me/").status_code == 403
    refused = client.get(f"{API}/")
    assert refused.status_code == 403
    assert refused.json()["detail"] == (
        "This token only fetches its endpoint's project zip and model and reports their staging."
    )


def test_members_read_the_zip_and_model_but_only_the_token_reports(
    world: Any, tmp_path: Path
) -> None:
    serving_a_model(world, tmp_path)
    paths = routes("chat")
    for who in ("platform_admin", "workspace_admin", "researcher", "viewer"):
        member = world.api_client_for(who)
        assert member.get(paths["bundle"]).status_code == 200, who
        assert member.get(paths["model"]).status_code == 200, who
        assert body(member.get(paths["blob"])) == b"0123456789", who
        refused = member.post(paths["report"], REPORT, format="json")
        assert refused.status_code == 403, who
        assert refused.json()["detail"] == "Only an endpoint's own token reports on it."
    # A person's token reads as its user does.
    issued = issue_token(user=world.users["viewer"], name="laptop", read_only=True)
    assert bearer(issued.plaintext).get(paths["model"]).status_code == 200
    assert bearer(issued.plaintext).post(paths["report"], REPORT, format="json").status_code == 403
    outsider = world.api_client_for("outsider")
    assert outsider.get(paths["bundle"]).status_code == 404
    assert APIClient().get(paths["model"]).status_code == 401


def test_a_run_token_reaches_no_endpoint_route_and_an_endpoint_token_no_run_route(
    world: Any, tmp_path: Path
) -> None:
    endpoint = serving_a_model(world, tmp_path)
    run = make_run(world, files={"main.py": "print(1)\n"})
    attempt = RunAttempt.objects.for_workspace(world.alpha).get(run=run, number=1)
    run_token = issue_run_token(run=run, attempt=attempt, max_runtime_seconds=None)
    assert run_token is not None
    for route in routes("chat").values():
        if route.endswith("staged/"):
            answer = bearer(run_token).post(route, REPORT, format="json")
        else:
            answer = bearer(run_token).get(route)
        assert answer.status_code == 403, route
    # The run's routes that take run tokens take no endpoint token, though its user could read
    # them: the run's bundle, its data, its reports.
    client = bearer(token_for(endpoint))
    run_base = f"{API}/alpha/runs/{run.name}/"
    for route in ("bundle/", "data/", f"data/blobs/{'0' * 64}/"):
        assert client.get(f"{run_base}{route}").status_code == 403, route
    for route in ("report/data-staged/", "report/events/"):
        answer = client.post(f"{run_base}{route}", {"kind": "x", **REPORT}, format="json")
        assert answer.status_code == 403, route


def test_reports_are_bounded_per_token(world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from serving.api import workload

    monkeypatch.setattr(workload, "REPORTS_PER_MINUTE", 3)
    endpoint = make_endpoint(world)
    client = bearer(token_for(endpoint))
    for _ in range(3):
        assert client.post(routes("chat")["report"], REPORT, format="json").status_code == 201
    refused = client.post(routes("chat")["report"], REPORT, format="json")
    assert refused.status_code == 429
    assert "Retry-After" in refused
    assert refused.json()["detail"].startswith("An endpoint may report at most 3 times a minute")


# --- The real fetcher and stager against a live portal ---------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_stager_stages_the_model_from_the_listing(
    world: Any, live_server: Any, tmp_path: Path
) -> None:
    """``render.STAGE_SCRIPT`` as the endpoint's init container runs it, against the portal's
    own listing and files, with the endpoint's token: every file of the version under the
    model's folder (no dataset folder), read-only, each SHA-256 checked; the report recorded."""
    source = tmp_path / "checkpoint"
    (source / "tokenizer").mkdir(parents=True)
    (source / "config.json").write_text('{"layers": 2}\n')
    (source / "weights.bin").write_bytes(bytes(range(256)) * 4)
    (source / "tokenizer" / "vocab.txt").write_text("a\nb\nc\n")
    (source / "tokenizer" / "same-config.json").write_text('{"layers": 2}\n')  # one blob, twice
    version = ingest_folder(asset_named(world.alpha, "model", "tiny-gpt"), source, source="upload")
    set_alias(version, "production")
    endpoint = make_endpoint(world, spec=MODEL_SPEC)
    assert endpoint.model_version_id == version.pk
    token = token_for(endpoint)
    base = f"{live_server.url}/api/v1/workspaces/alpha/endpoints/chat/"
    root = tmp_path / "model"
    root.mkdir()

    done = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            STAGE_SCRIPT,
            f"{base}model/",
            str(root),
            str(version.bytes),
            f"{base}report/model-staged/",
        ],
        env={"TAU_RUN_TOKEN": token, "PATH": os.environ.get("PATH", "")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert f"tau-stage-data: 4 files, {version.bytes} bytes verified" in done.stdout
    staged = {
        str(path.relative_to(root)): path.read_bytes() for path in root.rglob("*") if path.is_file()
    }
    assert staged == {
        "config.json": b'{"layers": 2}\n',
        "weights.bin": bytes(range(256)) * 4,
        "tokenizer/vocab.txt": b"a\nb\nc\n",
        "tokenizer/same-config.json": b'{"layers": 2}\n',
    }
    for name, content in staged.items():
        assert version.files.get(path=name).sha256 == hashlib.sha256(content).hexdigest()
        assert (root / name).stat().st_mode & 0o222 == 0  # read-only
    assert (root / "tokenizer").stat().st_mode & 0o222 == 0
    (event,) = EndpointEvent.objects.for_workspace(world.alpha).filter(
        endpoint=endpoint, kind=EndpointEventKind.MODEL_STAGED
    )
    assert (event.data["files"], event.data["bytes"], event.data["model"]) == (
        4,
        version.bytes,
        "tiny-gpt@1",
    )

    # Another endpoint's token stages nothing of it: the listing is not there for it.
    other = make_endpoint(world, name="other")
    again = tmp_path / "again"
    again.mkdir()
    refused = subprocess.run(
        [sys.executable, "-I", "-c", STAGE_SCRIPT, f"{base}model/", str(again), "4096", "x"],
        env={"TAU_RUN_TOKEN": token_for(other), "PATH": os.environ.get("PATH", "")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert refused.returncode != 0
    assert "the listing: the server answered 404" in refused.stderr


@pytest.mark.django_db(transaction=True)
def test_the_fetcher_fetches_checks_and_unpacks_the_project_zip(
    world: Any, live_server: Any, tmp_path: Path
) -> None:
    """``render.FETCH_SCRIPT`` as the endpoint's init container runs it, against the bundle
    route with the endpoint's token and the digest the endpoint was deployed with."""
    endpoint = make_endpoint(world, files={**ENDPOINT_FILES, "pkg/util.py": "X = 1\n"})
    assert endpoint.bundle is not None
    url = f"{live_server.url}/api/v1/workspaces/alpha/endpoints/chat/bundle/"

    def fetch(token: str, root: Path) -> subprocess.CompletedProcess[str]:
        root.mkdir()
        assert endpoint.bundle is not None
        return subprocess.run(
            [
                sys.executable,
                "-I",
                "-c",
                FETCH_SCRIPT,
                url,
                endpoint.bundle.sha256,
                str(root),
                str(MAX_BUNDLE_BYTES),
            ],
            env={"TAU_RUN_TOKEN": token, "PATH": os.environ.get("PATH", "")},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    done = fetch(token_for(endpoint), tmp_path / "fetch")
    assert done.returncode == 0, done.stderr
    assert f"tau-fetch-bundle: {endpoint.bundle.sha256} verified" in done.stdout
    code = tmp_path / "fetch" / "code"
    assert (code / "app.py").read_text() == ENDPOINT_FILES["app.py"]
    assert (code / "pkg" / "util.py").read_text() == "X = 1\n"

    other = make_endpoint(world, name="other")
    refused = fetch(token_for(other), tmp_path / "refused")
    assert refused.returncode == 1
    assert "answered 404" in refused.stderr
    assert not (tmp_path / "refused" / "code").exists()
    # A token revoked (the endpoint stopped) fetches nothing either.
    token = token_for(endpoint)
    services.stop_endpoint(endpoint=endpoint, user=world.users["researcher"])
    stopped = fetch(token, tmp_path / "stopped")
    assert stopped.returncode == 1
    assert "answered 401" in stopped.stderr


def test_the_token_never_outlives_the_policy(world: Any, settings: Any) -> None:
    settings.TAU_TOKEN_MAX_DAYS = 1
    endpoint = make_endpoint(world)
    token_for(endpoint)
    endpoint.refresh_from_db()
    assert endpoint.token is not None
    assert endpoint.token.expires_at <= timezone.now() + timedelta(days=1)


def test_options_describes_the_report_to_its_token(world: Any) -> None:
    """DRF's OPTIONS asks the view for a serializer to describe a POST with: the report
    route has one (the runs' report routes answered their own token's OPTIONS with a 500)."""
    client = bearer(token_for(make_endpoint(world)))
    described = client.options(routes("chat")["report"])
    assert described.status_code == 200
    assert set(described.json()["actions"]["POST"]) == {"files", "bytes", "seconds"}
