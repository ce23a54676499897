"""The ``endpoints:invoke`` token scope: tokens made before scopes existed keep exactly what
they could do (and cannot invoke); the scope is given on the tokens page, with
``manage.py create_token --scope``, and shown by ``/api/v1/me/``."""

from __future__ import annotations

import io
import secrets
import string
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone
from rest_framework.test import APIClient

from identity import tokens
from identity.models import ApiToken
from serving.models import EndpointState
from tests.serving import fakes
from tests.serving.factories import make_endpoint
from tests.serving.upstream import upstream_server

ENDPOINT = "/api/v1/workspaces/alpha/endpoints/chat/"


def bearer(plaintext: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    return client


@pytest.mark.django_db
def test_an_unknown_scope_is_refused(world: Any) -> None:
    with pytest.raises(tokens.TokenPolicyError, match="No such scope: runs:everything"):
        tokens.issue_token(user=world.users["researcher"], name="x", scopes=["runs:everything"])
    assert not ApiToken.objects.filter(name="x").exists()


@pytest.mark.django_db
def test_the_scope_is_audited_and_shown(world: Any) -> None:
    issued = tokens.issue_token(
        user=world.users["researcher"], name="app", scopes=["endpoints:invoke"], read_only=True
    )
    assert issued.token.scopes == ["endpoints:invoke"]
    me = bearer(issued.plaintext).get("/api/v1/me/").json()
    assert me["token"]["scopes"] == ["endpoints:invoke"]
    from portal.models import AuditEvent

    event = AuditEvent.objects.unscoped().get(action="token.create", object_id=str(issued.token.pk))
    assert event.after is not None
    assert event.after["scopes"] == ["endpoints:invoke"]
    plain = tokens.issue_token(user=world.users["researcher"], name="plain")
    assert bearer(plain.plaintext).get("/api/v1/me/").json()["token"]["scopes"] == []


@pytest.mark.django_db
def test_the_tokens_page_gives_the_scope(world: Any) -> None:
    client = world.client_for("researcher")
    page = client.get("/tokens/")
    assert "Invoke endpoints" in page.content.decode()
    made = client.post(
        "/tokens/", {"name": "app", "expires_in_days": "30", "invoke_endpoints": "on"}
    )
    assert made.status_code == 201
    token = ApiToken.objects.get(name="app")
    assert token.scopes == ["endpoints:invoke"]
    assert "endpoints:invoke" in made.content.decode()
    client.post("/tokens/", {"name": "plain", "expires_in_days": "30"})
    assert ApiToken.objects.get(name="plain").scopes == []


@pytest.mark.django_db
def test_create_token_gives_the_scope(world: Any) -> None:
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "create_token",
        "rob",
        "--scope",
        "endpoints:invoke",
        "--name",
        "cli",
        stdout=out,
        stderr=err,
    )
    assert ApiToken.objects.get(name="cli").scopes == ["endpoints:invoke"]
    assert "endpoints:invoke" in err.getvalue()
    token = out.getvalue().strip()
    make_endpoint(world, state=EndpointState.READY)
    with upstream_server() as upstream:
        fakes.BEHAVIOUR.address = upstream.address
        answer = bearer(token).post(ENDPOINT + "invoke/x", b"{}", content_type="application/json")
        assert answer.status_code == 200


# --- A token made before scopes existed --------------------------------------------------------

BEFORE = [("identity", "0001_initial")]


def migrate(targets: list[tuple[str, str]]) -> Any:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return MigrationExecutor(connection).loader.project_state(targets).apps


@pytest.fixture
def before() -> Iterator[Any]:
    """The schema before token scopes; the latest again afterwards, whatever happens."""
    apps = migrate(BEFORE)
    try:
        yield apps
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_token_made_before_scopes_does_what_it_did(world: Any, before: Any) -> None:
    key = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(12))
    secret = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(40))
    pepper_id = max(tokens._peppers())
    before.get_model("identity", "ApiToken")._default_manager.create(
        user_id=world.users["researcher"].pk,
        name="old",
        kind="user",
        key=key,
        secret_hash=tokens._digest(tokens._peppers()[pepper_id], key, secret),
        pepper_id=pepper_id,
        expires_at=timezone.now() + timedelta(days=2),
    )
    migrate([("identity", "0002_apitoken_scopes")])
    migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
    old = ApiToken.objects.get(key=key)
    assert old.scopes == []
    client = bearer(f"tau_{key}_{secret}")
    make_endpoint(world, state=EndpointState.READY)
    # It writes what it wrote before (here: scaling its user's endpoint) …
    assert client.patch(ENDPOINT, {"replicas": 2}, format="json").status_code == 200
    # … and is refused the one thing that needs the new scope.
    refused = client.post(ENDPOINT + "invoke/x", b"{}", content_type="application/json")
    assert refused.status_code == 403
    assert "endpoints:invoke" in refused.json()["detail"]
