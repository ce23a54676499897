"""Tenant-owned querysets fail closed: unscoped reads and writes raise, scoped ones work."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.db.models import Q
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext

from portal.models import AuditEvent
from portal.tenancy import UnscopedQueryError
from workspaces.models import Membership, Workspace, WorkspaceQuota
from workspaces.selectors import navigation_workspaces, user_workspaces, workspaces_for_user

pytestmark = pytest.mark.django_db

UNSCOPED_USES: dict[str, Callable[[Any], Any]] = {
    "list": lambda qs: list(qs),
    "iterate": lambda qs: [row.pk for row in qs],
    "iterator": lambda qs: list(qs.iterator()),
    "count": lambda qs: qs.count(),
    "exists": lambda qs: qs.exists(),
    "first": lambda qs: qs.first(),
    "get": lambda qs: qs.get(pk=1),
    "aggregate": lambda qs: qs.aggregate(n=__import__("django.db.models").db.models.Count("pk")),
    "values": lambda qs: list(qs.values("pk")),
    "update": lambda qs: qs.update(role="viewer"),
    "delete": lambda qs: qs.delete(),
    "bool": lambda qs: bool(qs),
    "len": lambda qs: len(qs),
}


@pytest.mark.parametrize("use", sorted(UNSCOPED_USES))
def test_unscoped_membership_queries_raise(world: Any, use: str) -> None:
    with pytest.raises(UnscopedQueryError):
        UNSCOPED_USES[use](Membership.objects.all())


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(
            lambda w: Membership.objects.filter(user=w.users["researcher"]), id="other-field"
        ),
        pytest.param(
            lambda w: Membership.objects.filter(workspace__slug="alpha"), id="through-join"
        ),
        pytest.param(
            lambda w: Membership.objects.filter(Q(workspace=w.alpha) | Q(role="admin")), id="or"
        ),
        pytest.param(lambda w: Membership.objects.exclude(workspace=w.beta), id="exclude"),
        pytest.param(
            lambda w: WorkspaceQuota.objects.filter(resource="nvidia.com/gpu"), id="quota"
        ),
        pytest.param(lambda w: AuditEvent.objects.all(), id="audit"),
    ],
)
def test_queries_not_restricted_to_a_workspace_raise(
    world: Any, build: Callable[[Any], Any]
) -> None:
    with pytest.raises(UnscopedQueryError):
        list(build(world))


def test_scoped_queries_return_only_that_workspace(world: Any) -> None:
    alpha_members = Membership.objects.for_workspace(world.alpha)
    assert {m.user.username for m in alpha_members} == {"alice", "rob", "vera"}
    assert Membership.objects.filter(workspace=world.beta).count() == 1
    assert Membership.objects.for_workspaces([world.alpha, world.beta]).count() == 4
    # A related manager is scoped by construction.
    assert world.alpha.memberships.count() == 3
    # Extra conditions combined with AND keep the scope.
    assert (
        Membership.objects.for_workspace(world.alpha)
        .filter(Q(role="admin") | Q(role="viewer"))
        .count()
        == 2
    )


def test_unscoped_is_the_explicit_escape_hatch(world: Any) -> None:
    assert Membership.objects.unscoped().count() == 4
    # The flag survives further chaining.
    assert Membership.objects.unscoped().filter(role="admin").order_by("pk").count() == 2


def test_empty_querysets_are_harmless(world: Any) -> None:
    assert list(Membership.objects.none()) == []


def test_workspaces_are_listed_only_through_access(world: Any) -> None:
    with pytest.raises(UnscopedQueryError):
        list(Workspace.objects.all())
    with pytest.raises(UnscopedQueryError):
        Workspace.objects.filter(slug="alpha").first()
    assert [w.slug for w in Workspace.objects.visible_to(world.users["researcher"])] == ["alpha"]
    assert [w.slug for w in Workspace.objects.visible_to(world.users["outsider"])] == ["beta"]
    staff_sees = {w.slug for w in Workspace.objects.visible_to(world.users["platform_admin"])}
    assert staff_sees == {"alpha", "beta"}


def test_inactive_workspaces_are_hidden(world: Any) -> None:
    world.alpha.active = False
    world.alpha.save()
    assert list(workspaces_for_user(world.users["researcher"])) == []


@pytest.mark.parametrize("who", ["platform_admin", "researcher", "outsider"])
def test_the_switcher_lists_what_the_home_page_lists(world: Any, who: str) -> None:
    """The top bar's switcher reads only names and slugs, in one query: the same workspaces
    in the same order as the annotated list, which it reuses where the page read it."""
    request = RequestFactory().get("/")
    request.user = world.users[who]
    with CaptureQueriesContext(connection) as queries:
        listed = navigation_workspaces(request)
    assert len(queries) == 1
    expected = list(workspaces_for_user(world.users[who]))
    assert [(w.pk, w.slug, w.name) for w in listed] == [(w.pk, w.slug, w.name) for w in expected]
    page = user_workspaces(request)
    with CaptureQueriesContext(connection) as queries:
        assert navigation_workspaces(request) is page
    assert len(queries) == 0


def test_workspaces_for_user_annotations(world: Any) -> None:
    rows: dict[str, Any] = {w.slug: w for w in workspaces_for_user(world.users["researcher"])}
    assert rows["alpha"].member_role == "researcher"
    # All members are counted, not only the caller (a join-based count would say 1).
    assert rows["alpha"].member_count == 3
    assert rows["alpha"].gpu_quota == 8
    staff_rows: dict[str, Any] = {
        w.slug: w for w in workspaces_for_user(world.users["platform_admin"])
    }
    assert staff_rows["beta"].member_role is None
    assert staff_rows["beta"].member_count == 1
