"""The proxy route, ``POST …/endpoints/{name}/invoke/{path}`` (and ``GET``, without a body),
against a real HTTP server on 127.0.0.1 standing in for the endpoint's address: the body and
its content type forwarded, the answer streamed back as it comes; 409 with the state when it
answers nothing, 413 past the body limit, 403 for a token without the ``endpoints:invoke``
scope, 502 when the endpoint does not answer."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import httpx
import pytest
from rest_framework.test import APIClient

from identity import tokens
from serving.api import views
from serving.models import EndpointState
from tests.serving import fakes
from tests.serving.factories import make_endpoint
from tests.serving.upstream import upstream_server

pytestmark = pytest.mark.django_db

INVOKE = "/api/v1/workspaces/alpha/endpoints/chat/invoke/"


def ready(world: Any, state: EndpointState = EndpointState.READY) -> Any:
    return make_endpoint(world, state=state)


def with_token(world: Any, who: str = "researcher", **kwargs: Any) -> APIClient:
    issued = tokens.issue_token(user=world.users[who], name="invoker", **kwargs)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.plaintext}")
    return client


def invoker(world: Any, **kwargs: Any) -> APIClient:
    return with_token(world, scopes=["endpoints:invoke"], **kwargs)


def body_of(response: Any) -> bytes:
    return b"".join(response.streaming_content)


def test_the_request_goes_through_and_the_answer_comes_back(world: Any) -> None:
    ready(world)
    with upstream_server() as upstream:
        fakes.BEHAVIOUR.address = upstream.address
        response = invoker(world).post(
            INVOKE + "v1/generate?temperature=0.5",
            '{"prompt": "hello"}',
            content_type="application/json",
        )
        assert response.status_code == 200
        assert response.streaming
        assert body_of(response) == b'{"prompt": "hello"}'
        assert response["Content-Type"] == "application/json"
        (seen,) = upstream.seen
    assert seen["path"] == "/v1/generate?temperature=0.5"
    assert seen["content_type"] == "application/json"
    # The caller's credentials stay with the portal.
    assert seen["authorization"] is None
    assert seen["cookie"] is None


def test_an_endpoints_cookie_goes_to_no_one(world: Any) -> None:
    """The portal's client is shared by every caller: a cookie an endpoint sets is neither
    passed back to the caller nor kept and sent with anyone's next request."""
    ready(world)
    with upstream_server() as upstream:
        fakes.BEHAVIOUR.address = upstream.address
        answer = invoker(world).post(INVOKE + "set-cookie", b"{}", content_type="text/plain")
        assert answer.status_code == 200
        assert "Set-Cookie" not in answer
        body_of(answer)
        other = with_token(world, who="viewer", scopes=["endpoints:invoke"])
        assert other.get(INVOKE + "v1/models").status_code == 200
        assert other.post(INVOKE + "x", b"{}", content_type="text/plain").status_code == 200
    assert [seen["cookie"] for seen in upstream.seen] == [None, None, None]


def test_the_endpoints_own_answer_is_passed_on(world: Any) -> None:
    ready(world)
    with upstream_server() as upstream:
        fakes.BEHAVIOUR.address = upstream.address
        response = invoker(world).post(INVOKE + "teapot", b"", content_type="text/plain")
        assert response.status_code == 418
        assert json.loads(body_of(response)) == {"error": "I am a teapot"}
        # Marked as the endpoint's own answer; the portal's refusals are not.
        assert response["X-Tau-Endpoint"] == "chat"


def test_a_body_of_any_type_and_the_route_prefix_itself(world: Any) -> None:
    ready(world)
    with upstream_server() as upstream:
        fakes.BEHAVIOUR.address = upstream.address + "/app"
        payload = bytes(range(256)) * 10
        response = invoker(world).post(INVOKE, payload, content_type="application/octet-stream")
        assert response.status_code == 200
        assert body_of(response) == payload
        assert upstream.seen[0]["path"] == "/app/"


def test_the_answer_is_streamed_as_it_comes(world: Any) -> None:
    """Each line of a streamed answer reaches the caller before the endpoint has written the
    next: nothing is gathered whole on the way."""
    ready(world)
    with upstream_server(delay=0.3) as upstream:
        fakes.BEHAVIOUR.address = upstream.address
        response = invoker(world).post(INVOKE + "stream", b"{}", content_type="application/json")
        assert response.status_code == 200
        assert response["Content-Type"] == "text/event-stream"
        pieces = iter(response.streaming_content)  # type: ignore[attr-defined]
        first = next(pieces)
        assert b"token 0" in first
        assert len(upstream.written) < 5  # the endpoint is still writing
        rest = b"".join(pieces)
    assert (first + rest).count(b"data: token") == 5


def test_streamed_under_asgi_too() -> None:
    """Under ASGI (make run's server) the answer is an async iterator whose pieces are read
    in a worker thread: the same pieces, never gathered whole."""
    with upstream_server() as upstream:
        client = httpx.Client(trust_env=False)
        answer = client.send(
            client.build_request("POST", upstream.address + "/stream", content=b"{}"),
            stream=True,
        )

        async def gather() -> list[bytes]:
            return [piece async for piece in views._async_chunks(answer)]

        pieces = asyncio.run(gather())
        client.close()
    assert b"".join(pieces).count(b"data: token") == 5
    assert answer.is_closed


@pytest.mark.parametrize(
    ("state", "code"),
    [
        (EndpointState.DEPLOYING, 409),
        (EndpointState.READY, 200),
        (EndpointState.UPDATING, 200),
        (EndpointState.UNHEALTHY, 409),
        (EndpointState.STOPPED, 409),
        (EndpointState.FAILED, 409),
    ],
)
def test_only_a_serving_endpoint_is_invoked(world: Any, state: EndpointState, code: int) -> None:
    ready(world, state)
    with upstream_server() as upstream:
        fakes.BEHAVIOUR.address = upstream.address
        response = invoker(world).post(INVOKE + "x", b"{}", content_type="application/json")
        assert response.status_code == code
        if code == 409:
            assert response.json()["state"] == state
            assert response.json()["detail"] == f"chat is {state}: it answers no requests now."
            assert "X-Tau-Endpoint" not in response
            assert upstream.seen == []


def test_a_body_past_the_limit_is_a_413_unsent(world: Any, settings: Any) -> None:
    settings.TAU_ENDPOINT_MAX_BODY_BYTES = 1000
    ready(world)
    with upstream_server() as upstream:
        fakes.BEHAVIOUR.address = upstream.address
        client = invoker(world)
        too_much = client.post(INVOKE + "x", b"x" * 1001, content_type="application/octet-stream")
        assert too_much.status_code == 413
        assert "TAU_ENDPOINT_MAX_BODY_BYTES" in too_much.json()["detail"]
        # JSON too, though Django's own limit for JSON bodies is smaller or larger.
        big_json = json.dumps({"text": "y" * 1200})
        assert (
            client.post(INVOKE + "x", big_json, content_type="application/json").status_code == 413
        )
        assert upstream.seen == []
        just = client.post(INVOKE + "x", b"x" * 1000, content_type="application/octet-stream")
        assert just.status_code == 200


def test_the_limit_is_ten_mib_and_above_djangos_json_limit(world: Any, settings: Any) -> None:
    assert settings.TAU_ENDPOINT_MAX_BODY_BYTES == 10 * 2**20
    ready(world)
    with upstream_server() as upstream:
        fakes.BEHAVIOUR.address = upstream.address
        three_mib = json.dumps({"text": "z" * (3 * 2**20)})
        assert len(three_mib) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        response = invoker(world).post(INVOKE + "x", three_mib, content_type="application/json")
        assert response.status_code == 200
        assert len(body_of(response)) == len(three_mib)


def test_a_token_needs_the_scope(world: Any) -> None:
    ready(world)
    with upstream_server() as upstream:
        fakes.BEHAVIOUR.address = upstream.address
        plain = with_token(world).post(INVOKE + "x", b"{}", content_type="application/json")
        assert plain.status_code == 403
        assert "endpoints:invoke" in plain.json()["detail"]
        # A read-only token without it cannot either; with it, it may (invoking is what it is for).
        assert (
            with_token(world, read_only=True)
            .post(INVOKE + "x", b"{}", content_type="application/json")
            .status_code
            == 403
        )
        scoped_reader = invoker(world, read_only=True)
        assert (
            scoped_reader.post(INVOKE + "x", b"{}", content_type="application/json").status_code
            == 200
        )
        # The scope adds nothing elsewhere: a read-only token with it still only reads.
        assert (
            scoped_reader.patch(
                "/api/v1/workspaces/alpha/endpoints/chat/", {"replicas": 2}, format="json"
            ).status_code
            == 403
        )
        # A session needs no scope.
        session = world.api_client_for("viewer").post(
            INVOKE + "x", b"{}", content_type="application/json"
        )
        assert session.status_code == 200
        assert len(upstream.seen) == 2


def test_a_token_of_one_workspace_reaches_no_other(world: Any) -> None:
    ready(world)
    from workspaces.models import Membership

    admin = world.users["workspace_admin"]
    Membership.objects.create(workspace=world.beta, user=admin, role="admin")
    client = invoker(world, who="workspace_admin", workspace=world.beta)
    assert client.post(INVOKE + "x", b"{}", content_type="application/json").status_code == 404


def test_who_may_invoke(world: Any) -> None:
    ready(world)
    with upstream_server() as upstream:
        fakes.BEHAVIOUR.address = upstream.address
        codes = {
            who: world.api_client_for(who)
            .post(INVOKE + "x", b"{}", content_type="application/json")
            .status_code
            for who in ("workspace_admin", "researcher", "viewer", "platform_admin", "outsider")
        }
    assert codes == {
        "workspace_admin": 200,
        "researcher": 200,
        "viewer": 200,
        "platform_admin": 403,  # staff read every workspace; they are not its members
        "outsider": 404,
    }


def test_no_address_yet_is_a_502(world: Any) -> None:
    ready(world)
    fakes.BEHAVIOUR.address = None
    response = invoker(world).post(INVOKE + "x", b"{}", content_type="application/json")
    assert response.status_code == 502
    assert response.json()["detail"] == "chat has no address yet; try again in a moment."


def test_an_endpoint_that_does_not_answer_is_a_502(world: Any) -> None:
    ready(world)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    fakes.BEHAVIOUR.address = f"http://127.0.0.1:{port}"
    response = invoker(world).post(INVOKE + "x", b"{}", content_type="application/json")
    assert response.status_code == 502
    assert response.json()["detail"] == "chat did not answer (ConnectError)."


def test_an_endpoint_too_slow_to_answer_is_a_502(world: Any, settings: Any) -> None:
    settings.TAU_ENDPOINT_INVOKE_TIMEOUT_SECONDS = 1
    ready(world)
    with upstream_server(slow=3) as upstream:
        fakes.BEHAVIOUR.address = upstream.address
        response = invoker(world).post(INVOKE + "slow", b"{}", content_type="application/json")
    assert response.status_code == 502
    assert response.json()["detail"] == "chat did not answer within 1 s."


@pytest.mark.parametrize("path", ["../admin", "a/../../b", "./x"])
def test_a_path_that_climbs_is_refused(world: Any, path: str) -> None:
    ready(world)
    fakes.BEHAVIOUR.address = "http://127.0.0.1:9"
    response = invoker(world).post(INVOKE + path, b"{}", content_type="application/json")
    assert response.status_code == 400
    assert "path" in response.json()


# --- GET: what an OpenAI-compatible endpoint lists (GET /v1/models), health checks -----------


def test_a_get_goes_through_with_its_query_string(world: Any) -> None:
    ready(world)
    with upstream_server() as upstream:
        fakes.BEHAVIOUR.address = upstream.address
        response = invoker(world).get(INVOKE + "v1/models?limit=2&order=asc")
        assert response.status_code == 200
        assert response.streaming
        assert json.loads(body_of(response)) == {"object": "list", "data": [{"id": "chat"}]}
        assert response["Content-Type"] == "application/json"
        assert response["X-Tau-Endpoint"] == "chat"
        (seen,) = upstream.seen
    assert seen["method"] == "GET"
    assert seen["path"] == "/v1/models?limit=2&order=asc"
    assert seen["body"] == b""
    assert seen["content_type"] is None
    assert seen["content_length"] is None
    assert seen["authorization"] is None
    assert seen["cookie"] is None


def test_a_get_sends_no_body_on_and_has_no_body_limit(world: Any, settings: Any) -> None:
    """A body sent with a GET is neither read nor passed on (so its size is no 413)."""
    settings.TAU_ENDPOINT_MAX_BODY_BYTES = 10
    ready(world)
    with upstream_server() as upstream:
        fakes.BEHAVIOUR.address = upstream.address
        response = invoker(world).generic(
            "GET", INVOKE + "health", "x" * 100, content_type="text/plain"
        )
        assert response.status_code == 200
        assert body_of(response) == b""
        (seen,) = upstream.seen
    assert (seen["method"], seen["path"], seen["body"]) == ("GET", "/health", b"")
    assert seen["content_type"] is None


@pytest.mark.parametrize(
    ("state", "code"),
    [
        (EndpointState.DEPLOYING, 409),
        (EndpointState.READY, 200),
        (EndpointState.UPDATING, 200),
        (EndpointState.UNHEALTHY, 409),
        (EndpointState.STOPPED, 409),
        (EndpointState.FAILED, 409),
    ],
)
def test_a_get_reaches_only_a_serving_endpoint(world: Any, state: EndpointState, code: int) -> None:
    ready(world, state)
    with upstream_server() as upstream:
        fakes.BEHAVIOUR.address = upstream.address
        response = invoker(world).get(INVOKE + "v1/models")
        assert response.status_code == code
        if code == 409:
            assert response.json()["state"] == state
            assert "X-Tau-Endpoint" not in response
            assert upstream.seen == []


def test_a_get_needs_the_token_scope_and_a_member(world: Any) -> None:
    ready(world)
    with upstream_server() as upstream:
        fakes.BEHAVIOUR.address = upstream.address
        plain = with_token(world).get(INVOKE + "v1/models")
        assert plain.status_code == 403
        assert "endpoints:invoke" in plain.json()["detail"]
        assert with_token(world, read_only=True).get(INVOKE + "v1/models").status_code == 403
        assert invoker(world, read_only=True).get(INVOKE + "v1/models").status_code == 200
        codes = {
            who: world.api_client_for(who).get(INVOKE + "v1/models").status_code
            for who in ("workspace_admin", "researcher", "viewer", "platform_admin", "outsider")
        }
        assert codes == {
            "workspace_admin": 200,
            "researcher": 200,
            "viewer": 200,
            "platform_admin": 403,
            "outsider": 404,
        }
        assert len(upstream.seen) == 4
    from workspaces.models import Membership

    admin = world.users["workspace_admin"]
    Membership.objects.create(workspace=world.beta, user=admin, role="admin")
    foreign = invoker(world, who="workspace_admin", workspace=world.beta)
    assert foreign.get(INVOKE + "v1/models").status_code == 404


def test_a_get_that_climbs_is_refused_and_head_is_not_passed_on(world: Any) -> None:
    ready(world)
    with upstream_server() as upstream:
        fakes.BEHAVIOUR.address = upstream.address
        climbing = invoker(world).get(INVOKE + "../admin")
        assert climbing.status_code == 400
        assert "path" in climbing.json()
        head = invoker(world).head(INVOKE + "v1/models")
        assert head.status_code == 405
        assert upstream.seen == []
