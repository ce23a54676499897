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


NGINX_502 = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad "
    b"Gateway</h1></center>\r\n<hr><center>nginx/1.25.3</center>\r\n</body>\r\n</html>\r\n"
)


def test_a_failing_webhook_reads_as_words_and_is_named_by_its_host(
    world: Any, live_server: Any, page: Any, notify_settings: Any, endpoint: Any
) -> None:
    """Issue 30: the receiver's HTML error page was shown raw, the admin called webhooks
    "webhook 2 of 2", and TEST-NET addresses were called private. A real endpoint answers
    nginx's 502 page to a real delivery; the pages show what it means."""
    from notifications import delivery
    from tests.notifications.helpers import finish
    from tests.runs.factories import make_run

    notify_settings.EMAIL_HOST = ""
    # A pause that outlasts the page's load on a busy machine (the fixture's 1 s did not).
    notify_settings.TAU_NOTIFY_RETRY_SECONDS = 3600
    notify_settings.TAU_NOTIFY_RETRY_MAX_SECONDS = 3600
    endpoint.statuses = [502]
    endpoint.answer = NGINX_502
    endpoint.headers = {"Content-Type": "text/html"}
    webhook = Webhook.objects.create(
        workspace=world.alpha, url=endpoint.url, secret=SECRET, events=["run.succeeded"]
    )
    finish(make_run(world))
    (row,) = NotificationDelivery.objects.for_workspace(world.alpha).filter(webhook=webhook)
    assert delivery.deliver(row.pk) is False
    problems = watch_console(page)

    log_in(page.context, live_server.url, world.users["workspace_admin"])
    page.goto(f"{live_server.url}/w/alpha/settings/webhooks/")
    facts = page.locator(".webhook-facts").inner_text()
    assert "failing: HTTP 502 Bad Gateway" in facts
    assert "paused until" in facts
    assert "<" not in facts
    assert "nginx" not in facts
    assert (
        page.locator(
            f"button[aria-label='Remove the webhook to 127.0.0.1:{endpoint.port}']"
        ).count()
        == 1
    )
    check_page(page, "webhooks-failing")
    # A documentation address is called what it is, not "private".
    page.fill("#id_url", "https://192.0.2.10/hook")
    page.fill("#id_secret", SECRET)
    page.click("button:has-text('Add webhook')")
    refusal = page.locator(".field-error[role=alert]").inner_text()
    assert "192.0.2.10 is a documentation (TEST-NET) address" in refusal
    assert "private" not in refusal

    page.context.clear_cookies()
    log_in(page.context, live_server.url, world.users["platform_admin"])
    page.goto(f"{live_server.url}/admin/notifications/notificationdelivery/")
    table = page.locator("#result_list").inner_text()
    assert f"127.0.0.1:{endpoint.port} (#{webhook.pk})" in table
    assert "HTTP 502 Bad Gateway" in table
    assert "of " not in table.split("HTTP 502")[0].split("\n")[-1]
    page.goto(f"{live_server.url}/admin/notifications/webhook/{webhook.pk}/change/")
    assert (
        page.locator("h2, h1").filter(has_text=f"127.0.0.1:{endpoint.port} (#{webhook.pk})").count()
        >= 1
    )
    assert problems == []
