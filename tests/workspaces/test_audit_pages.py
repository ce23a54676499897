"""The audit log pages: who sees what, filters, paging, and a fixed number of queries."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from portal import audit
from portal.models import AuditEvent
from workspaces.audit_views import AUDIT_PAGE_SIZE
from workspaces.models import WorkspaceQuota

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


def test_platform_staff_read_a_workspace_audit_log(world: Any) -> None:
    record(2, world.alpha, "alpha.thing")
    record(2, world.beta, "beta.thing")
    url = reverse("workspace-audit", kwargs={"workspace_slug": "alpha"})
    response = world.client_for("platform_admin").get(url)
    assert response.status_code == 200
    html = response.content.decode()
    assert html.count("alpha.thing</span>") == 2
    assert "beta.thing" not in html
    # Reading is all: the page takes no writes from staff who are not its admins.
    assert world.client_for("platform_admin").post(url).status_code == 403


def test_members_below_admin_still_cannot_read_it(world: Any) -> None:
    url = reverse("workspace-audit", kwargs={"workspace_slug": "alpha"})
    for who in ("researcher", "viewer"):
        response = world.client_for(who).get(url)
        assert response.status_code == 403
        assert "needs the admin role" in response.content.decode()
    assert world.client_for("outsider").get(url).status_code == 404


def test_changes_read_as_quantities_and_old_to_new(world: Any) -> None:
    quota = WorkspaceQuota.objects.for_workspace(world.alpha).get()
    with audit.acting_as(world.users["platform_admin"], source="admin"):
        quota.nominal = Decimal(16)
        quota.save()
        memory = WorkspaceQuota.objects.create(
            workspace=world.alpha,
            flavor=world.gpu_flavor,
            resource="memory",
            nominal=Decimal(4 * 2**30),
        )
        memory.nominal = Decimal(512 * 2**20)
        memory.save()
        # A row recorded before amounts were recorded as quantities.
        audit.record(
            action="update",
            workspace=world.alpha,
            object_type="workspaces.workspacequota",
            object_repr="alpha: 2Gi memory on h100",
            before={"nominal": "2147483648.000"},
            after={"nominal": "4294967296.000"},
        )
    for url in (reverse("audit"), reverse("workspace-audit", kwargs={"workspace_slug": "alpha"})):
        html = world.client_for("platform_admin").get(url).content.decode()
        assert '<pre class="change">nominal: 8 → 16</pre>' in html
        assert '<pre class="change">nominal: 4Gi → 512Mi</pre>' in html
        assert '<pre class="change">nominal: 2Gi → 4Gi</pre>' in html
        # A create folds its values away, each on its own line, empty ones left out.
        assert "<summary>show 5 fields</summary>" in html
        assert "resource: memory\nnominal: 4Gi</pre>" in html
        assert "borrowing_limit" not in html
        assert "4294967296" not in html
        assert "{&#x27;" not in html  # no Python dict
