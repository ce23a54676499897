"""The platform team's admin: workspaces with their members and quotas, flavors, cohorts."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Count, OuterRef, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from tau.k8s_names import GPU_RESOURCE
from tau.quantity import format_quantity
from workspaces.models import (
    Cohort,
    Membership,
    ResourceFlavor,
    Workspace,
    WorkspaceQuota,
)


class PlatformScopeMixin:
    """The admin is the platform team's view across all workspaces: read unscoped."""

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        queryset = super().get_queryset(request)  # type: ignore[misc]
        unscoped = getattr(queryset, "unscoped", None)
        return unscoped() if unscoped is not None else queryset  # type: ignore[no-any-return]


# One empty row of each inline is on the form from the start; a row left untouched is
# ignored on save (Django skips unchanged extra forms), so it never blocks or adds anything.
class MembershipInline(PlatformScopeMixin, admin.TabularInline):  # type: ignore[type-arg]
    model = Membership
    extra = 1
    autocomplete_fields = ["user"]
    fields = ["user", "role", "created_at"]
    readonly_fields = ["created_at"]


class QuotaInline(PlatformScopeMixin, admin.TabularInline):  # type: ignore[type-arg]
    model = WorkspaceQuota
    extra = 1
    fields = ["flavor", "resource", "nominal", "borrowing_limit", "lending_limit"]


def _quota_total(resource: str) -> Subquery:
    return Subquery(
        WorkspaceQuota.objects.filter(workspace=OuterRef("pk"), resource=resource)
        .values("workspace")
        .annotate(total=Sum("nominal"))
        .values("total")
    )


@admin.register(Workspace)
class WorkspaceAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = [
        "slug",
        "name",
        "namespace",
        "local_queue",
        "cohort",
        "members",
        "gpu_quota",
        "active",
        "portal_link",
    ]
    list_filter = ["active", "cohort"]
    search_fields = ["slug", "name", "namespace", "description"]
    list_select_related = ["cohort"]
    inlines = [MembershipInline, QuotaInline]
    readonly_fields = ["created_at"]
    fieldsets = [
        (None, {"fields": ["slug", "name", "description", "active"]}),
        ("Cluster", {"fields": ["namespace", "local_queue", "cohort"]}),
        (
            "Run defaults and policy",
            {"fields": ["default_image", "allowed_priorities", "default_priority"]},
        ),
        ("History", {"fields": ["created_at"]}),
    ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Workspace]:
        member_count = (
            Membership.objects.filter(workspace=OuterRef("pk"))
            .values("workspace")
            .annotate(total=Count("pk"))
            .values("total")
        )
        queryset: QuerySet[Workspace] = super().get_queryset(request)
        return queryset.annotate(
            member_count=Coalesce(Subquery(member_count), 0),
            gpu_total=_quota_total(GPU_RESOURCE),
        )

    @admin.display(description="Members", ordering="member_count")
    def members(self, workspace: Workspace) -> int:
        return workspace.member_count  # type: ignore[attr-defined, no-any-return]

    @admin.display(description="GPU quota", ordering="gpu_total")
    def gpu_quota(self, workspace: Workspace) -> str:
        total = workspace.gpu_total  # type: ignore[attr-defined]
        return "—" if total is None else format_quantity(total)

    @admin.display(description="Portal")
    def portal_link(self, workspace: Workspace) -> str:
        return format_html('<a href="{}">open</a>', workspace.get_absolute_url())


@admin.register(Membership)
class MembershipAdmin(PlatformScopeMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["user", "workspace", "role", "created_at"]
    list_filter = ["role", "workspace"]
    search_fields = ["user__username", "user__email", "workspace__slug", "workspace__name"]
    list_select_related = ["user", "workspace"]
    autocomplete_fields = ["user", "workspace"]


@admin.register(WorkspaceQuota)
class WorkspaceQuotaAdmin(PlatformScopeMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["workspace", "flavor", "resource", "nominal_amount", "borrowing", "lending"]
    list_filter = ["resource", "flavor", "workspace__cohort"]
    search_fields = ["workspace__slug", "workspace__name", "flavor__name", "resource"]
    list_select_related = ["workspace", "flavor"]
    autocomplete_fields = ["workspace"]

    @admin.display(description="Nominal", ordering="nominal")
    def nominal_amount(self, quota: WorkspaceQuota) -> str:
        return quota.display_amount(quota.nominal)

    @admin.display(description="Borrowing limit")
    def borrowing(self, quota: WorkspaceQuota) -> str:
        return quota.display_amount(quota.borrowing_limit) if quota.workspace.cohort_id else "—"

    @admin.display(description="Lending limit")
    def lending(self, quota: WorkspaceQuota) -> str:
        return quota.display_amount(quota.lending_limit) if quota.workspace.cohort_id else "—"


@admin.register(ResourceFlavor)
class ResourceFlavorAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["name", "gpu_model", "labels", "workspaces_with_quota"]
    search_fields = ["name", "gpu_model", "description"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[ResourceFlavor]:
        queryset: QuerySet[ResourceFlavor] = super().get_queryset(request)
        return queryset.annotate(workspace_count=Count("quotas__workspace", distinct=True))

    @admin.display(description="Node labels")
    def labels(self, flavor: ResourceFlavor) -> str:
        labels = flavor.node_labels if isinstance(flavor.node_labels, dict) else {}
        return ", ".join(f"{key}={value}" for key, value in sorted(labels.items())) or "—"

    @admin.display(description="Workspaces with quota", ordering="workspace_count")
    def workspaces_with_quota(self, flavor: ResourceFlavor) -> int:
        return flavor.workspace_count  # type: ignore[attr-defined, no-any-return]


@admin.register(Cohort)
class CohortAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["name", "workspace_list", "description"]
    search_fields = ["name", "description"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Cohort]:
        return super().get_queryset(request).prefetch_related("workspaces")

    @admin.display(description="Workspaces")
    def workspace_list(self, cohort: Cohort) -> str:
        links = [
            format_html(
                '<a href="{}">{}</a>',
                reverse("admin:workspaces_workspace_change", args=[workspace.pk]),
                workspace.slug,
            )
            for workspace in cohort.workspaces.all()
        ]
        return format_html(", ".join(["{}"] * len(links)), *links) if links else "—"
