"""What one proxied request costs the portal (``…/endpoints/{name}/invoke/{path}``), and that
nothing it saves is a decision kept past the request: the SQL queries it makes, pinned; the
endpoint read by one statement written out once (``serving.api.views.serving_endpoint``),
which must find what the ORM finds; the connection to the endpoint kept and reused, from one
client per process that a worker's threads share; and a revoked token or a stopped endpoint
refused on the very next request."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from identity import tokens
from serving.api import views
from serving.models import Endpoint, EndpointState
from tests.serving import fakes
from tests.serving.factories import make_endpoint
from tests.serving.test_invoke import INVOKE, body_of, invoker, ready
from tests.serving.upstream import upstream_server

pytestmark = pytest.mark.django_db


def fields(instance: Any) -> dict[str, Any]:
    return {f.attname: getattr(instance, f.attname) for f in instance._meta.concrete_fields}


def queries_of(send: Any) -> list[str]:
    """The SQL a request made, its answer read to the end."""
    with CaptureQueriesContext(connection) as captured:
        response = send()
        assert response.status_code == 200
        body_of(response)
    return [query["sql"] for query in captured.captured_queries]


def test_a_proxied_request_makes_three_queries(world: Any) -> None:
    """With a token: the token and its user, the workspace and the caller's role in it, the
    endpoint. Nothing else, whatever the method; the token's ``last_used_at`` and the
    endpoint's ``last_request_at`` add one write each at most once a minute."""
    ready(world)
    client = invoker(world)
    with upstream_server() as upstream:
        fakes.BEHAVIOUR.address = upstream.address
        first = queries_of(lambda: client.post(INVOKE + "x", b"{}", content_type="text/plain"))
        assert len(first) == 5  # the two once-a-minute writes
        assert sum(query.startswith("UPDATE") for query in first) == 2
        for _ in range(3):
            post = queries_of(lambda: client.post(INVOKE + "x", b"{}", content_type="text/plain"))
            assert len(post) == 3, post
            assert not any(query.startswith("UPDATE") for query in post)
        get = queries_of(lambda: client.get(INVOKE + "v1/models"))
        assert len(get) == 3, get


def test_a_proxied_request_with_a_session_makes_four(world: Any) -> None:
    """A browser's session: the session, its user, the workspace with the role, the endpoint."""
    ready(world)
    Endpoint.objects.unscoped().update(last_request_at=timezone.now())  # noted a moment ago
    client = Client()
    client.force_login(world.users["viewer"])
    with upstream_server() as upstream:
        fakes.BEHAVIOUR.address = upstream.address
        made = queries_of(lambda: client.get(INVOKE + "v1/models"))
    assert len(made) == 4, made


def test_the_endpoint_is_read_as_the_orm_reads_it(world: Any) -> None:
    made = make_endpoint(world, state=EndpointState.READY)
    Endpoint.objects.unscoped().filter(pk=made.pk).update(
        last_request_at=timezone.now(), url="http://127.0.0.1:1/app"
    )
    with CaptureQueriesContext(connection) as captured:
        found = views.serving_endpoint(world.alpha.pk, made.name)
    assert len(captured) == 1
    assert found is not None
    expected = Endpoint.objects.for_workspace(world.alpha).get(pk=made.pk)
    assert fields(found) == fields(expected)
    assert found.spec == expected.spec  # JSON, as the ORM gives it
    # Another workspace's is not there; nor is a deleted one; a NUL asks nothing.
    assert views.serving_endpoint(world.beta.pk, made.name) is None
    with CaptureQueriesContext(connection) as captured:
        assert views.serving_endpoint(world.alpha.pk, "chat\x00") is None
    assert len(captured) == 0
    Endpoint.objects.unscoped().filter(pk=made.pk).update(deleted_at=timezone.now())
    assert views.serving_endpoint(world.alpha.pk, made.name) is None


def test_a_revoked_token_and_a_stopped_endpoint_are_refused_at_once(world: Any) -> None:
    """Nothing of a request's checks outlives it: the next request after a revocation or a
    state change is refused."""
    made = ready(world)
    issued = tokens.issue_token(
        user=world.users["researcher"], name="invoker", scopes=["endpoints:invoke"]
    )
    client = invoker(world)
    revoked = world.api_client_for("anonymous")
    revoked.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.plaintext}")
    with upstream_server() as upstream:
        fakes.BEHAVIOUR.address = upstream.address
        assert revoked.post(INVOKE + "x", b"{}", content_type="text/plain").status_code == 200
        tokens.revoke_token(token=issued.token)
        assert revoked.post(INVOKE + "x", b"{}", content_type="text/plain").status_code == 401
        assert client.get(INVOKE + "v1/models").status_code == 200
        Endpoint.objects.unscoped().filter(pk=made.pk).update(state=EndpointState.STOPPED)
        stopped = client.get(INVOKE + "v1/models")
        assert stopped.status_code == 409
        assert stopped.json()["state"] == EndpointState.STOPPED
        assert len(upstream.seen) == 2


def test_the_connection_to_the_endpoint_is_kept_and_reused(world: Any) -> None:
    ready(world)
    client = invoker(world)
    with upstream_server() as upstream:
        fakes.BEHAVIOUR.address = upstream.address
        for _ in range(5):
            response = client.post(INVOKE + "x", b"{}", content_type="text/plain")
            assert body_of(response) == b"{}"
        assert client.get(INVOKE + "v1/models").status_code == 200
    assert len({seen["peer"] for seen in upstream.seen}) == 1
    assert len(upstream.seen) == 6


def test_one_client_per_process_shared_by_its_threads(monkeypatch: Any) -> None:
    """gunicorn's threads (``--threads``) share the worker's client: made once, however many
    ask at once, and its pool serves them all at the same time."""
    monkeypatch.setattr(views, "_client", None)
    start = threading.Barrier(8)
    made: list[Any] = []
    answers: list[bytes] = []

    def ask(address: str, number: int) -> None:
        start.wait()
        client = views.proxy_client()
        made.append(client)
        for _ in range(5):
            answer = client.post(f"{address}/echo", content=f"{number}".encode())
            answers.append(answer.content)

    with upstream_server() as upstream:
        threads = [
            threading.Thread(target=ask, args=(upstream.address, number)) for number in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert len({id(client) for client in made}) == 1
    assert sorted(answers) == sorted(f"{number}".encode() for number in range(8) for _ in range(5))
    # At most one connection per thread at a time, each kept for the next request.
    assert len({seen["peer"] for seen in upstream.seen}) <= 8
    views.proxy_client().close()
