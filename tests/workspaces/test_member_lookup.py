"""Adding a member: a workspace admin adds only people who already share a workspace with
them, and the answer never tells who else has an account on the installation."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.conftest import make_workspace
from workspaces.models import Membership, Role

pytestmark = pytest.mark.django_db

MEMBERS = reverse("api:member-list", kwargs={"workspace_slug": "alpha"})
CYRILLIC_E = "\u0435"


def add(world: Any, username: str, who: str = "workspace_admin") -> Any:
    client = world.api_client_for(who)
    return client.post(MEMBERS, {"username": username, "role": "viewer"}, format="json")


def refusal_for(world: Any, username: str) -> tuple[int, str]:
    response = add(world, username)
    return response.status_code, str(response.json()["username"]).replace(username, "<name>")


def alpha_usernames(world: Any) -> set[str]:
    return {m.user.username for m in Membership.objects.for_workspace(world.alpha)}


def colleague(world: Any, django_user_model: Any, username: str, **extra: Any) -> Any:
    """A user who shares workspace gamma (as a viewer) with alice, alpha's admin."""
    gamma = make_workspace("gamma")
    user = django_user_model.objects.create_user(username=username, **extra)
    Membership.objects.create(workspace=gamma, user=world.users["workspace_admin"], role="viewer")
    Membership.objects.create(workspace=gamma, user=user, role=Role.RESEARCHER)
    return user


def test_another_tenants_user_looks_exactly_like_no_user(world: Any) -> None:
    """otto exists (he is beta's admin) but shares no workspace with alice."""
    before = alpha_usernames(world)
    with CaptureQueriesContext(connection) as unknown_queries:
        unknown = refusal_for(world, "nobody")
    with CaptureQueriesContext(connection) as otto_queries:
        otto = refusal_for(world, "otto")
    assert unknown == otto
    assert unknown[0] == 400
    assert "otto" not in str(add(world, "otto").json()).replace("'otto'", "")
    # The same work either way: one lookup, no branch that only a real account takes.
    assert len(unknown_queries) == len(otto_queries)
    assert alpha_usernames(world) == before


def test_an_inactive_colleague_looks_like_no_user(world: Any, django_user_model: Any) -> None:
    colleague(world, django_user_model, "gone", is_active=False)
    assert refusal_for(world, "gone") == refusal_for(world, "nobody")


def test_a_colleague_from_a_shared_workspace_is_added(world: Any, django_user_model: Any) -> None:
    colleague(world, django_user_model, "gina", first_name="Gina", last_name="Lollo")
    response = add(world, "gina")
    assert response.status_code == 201
    assert response.json()["username"] == "gina"
    assert response.json()["full_name"] == "Gina Lollo"
    assert "gina" in alpha_usernames(world)


def test_platform_staff_add_anyone(world: Any) -> None:
    Membership.objects.create(
        workspace=world.alpha, user=world.users["platform_admin"], role=Role.ADMIN
    )
    response = add(world, "otto", who="platform_admin")
    assert response.status_code == 201
    assert "otto" in alpha_usernames(world)


def test_confusable_usernames_are_refused_in_lookups(world: Any, django_user_model: Any) -> None:
    # An account from before usernames were ASCII only, sharing a workspace with alice.
    look_alike = f"r{CYRILLIC_E}searcher"
    colleague(world, django_user_model, look_alike)
    assert refusal_for(world, look_alike) == refusal_for(world, "nobody")
    # And the Latin spelling does not find it either.
    assert refusal_for(world, "researcher") == refusal_for(world, "nobody")
    assert look_alike not in alpha_usernames(world)


def test_compatibility_forms_are_folded(world: Any, django_user_model: Any) -> None:
    colleague(world, django_user_model, "gina")
    fullwidth = "".join(chr(ord(char) + 0xFEE0) for char in "gina")
    response = add(world, fullwidth)
    assert response.status_code == 201
    assert response.json()["username"] == "gina"
