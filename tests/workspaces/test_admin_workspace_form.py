"""Adding a workspace in the admin: the platform admin types only what matters.

Namespace and LocalQueue default from the slug (``tau-<slug>`` and ``<slug>``), a typed value
is still checked, and the form starts with one empty member row and one empty quota row that
are ignored when left alone. The form is read from the page and sent back the way a browser
would, so "left alone" means exactly what the page rendered.
"""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

import pytest
from django.urls import reverse

from portal.models import AuditEvent
from tests.conftest import make_workspace
from workspaces.models import Membership, Workspace, WorkspaceQuota

pytestmark = pytest.mark.django_db

ADD_URL = "admin:workspaces_workspace_add"


class _FormReader(HTMLParser):
    """What a browser would submit from the form with the given id, untouched."""

    def __init__(self, form_id: str) -> None:
        super().__init__()
        self.form_id = form_id
        self.inside = False
        self.values: dict[str, str] = {}
        self._select: str | None = None
        self._select_first: str | None = None
        self._textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {key: value or "" for key, value in attrs}
        if tag == "form":
            self.inside = attributes.get("id") == self.form_id
            return
        if not self.inside:
            return
        name = attributes.get("name", "")
        if tag == "input" and name:
            kind = attributes.get("type", "text")
            if kind in {"submit", "button", "file"}:
                return
            if kind in {"checkbox", "radio"}:
                if "checked" in attributes:
                    self.values[name] = attributes.get("value", "on")
                return
            self.values[name] = attributes.get("value", "")
        elif tag == "select" and name:
            self._select, self._select_first = name, None
        elif tag == "option" and self._select is not None:
            value = attributes.get("value", "")
            if self._select_first is None:
                self._select_first = value
            if "selected" in attributes:
                self.values[self._select] = value
        elif tag == "textarea" and name:
            self._textarea = name
            self.values[name] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self.inside = False
        elif tag == "select" and self._select is not None:
            # With nothing selected a browser sends the first option.
            self.values.setdefault(self._select, self._select_first or "")
            self._select = None
        elif tag == "textarea":
            self._textarea = None

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self.values[self._textarea] += data.removeprefix("\n")


def rendered_form(html: str, form_id: str = "workspace_form") -> dict[str, str]:
    reader = _FormReader(form_id)
    reader.feed(html)
    # The hidden templates for rows added by JavaScript are not sent by a browser's
    # "Save" any differently, but Django ignores them: keep them out to read clearly.
    return {name: value for name, value in reader.values.items() if "__prefix__" not in name}


def add_page(world: Any) -> dict[str, str]:
    response = world.client_for("platform_admin").get(reverse(ADD_URL))
    assert response.status_code == 200
    return rendered_form(response.content.decode())


def with_an_admin(world: Any, form: dict[str, str]) -> dict[str, str]:
    """The add form with its member row filled in: a workspace is saved with an admin."""
    form.update(
        {"memberships-0-user": str(world.users["researcher"].pk), "memberships-0-role": "admin"}
    )
    return form


def test_add_form_shows_one_empty_member_row_and_one_empty_quota_row(world: Any) -> None:
    form = add_page(world)
    for prefix in ("memberships", "quotas"):
        assert form[f"{prefix}-TOTAL_FORMS"] == "1"
        assert form[f"{prefix}-INITIAL_FORMS"] == "0"
    assert form["memberships-0-user"] == ""
    assert form["quotas-0-flavor"] == ""
    assert form["quotas-0-resource"] == ""
    assert form["quotas-0-nominal"] == ""


def test_change_form_shows_one_empty_row_after_the_existing_ones(world: Any) -> None:
    page = world.client_for("platform_admin").get(
        reverse("admin:workspaces_workspace_change", args=[world.alpha.pk])
    )
    form = rendered_form(page.content.decode())
    members = Membership.objects.for_workspace(world.alpha).count()
    quotas = WorkspaceQuota.objects.for_workspace(world.alpha).count()
    assert form["memberships-TOTAL_FORMS"] == str(members + 1)
    assert form["memberships-INITIAL_FORMS"] == str(members)
    assert form["quotas-TOTAL_FORMS"] == str(quotas + 1)
    assert form[f"memberships-{members}-user"] == ""


def test_untouched_empty_rows_neither_block_nor_add_anything(world: Any) -> None:
    form = with_an_admin(world, add_page(world))
    form.update({"slug": "gamma", "name": "Gamma"})  # the quota row stays untouched
    response = world.client_for("platform_admin").post(reverse(ADD_URL), form)
    assert response.status_code == 302, response.content.decode()[:3000]
    gamma = Workspace.unscoped_objects.get(slug="gamma")
    assert Membership.objects.for_workspace(gamma).count() == 1
    assert WorkspaceQuota.objects.for_workspace(gamma).count() == 0
    recorded = AuditEvent.objects.for_workspace(gamma)
    assert sorted((event.action, event.object_type) for event in recorded) == [
        ("create", "workspaces.membership"),
        ("create", "workspaces.workspace"),
    ]


def test_a_workspace_without_an_admin_is_not_saved(world: Any) -> None:
    form = add_page(world)
    form.update({"slug": "gamma", "name": "Gamma"})
    response = world.client_for("platform_admin").post(reverse(ADD_URL), form)
    assert response.status_code == 200
    assert "A workspace needs an admin: give at least one member the role admin." in (
        response.content.decode()
    )
    form.update(
        {"memberships-0-user": str(world.users["researcher"].pk), "memberships-0-role": "viewer"}
    )
    response = world.client_for("platform_admin").post(reverse(ADD_URL), form)
    assert response.status_code == 200
    assert not Workspace.unscoped_objects.filter(slug="gamma").exists()


def test_the_last_admin_cannot_be_removed_or_demoted_here(world: Any) -> None:
    url = reverse("admin:workspaces_workspace_change", args=[world.alpha.pk])
    client = world.client_for("platform_admin")
    form = rendered_form(client.get(url).content.decode())
    admin_row = next(
        name.removesuffix("-role")
        for name, value in form.items()
        if name.startswith("memberships-") and name.endswith("-role") and value == "admin"
    )
    for change in ({f"{admin_row}-role": "viewer"}, {f"{admin_row}-DELETE": "on"}):
        response = client.post(url, {**form, **change})
        assert response.status_code == 200
        assert "A workspace needs an admin" in response.content.decode()
    admin = Membership.objects.for_workspace(world.alpha).get(user=world.users["workspace_admin"])
    assert admin.role == "admin"


@pytest.mark.parametrize("namespace", ["kube-system", "default", "kueue-system", "taugrid"])
def test_system_and_portal_namespaces_are_refused(world: Any, namespace: str) -> None:
    form = with_an_admin(world, add_page(world))
    form.update({"slug": "gamma", "name": "Gamma", "namespace": namespace})
    response = world.client_for("platform_admin").post(reverse(ADD_URL), form)
    assert response.status_code == 200
    [error] = response.context["adminform"].form.errors["namespace"]
    assert error.startswith(f"{namespace!r} is ")
    assert error.endswith("(leave this empty for tau- and the slug).")
    assert not Workspace.unscoped_objects.filter(slug="gamma").exists()


def test_filled_rows_next_to_the_empty_ones_are_saved(world: Any) -> None:
    form = add_page(world)
    form.update(
        {
            "slug": "gamma",
            "name": "Gamma",
            "memberships-0-user": str(world.users["researcher"].pk),
            "memberships-0-role": "admin",
            "quotas-0-flavor": str(world.gpu_flavor.pk),
            "quotas-0-resource": "memory",
            "quotas-0-nominal": "64Gi",
        }
    )
    response = world.client_for("platform_admin").post(reverse(ADD_URL), form)
    assert response.status_code == 302, response.content.decode()[:3000]
    gamma = Workspace.unscoped_objects.get(slug="gamma")
    assert Membership.objects.for_workspace(gamma).get().role == "admin"
    assert WorkspaceQuota.objects.for_workspace(gamma).get().nominal == 64 * 2**30


def test_blank_namespace_and_queue_default_from_the_slug(world: Any) -> None:
    form = add_page(world)
    assert form["namespace"] == ""
    assert form["local_queue"] == ""
    form = with_an_admin(world, form)
    form.update({"slug": "vision-team", "name": "Vision"})
    response = world.client_for("platform_admin").post(reverse(ADD_URL), form)
    assert response.status_code == 302, response.content.decode()[:3000]
    workspace = Workspace.unscoped_objects.get(slug="vision-team")
    assert (workspace.namespace, workspace.local_queue) == ("tau-vision-team", "vision-team")
    # The audit record holds what was really saved, not the blanks that were typed.
    created = AuditEvent.objects.unscoped().get(
        action="create", object_type="workspaces.workspace", object_id=str(workspace.pk)
    )
    assert created.after is not None
    assert created.after["namespace"] == "tau-vision-team"
    assert created.after["local_queue"] == "vision-team"


def test_the_add_form_says_what_an_empty_namespace_means(world: Any) -> None:
    html = world.client_for("platform_admin").get(reverse(ADD_URL)).content.decode()
    assert "Leave empty for tau- and the slug, e.g. tau-vision-team." in html
    assert "Leave empty to use the slug." in html


def test_typed_names_are_kept(world: Any) -> None:
    form = with_an_admin(world, add_page(world))
    form.update({"slug": "gamma", "name": "Gamma", "namespace": "ml-gamma", "local_queue": "main"})
    response = world.client_for("platform_admin").post(reverse(ADD_URL), form)
    assert response.status_code == 302
    gamma = Workspace.unscoped_objects.get(slug="gamma")
    assert (gamma.namespace, gamma.local_queue) == ("ml-gamma", "main")


@pytest.mark.parametrize(
    ("field", "value"),
    [("namespace", "Not_A_Namespace"), ("local_queue", "queue."), ("namespace", "x" * 64)],
)
def test_typed_names_are_still_validated(world: Any, field: str, value: str) -> None:
    form = add_page(world)
    form.update({"slug": "gamma", "name": "Gamma", field: value})
    response = world.client_for("platform_admin").post(reverse(ADD_URL), form)
    assert response.status_code == 200
    assert field in response.context["adminform"].form.errors
    assert not Workspace.unscoped_objects.filter(slug="gamma").exists()


def test_a_default_namespace_already_taken_says_what_to_do(world: Any) -> None:
    make_workspace("other", namespace="tau-gamma")
    form = add_page(world)
    form.update({"slug": "gamma", "name": "Gamma"})
    response = world.client_for("platform_admin").post(reverse(ADD_URL), form)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert errors["namespace"] == [
        "The default namespace 'tau-gamma' is already used by another workspace; "
        "type a namespace for this one."
    ]
    assert not Workspace.unscoped_objects.filter(slug="gamma").exists()


def test_an_existing_workspace_cannot_lose_its_namespace(world: Any) -> None:
    url = reverse("admin:workspaces_workspace_change", args=[world.alpha.pk])
    client = world.client_for("platform_admin")
    form = rendered_form(client.get(url).content.decode())
    form["namespace"] = ""
    response = client.post(url, form)
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["namespace"] == [
        "An existing workspace keeps its namespace; type it (it is 'tau-alpha' now) or the new one."
    ]
    world.alpha.refresh_from_db()
    assert world.alpha.namespace == "tau-alpha"


def test_unchanged_change_form_saves_cleanly(world: Any) -> None:
    # The change form read back as rendered (one empty row per inline included) saves
    # without errors and without recording anything: nothing was changed.
    url = reverse("admin:workspaces_workspace_change", args=[world.alpha.pk])
    client = world.client_for("platform_admin")
    form = rendered_form(client.get(url).content.decode())
    before = AuditEvent.objects.unscoped().count()
    response = client.post(url, form)
    assert response.status_code == 302, response.content.decode()[:3000]
    assert AuditEvent.objects.unscoped().count() == before


def test_a_workspace_created_in_code_gets_the_defaults_too(world: Any) -> None:
    workspace = Workspace.unscoped_objects.create(slug="delta", name="Delta")
    assert (workspace.namespace, workspace.local_queue) == ("tau-delta", "delta")
