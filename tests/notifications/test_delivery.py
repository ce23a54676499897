"""Webhook deliveries end to end inside one process: a run's change of state (or a budget
notice) becomes a delivery row in its transaction, and the outbox POSTs it, signed, to a
real HTTP endpoint on 127.0.0.1; a down endpoint gets retries with backoff, recorded in the
delivery log, and is given up after a bounded number of tries."""

from __future__ import annotations

import json
import logging
import socket
import time
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from notifications import delivery, sending
from notifications.models import NotificationDelivery, NotifiedWait, PayloadFormat, Webhook
from notifications.waiting import notify_waiting_runs
from portal.notices import Notice, announce
from portal.outbox import _OnCommit
from runs.lifecycle import cancel_run
from runs.models import FailureClass, Run, RunState, failure_hint_for
from runs.state import transition
from tests.notifications.helpers import SECRET, Endpoint, finish
from tests.runs.factories import make_run
from tests.runs.processes import free_port

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def webhooks_only(notify_settings: Any) -> None:
    """No e-mail here (tests/notifications/test_email.py sends those): the outbox holds
    the webhook deliveries only."""
    notify_settings.EMAIL_HOST = ""


def webhook(world: Any, url: str, **fields: Any) -> Webhook:
    return Webhook.objects.create(
        workspace=world.alpha,
        url=url,
        secret=fields.pop("secret", SECRET),
        created_by=world.users["workspace_admin"],
        **fields,
    )


def rows(world: Any, **filters: Any) -> list[NotificationDelivery]:
    return list(
        NotificationDelivery.objects.for_workspace(world.alpha)
        .filter(channel=NotificationDelivery.Channel.WEBHOOK, **filters)
        .order_by("pk")
    )


def send_all(world: Any) -> list[bool]:
    return [delivery.deliver(row.pk) for row in rows(world)]


def test_a_finished_run_is_posted_signed_to_the_webhook(
    world: Any, notify_settings: Any, endpoint: Endpoint, django_capture_on_commit_callbacks: Any
) -> None:
    hook = webhook(world, endpoint.url)
    run = make_run(world)
    with django_capture_on_commit_callbacks() as callbacks:
        finish(run)
    (row,) = rows(world)
    # Written in the run's transaction, published only once it commits.
    every_row = NotificationDelivery.objects.for_workspace(world.alpha).values_list("pk", flat=True)
    published = [
        c.row_id for c in callbacks if isinstance(c, _OnCommit) and c.key == delivery.SEND_TASK
    ]
    assert sorted(published) == sorted(every_row)
    assert row.pk in every_row
    assert endpoint.received == []
    assert delivery.deliver(row.pk) is True
    (received,) = endpoint.received
    assert received.signature_ok
    assert received.timestamp_ok
    assert received.path == "/hooks/taugrid"
    assert received.headers["Content-Type"] == "application/json"
    body = received.json
    assert body["event"] == "run.succeeded"
    assert body["id"] == row.pk
    assert body["count"] == 1
    assert body["workspace"] == "alpha"
    assert body["run"]["name"] == run.name
    assert body["run"]["submitted_by"] == "rob"
    assert body["url"] == f"https://taugrid.example.org/w/alpha/runs/{run.name}/"
    row.refresh_from_db()
    assert row.delivered_at is not None
    assert row.tries == 1
    assert row.last_status_code == 200
    assert row.status == "delivered"
    assert row.webhook_id == hook.pk
    # Delivered is delivered: a second call (a re-delivered task) sends nothing.
    assert delivery.deliver(row.pk) is False
    assert len(endpoint.received) == 1


def test_the_signature_is_checked_by_the_receiver(
    world: Any, notify_settings: Any, endpoint: Endpoint
) -> None:
    """A webhook signing with another secret is refused by a receiver checking signatures:
    the check in ``Endpoint`` is not vacuous."""
    webhook(world, endpoint.url, secret="not-the-receivers-secret-at-all")
    finish(make_run(world))
    assert send_all(world) == [False]
    (received,) = endpoint.received
    assert not received.signature_ok
    assert received.timestamp_ok
    timestamp = received.headers["X-TauGrid-Timestamp"]
    assert received.headers["X-TauGrid-Signature"] == sending.signature(
        "not-the-receivers-secret-at-all", timestamp, received.body
    )
    (row,) = rows(world)
    assert row.last_status_code == 401
    assert row.status == "retrying"


def test_a_down_endpoint_gets_retries_with_backoff_then_is_given_up(
    world: Any, notify_settings: Any, endpoint: Endpoint
) -> None:
    closed = free_port()  # nothing listens there
    hook = webhook(world, f"http://127.0.0.1:{closed}/hook")
    finish(make_run(world))
    (row,) = rows(world)

    assert delivery.deliver(row.pk) is False
    row.refresh_from_db()
    assert row.tries == 1
    assert row.status == "retrying"
    assert "ConnectionRefusedError" in row.last_error
    assert row.last_tried_at is not None
    assert row.next_try_at - row.last_tried_at == pytest.approx(
        timedelta(seconds=1), abs=timedelta(seconds=0.5)
    )
    # Not due before its backoff is over: nothing is tried.
    assert delivery.deliver(row.pk) is False
    row.refresh_from_db()
    assert row.tries == 1

    # The endpoint comes up, but answers 500 with something to say.
    endpoint.statuses = [500]
    endpoint.answer = b"upstream is down"
    Webhook.objects.for_workspace(world.alpha).filter(pk=hook.pk).update(url=endpoint.url)
    _due_now(row)
    assert delivery.due_deliveries() == [row.pk]
    assert delivery.deliver(row.pk) is False
    row.refresh_from_db()
    assert row.tries == 2
    assert row.last_status_code == 500
    assert row.last_error == "HTTP 500 Internal Server Error: upstream is down"
    assert row.next_try_at - row.last_tried_at == pytest.approx(
        timedelta(seconds=2), abs=timedelta(seconds=0.5)
    )

    _due_now(row)
    assert delivery.deliver(row.pk) is False  # the third and last try (TAU_NOTIFY_MAX_TRIES)
    row.refresh_from_db()
    assert row.tries == 3
    assert row.given_up_at is not None
    assert row.status == "given up"
    assert row.last_error == "HTTP 500 Internal Server Error: upstream is down"
    _due_now(row)
    assert delivery.due_deliveries() == []
    assert delivery.deliver(row.pk) is False
    assert len(endpoint.received) == 2


def _due_now(row: NotificationDelivery) -> None:
    """Let the backoff pass without waiting for it: the row's, and its endpoint's pause."""
    NotificationDelivery.objects.for_workspace(row.workspace_id).filter(pk=row.pk).update(
        next_try_at=timezone.now() - timedelta(seconds=1),
        created_at=timezone.now() - timedelta(minutes=1),
        published_at=None,
    )
    if row.webhook_id is not None:
        Webhook.objects.for_workspace(row.workspace_id).filter(pk=row.webhook_id).update(
            resume_at=timezone.now() - timedelta(seconds=1)
        )


def test_a_retry_that_works_is_delivered(
    world: Any, notify_settings: Any, endpoint: Endpoint
) -> None:
    endpoint.statuses = [503, 204]
    webhook(world, endpoint.url)
    finish(make_run(world))
    (row,) = rows(world)
    assert delivery.deliver(row.pk) is False
    _due_now(row)
    assert delivery.deliver(row.pk) is True
    row.refresh_from_db()
    assert row.tries == 2
    assert row.status == "delivered"
    assert row.last_error == ""
    assert row.last_status_code == 204
    assert [r.signature_ok for r in endpoint.received] == [True, True]


def test_redirects_are_not_followed_and_answers_are_read_bounded(
    world: Any, notify_settings: Any, endpoint: Endpoint
) -> None:
    endpoint.statuses = [302]
    endpoint.headers = {"Location": "http://127.0.0.1:1/elsewhere"}
    webhook(world, endpoint.url)
    finish(make_run(world))
    (row,) = rows(world)
    delivery.deliver(row.pk)
    row.refresh_from_db()
    assert row.last_status_code == 302
    assert "redirects are not followed" in row.last_error
    assert "http://127.0.0.1:1/elsewhere" in row.last_error
    assert len(endpoint.received) == 1

    endpoint.statuses = [500]
    endpoint.answer = b"x" * (2 * 2**20)
    _due_now(row)
    delivery.deliver(row.pk)
    row.refresh_from_db()
    assert row.last_error.startswith("HTTP 500 Internal Server Error: xxx")
    assert len(row.last_error) <= 300


def test_an_endpoint_that_never_answers_times_out_quickly(world: Any, notify_settings: Any) -> None:
    notify_settings.TAU_WEBHOOK_TIMEOUT_SECONDS = 1
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections complete in the backlog; nothing ever answers
    try:
        webhook(world, f"http://127.0.0.1:{silent.getsockname()[1]}/hook")
        finish(make_run(world))
        started = time.monotonic()
        assert send_all(world) == [False]
        assert time.monotonic() - started < 5
    finally:
        silent.close()
    (row,) = rows(world)
    assert "timed out" in row.last_error


def test_a_down_endpoint_never_delays_a_run(
    world: Any, notify_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The receiver writes rows only: nothing is sent inside the run's transaction."""

    def no_sending(**kwargs: Any) -> int:
        raise AssertionError("a webhook was called inside the run's transaction")

    monkeypatch.setattr(sending, "post_webhook", no_sending)
    webhook(world, f"http://127.0.0.1:{free_port()}/hook")
    started = time.monotonic()
    run = finish(make_run(world))
    assert time.monotonic() - started < 2
    assert run.state == RunState.SUCCEEDED
    assert len(rows(world)) == 1


def test_an_empty_event_list_gets_every_event_and_a_list_only_its_events(
    world: Any, notify_settings: Any
) -> None:
    everything = webhook(world, "http://127.0.0.1:9/all", events=[])
    failures = webhook(world, "http://127.0.0.1:9/failures", events=["run.failed"])
    finish(make_run(world))
    finish(make_run(world), RunState.FAILED)
    assert [row.event for row in rows(world, webhook=everything)] == [
        "run.succeeded",
        "run.failed",
    ]
    assert [row.event for row in rows(world, webhook=failures)] == ["run.failed"]


def test_a_failed_run_says_its_failure_class_and_hint(
    world: Any, notify_settings: Any, endpoint: Endpoint
) -> None:
    webhook(world, endpoint.url)
    run = make_run(world)
    Run.objects.for_workspace(world.alpha).filter(pk=run.pk).update(
        failure_class=FailureClass.OOM_KILLED
    )
    finish(run, RunState.FAILED, reason="The container was OOM-killed.")
    assert send_all(world) == [True]
    body = endpoint.received[0].json
    assert body["event"] == "run.failed"
    assert body["title"] == f"Run {run.name} failed: Out of memory"
    assert body["data"]["failure_class"] == "oom_killed"
    assert body["data"]["hint"] == failure_hint_for(
        "oom_killed", log_size=0, exit_code=None, failure_message="The container was OOM-killed."
    )
    assert "compute.memory" in body["data"]["hint"]
    assert body["data"]["reason"] == "The container was OOM-killed."


def test_the_slack_format_is_text_and_blocks(
    world: Any, notify_settings: Any, endpoint: Endpoint
) -> None:
    webhook(world, endpoint.url, format=PayloadFormat.SLACK)
    run = make_run(world)
    Run.objects.for_workspace(world.alpha).filter(pk=run.pk).update(
        failure_class=FailureClass.USER_ERROR
    )
    finish(run, RunState.FAILED, reason="exit 1")
    assert send_all(world) == [True]
    (received,) = endpoint.received
    assert received.signature_ok
    body = received.json
    assert set(body) == {"text", "blocks"}
    link = f"https://taugrid.example.org/w/alpha/runs/{run.name}/"
    assert body["text"] == f"Run {run.name} failed: Exited with an error {link}"
    (block,) = body["blocks"]
    assert block["type"] == "section"
    assert block["text"]["type"] == "mrkdwn"
    assert block["text"]["text"].startswith(f"*<{link}|Run {run.name} failed")
    assert "Failure: Exited with an error" in block["text"]["text"]
    assert "Hint: " in block["text"]["text"]


#: A run's last line of output as issue 30's attacker wrote it: a ping for the whole channel,
#: a link whose words are the portal's address, and Slack's own escapes in the raw.
HOSTILE_OUTPUT = (
    "<!channel> log in again at <https://evil.example/login|https://taugrid.example.org/login>"
    " & <@U0123> &lt;"
)


def test_slack_messages_escape_what_runs_and_people_wrote(
    world: Any, notify_settings: Any, endpoint: Endpoint
) -> None:
    webhook(world, endpoint.url, format=PayloadFormat.SLACK)
    run = make_run(world)
    finish(run, RunState.FAILED, reason=f"Exited with code 1. Its last output: {HOSTILE_OUTPUT}")
    # A budget warning's title holds the workspace's name, which its admins choose.
    announce(
        Notice(
            event="budget.threshold",
            workspace_id=world.alpha.pk,
            title="<!here> <https://evil.example|Alpha> has used 80% of its GPU-hour budget",
            data={"month": "2026-12", "threshold_percent": 80},
            key="budget:hostile",
        )
    )
    assert send_all(world) == [True, True]
    failed, budget = (received.json for received in endpoint.received)
    for body in (failed, budget):
        (block,) = body["blocks"]
        for text in (body["text"], block["text"]["text"]):
            # No ping and no link but the portal's own: every < and > is escaped.
            assert "<!" not in text
            assert "<@" not in text
            assert "<https://evil" not in text
    shown = failed["blocks"][0]["text"]["text"]
    link = f"https://taugrid.example.org/w/alpha/runs/{run.name}/"
    assert shown.count("<") == 1  # the run's link, the only markup
    assert shown.startswith(f"*<{link}|Run {run.name} failed")
    assert (
        "Why: Exited with code 1. Its last output: &lt;!channel&gt; log in again at "
        "&lt;https://evil.example/login|https://taugrid.example.org/login&gt; &amp; "
        "&lt;@U0123&gt; &amp;lt;"
    ) in shown
    assert budget["text"].startswith("&lt;!here&gt; &lt;https://evil.example|Alpha&gt; has used")


def test_slack_messages_stay_within_slacks_section_limit(notify_settings: Any) -> None:
    payload = {
        "title": "Run r failed",
        "url": "https://taugrid.example.org/w/alpha/runs/r/",
        "workspace": "alpha",
        "run": {"name": "r"},
        "data": {"reason": "<" * 5000, "hint": "&" * 5000, "cancelled_by": ">" * 5000},
    }
    text = sending.slack_message(payload, count=1)["blocks"][0]["text"]["text"]
    assert len(text) <= sending.SLACK_SECTION_LIMIT
    assert "<" not in text.replace("*<https://taugrid.example.org/w/alpha/runs/r/|", "")
    # Never an escape cut in two.
    assert not any(text.endswith(part) for part in ("&", "&l", "&lt", "&a", "&am", "&amp"))


NGINX_502 = b"""<html>
<head><title>502 Bad Gateway</title></head>
<body>
<center><h1>502 Bad Gateway</h1></center>
<hr><center>nginx/1.25.3</center>
</body>
</html>
"""

MAINTENANCE_PAGE = (
    b"<!DOCTYPE html><html><head><title>  Down for\n maintenance \xe2\x80\xae until 18:00"
    b"</title><style>body { color: red }</style><script>alert(1)</script></head>"
    b"<body><h1>Sorry</h1>" + b"<p>filler</p>" * 2000 + b"</body></html>"
)


@pytest.mark.parametrize(
    ("status", "answer", "content_type", "logged"),
    [
        (502, NGINX_502, "text/html", "HTTP 502 Bad Gateway"),
        (
            503,
            MAINTENANCE_PAGE,
            "text/html; charset=utf-8",
            "HTTP 503 Service Unavailable: Down for maintenance until 18:00",
        ),
        (
            500,
            b"<html><body><h1>Oops</h1>\n<p>Try\tagain   later.</p></body></html>",
            None,
            "HTTP 500 Internal Server Error: Oops Try again later.",
        ),
        (
            400,
            b'{"error": "invalid_payload",\n "ok": false}',
            "application/json",
            'HTTP 400 Bad Request: {"error": "invalid_payload", "ok": false}',
        ),
    ],
)
def test_an_endpoints_error_page_is_logged_as_a_short_text(
    world: Any,
    notify_settings: Any,
    endpoint: Endpoint,
    status: int,
    answer: bytes,
    content_type: str | None,
    logged: str,
) -> None:
    endpoint.statuses = [status]
    endpoint.answer = answer
    if content_type:
        endpoint.headers = {"Content-Type": content_type}
    webhook(world, endpoint.url)
    finish(make_run(world))
    assert send_all(world) == [False]
    (row,) = rows(world)
    assert row.last_status_code == status
    assert row.last_error == logged
    assert "<" not in row.last_error.replace('{"error"', "")
    assert len(row.last_error) <= 300


def test_repeated_events_are_folded_into_one_delivery(
    world: Any, notify_settings: Any, endpoint: Endpoint
) -> None:
    webhook(world, endpoint.url)
    run = make_run(world)
    run = finish(run, RunState.PREEMPTED)
    for _ in range(2):  # put back, admitted again, preempted again: the same event
        run = transition(run, RunState.QUEUED)
        run = transition(run, RunState.ADMITTED)
        run = transition(run, RunState.PREEMPTED)
    (row,) = rows(world)
    assert row.event == "run.preempted"
    assert row.count == 3
    assert row.key == f"run:{run.pk}"
    assert delivery.deliver(row.pk) is True
    assert endpoint.received[0].json["count"] == 3
    # Once sent, the next repeat is a delivery of its own.
    run = transition(run, RunState.QUEUED)
    run = transition(run, RunState.ADMITTED)
    transition(run, RunState.PREEMPTED)
    assert [r.count for r in rows(world)] == [3, 1]


def test_a_delivery_being_sent_is_not_folded_into(world: Any, notify_settings: Any) -> None:
    webhook(world, "http://127.0.0.1:9/hook")
    notice = Notice(
        event="budget.threshold",
        workspace_id=world.alpha.pk,
        title="alpha used 80% of its GPU-hour budget for 2026-12",
        data={"month": "2026-12", "threshold_percent": 80},
        key="budget:1:2026-12:80",
    )
    announce(notice)
    announce(notice)
    (row,) = rows(world)
    assert row.count == 2
    NotificationDelivery.objects.for_workspace(world.alpha).filter(pk=row.pk).update(
        claimed_at=timezone.now()
    )
    announce(notice)
    assert [r.count for r in rows(world)] == [2, 1]
    # Another key (another threshold) is another delivery.
    announce(Notice(**{**notice.__dict__, "key": "budget:1:2026-12:100"}))
    assert len(rows(world)) == 3


def test_a_budget_notice_is_posted(world: Any, notify_settings: Any, endpoint: Endpoint) -> None:
    webhook(world, endpoint.url, events=["budget.threshold"])
    data = {
        "month": "2026-12",
        "threshold_percent": 80,
        "flavor": "h100",
        "used_gpu_hours": 320.5,
        "budget_gpu_hours": 400,
    }
    announce(
        Notice(
            event="budget.threshold",
            workspace_id=world.alpha.pk,
            title="alpha used 80% of its h100 GPU-hour budget for 2026-12",
            data=data,
            key="budget:7:2026-12:80",
        )
    )
    finish(make_run(world))  # not subscribed to
    assert send_all(world) == [True]
    body = endpoint.received[0].json
    assert body["event"] == "budget.threshold"
    assert body["data"] == data
    assert body["run"] is None
    assert body["url"] == "https://taugrid.example.org/w/alpha/"


def test_a_run_cancelled_by_its_submitter_is_not_told_of(world: Any, notify_settings: Any) -> None:
    webhook(world, "http://127.0.0.1:9/hook")
    waiting = make_run(world)
    cancel_run(run=waiting, user=world.users["researcher"])  # at once: it was not running
    running = finish(make_run(world), RunState.RUNNING)
    cancel_run(run=running, user=world.users["researcher"])  # CANCELLING first
    transition(running, RunState.CANCELLED)
    assert [
        Run.objects.for_workspace(world.alpha).get(pk=r.pk).state for r in (waiting, running)
    ] == [
        RunState.CANCELLED,
        RunState.CANCELLED,
    ]
    assert rows(world) == []


def test_a_run_cancelled_by_someone_else_is_told_of_with_who(
    world: Any, notify_settings: Any
) -> None:
    webhook(world, "http://127.0.0.1:9/hook")
    waiting = make_run(world)
    cancel_run(run=waiting, user=world.users["workspace_admin"])
    running = finish(make_run(world), RunState.RUNNING)
    cancel_run(run=running, user=world.users["workspace_admin"])
    # The backend reports it stopped: the event names nobody, the request did.
    transition(running, RunState.CANCELLED, reason="stopped")
    told = rows(world)
    assert [row.event for row in told] == ["run.cancelled", "run.cancelled"]
    assert [row.payload["data"]["cancelled_by"] for row in told] == ["alice", "alice"]
    assert told[1].payload["title"] == f"Run {running.name} was cancelled by alice"


def test_a_long_wait_is_told_of_once_per_wait(world: Any, notify_settings: Any) -> None:
    notify_settings.TAU_NOTIFY_WAITING_MINUTES = 30
    webhook(world, "http://127.0.0.1:9/hook")
    run = transition(make_run(world), RunState.QUEUED)
    recent = transition(make_run(world), RunState.QUEUED)
    long_ago = timezone.now() - timedelta(minutes=45)
    Run.objects.for_workspace(world.alpha).filter(pk=run.pk).update(queued_at=long_ago)
    Run.objects.for_workspace(world.alpha).filter(pk=recent.pk).update(
        queued_at=timezone.now() - timedelta(minutes=5)
    )
    assert notify_waiting_runs() == 1
    assert notify_waiting_runs() == 0  # the next beat: the same wait, not told again
    (row,) = rows(world)
    assert row.event == "run.waiting"
    assert row.payload["run"]["name"] == run.name
    assert row.payload["data"]["waiting_minutes"] == 45
    # Admitted, then put back in the queue: a new wait, told of once it is long too.
    run = transition(run, RunState.ADMITTED)
    run = transition(run, RunState.QUEUED)
    assert notify_waiting_runs() == 0
    Run.objects.for_workspace(world.alpha).filter(pk=run.pk).update(
        queued_at=timezone.now() - timedelta(minutes=31)
    )
    assert notify_waiting_runs() == 1
    assert notify_waiting_runs() == 0
    assert [r.event for r in rows(world)] == ["run.waiting", "run.waiting"]
    assert NotifiedWait.objects.for_workspace(world.alpha).count() == 2


def test_the_reconciler_sends_what_no_task_did(
    world: Any, notify_settings: Any, endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    from notifications.tasks import reconcile_notifications

    published: list[int] = []

    def publish(pk: int) -> bool:
        published.append(pk)
        return True

    monkeypatch.setattr(delivery, "publish", publish)
    webhook(world, endpoint.url)
    finish(make_run(world))
    (row,) = rows(world)
    assert reconcile_notifications() == 0  # the task published at commit is waiting
    _due_now(row)  # a task that was lost: the row is due, no task waits for it
    # The reconciler publishes it for the notifier's slots (it sends nothing itself, so it
    # never holds a slot for the time many endpoints take), once.
    assert reconcile_notifications() == 1
    assert reconcile_notifications() == 0
    assert published == [row.pk]
    assert endpoint.received == []
    assert delivery.deliver(row.pk) is True
    assert len(endpoint.received) == 1


def test_the_address_is_checked_again_when_delivering(
    world: Any, notify_settings: Any, endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DNS rebinding: a name that resolved to a public address when the webhook was saved
    and to the portal's own network when it is delivered is refused at delivery, and the
    endpoint is never reached."""
    from notifications import services

    notify_settings.TAU_WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    answers = {"hooks.example.org": "93.184.215.14"}
    real = socket.getaddrinfo

    def fake_getaddrinfo(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host in answers:
            return real(answers[host], port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", fake_getaddrinfo)
    url = f"http://hooks.example.org:{endpoint.port}/hooks/taugrid"
    saved = services.create_webhook(
        workspace=world.alpha, url=url, secret=SECRET, events=[], by=world.users["workspace_admin"]
    )
    assert saved.url == url
    answers["hooks.example.org"] = "127.0.0.1"  # rebound to where the endpoint listens
    finish(make_run(world))
    assert send_all(world) == [False]
    (row,) = rows(world)
    assert "127.0.0.1 is a loopback address" in row.last_error
    assert endpoint.received == []
    # And a name resolving to a private address is refused when saved.
    answers["internal.example.org"] = "10.0.0.5"
    with pytest.raises(ValidationError, match=r"10\.0\.0\.5 is a private address"):
        services.create_webhook(
            workspace=world.alpha,
            url="https://internal.example.org/hook",
            secret=SECRET,
            events=[],
            by=world.users["workspace_admin"],
        )


def test_secrets_never_reach_the_logs(
    world: Any,
    notify_settings: Any,
    endpoint: Endpoint,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    admin = world.api_client_for("workspace_admin")
    created = admin.post(
        "/api/v1/workspaces/alpha/webhooks/",
        {"url": endpoint.url, "secret": SECRET, "events": []},
        format="json",
    )
    assert created.status_code == 201
    refused = admin.post(
        "/api/v1/workspaces/alpha/webhooks/",
        {"url": "ftp://example.org/", "secret": SECRET},
        format="json",
    )
    assert refused.status_code == 400
    endpoint.statuses = [500, 500, 500]
    finish(make_run(world))
    (row,) = rows(world)
    for _ in range(3):  # fails, retries, gives up: every log line there is
        delivery.deliver(row.pk)
        _due_now(row)
    row.refresh_from_db()
    assert row.status == "given up"
    messages = [record.getMessage() for record in caplog.records]
    assert any("giving up" in message for message in messages)
    assert any("failed, try 1 of 3" in message for message in messages)
    assert SECRET not in caplog.text
    assert all(SECRET not in message for message in messages)
    # The delivery log and the payload do not hold it either.
    assert SECRET not in row.last_error + json.dumps(row.payload)


def test_a_notification_that_cannot_be_written_never_stops_a_run(
    world: Any, notify_settings: Any, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    from notifications import receivers

    def broken(event: Any) -> None:
        raise RuntimeError("a bug in the notifications")

    monkeypatch.setattr(receivers, "notify", broken)
    run = finish(make_run(world))
    assert Run.objects.for_workspace(world.alpha).get(pk=run.pk).state == RunState.SUCCEEDED
    assert "could not write the notifications of run.succeeded" in caplog.text


def test_https_checks_the_certificate_against_the_name_not_the_address(
    world: Any,
    notify_settings: Any,
    tls_endpoint: tuple[Endpoint, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The connection goes to the checked address, and TLS still checks the certificate
    against the URL's host: an untrusted certificate is a failure, a trusted one for that
    name is delivered."""
    import ssl

    endpoint, certificate = tls_endpoint
    webhook(world, f"https://localhost:{endpoint.port}/hooks/taugrid")
    finish(make_run(world))
    (row,) = rows(world)
    assert delivery.deliver(row.pk) is False
    row.refresh_from_db()
    assert "CERTIFICATE_VERIFY_FAILED" in row.last_error
    assert endpoint.received == []

    trusting = ssl.create_default_context
    monkeypatch.setattr(
        ssl,
        "create_default_context",
        lambda *args, **kwargs: trusting(cafile=certificate),
    )
    _due_now(row)
    assert delivery.deliver(row.pk) is True
    (received,) = endpoint.received
    assert received.signature_ok
    assert received.headers["Host"] == f"localhost:{endpoint.port}"
