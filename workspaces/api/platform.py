"""The platform API for staff: create workspaces with their members and quotas, replace a
workspace's quotas, and manage flavors and cohorts (``workspaces.provisioning`` does the
work, with the admin's rules). Everyone else gets 403, as does a token limited to one
workspace: the platform is not inside a workspace."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from drf_spectacular.utils import extend_schema, extend_schema_field, extend_schema_view
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api import refusals
from workspaces import kueue_coverage, provisioning
from workspaces.access import token_workspace_id
from workspaces.api.serializers import QuotaSerializer, WorkspaceSerializer
from workspaces.models import Cohort, ResourceFlavor, Role, Workspace, WorkspaceQuota
from workspaces.selectors import workspaces_for_user

QUANTITY_HELP = "A Kubernetes quantity: 8 (GPUs), 64 or 500m (CPUs), 512Gi (memory)."


class IsPlatformStaff(BasePermission):
    message = "This is for platform staff, with a token not limited to one workspace."

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and user.is_staff) and (
            token_workspace_id(request) is None
        )


def refused(error: provisioning.Refused) -> ValidationError:
    return ValidationError(error.problems)


class QuotaInputSerializer(serializers.Serializer[Any]):
    flavor = serializers.CharField(
        max_length=63,
        min_length=1,
        help_text="An existing flavor's name (GET /api/v1/flavors/); another is a 400.",
    )
    resource = serializers.CharField(max_length=253, min_length=1)
    nominal = serializers.CharField(max_length=40, min_length=1, help_text=QUANTITY_HELP)
    borrowing_limit = serializers.CharField(
        max_length=40,
        min_length=1,
        allow_null=True,
        required=False,
        default=None,
        help_text="null: no limit",
    )
    lending_limit = serializers.CharField(
        max_length=40,
        min_length=1,
        allow_null=True,
        required=False,
        default=None,
        help_text="null: all of the nominal quota",
    )

    def rows(self) -> list[provisioning.QuotaRow]:
        return [provisioning.QuotaRow(**item) for item in self.validated_data]


class MemberInputSerializer(serializers.Serializer[Any]):
    username = serializers.CharField(
        max_length=150,
        min_length=1,
        help_text="An existing user (people appear after their first login); another is a 400.",
    )
    role = serializers.ChoiceField(choices=Role.choices, default=Role.RESEARCHER)


class WorkspaceInputSerializer(serializers.Serializer[Any]):
    """A workspace as staff give it; on PATCH every field is optional and ``quotas``, when
    given, replaces the whole list."""

    # min_length states in the schema what "may not be blank" already refuses.
    slug = serializers.CharField(max_length=40, min_length=1)
    name = serializers.CharField(max_length=100, min_length=1)
    description = serializers.CharField(required=False, allow_blank=True, max_length=10_000)
    namespace = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=63,
        help_text="Empty: tau- and the slug. Not a namespace of the cluster or its operators "
        "(TAU_WORKSPACE_NAMESPACES_DENIED: kube-*, default, kueue-system …) nor TauGrid's own: "
        "those are a 400.",
    )
    local_queue = serializers.CharField(required=False, allow_blank=True, max_length=63)
    default_image = serializers.CharField(required=False, allow_blank=True, max_length=255)
    allowed_priorities = serializers.ListField(
        child=serializers.CharField(max_length=253, min_length=1),
        required=False,
        max_length=50,
        help_text="Names of existing priority classes; another is a 400.",
    )
    default_priority = serializers.CharField(required=False, allow_blank=True, max_length=253)
    cohort = serializers.CharField(
        required=False,
        allow_null=True,
        max_length=63,
        min_length=1,
        help_text="An existing cohort's name (GET /api/v1/cohorts/), another is a 400; null: none.",
    )
    members = MemberInputSerializer(  # type: ignore[call-arg]
        many=True,
        required=False,
        max_length=1000,
        help_text="On creation at least one must be an admin (a workspace keeps one): "
        "without, a 400. Changed later with /api/v1/workspaces/{slug}/members/.",
    )
    quotas = QuotaInputSerializer(many=True, required=False, max_length=500)  # type: ignore[call-arg]


class PlatformWorkspaceSerializer(WorkspaceSerializer):
    quotas = serializers.SerializerMethodField()
    quota_warnings = serializers.SerializerMethodField(
        help_text="On the Kubernetes backend, what the quotas leave out of what runs ask for "
        "(a resource without any row, a GPU flavor without cpu or memory): runs that Kueue "
        "would never admit, which submission refuses. Empty when they cover it."
    )

    class Meta(WorkspaceSerializer.Meta):
        fields = [*WorkspaceSerializer.Meta.fields, "quotas", "quota_warnings"]

    @extend_schema_field(QuotaSerializer(many=True))
    def get_quotas(self, workspace: Workspace) -> list[dict[str, Any]]:
        rows = (
            WorkspaceQuota.objects.for_workspace(workspace)
            .select_related("flavor")
            .order_by("flavor__name", "resource")
        )
        return list(QuotaSerializer(rows, many=True).data)

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_quota_warnings(self, workspace: Workspace) -> list[str]:
        return kueue_coverage.quota_warnings(workspace) if kueue_coverage.kueue_in_use() else []


def platform_answer(request: Request, workspace: Workspace) -> dict[str, Any]:
    annotated = workspaces_for_user(request.user).get(pk=workspace.pk)
    return dict(PlatformWorkspaceSerializer(annotated).data)


def create_workspace(request: Request) -> Response:
    payload = WorkspaceInputSerializer(data=request.data)
    payload.is_valid(raise_exception=True)
    data = dict(payload.validated_data)
    try:
        workspace = provisioning.create_workspace(
            slug=data.pop("slug"),
            cohort=data.pop("cohort", None),
            members=[provisioning.MemberRow(**item) for item in data.pop("members", [])],
            quotas=[provisioning.QuotaRow(**item) for item in data.pop("quotas", [])],
            fields=data,
        )
    except provisioning.Refused as error:
        raise refused(error) from None
    return Response(platform_answer(request, workspace), status=status.HTTP_201_CREATED)


def update_workspace(request: Request, workspace: Workspace) -> Response:
    payload = WorkspaceInputSerializer(data=request.data, partial=True)
    payload.is_valid(raise_exception=True)
    data = dict(payload.validated_data)
    if "slug" in data and data.pop("slug") != workspace.slug:
        raise ValidationError({"slug": ["A workspace keeps its slug (URLs and objects use it)."]})
    if "members" in data:
        raise ValidationError(
            {"members": ["Change members with /api/v1/workspaces/{slug}/members/."]}
        )
    quotas = data.pop("quotas", None)
    changes: dict[str, Any] = {}
    if "cohort" in data:
        changes["cohort"] = data.pop("cohort")
    try:
        provisioning.update_workspace(
            workspace,
            fields=data,
            quotas=None if quotas is None else [provisioning.QuotaRow(**q) for q in quotas],
            **changes,
        )
    except provisioning.Refused as error:
        raise refused(error) from None
    return Response(platform_answer(request, workspace))


class FlavorSerializer(serializers.ModelSerializer[ResourceFlavor]):
    node_labels = serializers.DictField(child=serializers.CharField(max_length=63), required=False)
    tolerations = serializers.ListField(
        child=serializers.DictField(), required=False, max_length=50
    )

    class Meta:
        model = ResourceFlavor
        fields = ["name", "gpu_model", "node_labels", "tolerations", "description"]
        # Uniqueness is the model's check (provisioning), with the admin's words.
        extra_kwargs: ClassVar[dict[str, Any]] = {"name": {"validators": []}}


class CohortSerializer(serializers.ModelSerializer[Cohort]):
    # (DRF takes declared fields off the class: no clash with Serializer.parent at run time.)
    parent = serializers.SlugRelatedField(  # type: ignore[assignment]
        slug_field="name",
        queryset=Cohort.objects.all(),
        allow_null=True,
        required=False,
        help_text="An existing cohort this one is nested in (Kueue's spec.parentName), another "
        "is a 400; null: none.",
    )

    class Meta:
        model = Cohort
        fields = ["name", "parent", "description"]
        extra_kwargs: ClassVar[dict[str, Any]] = {"name": {"validators": []}}


def staff_collection_schema(serializer: type[serializers.Serializer[Any]]) -> Any:
    """The schema of a collection's GET and POST (the views are generic over the kind)."""
    return extend_schema_view(
        get=extend_schema(responses={200: serializer(many=True), **refusals(in_workspace=False)}),
        post=extend_schema(
            request=serializer,
            responses={201: serializer, **refusals(400, 413, in_workspace=False)},
        ),
    )


def staff_item_schema(serializer: type[serializers.Serializer[Any]]) -> Any:
    return extend_schema_view(
        get=extend_schema(responses={200: serializer, **refusals(404, in_workspace=False)}),
        patch=extend_schema(
            request=serializer,
            responses={200: serializer, **refusals(400, 404, 413, in_workspace=False)},
        ),
    )


class _StaffKind(APIView):
    """A platform-wide kind addressed by its ``name``: the model, its JSON shape, and the
    provisioning function that creates (instance None) or changes one."""

    # The API's own checks (authenticated; token scope: read-only and run tokens) first.
    permission_classes = [*APIView.permission_classes, IsPlatformStaff]
    model: type[Any]
    serializer_class: type[serializers.ModelSerializer[Any]]
    saver: ClassVar[Callable[..., Any]]  # (instance or None, fields) -> the saved row

    def _saved(self, payload: serializers.ModelSerializer[Any], instance: Any) -> Any:
        payload.is_valid(raise_exception=True)
        try:
            return self.saver(instance, dict(payload.validated_data))
        except provisioning.Refused as error:
            raise refused(error) from None


class _StaffCollection(_StaffKind):
    """List (GET) and create (POST)."""

    def get(self, request: Request) -> Response:
        rows = self.model.objects.order_by("name")
        return Response(self.serializer_class(rows, many=True).data)

    def post(self, request: Request) -> Response:
        created = self._saved(self.serializer_class(data=request.data), None)
        return Response(self.serializer_class(created).data, status=status.HTTP_201_CREATED)


class _StaffItem(_StaffKind):
    """Read (GET) and change (PATCH) one, by name."""

    def _get(self, name: str) -> Any:
        found = self.model.objects.filter(name=name).first()
        if found is None:
            raise NotFound(f"No {self.model._meta.verbose_name} named {name!r}.")
        return found

    def get(self, request: Request, name: str) -> Response:
        return Response(self.serializer_class(self._get(name)).data)

    def patch(self, request: Request, name: str) -> Response:
        instance = self._get(name)
        payload = self.serializer_class(instance, data=request.data, partial=True)
        return Response(self.serializer_class(self._saved(payload, instance)).data)


@staff_collection_schema(FlavorSerializer)
class FlavorListView(_StaffCollection):
    """ResourceFlavors: node labels that select the nodes, tolerations for their taints."""

    model = ResourceFlavor
    serializer_class = FlavorSerializer
    saver = staticmethod(provisioning.save_flavor)


@staff_item_schema(FlavorSerializer)
class FlavorDetailView(_StaffItem):
    model = ResourceFlavor
    serializer_class = FlavorSerializer
    saver = staticmethod(provisioning.save_flavor)


@staff_collection_schema(CohortSerializer)
class CohortListView(_StaffCollection):
    """Cohorts: workspaces in one borrow each other's unused quota."""

    model = Cohort
    serializer_class = CohortSerializer
    saver = staticmethod(provisioning.save_cohort)


@staff_item_schema(CohortSerializer)
class CohortDetailView(_StaffItem):
    model = Cohort
    serializer_class = CohortSerializer
    saver = staticmethod(provisioning.save_cohort)
