"""Reads about workspaces, always already scoped to what the caller may see."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db.models import Count, OuterRef, Subquery, Sum
from django.db.models.functions import Coalesce
from django.http import HttpRequest

from tau.k8s_names import GPU_RESOURCE
from workspaces.models import Membership, Workspace, WorkspaceQuerySet, WorkspaceQuota

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


def navigation_workspaces(request: HttpRequest) -> list[Any]:
    """The workspaces the switcher in every page's top bar lists (name and slug, by name):
    the page's own :func:`user_workspaces` where it read them (the home page), otherwise
    just those columns. The role, member count and GPU quota that :func:`workspaces_for_user`
    adds are three subqueries that the switcher never shows; building and running them was
    a sixth of a page's time, on every page."""
    cached: list[Any] | None = getattr(request, "_tau_user_workspaces", None)
    if cached is not None:
        return cached
    return list(
        Workspace.objects.visible_to(request.user)
        .only("pk", "slug", "name")
        .order_by("name", "slug")
    )


def user_workspaces(request: HttpRequest) -> list[Any]:
    """The caller's workspaces, read once per request however many parts of a page ask."""
    cached: list[Any] | None = getattr(request, "_tau_user_workspaces", None)
    if cached is None:
        cached = list(workspaces_for_user(request.user))
        request._tau_user_workspaces = cached  # type: ignore[attr-defined]
    return cached
