"""Who may do what in a workspace, decided once for every page and API route.

The workspace always comes from the URL and is resolved through the caller's membership:
to someone without access it does not exist (404), and a member whose role is too low for
a write gets 403. Page views inherit :class:`WorkspaceViewMixin`, API views inherit
:class:`WorkspaceScopedViewSet`; neither lets a subclass skip the check.

Platform staff may read every active workspace (as a viewer) so they can help its members;
writing inside a workspace needs a membership with a high enough role.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from django.contrib.auth.mixins import LoginRequiredMixin, UserPassesTestMixin
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.db.models import Field, OuterRef, QuerySet, Subquery
from django.db.models.options import Options
from django.http import Http404, HttpRequest, HttpResponseBase
from drf_spectacular.openapi import AutoSchema
from rest_framework import exceptions as api_exceptions
from rest_framework import viewsets
from rest_framework.pagination import BasePagination
from rest_framework.permissions import SAFE_METHODS
from rest_framework.request import Request

from portal.tenancy import TenantQuerySet
from workspaces.models import Membership, Role, Workspace

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User


@dataclass(frozen=True)
class WorkspaceAccess:
    workspace: Workspace
    role: Role
    is_member: bool

    def allows(self, needed: Role) -> bool:
        return self.role.includes(needed)


class WorkspaceNotFound(Http404):
    pass


def resolve_workspace_access(
    user: User | AnonymousUser, workspace_slug: str, *, with_cohort: bool = True
) -> WorkspaceAccess:
    """The caller's access to the workspace named in the URL, in one query; 404 if none.
    ``with_cohort``: load the workspace's cohort with it (pages show it; the API, which runs
    this on every request, does not need it)."""
    if not user.is_authenticated:
        raise WorkspaceNotFound("No such workspace.")
    if with_cohort:
        member_role = Membership.objects.filter(workspace=OuterRef("pk"), user=user).values("role")[
            :1
        ]
        # unscoped(): this is the one place a workspace is looked up by name; the annotation
        # below is what decides whether the caller may see it at all.
        workspace = (
            Workspace.objects.unscoped()
            .filter(slug=workspace_slug, active=True)
            .select_related("cohort")
            .annotate(member_role=Subquery(member_role))
            .first()
        )
    else:
        workspace = _workspace_with_role(workspace_slug, user.pk)
    if workspace is None:
        raise WorkspaceNotFound("No such workspace.")
    role_name: str | None = workspace.member_role  # type: ignore[attr-defined]
    if role_name is not None:
        return WorkspaceAccess(workspace=workspace, role=Role(role_name), is_member=True)
    if user.is_staff:
        return WorkspaceAccess(workspace=workspace, role=Role.VIEWER, is_member=False)
    raise WorkspaceNotFound("No such workspace.")


def _workspace_with_role(slug: str, user_id: int) -> Workspace | None:
    """The active workspace named ``slug`` with the user's role in it as ``member_role``
    (None: not a member): the same query as the ORM one above without the cohort, written
    out once. The API runs it on every request, and building it through the ORM each time
    cost more than the rest of a bare API request."""
    sql = _workspace_with_role_sql(connection.vendor)
    return next(iter(Workspace.unscoped_objects.raw(sql, [user_id, slug, True])), None)


@functools.cache
def _workspace_with_role_sql(vendor: str) -> str:
    quote = connection.ops.quote_name
    workspace, membership = Workspace._meta, Membership._meta

    def column(meta: Options[Any], name: str) -> str:
        field = meta.get_field(name)
        assert isinstance(field, Field)
        return quote(str(field.column))

    columns = ", ".join(f"w.{quote(str(field.column))}" for field in workspace.concrete_fields)
    # Names come from the models' own metadata only; values go as parameters.
    return (
        f"SELECT {columns}, (SELECT m.{column(membership, 'role')} "  # noqa: S608
        f"FROM {quote(membership.db_table)} m WHERE m.{column(membership, 'workspace')} = "
        f"w.{column(workspace, 'id')} AND m.{column(membership, 'user')} = %s LIMIT 1) "
        f"AS member_role FROM {quote(workspace.db_table)} w "
        f"WHERE w.{column(workspace, 'slug')} = %s AND w.{column(workspace, 'active')} = %s"
    )


def token_workspace_id(request: Request) -> int | None:
    """The workspace an API token is limited to, if the caller used such a token."""
    return getattr(getattr(request, "auth", None), "workspace_id", None)


def is_write(method: str) -> bool:
    return method not in SAFE_METHODS


class WorkspaceViewMixin(LoginRequiredMixin):
    """For pages under ``/w/<workspace_slug>/``: sets ``self.workspace`` and ``self.access``.

    ``read_role`` is needed for GET/HEAD/OPTIONS, ``write_role`` for every other method.
    """

    read_role: ClassVar[Role] = Role.VIEWER
    write_role: ClassVar[Role] = Role.RESEARCHER
    workspace: Workspace
    access: WorkspaceAccess

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not request.user.is_authenticated:
            return self.handle_no_permission()
        self.access = resolve_workspace_access(request.user, kwargs["workspace_slug"])
        self.workspace = self.access.workspace
        needed = self.write_role if is_write(request.method or "GET") else self.read_role
        if not self.access.allows(needed):
            raise PermissionDenied(f"This needs the {needed.label.lower()} role in this workspace.")
        response: HttpResponseBase = super().dispatch(request, *args, **kwargs)
        return response

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context: dict[str, Any] = super().get_context_data(**kwargs)  # type: ignore[misc]
        context["workspace"] = self.workspace
        context["access"] = self.access
        return context


class StaffRequiredMixin(LoginRequiredMixin, UserPassesTestMixin):
    """Pages for the platform team only: others who are logged in get 403."""

    def test_func(self) -> bool:
        return bool(self.request.user.is_staff)  # type: ignore[attr-defined]


class ApiAutoSchema(AutoSchema):
    """drf-spectacular's schema with one correction: a view's paginator pages its ``list``
    action only. The other actions that answer a list (a run's events, its checkpoints)
    answer a plain JSON list, whatever the view's ``pagination_class``."""

    def _get_paginator(self) -> BasePagination | None:
        action = getattr(self.view, "action", None)
        if action is not None and action != "list":
            return None
        paginator: BasePagination | None = super()._get_paginator()  # type: ignore[no-untyped-call]
        return paginator


class WorkspaceScopedViewSet(viewsets.GenericViewSet):  # type: ignore[type-arg]
    """Base for API routes under ``/api/v1/workspaces/<workspace_slug>/``.

    Subclasses name a ``base_queryset`` (or override ``get_base_queryset``); this class
    restricts it to the workspace. Overriding ``get_queryset`` is refused at import time, so
    no subclass can drop the restriction. Lists answer whole unless a viewset names its own
    ``pagination_class`` (the runs list pages; members and quotas are short).
    """

    read_role: ClassVar[Role] = Role.VIEWER
    write_role: ClassVar[Role] = Role.RESEARCHER
    pagination_class: type[BasePagination] | None = None
    schema = ApiAutoSchema()
    # A tenant-owned queryset (Model.objects...); checked when used.
    base_queryset: ClassVar[QuerySet[Any] | None] = None
    workspace: Workspace
    access: WorkspaceAccess

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "get_queryset" in cls.__dict__:
            raise TypeError(
                f"{cls.__name__} must not override get_queryset(); override "
                "get_base_queryset() and let the base class scope it to the workspace"
            )

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        try:
            self.access = resolve_workspace_access(
                request.user, kwargs["workspace_slug"], with_cohort=False
            )
        except Http404:
            raise api_exceptions.NotFound("No such workspace.") from None
        scope = token_workspace_id(request)
        if scope is not None and scope != self.access.workspace.pk:
            # A token for one workspace cannot see that any other exists.
            raise api_exceptions.NotFound("No such workspace.")
        self.workspace = self.access.workspace
        needed = (
            self.write_role_for(request) if is_write(request.method or "GET") else self.read_role
        )
        if not self.access.allows(needed):
            raise api_exceptions.PermissionDenied(
                f"This needs the {needed.label.lower()} role in this workspace."
            )

    def write_role_for(self, request: Request) -> Role:
        return self.write_role

    def get_base_queryset(self) -> QuerySet[Any]:
        if self.base_queryset is None:
            raise NotImplementedError(f"{type(self).__name__} must set base_queryset")
        return self.base_queryset.all()

    def get_queryset(self) -> TenantQuerySet[Any]:
        queryset = self.get_base_queryset()
        if not isinstance(queryset, TenantQuerySet):
            raise TypeError("workspace API routes only serve tenant-owned models")
        return queryset.for_workspace(self.workspace)
