"""The endpoint pages (issue 34): a workspace's endpoints (idle ones flagged, live rows, a
pinned number of queries), one endpoint with how to call it, its history and its log panel,
its scale, stop and delete buttons for those the API lets change it, a model version's
"Served by", and the platform admin's idle filter; another workspace's endpoints do not
exist here."""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from catalog.ingest import ingest_folder
from serving import services
from serving.models import Endpoint, EndpointState
from tests.serving.factories import ENDPOINT_SPEC, MODEL_SPEC, make_endpoint, model_version
from workspaces.models import Membership

pytestmark = pytest.mark.django_db

PAGES = "/w/alpha/endpoints/"
READERS = ("platform_admin", "workspace_admin", "researcher", "viewer")


def text_of(html: str) -> str:
    """What a person reads: no tags."""
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S)
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


def get(client: Any, url: str, **headers: str) -> str:
    response = client.get(url, **headers)
    assert response.status_code == 200, (url, response.status_code)
    return str(response.content.decode())


def change(endpoint: Endpoint, **fields: Any) -> Endpoint:
    """Set fields on the row as a backend's reports would have (bypassing the services)."""
    Endpoint.objects.for_workspace(endpoint.workspace_id).filter(pk=endpoint.pk).update(**fields)
    endpoint.refresh_from_db()
    return endpoint


def another_researcher(world: Any, django_user_model: Any) -> Client:
    ruth = django_user_model.objects.create_user(username="ruth")
    Membership.objects.create(workspace=world.alpha, user=ruth, role="researcher")
    client = Client()
    client.force_login(ruth)
    return client


@pytest.mark.parametrize("who", READERS)
def test_every_reader_sees_the_list_and_the_page(world: Any, tmp_path: Path, who: str) -> None:
    version = model_version(world, tmp_path)
    endpoint = make_endpoint(world, spec=MODEL_SPEC)
    change(
        endpoint,
        state=EndpointState.READY,
        state_reason="Answering requests.",
        replicas_ready=1,
        requests_per_second=12.5,
        latency_p95_ms=21.0,
        error_rate=0.005,
    )
    client = world.client_for(who)
    listing = get(client, PAGES)
    rows = text_of(listing[listing.index('id="endpoint-rows"') :])
    assert "chat" in rows
    assert "Ready" in rows
    assert "Answering requests." in rows
    assert "tiny-gpt@1" in rows
    assert "1/1" in rows
    assert "12.5" in rows
    assert "21 ms" in rows
    assert "0.5 %" in rows
    assert "rob" in rows
    assert f'href="{PAGES}chat/"' in listing
    assert f'href="/w/alpha/models/tiny-gpt/versions/{version.number}/"' in listing
    page = get(client, f"{PAGES}chat/")
    said = text_of(page)
    assert "Answering requests." in said
    assert "generation 1" in said
    assert "/api/v1/workspaces/alpha/endpoints/chat/invoke/" in said
    assert "endpoints:invoke" in said
    assert 'href="/tokens/"' in page
    assert 'curl -X POST "http://testserver/api/v1/workspaces/alpha/endpoints/chat/invoke/"' in (
        unescape(page)
    )
    assert 'href="/api/v1/workspaces/alpha/endpoints/chat/evidence/"' in page
    assert "Deployed" in text_of(page[page.index('id="history-heading"') :])


def test_the_navigation_names_endpoints_after_models(world: Any) -> None:
    html = get(world.client_for("viewer"), "/w/alpha/runs/")
    nav = html[html.index('<nav class="topnav"') : html.index("</nav>")]
    names = [name for _, name in re.findall(r'<a href="([^"]+)">([^<]+)</a>', nav)]
    assert names[names.index("Models") + 1] == "Endpoints"
    assert f'<a href="{PAGES}">Endpoints</a>' in nav


def test_an_empty_list_says_how_to_deploy(world: Any) -> None:
    said = text_of(get(world.client_for("viewer"), PAGES))
    assert "No endpoints yet" in said
    assert "tau serve deploy" in said


def test_another_workspaces_endpoints_do_not_exist_here(world: Any) -> None:
    make_endpoint(world, who="outsider", workspace=world.beta, name="secret")
    researcher = world.client_for("researcher")
    for url in (
        f"{PAGES}secret/",
        f"{PAGES}secret/log/",
        "/w/beta/endpoints/",
        "/w/beta/endpoints/secret/",
    ):
        assert researcher.get(url).status_code == 404, url
    assert researcher.post(f"{PAGES}secret/stop/").status_code == 404
    assert "secret" not in get(researcher, PAGES)
    assert world.client_for("outsider").get(f"{PAGES}").status_code == 404
    # A deleted endpoint's page is gone too (its record stays, for the history).
    make_endpoint(world)
    world.client_for("researcher").post(f"{PAGES}chat/delete/")
    assert researcher.get(f"{PAGES}chat/").status_code == 404


def test_an_endpoint_unused_for_the_idle_hours_is_flagged(world: Any, settings: Any) -> None:
    settings.TAU_ENDPOINT_IDLE_HOURS = 24
    now = timezone.now()
    quiet = make_endpoint(world, name="quiet")
    change(quiet, state=EndpointState.READY, created_at=now - timedelta(hours=30))
    used = make_endpoint(world, name="used")
    change(
        used,
        state=EndpointState.READY,
        created_at=now - timedelta(hours=30),
        last_request_at=now - timedelta(hours=2),
    )
    lapsed = make_endpoint(world, name="lapsed")
    change(
        lapsed,
        state=EndpointState.UNHEALTHY,
        created_at=now - timedelta(days=9),
        last_request_at=now - timedelta(hours=25),
    )
    stopped = make_endpoint(world, name="stopped")
    change(stopped, state=EndpointState.STOPPED, created_at=now - timedelta(days=9))
    young = make_endpoint(world, name="young")
    change(young, state=EndpointState.READY)
    listing = get(world.client_for("viewer"), PAGES)
    flagged = {
        name
        for name in ("quiet", "used", "lapsed", "stopped", "young")
        if "idle: 0 requests in the last 24 hours"
        in text_of(listing[listing.index(f'href="{PAGES}{name}/"') :].split("</tr>")[0])
    }
    assert flagged == {"quiet", "lapsed"}
    page = text_of(get(world.client_for("viewer"), f"{PAGES}quiet/"))
    assert "Idle: 0 requests in the last 24 hours." in page
    assert "No request has reached it since it was deployed" in page
    assert "Idle:" not in text_of(get(world.client_for("viewer"), f"{PAGES}used/"))
    settings.TAU_ENDPOINT_IDLE_HOURS = 48
    assert "idle: 0 requests" not in get(world.client_for("viewer"), PAGES)


def test_a_request_through_the_proxy_counts_once_a_minute(world: Any) -> None:
    """The proxy notes that an endpoint was used (what "idle" is read from), with one small
    write a minute at most; the backend's traffic figures count too."""
    endpoint = make_endpoint(world, state=EndpointState.READY)
    assert endpoint.last_request_at is None
    client = world.api_client_for("researcher")
    invoke = "/api/v1/workspaces/alpha/endpoints/chat/invoke/"
    client.post(invoke, b"{}", content_type="application/json")  # no address yet: 502
    endpoint.refresh_from_db()
    first = endpoint.last_request_at
    assert first is not None
    assert timezone.now() - first < timedelta(seconds=30)
    with CaptureQueriesContext(connection) as queries:
        client.post(invoke, b"{}", content_type="application/json")
    assert not [q for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    change(endpoint, last_request_at=first - timedelta(minutes=5))
    client.post(invoke, b"{}", content_type="application/json")
    endpoint.refresh_from_db()
    assert endpoint.last_request_at is not None
    assert endpoint.last_request_at > first
    # Traffic its backend measured (requests straight to its address too) counts; none, not.
    change(endpoint, last_request_at=None)
    services.record_metrics(endpoint, requests_per_second=0.0, latency_p95_ms=None, error_rate=0)
    endpoint.refresh_from_db()
    assert endpoint.last_request_at is None
    services.record_metrics(endpoint, requests_per_second=0.2, latency_p95_ms=9.0, error_rate=0)
    endpoint.refresh_from_db()
    assert endpoint.last_request_at == endpoint.metrics_at


#: Session, user, access, the count of endpoints, the page of them (their model versions and
#: whether each is idle read with them), the navigation's workspaces; its live rows the same
#: less the navigation.
PINNED_LIST = 6


def test_the_lists_queries_are_pinned(world: Any, tmp_path: Path) -> None:
    model_version(world, tmp_path)
    client = world.client_for("researcher")
    make_endpoint(world, name="first", spec=MODEL_SPEC)
    with CaptureQueriesContext(connection) as one:
        get(client, PAGES)
    with CaptureQueriesContext(connection) as one_fragment:
        get(client, PAGES, HTTP_HX_REQUEST="true")
    for number in range(6):
        make_endpoint(
            world, name=f"more-{number}", spec=MODEL_SPEC if number % 2 else ENDPOINT_SPEC
        )
    with CaptureQueriesContext(connection) as many:
        html = get(client, PAGES)
    with CaptureQueriesContext(connection) as many_fragment:
        get(client, PAGES, HTTP_HX_REQUEST="true")
    assert html.count('class="stack-lead endpoint-name"') == 7
    sql = [q["sql"][:60] for q in many.captured_queries]
    assert len(one) == len(many) == PINNED_LIST, sql
    assert len(one_fragment) == len(many_fragment) == PINNED_LIST - 1


def test_the_list_follows_live_endpoints_and_answers_304_when_nothing_changed(
    world: Any,
) -> None:
    endpoint = make_endpoint(world)
    client = world.client_for("viewer")
    listing = get(client, PAGES)
    assert f'data-poll-url="{PAGES}"' in listing
    first = client.get(PAGES, HTTP_HX_REQUEST="true")
    assert first.status_code == 200
    assert 'id="endpoint-rows"' in first.content.decode()
    assert "<html" not in first.content.decode()
    again = client.get(PAGES, HTTP_HX_REQUEST="true", HTTP_IF_NONE_MATCH=first["ETag"])
    assert again.status_code == 304
    services.observe(endpoint, state=EndpointState.READY, replicas_ready=1)
    moved = client.get(PAGES, HTTP_HX_REQUEST="true", HTTP_IF_NONE_MATCH=first["ETag"])
    assert moved.status_code == 200
    assert "Ready" in moved.content.decode()
    services.stop_endpoint(endpoint=endpoint, user=world.users["researcher"])
    assert "data-poll-url" not in get(client, PAGES)
    # The endpoint's own page: its live part polls while it runs, and the same 304.
    live_page = client.get(f"{PAGES}chat/", HTTP_HX_REQUEST="true")
    assert live_page.status_code == 200
    assert 'id="endpoint-live"' in live_page.content.decode()
    assert "data-poll-url" not in live_page.content.decode()  # stopped: nothing changes
    assert (
        client.get(
            f"{PAGES}chat/", HTTP_HX_REQUEST="true", HTTP_IF_NONE_MATCH=live_page["ETag"]
        ).status_code
        == 304
    )


def test_the_log_panel_shows_a_replicas_last_lines(world: Any) -> None:
    endpoint = make_endpoint(world)
    client = world.client_for("viewer")
    page = get(client, f"{PAGES}chat/")
    assert f'data-poll-url="{PAGES}chat/log/"' in page
    panel = get(client, f"{PAGES}chat/log/", HTTP_HX_REQUEST="true")
    assert "serving requests" in panel
    assert 'data-poll-url="/w/alpha/endpoints/chat/log/"' in panel
    assert '<option value="replica-1"' in panel
    chosen = get(client, f"{PAGES}chat/log/?replica=replica-1", HTTP_HX_REQUEST="true")
    assert '<option value="replica-1" selected>' in chosen
    assert f'data-poll-url="{PAGES}chat/log/?replica=replica-1"' in get(
        client, f"{PAGES}chat/?replica=replica-1"
    )
    services.stop_endpoint(endpoint=endpoint, user=world.users["researcher"])
    stopped = get(client, f"{PAGES}chat/log/", HTTP_HX_REQUEST="true")
    assert "nothing of it runs" in stopped
    assert "data-poll-url" not in stopped


def test_its_deployer_scales_and_stops_it_from_its_page(world: Any) -> None:
    make_endpoint(world)
    client = world.client_for("researcher")
    page = get(client, f"{PAGES}chat/")
    assert 'action="/w/alpha/endpoints/chat/scale/"' in page
    assert 'action="/w/alpha/endpoints/chat/stop/"' in page
    assert "data-confirm=" in page
    assert "csrfmiddlewaretoken" in page
    response = client.post(f"{PAGES}chat/scale/", {"replicas": "3"})
    assert response.status_code == 302
    assert response["Location"] == f"{PAGES}chat/"
    endpoint = Endpoint.objects.for_workspace(world.alpha).get(name="chat")
    assert (endpoint.replicas_desired, endpoint.generation) == (3, 2)
    shown = text_of(get(client, f"{PAGES}chat/"))
    assert "Scaling chat to 3 replicas (generation 2)." in shown
    assert "Scaled from 1 to 3 replicas by rob." in shown
    # The number it has changes nothing, and says so; a number it cannot have too.
    client.post(f"{PAGES}chat/scale/", {"replicas": "3"})
    assert "chat has 3 replicas already: nothing changed." in text_of(get(client, f"{PAGES}chat/"))
    for wrong in ("0", "65", "two", ""):
        client.post(f"{PAGES}chat/scale/", {"replicas": wrong})
        assert "Not done:" in text_of(get(client, f"{PAGES}chat/"))
    endpoint.refresh_from_db()
    assert (endpoint.replicas_desired, endpoint.generation) == (3, 2)
    assert client.post(f"{PAGES}chat/stop/").status_code == 302
    endpoint.refresh_from_db()
    assert endpoint.state == EndpointState.STOPPED
    assert "Stopped by rob." in text_of(get(client, f"{PAGES}chat/"))
    response = client.post(f"{PAGES}chat/delete/")
    assert response.status_code == 302
    assert response["Location"] == PAGES
    endpoint.refresh_from_db()
    assert endpoint.deleted_at is not None


def test_only_its_deployer_or_an_admin_acts_as_the_api_allows(
    world: Any, django_user_model: Any
) -> None:
    make_endpoint(world)
    ruth = another_researcher(world, django_user_model)
    for client in (world.client_for("viewer"), world.client_for("platform_admin"), ruth):
        page = get(client, f"{PAGES}chat/")
        assert 'method="post" action="/w/alpha/endpoints/' not in page
        assert 'id="replicas"' not in page
        for action in ("scale", "stop", "delete"):
            assert f"/chat/{action}/" not in page
            assert client.post(f"{PAGES}chat/{action}/", {"replicas": "2"}).status_code == 403
    endpoint = Endpoint.objects.for_workspace(world.alpha).get(name="chat")
    assert (endpoint.state, endpoint.replicas_desired) == (EndpointState.DEPLOYING, 1)
    admin = world.client_for("workspace_admin")
    assert 'action="/w/alpha/endpoints/chat/scale/"' in get(admin, f"{PAGES}chat/")
    assert admin.post(f"{PAGES}chat/scale/", {"replicas": "2"}).status_code == 302
    endpoint.refresh_from_db()
    assert endpoint.replicas_desired == 2


def test_a_model_versions_page_lists_the_endpoints_that_served_it(
    world: Any, tmp_path: Path
) -> None:
    first = model_version(world, tmp_path)
    make_endpoint(world, spec=MODEL_SPEC)
    page = get(world.client_for("viewer"), "/w/alpha/models/tiny-gpt/versions/1/")
    served = page[
        page.index('id="served-by-heading"') : page.index(
            "</section>", page.index('id="served-by-heading"')
        )
    ]
    assert f'href="{PAGES}chat/"' in served
    assert "serves it now" in text_of(served)
    # An update to another version: the first one's page says chat served it before.
    source = tmp_path / "model-v2"
    source.mkdir()
    (source / "weights.bin").write_bytes(b"other weights")
    second = ingest_folder(first.asset, source, source="prefix")
    endpoint = Endpoint.objects.for_workspace(world.alpha).get(name="chat")
    services.update_endpoint(
        endpoint=endpoint,
        user=world.users["researcher"],
        model=services.ModelChoice(name="tiny-gpt", version=str(second.number)),
    )
    before = text_of(get(world.client_for("viewer"), "/w/alpha/models/tiny-gpt/versions/1/"))
    now = text_of(
        get(world.client_for("viewer"), f"/w/alpha/models/tiny-gpt/versions/{second.number}/")
    )
    assert "served it before" in before
    assert "serves it now" not in before
    assert "serves it now" in now
    listing = get(world.client_for("viewer"), PAGES)
    assert f"tiny-gpt@{second.number}" in text_of(listing)


def test_a_model_version_no_endpoint_served_says_how_to_serve_it(
    world: Any, tmp_path: Path
) -> None:
    model_version(world, tmp_path)
    said = text_of(get(world.client_for("viewer"), "/w/alpha/models/tiny-gpt/versions/1/"))
    assert "No endpoint has served it." in said
    assert "tau serve deploy --model tiny-gpt@1" in said


def test_the_platform_admin_filters_idle_endpoints(world: Any, settings: Any) -> None:
    settings.TAU_ENDPOINT_IDLE_HOURS = 24
    quiet = make_endpoint(world, name="quiet")
    change(quiet, state=EndpointState.READY, created_at=timezone.now() - timedelta(days=2))
    busy = make_endpoint(world, name="busy")
    change(busy, state=EndpointState.READY, last_request_at=timezone.now())
    make_endpoint(world, name="fresh", state=EndpointState.READY)  # never used, deployed now
    admin = world.client_for("platform_admin")
    url = "/admin/serving/endpoint/"
    idle = get(admin, url + "?idle=yes")
    assert ">quiet<" in idle
    assert ">busy<" not in idle
    not_idle = get(admin, url + "?idle=no")
    assert ">busy<" in not_idle
    assert ">fresh<" in not_idle
    assert ">quiet<" not in not_idle
    assert ">quiet<" in get(admin, url + f"?state=ready&workspace__id__exact={world.alpha.pk}")


def test_the_platform_queue_lists_every_workspaces_running_endpoints(
    world: Any, settings: Any
) -> None:
    settings.TAU_ENDPOINT_IDLE_HOURS = 24
    quiet = make_endpoint(world, name="quiet")
    change(quiet, state=EndpointState.READY, created_at=timezone.now() - timedelta(days=2))
    make_endpoint(world, name="busy", state=EndpointState.READY)
    make_endpoint(world, who="outsider", workspace=world.beta, name="theirs")
    gone = make_endpoint(world, name="gone", state=EndpointState.STOPPED)
    services.delete_endpoint(endpoint=gone, user=None)
    page = get(world.client_for("platform_admin"), "/queue/")
    section = page[page.index('id="platform-endpoints-heading"') :]
    rows = [text_of(row) for row in section.split("<tr>")[2:]]
    assert [row.split()[0] for row in rows] == ["quiet", "busy", "theirs"]
    assert "idle: 0 requests in the last 24 hours" in rows[0]
    assert "idle" not in rows[1]
    assert 'href="/w/beta/endpoints/theirs/"' in section
    assert world.client_for("workspace_admin").get("/queue/").status_code == 403


def test_a_replica_name_no_replica_can_have_shows_the_default(world: Any) -> None:
    make_endpoint(world)
    client = world.client_for("viewer")
    for asked in ("../etc", "a&b=c", "x" * 300, "\x00"):
        response = client.get(f"{PAGES}chat/log/", {"replica": asked})
        assert response.status_code == 200
        panel = response.content.decode()
        assert '<option value="replica-0" selected>' in panel
    page = get(client, f"{PAGES}chat/?replica=a%26b%3Dc")
    assert f'data-poll-url="{PAGES}chat/log/"' in page
