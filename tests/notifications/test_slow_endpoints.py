"""A slow or failing webhook endpoint cannot starve anything else (issue 30): one deadline for
the whole of a delivery, even against a receiver trickling a byte at a time (plain HTTP and
TLS); a failing endpoint paused, twice as long each time, with its other deliveries waiting
and using up no tries; one delivery per endpoint and a bounded share per workspace at a time;
the next one published as soon as a slot frees up; the reconciler publishing (never sending)
one row per endpoint; notifications on a Celery queue of their own; at most
TAU_WEBHOOKS_PER_WORKSPACE webhooks per workspace."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse
from django.utils import timezone

from notifications import delivery, sending, services
from notifications.models import NotificationDelivery, Webhook
from tests.notifications.helpers import SECRET, Endpoint, Trickler, self_signed_certificate
from tests.runs.processes import free_port

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


@pytest.fixture(autouse=True)
def webhooks_only(notify_settings: Any) -> None:
    notify_settings.EMAIL_HOST = ""


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """What the outbox asks the notifier to send (instead of the broker)."""
    sent: list[int] = []

    def publish(pk: int) -> bool:
        sent.append(pk)
        return True

    monkeypatch.setattr(delivery, "publish", publish)
    return sent


def webhook(workspace: Any, url: str, **fields: Any) -> Webhook:
    return Webhook.objects.create(workspace=workspace, url=url, secret=SECRET, **fields)


def rows_of(hook: Webhook) -> list[NotificationDelivery]:
    return list(
        NotificationDelivery.objects.for_workspace(hook.workspace_id)
        .filter(webhook=hook)
        .order_by("pk")
    )


_events = iter(range(1, 10**6))


def an_event(world: Any, workspace: Any = None) -> None:
    """Something happens in ``workspace`` (alpha): one delivery per webhook there."""
    number = next(_events)
    services.notify(
        services.Event(
            name="run.succeeded",
            workspace=workspace or world.alpha,
            title=f"Run r{number} succeeded",
            payload={"event": "run.succeeded", "title": f"Run r{number} succeeded"},
            key=f"test:{number}",
        )
    )


def paused_for(hook: Webhook) -> float:
    """Seconds the endpoint stays paused from now."""
    assert hook.resume_at is not None
    return (hook.resume_at - timezone.now()).total_seconds()


def claimed_now(row: NotificationDelivery) -> None:
    """As if a notifier were sending ``row`` right now (a live claim)."""
    NotificationDelivery.objects.unscoped().filter(pk=row.pk).update(claimed_at=timezone.now())


def due(*rows: NotificationDelivery) -> None:
    """Past the grace the task published at commit has, with no task waiting for them."""
    NotificationDelivery.objects.unscoped().filter(pk__in=[r.pk for r in rows]).update(
        created_at=timezone.now() - timedelta(minutes=1), published_at=None
    )


# -- one deadline for the whole delivery ---------------------------------------------------------


def test_a_receiver_trickling_bytes_is_cut_off_at_the_deadline(notify_settings: Any) -> None:
    """The attack: every byte comes before a timeout per read would fire, so only a deadline
    for the whole delivery ends it."""
    notify_settings.TAU_WEBHOOK_TIMEOUT_SECONDS = 2
    slow = Trickler(interval=0.5, hold=30)
    try:
        started = time.monotonic()
        with pytest.raises(sending.SendFailed, match="no complete answer within 2s") as failed:
            sending.post_webhook(url=slow.url, secret=SECRET, body=b"{}")
        took = time.monotonic() - started
    finally:
        slow.stop()
    assert slow.connections == 1
    # The deadline, and a little for a loaded machine; the receiver would have held it 30 s.
    assert took < 2 + 2.5, took
    assert "TAU_WEBHOOK_TIMEOUT_SECONDS" in str(failed.value)


@pytest.fixture
def tls_trickler(tmp_path: Any) -> Iterator[tuple[int, str]]:
    """An HTTPS receiver on 127.0.0.1 (certificate for localhost) that completes the TLS
    handshake, reads the POST and trickles its answer a byte every half second."""
    cert, key = self_signed_certificate(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = socket.create_server(("127.0.0.1", 0))
    stopping = threading.Event()

    def serve() -> None:
        while not stopping.is_set():
            try:
                raw, _ = server.accept()
            except OSError:
                return
            try:
                with context.wrap_socket(raw, server_side=True) as client:
                    request = b""
                    while b"\r\n\r\n" not in request:
                        request += client.recv(4096)
                    for byte in Trickler.ANSWER[:-1]:
                        if stopping.wait(0.5):
                            break
                        client.sendall(bytes([byte]))
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield int(server.getsockname()[1]), cert
    stopping.set()
    server.close()


def test_the_deadline_holds_over_tls_too(
    notify_settings: Any, tls_trickler: tuple[int, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, certificate = tls_trickler
    trusting = ssl.create_default_context
    monkeypatch.setattr(
        ssl, "create_default_context", lambda *args, **kwargs: trusting(cafile=certificate)
    )
    notify_settings.TAU_WEBHOOK_TIMEOUT_SECONDS = 2
    started = time.monotonic()
    with pytest.raises(sending.SendFailed, match="no complete answer within 2s"):
        sending.post_webhook(url=f"https://localhost:{port}/hook", secret=SECRET, body=b"{}")
    assert time.monotonic() - started < 2 + 2.5


def test_a_quick_receiver_is_unaffected_by_the_deadline(
    notify_settings: Any, endpoint: Endpoint
) -> None:
    notify_settings.TAU_WEBHOOK_TIMEOUT_SECONDS = 2
    assert sending.post_webhook(url=endpoint.url, secret=SECRET, body=b'{"a": 1}') == 200
    (received,) = endpoint.received
    assert received.signature_ok


# -- a failing endpoint is paused ----------------------------------------------------------------


def test_a_failing_endpoint_is_paused_and_its_other_deliveries_wait_without_using_tries(
    world: Any, notify_settings: Any, endpoint: Endpoint, published: list[int]
) -> None:
    down = webhook(world.alpha, f"http://127.0.0.1:{free_port()}/hook")
    healthy = webhook(world.alpha, endpoint.url)
    for _ in range(3):
        an_event(world)
    first, second, third = rows_of(down)
    assert delivery.deliver(first.pk) is False  # connection refused
    down.refresh_from_db()
    assert down.failures_in_a_row == 1
    assert down.resume_at is not None
    # TAU_NOTIFY_RETRY_SECONDS (1 here) after the first failure.
    assert paused_for(down) == pytest.approx(1, abs=0.5)
    # While paused, its other deliveries are not tried and keep all their tries.
    assert delivery.deliver(second.pk) is False
    second.refresh_from_db()
    assert (second.tries, second.last_error, second.claimed_at) == (0, "", None)
    # The reconciler leaves them alone too; the healthy endpoint's rows go meanwhile.
    due(*rows_of(down), *rows_of(healthy))
    picked = delivery.due_deliveries()
    assert not set(picked) & {r.pk for r in rows_of(down)}
    assert rows_of(healthy)[0].pk in picked
    for row in rows_of(healthy):
        assert delivery.deliver(row.pk) is True
    assert len(endpoint.received) == 3

    # After the pause, one delivery probes it; failing again doubles the pause.
    Webhook.objects.unscoped().filter(pk=down.pk).update(resume_at=timezone.now())
    NotificationDelivery.objects.unscoped().filter(pk=first.pk).update(
        next_try_at=timezone.now() + timedelta(hours=1)
    )
    assert delivery.deliver(second.pk) is False
    down.refresh_from_db()
    assert down.failures_in_a_row == 2
    assert paused_for(down) == pytest.approx(2, abs=0.5)
    third.refresh_from_db()
    assert third.tries == 0

    # It comes back: the first delivery that works ends the pause.
    Webhook.objects.unscoped().filter(pk=down.pk).update(url=endpoint.url, resume_at=timezone.now())
    assert delivery.deliver(third.pk) is True
    down.refresh_from_db()
    assert down.failures_in_a_row == 0
    assert down.resume_at is None


def test_the_webhooks_page_says_an_endpoint_is_paused(world: Any, notify_settings: Any) -> None:
    down = webhook(world.alpha, f"http://127.0.0.1:{free_port()}/hook")
    an_event(world)
    (row,) = rows_of(down)
    delivery.deliver(row.pk)
    page = world.client_for("workspace_admin").get(
        reverse("workspace-webhooks", kwargs={"workspace_slug": "alpha"})
    )
    assert b"paused until" in page.content
    assert b"after 1 failure in a row" in page.content


# -- one at a time per endpoint, a share per workspace -------------------------------------------


def test_one_delivery_per_endpoint_at_a_time_and_the_next_goes_when_it_ends(
    world: Any, notify_settings: Any, endpoint: Endpoint, published: list[int]
) -> None:
    hook = webhook(world.alpha, endpoint.url)
    an_event(world)
    an_event(world)
    first, second = rows_of(hook)
    claimed_now(first)  # a notifier is sending the first one
    assert delivery.deliver(second.pk) is False
    second.refresh_from_db()
    assert second.tries == 0
    assert second.published_at is None  # its task is spent: it is published again later
    assert endpoint.received == []
    # The first one ends (here: its claim is released as delivered): the next is published
    # at once, not at the reconciler's next pass.
    NotificationDelivery.objects.unscoped().filter(pk=first.pk).update(
        claimed_at=None, delivered_at=timezone.now()
    )
    assert delivery.publish_next(world.alpha.pk) == 1
    assert published == [second.pk]
    assert delivery.deliver(second.pk) is True


def test_a_delivery_that_ends_publishes_the_next_of_its_workspace(
    world: Any, notify_settings: Any, endpoint: Endpoint, published: list[int]
) -> None:
    hook = webhook(world.alpha, endpoint.url)
    an_event(world)
    an_event(world)
    first, second = rows_of(hook)
    due(second)
    assert delivery.deliver(first.pk) is True
    assert published == [second.pk]


def test_one_workspace_holds_at_most_its_share_of_the_notifier(
    world: Any, notify_settings: Any, endpoint: Endpoint, published: list[int]
) -> None:
    """Twenty slow endpoints of one workspace hold at most TAU_NOTIFY_WORKSPACE_CONCURRENCY
    slots: the rest of the notifier stays free for everyone else."""
    notify_settings.TAU_NOTIFY_WORKSPACE_CONCURRENCY = 2
    slow = [webhook(world.alpha, f"http://127.0.0.1:{free_port()}/slow/{n}") for n in range(3)]
    theirs = webhook(world.beta, endpoint.url)
    an_event(world)
    an_event(world, world.beta)
    (a,), (b,), (c,) = (rows_of(hook) for hook in slow)
    claimed_now(a)
    claimed_now(b)
    assert delivery.deliver(c.pk) is False
    c.refresh_from_db()
    assert c.tries == 0
    due(c, *rows_of(theirs))
    picked = delivery.due_deliveries()
    assert c.pk not in picked
    (beta_row,) = rows_of(theirs)
    assert beta_row.pk in picked
    assert delivery.deliver(beta_row.pk) is True


def test_the_reconciler_publishes_one_row_per_endpoint_and_never_twice(
    world: Any, notify_settings: Any, endpoint: Endpoint, published: list[int]
) -> None:
    from notifications.tasks import reconcile_notifications

    hook = webhook(world.alpha, endpoint.url)
    for _ in range(5):
        an_event(world)
    backlog = rows_of(hook)
    due(*backlog)
    assert reconcile_notifications() == 1
    assert published == [backlog[0].pk]  # the oldest first: one endpoint, one at a time
    assert reconcile_notifications() == 0  # its task waits in the queue: not published again
    # A task lost for REPUBLISH_SECONDS is published again.
    NotificationDelivery.objects.unscoped().filter(pk=backlog[0].pk).update(
        published_at=timezone.now() - timedelta(seconds=delivery.REPUBLISH_SECONDS + 1)
    )
    assert reconcile_notifications() == 1
    assert published == [backlog[0].pk, backlog[0].pk]


# -- queues --------------------------------------------------------------------------------------


def test_notifications_have_a_celery_queue_of_their_own() -> None:
    from django.conf import settings

    from portal.celery import app

    def queue(task: str) -> str:
        return str(app.amqp.router.route({}, task)["queue"].name)

    assert queue("notifications.tasks.send_notification") == "notifications"
    assert queue("notifications.tasks.reconcile_notifications") == "notifications"
    assert queue("notifications.tasks.notify_waiting") == "notifications"
    # Run hand-off, cancels, evidence sealing and every other periodic task stay on the
    # default queue, which the main worker consumes.
    assert queue("runs.tasks.deliver") == "celery"
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        task = str(entry["task"])
        expected = "notifications" if task.startswith("notifications.") else "celery"
        assert queue(task) == expected, task


# -- at most TAU_WEBHOOKS_PER_WORKSPACE webhooks -------------------------------------------------

LIST = "/api/v1/workspaces/alpha/webhooks/"


def test_the_api_refuses_a_21st_webhook_and_creates_nothing(world: Any) -> None:
    client = world.api_client_for("workspace_admin")
    for number in range(20):
        body = {"url": f"https://93.184.215.14/hooks/{number}", "secret": SECRET}
        assert client.post(LIST, body, format="json").status_code == 201
    one_more = {"url": "https://93.184.215.14/one-more", "secret": SECRET}
    refused = client.post(LIST, one_more, format="json")
    assert refused.status_code == 400, refused.json()
    detail = refused.json()["detail"]
    assert "has 20 webhooks, the most a workspace may have" in detail
    assert "remove one" in detail
    assert Webhook.objects.for_workspace(world.alpha).count() == 20
    assert not Webhook.objects.for_workspace(world.alpha).filter(url__endswith="one-more").exists()
    # Another workspace has its own allowance.
    theirs = world.api_client_for("outsider").post(
        "/api/v1/workspaces/beta/webhooks/",
        {"url": "https://93.184.215.14/beta", "secret": SECRET},
        format="json",
    )
    assert theirs.status_code == 201


def test_the_page_refuses_a_webhook_past_the_limit_saying_so(
    world: Any, notify_settings: Any
) -> None:
    notify_settings.TAU_WEBHOOKS_PER_WORKSPACE = 2
    for number in range(2):
        webhook(world.alpha, f"https://93.184.215.14/hooks/{number}")
    client = world.client_for("workspace_admin")
    page = reverse("workspace-webhooks", kwargs={"workspace_slug": "alpha"})
    refused = client.post(page, {"url": "https://93.184.215.14/third", "secret": SECRET})
    assert refused.status_code == 400
    assert b"This workspace has 2 webhooks, the most a workspace may have" in refused.content
    assert b"2 of at most 2" in refused.content
    assert Webhook.objects.for_workspace(world.alpha).count() == 2


def test_the_service_refuses_past_the_limit(world: Any, notify_settings: Any) -> None:
    notify_settings.TAU_WEBHOOKS_PER_WORKSPACE = 1
    services.create_webhook(
        workspace=world.alpha,
        url="https://93.184.215.14/a",
        secret=SECRET,
        events=[],
        by=world.users["workspace_admin"],
    )
    with pytest.raises(ValidationError, match="TAU_WEBHOOKS_PER_WORKSPACE=1"):
        services.create_webhook(
            workspace=world.alpha,
            url="https://93.184.215.14/b",
            secret=SECRET,
            events=[],
            by=world.users["workspace_admin"],
        )
