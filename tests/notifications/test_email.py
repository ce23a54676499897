"""E-mail: a real SMTP server (aiosmtpd, on 127.0.0.1) receives what the outbox sends;
each person chooses what they get (the defaults: their runs finished or failed); every
e-mail has a one-click unsubscribe link that works without logging in."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.test import Client
from django.urls import reverse

from notifications import delivery
from notifications.models import EmailPreference, NotificationDelivery
from notifications.unsubscribe import make_token
from portal.notices import Notice, announce
from runs.models import RunState
from tests.notifications.helpers import Smtp, finish
from tests.runs.factories import make_run
from workspaces.models import Membership

pytestmark = pytest.mark.django_db


def emails(world: Any) -> list[NotificationDelivery]:
    return list(
        NotificationDelivery.objects.for_workspace(world.alpha)
        .filter(channel=NotificationDelivery.Channel.EMAIL)
        .order_by("pk")
    )


def send_all(world: Any) -> list[bool]:
    return [delivery.deliver(row.pk) for row in emails(world)]


def test_a_finished_run_is_e_mailed_to_its_submitter(
    world: Any, notify_settings: Any, smtp: Smtp
) -> None:
    run = finish(make_run(world))
    assert send_all(world) == [True]
    (message,) = smtp.wait_for(1)
    assert smtp.mailbox.envelopes == [("taugrid@example.org", ["rob@example.org"])]
    assert message["To"] == "rob@example.org"
    assert message["From"] == "TauGrid <taugrid@example.org>"
    assert message["Subject"] == f"[TauGrid] Run {run.name} succeeded"
    body = message.get_content()
    assert f"https://taugrid.example.org/w/alpha/runs/{run.name}/" in body
    link = re.search(r"Stop these e-mails: (\S+)", body)
    assert link is not None
    assert link.group(1).startswith("https://taugrid.example.org/notifications/unsubscribe/")
    # RFC 8058: mail clients offer the same link as a one-click button (the header may be
    # folded onto a line of its own).
    assert message["List-Unsubscribe"].strip() == f"<{link.group(1)}>"
    assert message["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    (row,) = emails(world)
    assert row.status == "delivered"
    assert row.user_id == world.users["researcher"].pk


def test_the_defaults_are_finished_or_failed_runs_and_budgets_for_admins(
    world: Any, notify_settings: Any
) -> None:
    finish(make_run(world), RunState.PREEMPTED)  # not by default
    finish(make_run(world), RunState.FAILED)
    announce(
        Notice(
            event="budget.threshold",
            workspace_id=world.alpha.pk,
            title="alpha used 100% of its GPU-hour budget for 2026-12",
            data={"month": "2026-12", "threshold_percent": 100},
            key="budget:1:2026-12:100",
        )
    )
    told = [(row.event, row.user_id) for row in emails(world)]
    assert told == [
        ("run.failed", world.users["researcher"].pk),
        ("budget.threshold", world.users["workspace_admin"].pk),  # the admins only
    ]


def test_a_budget_e_mail_reaches_the_admins_through_smtp(
    world: Any, notify_settings: Any, smtp: Smtp
) -> None:
    announce(
        Notice(
            event="budget.threshold",
            workspace_id=world.alpha.pk,
            title="alpha used 80% of its GPU-hour budget for 2026-12",
            data={"month": "2026-12", "threshold_percent": 80, "used_gpu_hours": 320},
            key="budget:1:2026-12:80",
        )
    )
    assert send_all(world) == [True]
    (message,) = smtp.wait_for(1)
    assert message["To"] == "alice@example.org"
    body = message.get_content()
    assert "Threshold: 80%" in body
    assert "GPU-hours used: 320" in body


def test_choices_on_the_preferences_page_decide_what_is_sent(
    world: Any, notify_settings: Any
) -> None:
    client = world.client_for("researcher")
    page = reverse("notification-preferences")
    shown = client.get(page)
    assert shown.status_code == 200
    checked = re.findall(rb'value="([a-z.]+)"[^>]*checked', shown.content)
    assert checked == [b"run.succeeded", b"run.failed", b"budget.threshold"]
    saved = client.post(page, {"events": ["run.preempted", "run.cancelled"]})
    assert saved.status_code == 302
    preference = EmailPreference.objects.get(user=world.users["researcher"])
    assert preference.events == ["run.preempted", "run.cancelled"]
    finish(make_run(world))  # no longer wanted
    finish(make_run(world), RunState.PREEMPTED)
    assert [row.event for row in emails(world)] == ["run.preempted"]
    refused = client.post(page, {"events": ["run.finished"]})
    assert refused.status_code == 400
    assert EmailPreference.objects.get(user=world.users["researcher"]).events == [
        "run.preempted",
        "run.cancelled",
    ]


def test_the_profile_links_the_preferences(world: Any) -> None:
    profile = world.client_for("viewer").get(reverse("profile"))
    assert reverse("notification-preferences").encode() in profile.content
    assert Client().get(reverse("notification-preferences")).status_code == 302


def test_no_e_mail_without_an_smtp_server_or_an_address_or_a_membership(
    world: Any, notify_settings: Any
) -> None:
    notify_settings.EMAIL_HOST = ""
    finish(make_run(world))
    assert emails(world) == []
    notify_settings.EMAIL_HOST = "127.0.0.1"
    researcher = world.users["researcher"]
    researcher.email = ""
    researcher.save()
    finish(make_run(world))
    assert emails(world) == []
    researcher.email = "rob@example.org"
    researcher.save()
    run = make_run(world)
    Membership.objects.for_workspace(world.alpha).filter(user=researcher).delete()
    finish(run)
    assert emails(world) == []


def _unsubscribe_path(world: Any, notify_settings: Any, smtp: Smtp) -> str:
    finish(make_run(world))
    assert send_all(world) == [True]
    (message,) = smtp.wait_for(1)
    return str(urlsplit(str(message["List-Unsubscribe"]).strip().strip("<>")).path)


def test_the_unsubscribe_link_asks_first_and_stops_only_that_e_mail(
    world: Any, notify_settings: Any, smtp: Smtp
) -> None:
    path = _unsubscribe_path(world, notify_settings, smtp)
    visitor = Client(enforce_csrf_checks=True)  # no session: a mail client, a scanner
    asked = visitor.get(path)
    assert asked.status_code == 200
    assert b"Stop e-mails about" in asked.content
    assert b"run.succeeded" in asked.content
    # A GET (a link scanner, a prefetch) changes nothing.
    assert not EmailPreference.objects.filter(user=world.users["researcher"]).exists()
    done = visitor.post(path, {"List-Unsubscribe": "One-Click"})
    assert done.status_code == 200
    assert b"you will get no more e-mails about" in done.content
    preference = EmailPreference.objects.get(user=world.users["researcher"])
    assert preference.events == ["run.failed", "budget.threshold"]
    finish(make_run(world))
    finish(make_run(world), RunState.FAILED)
    assert [row.event for row in emails(world)][-1:] == ["run.failed"]
    assert len(emails(world)) == 2


def test_a_forged_or_altered_unsubscribe_token_is_refused(world: Any, notify_settings: Any) -> None:
    real = make_token(user_id=world.users["researcher"].pk, event="run.failed")
    forged = make_token(user_id=world.users["researcher"].pk, event="run.failed")[:-4] + "abcd"
    other_users = real.replace(
        real.split(":")[0], make_token(user_id=world.users["viewer"].pk, event="x").split(":")[0]
    )
    visitor = Client()
    for token in (forged, other_users, "not-a-token"):
        path = reverse("notification-unsubscribe", kwargs={"token": token})
        assert visitor.get(path).status_code == 400
        refused = visitor.post(path)
        assert refused.status_code == 400
        assert b"This unsubscribe link is not valid" in refused.content
    assert not EmailPreference.objects.exists()
    accepted = visitor.post(reverse("notification-unsubscribe", kwargs={"token": real}))
    assert accepted.status_code == 200
    assert EmailPreference.objects.get(user=world.users["researcher"]).events == [
        "run.succeeded",
        "budget.threshold",
    ]


def test_a_down_smtp_server_is_retried_and_logged(world: Any, notify_settings: Any) -> None:
    from tests.runs.processes import free_port

    notify_settings.EMAIL_PORT = free_port()  # nothing listens there
    finish(make_run(world))
    assert send_all(world) == [False]
    (row,) = emails(world)
    assert row.status == "retrying"
    assert row.tries == 1
    assert "ConnectionRefusedError" in row.last_error


def test_an_e_mail_not_wanted_any_more_is_not_sent(
    world: Any, notify_settings: Any, smtp: Smtp
) -> None:
    finish(make_run(world))
    researcher = world.users["researcher"]
    Client().post(
        reverse(
            "notification-unsubscribe",
            kwargs={"token": make_token(user_id=researcher.pk, event="run.succeeded")},
        )
    )
    assert send_all(world) == [False]
    (row,) = emails(world)
    assert row.status == "given up"
    assert row.last_error == (
        "The person stopped e-mails about run.succeeded before this one was sent."
    )
    assert smtp.mailbox.messages == []
