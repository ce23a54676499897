"""Writes to workspaces and memberships. Each function is one business action in one
transaction; audit events are written by the models' signals inside that transaction."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import transaction

from workspaces.models import Membership, Role, Workspace

if TYPE_CHECKING:
    from django.contrib.auth.models import User


class LastAdminError(ValidationError):
    """The change would leave a workspace without anyone who can manage it."""


def _ensure_admin_remains(workspace: Workspace, leaving: Membership) -> None:
    if leaving.role != Role.ADMIN:
        return
    other_admins = (
        Membership.objects.for_workspace(workspace)
        .filter(role=Role.ADMIN)
        .exclude(pk=leaving.pk)
        .select_for_update()
    )
    if not other_admins.exists():
        raise LastAdminError(
            "A workspace needs at least one admin: make someone else admin first.",
            code="last_admin",
        )


@transaction.atomic
def add_member(*, workspace: Workspace, username: str, role: Role) -> Membership:
    user_model = get_user_model()
    try:
        user: User = user_model._default_manager.get(
            **{user_model.USERNAME_FIELD: username, "is_active": True}
        )
    except user_model.DoesNotExist:
        raise ValidationError(
            {"username": f"No active user is called {username!r}."}, code="unknown_user"
        ) from None
    membership = Membership(workspace=workspace, user=user, role=role)
    membership.full_clean()
    membership.save()
    return membership


@transaction.atomic
def change_member_role(*, membership: Membership, role: Role) -> Membership:
    if membership.role == role:
        return membership
    if role != Role.ADMIN:
        _ensure_admin_remains(membership.workspace, membership)
    membership.role = role
    membership.save(update_fields=["role"])
    return membership


@transaction.atomic
def remove_member(*, membership: Membership) -> None:
    _ensure_admin_remains(membership.workspace, membership)
    membership.delete()


@transaction.atomic
def update_workspace_details(
    *,
    workspace: Workspace,
    name: str | None = None,
    description: str | None = None,
    default_image: str | None = None,
) -> Workspace:
    """What a workspace admin may change; namespace, queue, cohort and quotas are the
    platform team's and are changed in the admin."""
    changed = []
    for field, value in (
        ("name", name),
        ("description", description),
        ("default_image", default_image),
    ):
        if value is not None and getattr(workspace, field) != value:
            setattr(workspace, field, value)
            changed.append(field)
    if changed:
        workspace.full_clean()
        workspace.save(update_fields=changed)
    return workspace
