"""The UI shell: login, the workspace list, a workspace's home, error pages, headers."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.conftest import make_workspace
from workspaces.models import Membership, Role

pytestmark = pytest.mark.django_db


def test_login_with_username_and_password(django_user_model: Any, world: Any) -> None:
    django_user_model.objects.create_user(username="lee", password="a long test passphrase")
    client = Client()
    page = client.get(reverse("login"))
    assert page.status_code == 200
    assert b'autocomplete="current-password"' in page.content
    wrong = client.post(reverse("login"), {"username": "lee", "password": "nope"})
    assert wrong.status_code == 200
    assert b"Please enter a correct username and password" in wrong.content
    right = client.post(reverse("login"), {"username": "lee", "password": "a long test passphrase"})
    assert right.status_code == 302
    assert right["Location"] == reverse("home")


def test_home_lists_workspaces_with_role_and_quota(world: Any) -> None:
    page = world.client_for("researcher").get(reverse("home"))
    html = page.content.decode()
    assert "Alpha" in html
    assert "Beta" not in html
    assert "role-researcher" in html
    assert "/w/alpha/" in html


def test_home_empty_state_explains_what_to_do(django_user_model: Any) -> None:
    loner = django_user_model.objects.create_user(username="newbie")
    client = Client()
    client.force_login(loner)
    html = client.get(reverse("home")).content.decode()
    assert "You are not in any workspace yet" in html
    assert "newbie" in html


def test_workspace_home_shows_quota_members_and_empty_runs(world: Any) -> None:
    html = (
        world.client_for("viewer")
        .get(reverse("workspace-home", kwargs={"workspace_slug": "alpha"}))
        .content.decode()
    )
    assert "No runs yet." in html
    assert "nvidia.com/gpu" in html
    assert "NVIDIA-H100-80GB-HBM3" in html
    for username in ("alice", "rob", "vera"):
        assert username in html
    assert "Edit in admin" not in html
    staff_html = (
        world.client_for("platform_admin")
        .get(reverse("workspace-home", kwargs={"workspace_slug": "alpha"}))
        .content.decode()
    )
    assert "Edit in admin" in staff_html
    assert "platform staff (read-only)" in staff_html


def test_workspace_without_quota_says_so(world: Any) -> None:
    lonely = make_workspace("lonely")
    Membership.objects.create(
        workspace=lonely, user=world.users["researcher"], role=Role.RESEARCHER
    )
    html = (
        world.client_for("researcher")
        .get(reverse("workspace-home", kwargs={"workspace_slug": "lonely"}))
        .content.decode()
    )
    assert "No quota yet." in html


@pytest.mark.parametrize("url_name", ["home", "workspace-home"])
def test_page_query_counts_do_not_grow(world: Any, django_user_model: Any, url_name: str) -> None:
    kwargs = {"workspace_slug": "alpha"} if url_name == "workspace-home" else {}
    client = world.client_for("researcher")
    url = reverse(url_name, kwargs=kwargs)
    with CaptureQueriesContext(connection) as few:
        assert client.get(url).status_code == 200
    researcher = world.users["researcher"]
    for index in range(12):
        workspace = make_workspace(f"more-{index}")
        Membership.objects.create(workspace=workspace, user=researcher, role=Role.VIEWER)
        other = django_user_model.objects.create_user(username=f"colleague{index}")
        Membership.objects.create(workspace=world.alpha, user=other, role=Role.VIEWER)
    with CaptureQueriesContext(connection) as many:
        assert client.get(url).status_code == 200
    assert len(few) == len(many)
    # Session and user; then the workspace list (shared by page and navigation), or: the
    # access check, runs in use and quotas (usage), my runs, active runs, run counts,
    # its newest pipelines, members, the storage its datasets and models keep, and the
    # navigation's workspace list.
    expected = {"home": 3, "workspace-home": 12}[url_name]
    assert len(many) == expected, [q["sql"] for q in many.captured_queries]


def test_security_headers_are_set(world: Any) -> None:
    response = world.client_for("researcher").get(reverse("home"))
    csp = response["Content-Security-Policy"]
    assert "script-src 'self'" in csp
    assert "unsafe-inline" not in csp
    assert "frame-ancestors 'none'" in csp
    assert response["X-Frame-Options"] == "DENY"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert len(response["X-Request-ID"]) == 32


def test_pages_have_no_inline_scripts(world: Any) -> None:
    html = (
        world.client_for("researcher")
        .get(reverse("workspace-home", kwargs={"workspace_slug": "alpha"}))
        .content.decode()
    )
    for chunk in html.split("<script")[1:]:
        assert chunk.split(">", 1)[0].strip().startswith("src="), (
            "inline <script> would be blocked by the CSP"
        )
    assert "<style" not in html


def test_csrf_is_enforced_on_forms() -> None:
    client = Client(enforce_csrf_checks=True)
    response = client.post(reverse("login"), {"username": "x", "password": "y"})
    assert response.status_code == 403


def test_not_found_page_is_friendly(world: Any) -> None:
    response = world.client_for("outsider").get(
        reverse("workspace-home", kwargs={"workspace_slug": "alpha"})
    )
    assert response.status_code == 404
    assert b"Back to your workspaces" in response.content


def test_forbidden_page_names_the_needed_role(world: Any) -> None:
    response = world.client_for("viewer").post(
        reverse("workspace-home", kwargs={"workspace_slug": "alpha"})
    )
    assert response.status_code == 403
    assert b"researcher role" in response.content


def test_every_page_links_the_icon() -> None:
    html = Client().get(reverse("login")).content.decode()
    assert '<link rel="icon" href="/static/img/favicon.svg" type="image/svg+xml">' in html


def test_favicon_ico_leads_to_the_icon() -> None:
    """Browsers ask for /favicon.ico on every page, whatever the page links."""
    client = Client()
    response = client.get("/favicon.ico")
    assert response.status_code == 302
    assert response["Location"] == "/static/img/favicon.svg"
    icon = client.get(response["Location"])
    assert icon.status_code == 200
    assert icon["Content-Type"].startswith("image/svg+xml")
    body = b"".join(icon.streaming_content)  # type: ignore[attr-defined]
    assert body.lstrip().startswith(b"<svg")
    # The Content Security Policy of the pages lets them show it (same origin).
    page = client.get(reverse("login"))
    assert "img-src 'self'" in page["Content-Security-Policy"]
