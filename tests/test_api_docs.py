"""The API's interactive docs at /api/v1/docs/ (web/api_docs.py): Swagger UI served from this
installation (its files are our static files, from drf-spectacular-sidecar), within the
portal's CSP, showing the schema this installation serves."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.staticfiles import finders
from django.test import Client

from identity.tokens import issue_token
from tests.pages.browser_support import log_in, watch_console
from web.api_docs import SCHEMA_NEEDS_CREDENTIALS

DOCS = "/api/v1/docs/"


@pytest.mark.django_db
def test_the_docs_page_uses_only_this_installations_files(world: Any) -> None:
    client = world.client_for("researcher")
    response = client.get(DOCS)
    assert response.status_code == 200
    html = response.content.decode()
    sources = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert len(sources) >= 5, html
    for source in sources:
        assert source.startswith("/"), source  # no other host, no CDN
        if source.startswith("/static/"):
            assert finders.find(source.removeprefix("/static/")), f"{source} is not served"
    assert "<style" not in html
    assert re.search(r"<script>", html) is None  # no inline script
    policy = response["Content-Security-Policy"]
    assert "http" not in policy
    assert "script-src 'self'" in policy
    script = client.get(DOCS, {"script": ""})
    assert script.status_code == 200
    assert script["Content-Type"].startswith("application/javascript")
    assert "/api/v1/schema/" in script.content.decode()


@pytest.mark.django_db
def test_a_visitor_is_sent_to_sign_in(world: Any) -> None:
    response = world.client_for("anonymous").get(DOCS)
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_swagger_ui_shows_the_operations_without_a_csp_violation(
    world: Any, live_server: Any, page: Any
) -> None:
    problems = watch_console(page)
    log_in(page.context, live_server.url, world.users["researcher"])
    page.goto(f"{live_server.url}{DOCS}")
    page.wait_for_selector("text=/api/v1/workspaces/{workspace_slug}/runs/", timeout=20_000)
    assert page.locator(".opblock").count() >= 20
    assert problems == []


@pytest.mark.django_db
def test_the_schema_tells_a_caller_without_credentials_how_to_send_them(world: Any) -> None:
    response = world.client_for("anonymous").get("/api/v1/schema/", {"format": "json"})
    assert response.status_code == 401
    assert response.json() == {"detail": SCHEMA_NEEDS_CREDENTIALS}
    assert "Authorization: Bearer <token>" in SCHEMA_NEEDS_CREDENTIALS


@pytest.mark.django_db
def test_the_schema_is_served_to_a_token(world: Any) -> None:
    plaintext = issue_token(user=world.users["viewer"], name="schema").plaintext
    response = Client().get(
        "/api/v1/schema/", {"format": "json"}, HTTP_AUTHORIZATION=f"Bearer {plaintext}"
    )
    assert response.status_code == 200
    assert response.json()["openapi"].startswith("3.")
