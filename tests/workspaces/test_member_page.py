"""The members page (``/w/<slug>/members/``): its admins add, change and remove members with
the API's rules (who can be added, the last admin), every change audited as the API's are;
the others read it; plain form posts and htmx get the same answers. Who may reach each URL
at all is in tests/test_access_matrix.py; the page in a browser is in
tests/pages/test_browser_members.py."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from portal.models import AuditEvent
from workspaces.models import Membership, Role
from workspaces.services import NOT_ADDABLE

pytestmark = pytest.mark.django_db

PAGE = "/w/alpha/members/"
HTMX = {"HTTP_HX_REQUEST": "true"}


def colleague(world: Any, username: str = "gus") -> Any:
    """Someone alice may add: a member of beta, which alice joins as a viewer."""
    user = get_user_model()._default_manager.create_user(username=username)
    Membership.objects.create(workspace=world.beta, user=user, role=Role.VIEWER)
    Membership.objects.get_or_create(
        workspace=world.beta, user=world.users["workspace_admin"], defaults={"role": Role.VIEWER}
    )
    return user


def role_of(world: Any, username: str) -> str | None:
    found = Membership.objects.for_workspace(world.alpha).filter(user__username=username).first()
    return found.role if found is not None else None


def membership_events(world: Any) -> list[AuditEvent]:
    """alpha's membership events from the pages (the fixtures' own are the system's)."""
    return list(
        AuditEvent.objects.for_workspace(world.alpha)
        .filter(object_type="workspaces.membership", source="web")
        .order_by("id")
    )


def test_an_admin_adds_a_colleague_and_it_is_audited(world: Any) -> None:
    colleague(world)
    admin = world.client_for("workspace_admin")
    answer = admin.post(PAGE, {"username": "gus", "role": "viewer"})
    assert answer.status_code == 302
    assert answer["Location"] == PAGE
    assert role_of(world, "gus") == "viewer"
    (event,) = membership_events(world)
    assert (event.action, event.source, event.actor_username) == ("create", "web", "alice")
    assert event.after is not None
    assert event.after["role"] == "viewer"
    # The page says what happened, once.
    page = admin.get(PAGE).content.decode()
    assert "Added gus to Alpha as viewer." in page
    assert "Added gus" not in admin.get(PAGE).content.decode()


def test_with_htmx_the_fragment_says_it_in_place(world: Any) -> None:
    colleague(world)
    answer = world.client_for("workspace_admin").post(
        PAGE, {"username": "gus", "role": "researcher"}, **HTMX
    )
    assert answer.status_code == 200
    html = answer.content.decode()
    assert html.lstrip().startswith('<div id="members"')
    assert "Added gus to Alpha as researcher." in html
    assert 'data-username="gus"' in html
    assert "<html" not in html


def test_someone_who_cannot_be_added_gets_one_answer_and_nothing_changes(world: Any) -> None:
    """otto exists (beta's admin) but shares no workspace with alice: the same words as a
    name nobody has, so the form cannot tell who has an account."""
    admin = world.client_for("workspace_admin")
    answers = {}
    for name in ("otto", "nobody-at-all"):
        answer = admin.post(PAGE, {"username": name, "role": "viewer"})
        assert answer.status_code == 400
        answers[name] = answer.content.decode()
        assert NOT_ADDABLE.format(username=name).replace("'", "&#x27;") in answers[name]
    assert role_of(world, "otto") is None
    assert membership_events(world) == []


def test_adding_a_member_twice_is_refused(world: Any) -> None:
    answer = world.client_for("workspace_admin").post(PAGE, {"username": "rob", "role": "admin"})
    assert answer.status_code == 400
    assert "already a member" in answer.content.decode()
    assert role_of(world, "rob") == "researcher"


def test_an_admin_changes_a_role_and_removes_a_member(world: Any) -> None:
    admin = world.client_for("workspace_admin")
    changed = admin.post("/w/alpha/members/rob/role/", {"role": "admin"})
    assert changed.status_code == 302
    assert role_of(world, "rob") == "admin"
    removed = admin.post("/w/alpha/members/vera/remove/", **HTMX)
    assert removed.status_code == 200
    assert "Removed vera from Alpha." in removed.content.decode()
    assert role_of(world, "vera") is None
    events = membership_events(world)
    assert [(e.action, e.actor_username, e.source) for e in events] == [
        ("update", "alice", "web"),
        ("delete", "alice", "web"),
    ]
    assert (events[0].before, events[0].after) == ({"role": "researcher"}, {"role": "admin"})
    # vera's session no longer opens the workspace.
    assert world.client_for("viewer").get(PAGE).status_code == 404


@pytest.mark.parametrize("htmx", [False, True])
def test_the_last_admin_can_neither_step_down_nor_be_removed(world: Any, htmx: bool) -> None:
    admin = world.client_for("workspace_admin")
    headers = HTMX if htmx else {}
    demoted = admin.post("/w/alpha/members/alice/role/", {"role": "researcher"}, **headers)
    removed = admin.post("/w/alpha/members/alice/remove/", **headers)
    for answer, what in ((demoted, "stays admin"), (removed, "stays a member")):
        assert answer.status_code == 400
        text = answer.content.decode()
        assert f"alice {what}: A workspace needs at least one admin: make someone else admin " in (
            text
        )
    assert role_of(world, "alice") == "admin"
    assert membership_events(world) == []


def test_an_admin_who_leaves_is_taken_to_their_workspaces(world: Any) -> None:
    Membership.objects.for_workspace(world.alpha).filter(user__username="rob").update(role="admin")
    admin = world.client_for("workspace_admin")
    answer = admin.post("/w/alpha/members/alice/remove/", **HTMX)
    assert answer.status_code == 204
    assert answer["HX-Redirect"] == "/"
    assert role_of(world, "alice") is None
    assert "You left Alpha." in admin.get("/").content.decode()


def test_an_admin_who_steps_down_sees_the_read_only_page(world: Any) -> None:
    Membership.objects.for_workspace(world.alpha).filter(user__username="rob").update(role="admin")
    answer = world.client_for("workspace_admin").post(
        "/w/alpha/members/alice/role/", {"role": "viewer"}, **HTMX
    )
    assert answer.status_code == 200
    html = answer.content.decode()
    assert "alice is now viewer." in html
    assert "Add a member" not in html
    assert "Change role" not in html
    assert "Only this workspace's admins add people" in html
    assert "ask rob." in html


def test_readers_see_the_list_without_the_forms(world: Any) -> None:
    for who in ("viewer", "researcher", "platform_admin"):
        html = world.client_for(who).get(PAGE).content.decode()
        assert 'data-username="alice"' in html
        assert 'data-username="vera"' in html
        assert "Add a member" not in html
        assert "Change role" not in html
        assert "ask alice" in html
    html = world.client_for("workspace_admin").get(PAGE).content.decode()
    assert "Add a member" in html
    assert html.count(">Change role</button>") == 3


def test_a_change_to_someone_who_is_not_a_member_is_404(world: Any) -> None:
    admin = world.client_for("workspace_admin")
    assert admin.post("/w/alpha/members/otto/role/", {"role": "viewer"}).status_code == 404
    assert admin.post("/w/alpha/members/otto/remove/").status_code == 404
    assert Membership.objects.for_workspace(world.beta).get(user__username="otto").role == "admin"


def test_a_role_that_does_not_exist_changes_nothing(world: Any) -> None:
    answer = world.client_for("workspace_admin").post(
        "/w/alpha/members/rob/role/", {"role": "owner"}
    )
    assert answer.status_code == 400
    assert role_of(world, "rob") == "researcher"


def test_changes_need_the_csrf_token(world: Any) -> None:
    admin = Client(enforce_csrf_checks=True)
    admin.force_login(world.users["workspace_admin"])
    assert admin.post("/w/alpha/members/rob/remove/").status_code == 403
    assert admin.post("/w/alpha/members/rob/role/", {"role": "viewer"}).status_code == 403
    colleague(world)
    assert admin.post(PAGE, {"username": "gus", "role": "viewer"}).status_code == 403
    assert role_of(world, "rob") == "researcher"
    assert role_of(world, "gus") is None


def test_the_page_and_its_fragment_vary_on_htmx(world: Any) -> None:
    client = world.client_for("researcher")
    for headers in ({}, HTMX):
        response = client.get(PAGE, **headers)
        assert response.status_code == 200
        assert "hx-request" in response.get("Vary", "").lower()


# Session, user, the workspace with the caller's role, the members with their users, the
# navigation's workspaces; for an admin also the names the add form suggests.
PINNED = {"researcher": 5, "workspace_admin": 6}


@pytest.mark.parametrize("who", sorted(PINNED))
def test_the_list_answers_in_a_pinned_number_of_queries(world: Any, who: str) -> None:
    client = world.client_for(who)

    def count() -> tuple[int, list[str]]:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(PAGE).status_code == 200
        return len(queries), [query["sql"][:120] for query in queries.captured_queries]

    few, _ = count()
    users = get_user_model()._default_manager
    for index in range(30):
        user = users.create_user(username=f"member{index}", first_name="M", last_name=str(index))
        Membership.objects.create(workspace=world.alpha, user=user, role=Role.VIEWER)
    many, sql = count()
    assert few == many, sql
    assert many == PINNED[who], sql
