"""The two lookups every API request makes, written out as SQL once (identity.tokens
``token_with_user``, workspaces.access for the API), give exactly what the ORM gives."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from identity.models import ApiToken
from identity.tokens import issue_token, token_with_user
from workspaces.access import WorkspaceNotFound, resolve_workspace_access
from workspaces.models import Workspace

pytestmark = pytest.mark.django_db


def fields(instance: Any) -> dict[str, Any]:
    return {f.attname: getattr(instance, f.attname) for f in instance._meta.concrete_fields}


def test_a_token_and_its_user_as_the_orm_reads_them(world: Any) -> None:
    user = world.users["researcher"]
    user.last_login = timezone.now() - timedelta(days=1)
    user.save()
    issued = issue_token(user=user, name="ci", workspace=world.alpha, read_only=True)
    ApiToken.objects.filter(pk=issued.token.pk).update(last_used_at=timezone.now())
    with CaptureQueriesContext(connection) as queries:
        token = token_with_user(issued.token.key)
    assert len(queries) == 1
    assert token is not None
    expected = ApiToken.objects.select_related("user").get(pk=issued.token.pk)
    assert fields(token) == fields(expected)
    assert fields(token.user) == fields(expected.user)
    assert token.read_only is True
    assert token.user.is_active is True
    with CaptureQueriesContext(connection) as queries:
        assert token.user.get_username() == "rob"  # loaded with it
    assert len(queries) == 0
    assert token_with_user("nosuchkey000") is None


@pytest.mark.parametrize("who", ["platform_admin", "workspace_admin", "researcher", "viewer"])
def test_the_api_resolves_a_workspace_as_pages_do(world: Any, who: str) -> None:
    user = world.users[who]
    page = resolve_workspace_access(user, "alpha")
    with CaptureQueriesContext(connection) as queries:
        api = resolve_workspace_access(user, "alpha", with_cohort=False)
    assert len(queries) == 1
    assert (api.role, api.is_member) == (page.role, page.is_member)
    assert fields(api.workspace) == fields(page.workspace)
    assert api.workspace.allowed_priorities == ["normal"]


@pytest.mark.parametrize("who", ["outsider", "anonymous"])
def test_the_api_does_not_find_a_workspace_it_may_not_see(world: Any, who: str) -> None:
    from django.contrib.auth.models import AnonymousUser

    user = world.users[who] or AnonymousUser()
    for with_cohort in (True, False):
        with pytest.raises(WorkspaceNotFound):
            resolve_workspace_access(user, "alpha", with_cohort=with_cohort)


def test_an_inactive_workspace_is_not_found_by_anyone(world: Any) -> None:
    Workspace.objects.unscoped().filter(slug="alpha").update(active=False)
    for with_cohort in (True, False):
        with pytest.raises(WorkspaceNotFound):
            resolve_workspace_access(
                world.users["workspace_admin"], "alpha", with_cohort=with_cohort
            )
