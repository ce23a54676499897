"""Reads about workspaces, always already scoped to what the caller may see."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING

from django.db.models import Count, OuterRef, Subquery, Sum
from django.db.models.functions import Coalesce

from workspaces.models import GPU_RESOURCE, Membership, Workspace, WorkspaceQuerySet, WorkspaceQuota

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User


def workspaces_for_user(user: User | AnonymousUser) -> WorkspaceQuerySet:
    """The workspaces the user may open, each annotated with the user's own role (None for
    platform staff who are not members), its member count and its total GPU quota."""
    if not user.is_authenticated:
        return Workspace.objects.get_queryset().none()
    own_role = Membership.objects.filter(workspace=OuterRef("pk"), user=user).values("role")[:1]
    # Subqueries, not joins: visible_to() already joins memberships for non-staff users,
    # and aggregating over that join would count only the caller.
    member_count = (
        Membership.objects.filter(workspace=OuterRef("pk"))
        .values("workspace")
        .annotate(total=Count("pk"))
        .values("total")
    )
    gpu_quota = (
        WorkspaceQuota.objects.filter(workspace=OuterRef("pk"), resource=GPU_RESOURCE)
        .values("workspace")
        .annotate(total=Sum("nominal"))
        .values("total")
    )
    return (
        Workspace.objects.visible_to(user)
        .select_related("cohort")
        .annotate(
            member_role=Subquery(own_role),
            member_count=Coalesce(Subquery(member_count), 0),
            gpu_quota=Subquery(gpu_quota),
        )
        .order_by("name", "slug")
    )


@dataclass(frozen=True)
class QuotaLine:
    flavor: str
    gpu_model: str
    resource: str
    nominal: str
    borrowing_limit: str
    lending_limit: str
    nominal_value: Decimal


def quota_lines(workspace: Workspace) -> list[QuotaLine]:
    rows = (
        WorkspaceQuota.objects.for_workspace(workspace)
        .select_related("flavor")
        .order_by("flavor__name", "resource")
    )
    return [
        QuotaLine(
            flavor=row.flavor.name,
            gpu_model=row.flavor.gpu_model,
            resource=row.resource,
            nominal=row.display_amount(row.nominal),
            borrowing_limit=row.display_amount(row.borrowing_limit),
            lending_limit=row.display_amount(row.lending_limit),
            nominal_value=row.nominal,
        )
        for row in rows
    ]
