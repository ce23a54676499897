"""REST API for workspaces: the caller's workspaces, one workspace, its quotas and members."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import generics, status
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api import refusals
from portal.requests import signed_in_user
from workspaces import services
from workspaces.access import WorkspaceScopedViewSet, token_workspace_id
from workspaces.api import platform
from workspaces.api.serializers import (
    MemberCreateSerializer,
    MemberSerializer,
    MemberUpdateSerializer,
    QuotaSerializer,
    WorkspaceSerializer,
)
from workspaces.models import Membership, Role, WorkspaceQuota
from workspaces.selectors import workspaces_for_user

#: What a workspace's own admins cannot change through the API: the platform team's part.
STAFF_ONLY_FIELDS = frozenset(
    {"cohort", "quotas", "namespace", "local_queue", "allowed_priorities", "default_priority"}
)


def _as_api_error(exc: DjangoValidationError) -> ValidationError:
    if hasattr(exc, "error_dict"):
        return ValidationError(exc.message_dict)
    return ValidationError({"detail": exc.messages})


@extend_schema_view(
    get=extend_schema(
        responses={200: WorkspaceSerializer(many=True), **refusals(in_workspace=False)}
    ),
    post=extend_schema(
        request=platform.WorkspaceInputSerializer,
        responses={
            201: platform.PlatformWorkspaceSerializer,
            **refusals(400, 413, in_workspace=False, words={403: "Platform staff only."}),
        },
    ),
)
class WorkspaceListView(generics.ListAPIView):  # type: ignore[type-arg]
    """The workspaces you can open, with your role in each. Platform staff create
    workspaces here, with their members and quotas."""

    serializer_class = WorkspaceSerializer
    pagination_class = None  # a person belongs to a handful of workspaces

    def get_permissions(self) -> Any:
        if self.request.method == "POST":
            return [*super().get_permissions(), platform.IsPlatformStaff()]
        return super().get_permissions()

    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return platform.create_workspace(request)

    def get_queryset(self) -> Any:
        workspaces = workspaces_for_user(self.request.user)
        scope = token_workspace_id(self.request)
        return workspaces if scope is None else workspaces.filter(pk=scope)


class WorkspaceDetailViewSet(WorkspaceScopedViewSet):
    """One workspace. Its admins may change its name, description and default image;
    platform staff may change everything else too (cohort, priorities, and ``quotas``, which
    replaces the whole list)."""

    serializer_class = WorkspaceSerializer
    write_role = Role.ADMIN

    def write_role_for(self, request: Request) -> Role:
        # Staff reach every workspace as viewers; what they may change is checked below.
        return Role.VIEWER if request.user.is_staff else self.write_role

    def _annotated_workspace(self) -> Any:
        return workspaces_for_user(self.request.user).get(pk=self.workspace.pk)

    @extend_schema(responses={200: WorkspaceSerializer, **refusals()})
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(WorkspaceSerializer(self._annotated_workspace()).data)

    @extend_schema(
        request=platform.WorkspaceInputSerializer,
        responses={200: platform.PlatformWorkspaceSerializer, **refusals(400, 413)},
    )
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        if request.user.is_staff and token_workspace_id(request) is None:
            return platform.update_workspace(request, self.workspace)
        if not self.access.allows(self.write_role):
            raise PermissionDenied(f"This needs the {self.write_role.label.lower()} role here.")
        staff_only = sorted(set(request.data) & STAFF_ONLY_FIELDS)
        if staff_only:
            raise PermissionDenied(
                f"Only platform staff change {', '.join(staff_only)}; ask your platform team."
            )
        serializer = WorkspaceSerializer(self.workspace, data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        try:
            services.update_workspace_details(
                workspace=self.workspace,
                name=serializer.validated_data.get("name"),
                description=serializer.validated_data.get("description"),
                default_image=serializer.validated_data.get("default_image"),
            )
        except DjangoValidationError as exc:
            raise _as_api_error(exc) from None
        return Response(platform.platform_answer(request, self.workspace))


class QuotaViewSet(WorkspaceScopedViewSet):
    """The workspace's quotas per flavor and resource (set by the platform team)."""

    serializer_class = QuotaSerializer
    base_queryset = WorkspaceQuota.objects.select_related("flavor").order_by(
        "flavor__name", "resource"
    )

    @extend_schema(responses={200: QuotaSerializer(many=True), **refusals()})
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(QuotaSerializer(self.get_queryset(), many=True).data)


class MemberViewSet(WorkspaceScopedViewSet):
    """Members and their roles. Workspace admins add, change and remove members; they add
    only people who already share a workspace with them (``services.addable_users``)."""

    serializer_class = MemberSerializer
    write_role = Role.ADMIN
    base_queryset = Membership.objects.select_related("user").order_by("user__username")
    lookup_field = "user__username"
    lookup_url_kwarg = "username"

    @extend_schema(responses={200: MemberSerializer(many=True), **refusals()})
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(MemberSerializer(self.get_queryset(), many=True).data)

    def get_object(self) -> Membership:
        # Named, unlike DRF's "No Membership matches the given query.": `tau workspace
        # members remove bob` can then say that bob is not a member here.
        username = self.kwargs[self.lookup_url_kwarg]
        membership: Membership | None = self.get_queryset().filter(user__username=username).first()
        if membership is None:
            raise NotFound(f"{username} is not a member of this workspace.")
        return membership

    @extend_schema(responses={200: MemberSerializer, **refusals()})
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(MemberSerializer(self.get_object()).data)

    @extend_schema(
        request=MemberCreateSerializer,
        responses={201: MemberSerializer, **refusals(400, 413)},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = MemberCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        try:
            membership = services.add_member(
                workspace=self.workspace,
                username=payload.validated_data["username"],
                role=Role(payload.validated_data["role"]),
                by=signed_in_user(request),
            )
        except DjangoValidationError as exc:
            raise _as_api_error(exc) from None
        return Response(MemberSerializer(membership).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request=MemberUpdateSerializer,
        responses={200: MemberSerializer, **refusals(400, 413)},
    )
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        membership = self.get_object()
        # A partial update: without a role there is nothing to change.
        payload = MemberUpdateSerializer(data=request.data, partial=True)
        payload.is_valid(raise_exception=True)
        if "role" not in payload.validated_data:
            return Response(MemberSerializer(membership).data)
        try:
            services.change_member_role(
                membership=membership, role=Role(payload.validated_data["role"])
            )
        except DjangoValidationError as exc:
            raise _as_api_error(exc) from None
        return Response(MemberSerializer(membership).data)

    @extend_schema(
        responses={
            204: None,
            **refusals(400, words={400: "A workspace keeps at least one admin."}),
        }
    )
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        membership = self.get_object()
        try:
            services.remove_member(membership=membership)
        except DjangoValidationError as exc:
            raise _as_api_error(exc) from None
        return Response(status=status.HTTP_204_NO_CONTENT)
