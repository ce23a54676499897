"""Managing webhooks: the API and the settings page, for the workspace's admins only; the
secret goes in and never comes out; URLs and event names are checked when saved."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from notifications.models import Webhook
from portal.models import AuditEvent
from tests.notifications.helpers import SECRET

pytestmark = pytest.mark.django_db

LIST = "/api/v1/workspaces/alpha/webhooks/"
PUBLIC_URL = "https://93.184.215.14/hooks/taugrid"  # an address literal: no DNS needed


def create(world: Any, who: str = "workspace_admin", **fields: Any) -> Any:
    body = {"url": PUBLIC_URL, "secret": SECRET, "events": ["run.failed"], **fields}
    return world.api_client_for(who).post(LIST, body, format="json")


def test_an_admin_adds_lists_and_removes_a_webhook(world: Any) -> None:
    created = create(world, format="slack")
    assert created.status_code == 201, created.json()
    answer = created.json()
    assert answer["url"] == PUBLIC_URL
    assert answer["events"] == ["run.failed"]
    assert answer["format"] == "slack"
    assert answer["created_by"] == "alice"
    assert "secret" not in answer
    assert SECRET not in created.content.decode()
    webhook = Webhook.objects.for_workspace(world.alpha).get()
    assert webhook.secret == SECRET
    listed = world.api_client_for("workspace_admin").get(LIST)
    assert listed.status_code == 200
    assert [row["id"] for row in listed.json()] == [webhook.pk]
    assert SECRET not in listed.content.decode()
    gone = world.api_client_for("workspace_admin").delete(answer["url_path"])
    assert gone.status_code == 204
    assert not Webhook.objects.for_workspace(world.alpha).exists()
    actions = list(
        AuditEvent.objects.for_workspace(world.alpha)
        .filter(object_type="notifications.webhook")
        .order_by("id")
        .values_list("action", flat=True)
    )
    assert actions == ["webhook.created", "webhook.deleted"]
    audited = AuditEvent.objects.for_workspace(world.alpha).filter(
        object_type="notifications.webhook"
    )
    assert all(SECRET not in str(event.before) + str(event.after) for event in audited)


def test_an_empty_event_list_means_every_event(world: Any) -> None:
    created = create(world, events=[])
    assert created.status_code == 201
    assert created.json()["events"] == []


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"events": ["run.finished"]}, "events", "Unknown event: run.finished"),
        ({"url": "ftp://93.184.215.14/x"}, "url", "https://"),
        ({"url": "http://127.0.0.1:9/x"}, "url", "loopback"),
        ({"url": "http://10.1.2.3/x"}, "url", "private"),
        ({"url": "http://169.254.169.254/latest/meta-data/"}, "url", "link-local"),
        ({"url": "http://[::1]/x"}, "url", "loopback"),
        ({"url": "http://user:pw@93.184.215.14/x"}, "url", "user name or password"),
        ({"secret": "short"}, "secret", "16"),
        ({"format": "xml"}, "format", "valid choice"),
    ],
)
def test_a_wrong_webhook_is_refused_saying_what_to_do(
    world: Any, fields: dict[str, Any], field: str, words: str
) -> None:
    refused = create(world, **fields)
    assert refused.status_code == 400, refused.json()
    assert words in " ".join(refused.json()[field]), refused.json()
    assert not Webhook.objects.for_workspace(world.alpha).exists()


def test_the_unknown_event_message_lists_the_right_names(world: Any) -> None:
    refused = create(world, events=["run.succeeded", "run.done", "budget"])
    message = refused.json()["events"][0]
    assert "Unknown events: run.done, budget" in message
    assert "run.succeeded, run.failed, run.preempted, run.cancelled, run.waiting" in message


def test_private_addresses_are_allowed_when_the_setting_says_so(world: Any, settings: Any) -> None:
    settings.TAU_WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    assert create(world, url="http://127.0.0.1:9/x").status_code == 201


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a link-local address"),
        ("http://[2002:a9fe:a9fe::]/latest/", "leads to 169.254.169.254 (6to4)"),
        ("http://[::ffff:169.254.169.254]/latest/", "leads to 169.254.169.254 (IPv4-mapped)"),
        ("http://[fd00:ec2::254]/latest/", "a cloud metadata address"),
        ("http://0.0.0.0:9000/", "unspecified address"),
        ("http://127.0.0.1:8000/api/v1/workspaces/", "this portal itself"),
        ("http://[2002:7f00:1::]:8000/metrics", "this portal itself"),
        ("https://taugrid.example.org/api/v1/", "this portal itself"),
    ],
)
def test_metadata_and_the_portal_are_refused_even_with_private_addresses_allowed(
    world: Any, settings: Any, url: str, words: str
) -> None:
    """Issue 30: with TAU_WEBHOOK_ALLOW_PRIVATE_ADDRESSES on, the metadata address and the
    portal itself were accepted. They never are."""
    settings.TAU_WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    settings.TAU_API_URL = "http://127.0.0.1:8000"
    settings.TAU_PUBLIC_URL = "https://taugrid.example.org"
    refused = create(world, url=url)
    assert refused.status_code == 400, refused.json()
    assert words in " ".join(refused.json()["url"])
    assert not Webhook.objects.for_workspace(world.alpha).exists()


def test_the_issues_6to4_loopback_url_is_refused(world: Any) -> None:
    refused = create(world, url="http://[2002:7f00:1::]:9000/hook")
    assert refused.status_code == 400
    assert "leads to 127.0.0.1 (6to4), is a loopback address" in " ".join(refused.json()["url"])
    assert not Webhook.objects.for_workspace(world.alpha).exists()


@pytest.mark.parametrize(
    "url",
    [
        "https://192.0.2.10/x",
        "https://198.51.100.7/x",
        "https://203.0.113.5/x",
        "https://[2001:db8::1]/x",
    ],
)
def test_documentation_addresses_are_called_what_they_are(world: Any, url: str) -> None:
    refused = create(world, url=url)
    assert refused.status_code == 400
    message = " ".join(refused.json()["url"])
    assert "is a documentation (TEST-NET) address, reserved for examples" in message
    assert "private" not in message


@pytest.mark.parametrize(("who", "status"), [("researcher", 403), ("viewer", 403)])
def test_members_who_are_not_admins_may_not_see_or_change_webhooks(
    world: Any, who: str, status: int
) -> None:
    webhook = create(world).json()
    client = world.api_client_for(who)
    assert client.get(LIST).status_code == status
    assert create(world, who=who).status_code == status
    assert client.delete(webhook["url_path"]).status_code == status
    assert Webhook.objects.for_workspace(world.alpha).count() == 1


def test_another_workspaces_webhooks_do_not_exist(world: Any) -> None:
    webhook = create(world).json()
    outsider = world.api_client_for("outsider")  # beta's admin
    assert outsider.get(LIST).status_code == 404
    assert outsider.delete(webhook["url_path"]).status_code == 404
    # Under their own workspace, alpha's webhook id is no webhook either.
    beta_path = f"/api/v1/workspaces/beta/webhooks/{webhook['id']}/"
    assert outsider.delete(beta_path).status_code == 404
    assert Webhook.objects.for_workspace(world.alpha).count() == 1
    assert outsider.get("/api/v1/workspaces/beta/webhooks/").json() == []


def test_the_list_costs_a_fixed_number_of_queries(
    world: Any, django_assert_num_queries: Any
) -> None:
    client = world.api_client_for("workspace_admin")
    create(world)
    # The workspace with the caller's role, then the rows (the client is authenticated).
    with django_assert_num_queries(2):
        assert len(client.get(LIST).json()) == 1
    for _ in range(4):
        create(world)
    with django_assert_num_queries(2):
        assert len(client.get(LIST).json()) == 5


# -- the settings page -------------------------------------------------------------------------


def page(slug: str = "alpha") -> str:
    return reverse("workspace-webhooks", kwargs={"workspace_slug": slug})


def test_an_admin_adds_and_removes_a_webhook_on_the_page(world: Any) -> None:
    client = world.client_for("workspace_admin")
    shown = client.get(page())
    assert shown.status_code == 200
    assert b"No webhooks yet" in shown.content
    added = client.post(
        page(),
        {"url": PUBLIC_URL, "secret": SECRET, "events": ["run.failed", "run.waiting"]},
    )
    assert added.status_code == 302
    webhook = Webhook.objects.for_workspace(world.alpha).get()
    assert webhook.events == ["run.failed", "run.waiting"]
    listed = client.get(page())
    assert PUBLIC_URL.encode() in listed.content
    assert SECRET.encode() not in listed.content
    removed = client.post(
        reverse(
            "workspace-webhook-delete",
            kwargs={"workspace_slug": "alpha", "webhook_id": webhook.pk},
        )
    )
    assert removed.status_code == 302
    assert not Webhook.objects.for_workspace(world.alpha).exists()


def test_the_page_refuses_a_private_address_and_keeps_no_secret(world: Any) -> None:
    client = world.client_for("workspace_admin")
    refused = client.post(page(), {"url": "http://192.168.1.10/x", "secret": SECRET})
    assert refused.status_code == 400
    assert b"private address" in refused.content
    assert SECRET.encode() not in refused.content  # the secret field is not filled in again
    assert not Webhook.objects.for_workspace(world.alpha).exists()


def test_the_page_is_for_admins_and_hides_other_workspaces(world: Any) -> None:
    create(world)
    webhook = Webhook.objects.for_workspace(world.alpha).get()
    delete = reverse(
        "workspace-webhook-delete", kwargs={"workspace_slug": "alpha", "webhook_id": webhook.pk}
    )
    assert world.client_for("researcher").get(page()).status_code == 403
    assert world.client_for("viewer").post(delete).status_code == 403
    assert world.client_for("outsider").get(page()).status_code == 404
    assert world.client_for("outsider").post(delete).status_code == 404
    beta_delete = reverse(
        "workspace-webhook-delete", kwargs={"workspace_slug": "beta", "webhook_id": webhook.pk}
    )
    assert world.client_for("outsider").post(beta_delete).status_code == 404
    assert Webhook.objects.for_workspace(world.alpha).count() == 1


def test_the_page_costs_a_fixed_number_of_queries(
    world: Any, django_assert_num_queries: Any
) -> None:
    client = world.client_for("workspace_admin")
    create(world)
    client.get(page())  # warm the session
    # The session and its user, the workspace with the caller's role, the webhooks with
    # their newest delivery, and the workspaces of the page's navigation.
    with django_assert_num_queries(5):
        client.get(page())
    for _ in range(4):
        create(world)
    with django_assert_num_queries(5):
        response = client.get(page())
    assert response.content.count(PUBLIC_URL.encode()) == 5


def test_the_admin_shows_webhooks_and_their_delivery_log_never_the_secret(world: Any) -> None:
    from notifications.models import NotificationDelivery

    create(world)
    webhook = Webhook.objects.for_workspace(world.alpha).get()
    NotificationDelivery.objects.create(
        workspace=world.alpha,
        channel="webhook",
        webhook=webhook,
        event="run.failed",
        tries=2,
        last_status_code=500,
        last_error="HTTP 500: upstream is down",
    )
    staff = world.client_for("platform_admin")
    pages = [
        reverse("admin:notifications_webhook_changelist"),
        reverse("admin:notifications_webhook_change", args=[webhook.pk]),
        reverse("admin:notifications_notificationdelivery_changelist")
        + f"?webhook__id__exact={webhook.pk}",
    ]
    for url in pages:
        shown = staff.get(url)
        assert shown.status_code == 200, url
        assert SECRET.encode() not in shown.content, url
    log = staff.get(pages[2]).content
    assert b"HTTP 500: upstream is down" in log
    assert b"retrying" in log
