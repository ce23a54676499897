"""JSON shapes of workspaces, quotas and members in the REST API."""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from rest_framework import serializers

from tau.quantity import format_quantity
from workspaces.models import Cohort, Membership, Role, Workspace, WorkspaceQuota


class WorkspaceSerializer(serializers.ModelSerializer[Workspace]):
    cohort: serializers.SlugRelatedField[Cohort] = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True
    )
    role = serializers.SerializerMethodField(help_text="Your role here; null for platform staff.")
    member_count = serializers.IntegerField(read_only=True)
    gpu_quota = serializers.SerializerMethodField(
        help_text="Nominal nvidia.com/gpu over all flavors."
    )
    url = serializers.SerializerMethodField()

    class Meta:
        model = Workspace
        fields = [
            "slug",
            "name",
            "description",
            "namespace",
            "local_queue",
            "cohort",
            "default_image",
            "allowed_priorities",
            "default_priority",
            "role",
            "member_count",
            "gpu_quota",
            "url",
        ]
        read_only_fields = [
            "slug",
            "namespace",
            "local_queue",
            "cohort",
            "allowed_priorities",
            "default_priority",
        ]

    def get_role(self, workspace: Workspace) -> str | None:
        return getattr(workspace, "member_role", None)

    def get_gpu_quota(self, workspace: Workspace) -> int:
        total = getattr(workspace, "gpu_quota", None)
        return int(total or 0)

    def get_url(self, workspace: Workspace) -> str:
        return reverse("api:workspace-detail", kwargs={"workspace_slug": workspace.slug})


class QuotaSerializer(serializers.ModelSerializer[WorkspaceQuota]):
    flavor = serializers.CharField(source="flavor.name", read_only=True)
    gpu_model = serializers.CharField(source="flavor.gpu_model", read_only=True)
    nominal = serializers.SerializerMethodField()
    borrowing_limit = serializers.SerializerMethodField(help_text="null: no limit")
    lending_limit = serializers.SerializerMethodField(help_text="null: all of the nominal quota")

    class Meta:
        model = WorkspaceQuota
        fields = ["flavor", "gpu_model", "resource", "nominal", "borrowing_limit", "lending_limit"]
        read_only_fields = fields

    def _amount(self, quota: WorkspaceQuota, field: str) -> str | None:
        value = getattr(quota, field)
        return None if value is None else format_quantity(value, binary=quota.resource == "memory")

    def get_nominal(self, quota: WorkspaceQuota) -> str | None:
        return self._amount(quota, "nominal")

    def get_borrowing_limit(self, quota: WorkspaceQuota) -> str | None:
        return self._amount(quota, "borrowing_limit")

    def get_lending_limit(self, quota: WorkspaceQuota) -> str | None:
        return self._amount(quota, "lending_limit")


class MemberSerializer(serializers.ModelSerializer[Membership]):
    username = serializers.CharField(source="user.get_username", read_only=True)
    full_name = serializers.CharField(source="user.get_full_name", read_only=True)
    joined = serializers.DateTimeField(source="created_at", read_only=True)

    class Meta:
        model = Membership
        fields = ["username", "full_name", "role", "joined"]
        read_only_fields = fields


class MemberCreateSerializer(serializers.Serializer[Any]):
    username = serializers.CharField(max_length=150, min_length=1)
    role = serializers.ChoiceField(choices=Role.choices, default=Role.RESEARCHER)


class MemberUpdateSerializer(serializers.Serializer[Any]):
    role = serializers.ChoiceField(choices=Role.choices)
