"""Writes to workspaces and memberships. Each function is one business action in one
transaction; audit events are written by the models' signals inside that transaction."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import QuerySet

from portal import usernames
from workspaces.models import Membership, Role, Workspace

if TYPE_CHECKING:
    from django.contrib.auth.models import User

# One answer for "no such user" and "a user you may not add", so that adding a member cannot
# be used to find out who else has an account on the installation.
NOT_ADDABLE = (
    "No user called {username!r} that you can add. You can add people who already share a "
    "workspace with you; your platform team adds anyone else (or their identity-provider "
    "groups do)."
)


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


def addable_users(by: User) -> QuerySet[Any]:
    """The people ``by`` may add to a workspace they administer.

    The policy: a workspace admin adds only people they can already see, that is active
    users who are members (in any role) of an active workspace ``by`` belongs to; platform
    staff, who see every account in the admin anyway, add any active user. Everyone else
    joins through the platform team or the identity provider's group mapping
    (``TAU_OIDC_WORKSPACE_ROLES``).

    Why: a member lookup must not reveal the accounts of other tenants (the member lists of
    one's own workspaces already show these people, so nothing new is revealed), and an
    admin must not be able to pull a stranger into a workspace; the people one already
    works with in a shared workspace are the circle a platform team can live with. An
    invitation by e-mail would ask for consent as well, but needs mail delivery, which a
    self-hosted portal may not have.
    """
    user_model = get_user_model()
    users = user_model._default_manager.filter(is_active=True)
    if by.is_staff:
        return users
    return users.filter(memberships__workspace__in=Workspace.objects.visible_to(by)).distinct()


@transaction.atomic
def add_member(*, workspace: Workspace, username: str, role: Role, by: User) -> Membership:
    """Add ``username`` to ``workspace`` as ``by`` (see :func:`addable_users` for whom).

    An unknown name, an inactive account, a name outside the username rule (look-alike
    letters from another script) and a user ``by`` may not add all get the same answer,
    from the same single query.
    """
    user_model = get_user_model()
    user: User | None = None
    if usernames.is_allowed(username):
        user = (
            addable_users(by)
            .filter(**{user_model.USERNAME_FIELD: usernames.normalise(username)})
            .first()
        )
    if user is None:
        raise ValidationError(
            {"username": NOT_ADDABLE.format(username=username)}, code="not_addable"
        )
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
