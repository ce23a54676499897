"""The audit log pages: who sees what, filters, paging, and a fixed number of queries."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from portal import audit
from portal.identity.views import AUDIT_PAGE_SIZE
from portal.models import AuditEvent

pytestmark = pytest.mark.django_db


def record(n: int, workspace: Any, action: str = "matrix.test") -> None:
    with audit.acting_as(None, source="system"):
        for index in range(n):
            audit.record(action=action, workspace=workspace, object_repr=f"event {index}")


def test_platform_staff_see_everything_with_filters(world: Any) -> None:
    record(3, world.alpha, "alpha.thing")
    record(2, world.beta, "beta.thing")
    client = world.client_for("platform_admin")
    html = client.get(reverse("audit")).content.decode()
    assert "alpha.thing" in html
    assert "beta.thing" in html
    filtered = client.get(reverse("audit"), {"workspace": "beta"}).content.decode()
    assert "beta.thing" in filtered
    assert "alpha.thing" not in filtered
    by_action = client.get(reverse("audit"), {"action": "alpha.thing"}).content.decode()
    assert by_action.count("alpha.thing</span>") == 3


def test_workspace_admins_see_only_their_workspace(world: Any) -> None:
    record(2, world.alpha, "alpha.thing")
    record(2, world.beta, "beta.thing")
    html = (
        world.client_for("workspace_admin")
        .get(reverse("workspace-audit", kwargs={"workspace_slug": "alpha"}))
        .content.decode()
    )
    assert "alpha.thing" in html
    assert "beta.thing" not in html
    # Asking for another workspace through the filter changes nothing.
    sneaky = world.client_for("workspace_admin").get(
        reverse("workspace-audit", kwargs={"workspace_slug": "alpha"}), {"workspace": "beta"}
    )
    assert "beta.thing" not in sneaky.content.decode()


def test_audit_pages_keyset_paging_and_query_count(world: Any) -> None:
    client = world.client_for("platform_admin")
    record(5, world.alpha)
    with CaptureQueriesContext(connection) as few:
        client.get(reverse("audit"))
    record(AUDIT_PAGE_SIZE * 2, world.alpha, "bulk")
    with CaptureQueriesContext(connection) as many:
        first = client.get(reverse("audit"), {"action": "bulk"})
    assert len(few) == len(many)
    html = first.content.decode()
    assert "Older entries" in html
    newest = AuditEvent.objects.unscoped().filter(action="bulk").order_by("-id")
    cursor = newest[AUDIT_PAGE_SIZE - 1].id
    assert f"before={cursor}" in html
    # Newest first: the first page ends with event 50, the second starts with event 49.
    assert f"event {AUDIT_PAGE_SIZE}<" in html
    assert f"event {AUDIT_PAGE_SIZE - 1}<" not in html
    second = client.get(reverse("audit"), {"action": "bulk", "before": cursor}).content.decode()
    assert f"event {AUDIT_PAGE_SIZE - 1}<" in second
    assert f"event {AUDIT_PAGE_SIZE}<" not in second
    assert second.count("bulk</span>") == AUDIT_PAGE_SIZE
    assert "Older entries" not in second


def test_login_and_logout_are_audited(world: Any, django_user_model: Any) -> None:
    django_user_model.objects.create_user(username="lee", password="a long test passphrase")
    from django.test import Client

    client = Client(REMOTE_ADDR="192.0.2.7")
    client.post(reverse("login"), {"username": "lee", "password": "wrong"})
    client.post(reverse("login"), {"username": "lee", "password": "a long test passphrase"})
    client.post(reverse("logout"))
    events = list(
        AuditEvent.objects.unscoped()
        .filter(action__in=["login.failed", "login.success", "logout"])
        .order_by("id")
    )
    assert [(e.action, e.actor_username) for e in events] == [
        ("login.failed", ""),
        ("login.success", "lee"),
        ("logout", "lee"),
    ]
    assert events[0].object_repr == "password login as 'lee'"
    assert {e.remote_addr for e in events} == {"192.0.2.7"}
    assert "wrong" not in repr([(e.before, e.after, e.object_repr) for e in events])
