"""The endpoint pages in a real browser: the log panel loads from the backend, the deployer
scales the endpoint through the form (after the confirmation), no CSP violation, and its
pages and the platform queue's endpoints read well (axe-core) at both widths."""

from __future__ import annotations

from typing import Any

import pytest

from serving.models import Endpoint, EndpointState
from tests.pages.browser_support import check_page, log_in, watch_console
from tests.serving import fakes
from tests.serving.factories import make_endpoint

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_its_deployer_scales_it_through_the_form(
    world: Any, live_server: Any, page: Any, settings: Any
) -> None:
    settings.TAU_BACKEND_CLASSES = fakes.backend_classes(settings)
    fakes.reset()
    make_endpoint(world, state=EndpointState.READY)
    problems = watch_console(page)
    log_in(page.context, live_server.url, world.users["researcher"])
    page.goto(f"{live_server.url}/w/alpha/endpoints/chat/")

    page.wait_for_selector("#endpoint-log pre.log")
    assert "serving requests" in page.text_content("#endpoint-log pre.log")
    check_page(page, "endpoint")

    asked: list[str] = []

    def confirm(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.accept()

    page.on("dialog", confirm)
    page.fill("#replicas", "2")
    page.click(".scale-form button[type=submit]")
    page.wait_for_selector("text=Scaling chat to 2 replicas (generation 2).")
    assert asked
    assert "replicas of chat" in asked[0]
    endpoint = Endpoint.objects.for_workspace(world.alpha).get(name="chat")
    assert (endpoint.replicas_desired, endpoint.generation) == (2, 2)
    assert page.input_value("#replicas") == "2"
    # The list, its row for chat with its new number of replicas.
    page.goto(f"{live_server.url}/w/alpha/endpoints/")
    assert "0/2" in page.text_content("#endpoint-rows")
    check_page(page, "endpoints")
    # The platform team's queue page lists it with every workspace's.
    page.context.clear_cookies()
    log_in(page.context, live_server.url, world.users["platform_admin"])
    page.goto(f"{live_server.url}/queue/")
    assert "chat" in page.text_content("#platform-endpoints")
    check_page(page, "platform-queue-endpoints")
    assert problems == []
