"""The notification pages in a real browser: the webhooks settings page (with a webhook, a
refused one, and its errors), the e-mail preferences and the unsubscribe page, checked with
axe-core at 1280 px and 390 px, and within the portal's CSP."""

from __future__ import annotations

from typing import Any

import pytest

from notifications.models import NotificationDelivery, Webhook
from notifications.unsubscribe import make_token
from tests.notifications.helpers import SECRET
from tests.pages.browser_support import check_page, log_in, watch_console

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_notification_pages_pass_axe_at_both_widths(
    world: Any, live_server: Any, page: Any
) -> None:
    problems = watch_console(page)
    webhook = Webhook.objects.create(
        workspace=world.alpha,
        url="https://hooks.example.org/services/T000/B000/a-rather-long-incoming-webhook-path",
        secret=SECRET,
        events=["run.failed", "budget.threshold"],
    )
    NotificationDelivery.objects.create(
        workspace=world.alpha,
        channel="webhook",
        webhook=webhook,
        event="run.failed",
        tries=1,
        last_error="HTTP 500: upstream is down",
    )
    log_in(page.context, live_server.url, world.users["workspace_admin"])
    page.goto(f"{live_server.url}/w/alpha/settings/webhooks/")
    assert page.is_visible("text=upstream is down")
    check_page(page, "webhooks")
    page.fill("#id_url", "http://10.0.0.1/hook")
    page.fill("#id_secret", SECRET)
    page.click("button:has-text('Add webhook')")
    assert page.is_visible("text=private address")
    assert SECRET not in page.content()
    check_page(page, "webhooks-refused")
    page.goto(f"{live_server.url}/profile/")
    page.click("text=E-mail preferences")
    assert page.url.endswith("/profile/notifications/")
    check_page(page, "notification-preferences")
    page.click("button:has-text('Save')")
    assert page.is_visible("text=Your e-mail preferences are saved.")
    page.context.clear_cookies()
    token = make_token(user_id=world.users["researcher"].pk, event="run.succeeded")
    page.goto(f"{live_server.url}/notifications/unsubscribe/{token}/")
    check_page(page, "unsubscribe")
    page.click("button:has-text('Unsubscribe')")
    assert page.is_visible("text=you will get no more e-mails about")
    check_page(page, "unsubscribed")
    assert problems == []
