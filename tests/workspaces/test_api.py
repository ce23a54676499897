"""The workspaces API: what each caller sees and may change, and how many queries it costs."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.conftest import make_workspace
from workspaces.models import Membership, Role

pytestmark = pytest.mark.django_db


def test_workspace_list_shows_only_the_callers_workspaces(world: Any) -> None:
    response = world.api_client_for("researcher").get(reverse("api:workspace-list"))
    assert response.status_code == 200
    body = response.json()
    assert [item["slug"] for item in body] == ["alpha"]
    alpha = body[0]
    assert alpha["role"] == "researcher"
    assert alpha["member_count"] == 3
    assert alpha["gpu_quota"] == 8
    assert alpha["cohort"] == "research"
    assert alpha["url"] == "/api/v1/workspaces/alpha/"
    outsider = world.api_client_for("outsider").get(reverse("api:workspace-list")).json()
    assert [item["slug"] for item in outsider] == ["beta"]


def test_workspace_list_query_count_does_not_grow_with_workspaces(
    world: Any, django_user_model: Any
) -> None:
    client = world.api_client_for("researcher")
    url = reverse("api:workspace-list")
    with CaptureQueriesContext(connection) as few:
        assert client.get(url).status_code == 200
    researcher = world.users["researcher"]
    for index in range(15):
        workspace = make_workspace(f"extra-{index}")
        Membership.objects.create(workspace=workspace, user=researcher, role=Role.VIEWER)
    with CaptureQueriesContext(connection) as many:
        response = client.get(url)
    assert len(response.json()) == 16
    assert len(many) == len(few) == 1


def test_quota_endpoint(world: Any) -> None:
    response = world.api_client_for("viewer").get(
        reverse("api:quota-list", kwargs={"workspace_slug": "alpha"})
    )
    assert response.json() == [
        {
            "flavor": "h100",
            "gpu_model": "NVIDIA-H100-80GB-HBM3",
            "resource": "nvidia.com/gpu",
            "nominal": "8",
            "borrowing_limit": None,
            "lending_limit": None,
        }
    ]


def test_member_list_query_count_is_constant(world: Any, django_user_model: Any) -> None:
    client = world.api_client_for("viewer")
    url = reverse("api:member-list", kwargs={"workspace_slug": "alpha"})
    with CaptureQueriesContext(connection) as few:
        assert len(client.get(url).json()) == 3
    for index in range(20):
        user = django_user_model.objects.create_user(username=f"member{index}")
        Membership.objects.create(workspace=world.alpha, user=user, role=Role.VIEWER)
    with CaptureQueriesContext(connection) as many:
        assert len(client.get(url).json()) == 23
    # One to resolve the workspace and the caller's role, one for the members.
    assert len(few) == len(many) == 2


def test_workspace_admin_updates_details_but_not_platform_fields(world: Any) -> None:
    client = world.api_client_for("workspace_admin")
    url = reverse("api:workspace-detail", kwargs={"workspace_slug": "alpha"})
    # A platform field is refused out loud (it used to be dropped without a word), and
    # nothing of the request is written.
    refused = client.patch(url, {"name": "Alpha Lab", "namespace": "kube-system"}, format="json")
    assert refused.status_code == 403
    assert refused.json()["detail"] == (
        "Only platform staff change namespace; ask your platform team."
    )
    world.alpha.refresh_from_db()
    assert (world.alpha.name, world.alpha.namespace) == ("Alpha", "tau-alpha")
    response = client.patch(url, {"name": "Alpha Lab"}, format="json")
    assert response.status_code == 200
    assert response.json()["name"] == "Alpha Lab"
    world.alpha.refresh_from_db()
    assert (world.alpha.name, world.alpha.namespace) == ("Alpha Lab", "tau-alpha")


def test_adding_an_unknown_user_says_so(world: Any) -> None:
    client = world.api_client_for("workspace_admin")
    url = reverse("api:member-list", kwargs={"workspace_slug": "alpha"})
    response = client.post(url, {"username": "nobody", "role": "viewer"}, format="json")
    assert response.status_code == 400
    assert response.json() == {
        "detail": "The request is not valid; nothing was changed.",
        "username": [
            "No user called 'nobody' that you can add. You can add people who already share a "
            "workspace with you; your platform team adds anyone else (or their "
            "identity-provider groups do)."
        ],
    }


def test_adding_an_existing_member_twice_is_refused(world: Any) -> None:
    client = world.api_client_for("workspace_admin")
    url = reverse("api:member-list", kwargs={"workspace_slug": "alpha"})
    response = client.post(url, {"username": "rob", "role": "viewer"}, format="json")
    assert response.status_code == 400
    assert "already a member" in str(response.json())
    assert (
        Membership.objects.for_workspace(world.alpha).get(user__username="rob").role == "researcher"
    )


def test_the_last_admin_cannot_leave_or_be_demoted(world: Any) -> None:
    client = world.api_client_for("workspace_admin")
    me = reverse("api:member-detail", kwargs={"workspace_slug": "alpha", "username": "alice"})
    demote = client.patch(me, {"role": "viewer"}, format="json")
    assert demote.status_code == 400
    assert "at least one admin" in str(demote.json())
    assert client.delete(me).status_code == 400
    # With a second admin it works.
    rob = reverse("api:member-detail", kwargs={"workspace_slug": "alpha", "username": "rob"})
    assert client.patch(rob, {"role": "admin"}, format="json").status_code == 200
    assert client.patch(me, {"role": "viewer"}, format="json").status_code == 200


def test_members_of_another_workspace_are_not_found(world: Any) -> None:
    """Cross-workspace ids: otto exists, but is a member of beta, not alpha."""
    client = world.api_client_for("workspace_admin")
    url = reverse("api:member-detail", kwargs={"workspace_slug": "alpha", "username": "otto"})
    assert client.get(url).status_code == 404
    assert client.patch(url, {"role": "admin"}, format="json").status_code == 404
    assert client.delete(url).status_code == 404
    assert Membership.objects.for_workspace(world.beta).get().role == "admin"


def test_removed_member_loses_access_at_once(world: Any) -> None:
    researcher = world.api_client_for("researcher")
    url = reverse("api:workspace-detail", kwargs={"workspace_slug": "alpha"})
    assert researcher.get(url).status_code == 200
    admin = world.api_client_for("workspace_admin")
    admin.delete(
        reverse("api:member-detail", kwargs={"workspace_slug": "alpha", "username": "rob"})
    )
    assert researcher.get(url).status_code == 404


def test_openapi_schema_describes_the_routes(world: Any) -> None:
    response = world.api_client_for("researcher").get(
        reverse("api:schema"), HTTP_ACCEPT="application/vnd.oai.openapi+json"
    )
    assert response.status_code == 200
    text = response.content.decode()
    for path in (
        "/api/v1/workspaces/",
        "/api/v1/workspaces/{workspace_slug}/",
        "/api/v1/workspaces/{workspace_slug}/quota/",
        "/api/v1/workspaces/{workspace_slug}/members/",
    ):
        assert path in text
