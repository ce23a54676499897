"""The members page in a real browser against a live server: a workspace admin adds a
colleague, changes a role and removes a member without the page reloading (htmx), is told in
place that the last admin can neither step down nor leave, and a viewer (and platform staff)
read the list without the forms; axe-core at 1280 px and 390 px on each, screenshots kept."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model

from tests.conftest import make_workspace
from tests.pages.browser_support import check_page, log_in, watch_console
from workspaces.models import Membership, Role

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LAST_ADMIN = "A workspace needs at least one admin: make someone else admin first."


def role_of(world: Any, username: str) -> str | None:
    found = Membership.objects.for_workspace(world.alpha).filter(user__username=username).first()
    return found.role if found is not None else None


def row(page: Any, username: str) -> Any:
    return page.locator(f"#members li[data-username='{username}']")


def said(page: Any) -> str:
    """What the members fragment says after a change (its status or alert)."""
    answer = page.locator("#members [role=status], #members [role=alert]").first
    answer.wait_for()
    return str(answer.inner_text()).strip()


def test_an_admin_manages_members_in_place(world: Any, live_server: Any, page: Any) -> None:
    problems = watch_console(page)
    # gus shares gamma with alice, so alice may add him to alpha; otto (beta) she may not.
    gamma = make_workspace("gamma")
    gus = get_user_model()._default_manager.create_user(
        username="gus", first_name="Gus", last_name="Grant"
    )
    Membership.objects.create(workspace=gamma, user=gus, role=Role.VIEWER)
    Membership.objects.create(
        workspace=gamma, user=world.users["workspace_admin"], role=Role.VIEWER
    )
    log_in(page.context, live_server.url, world.users["workspace_admin"])
    page.goto(f"{live_server.url}/w/alpha/")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Members").click()
    page.wait_for_url(f"{live_server.url}/w/alpha/members/")
    check_page(page, "members-admin")
    # axe-core leaves style="" on what it inspected, which htmx would copy onto the swapped
    # elements (and the CSP refuse): start again from a page as people get it.
    page.reload()
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads

    # The only admin cannot step down: said where the list is, nothing changed.
    row(page, "alice").get_by_label("Role of alice", exact=True).select_option("researcher")
    row(page, "alice").get_by_role("button", name="Change role of alice").click()
    page.locator("#members [role=alert]").wait_for()
    assert said(page) == f"alice stays admin: {LAST_ADMIN}"
    assert row(page, "alice").get_by_label("Role of alice", exact=True).input_value() == "admin"
    assert role_of(world, "alice") == "admin"

    # ... nor leave (after confirming).
    page.once("dialog", lambda dialog: dialog.accept())
    row(page, "alice").get_by_role("button", name="Remove alice").click()
    page.get_by_text(f"alice stays a member: {LAST_ADMIN}").wait_for()
    assert role_of(world, "alice") == "admin"

    # Adding a colleague, suggested by the form.
    assert page.locator("#addable-users option[value='gus']").count() == 1
    page.get_by_label("Username").fill("gus")
    page.locator("#members form.stack").get_by_label("Role").select_option("viewer")
    page.get_by_role("button", name="Add member").click()
    page.get_by_text("Added gus to Alpha as viewer.").wait_for()
    assert row(page, "gus").get_by_text("Gus Grant").count() == 1
    assert role_of(world, "gus") == "viewer"

    # Making rob an admin, then removing vera: a dismissed confirmation removes nobody.
    row(page, "rob").get_by_label("Role of rob", exact=True).select_option("admin")
    row(page, "rob").get_by_role("button", name="Change role of rob").click()
    page.get_by_text("rob is now admin.").wait_for()
    assert role_of(world, "rob") == "admin"
    page.once("dialog", lambda dialog: dialog.dismiss())
    row(page, "vera").get_by_role("button", name="Remove vera").click()
    page.wait_for_timeout(300)
    assert role_of(world, "vera") == "viewer"
    page.once("dialog", lambda dialog: dialog.accept())
    row(page, "vera").get_by_role("button", name="Remove vera").click()
    page.get_by_text("Removed vera from Alpha.").wait_for()
    assert row(page, "vera").count() == 0
    assert role_of(world, "vera") is None

    # Someone alice may not add: the form says so, with the name kept to correct it.
    page.get_by_label("Username").fill("otto")
    page.get_by_role("button", name="Add member").click()
    page.get_by_text("No user called 'otto' that you can add.", exact=False).wait_for()
    assert page.get_by_label("Username").input_value() == "otto"
    assert role_of(world, "otto") is None
    assert page.evaluate("window.__sameDocument === true"), "the page reloaded"
    assert problems == []
    check_page(page, "members-refused")


def test_viewers_and_staff_read_the_members_without_the_forms(
    world: Any, live_server: Any, page: Any
) -> None:
    problems = watch_console(page)
    log_in(page.context, live_server.url, world.users["viewer"])
    page.goto(f"{live_server.url}/w/alpha/members/")
    assert row(page, "alice").get_by_text("Admin").count() == 1
    assert page.get_by_role("button", name="Add member").count() == 0
    assert page.locator("#members select").count() == 0
    assert "ask alice" in page.inner_text("#members")
    check_page(page, "members-viewer")
    # Platform staff read every workspace, as viewers: the same page.
    context = page.context.browser.new_context(viewport={"width": 1280, "height": 900})
    staff = context.new_page()
    problems += watch_console(staff)
    log_in(context, live_server.url, world.users["platform_admin"])
    staff.goto(f"{live_server.url}/w/alpha/members/")
    assert staff.get_by_role("button", name="Add member").count() == 0
    assert staff.locator("#members li[data-username='rob']").get_by_text("Researcher").count() == 1
    assert staff.get_by_role("link", name="platform admin").count() == 1
    check_page(staff, "members-staff")
    context.close()
    assert problems == []
