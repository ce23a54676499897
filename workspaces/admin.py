"""The platform team's admin: workspaces with their members and quotas, flavors, cohorts."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import Count, OuterRef, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator

from tau.k8s_names import GPU_RESOURCE
from tau.quantity import format_quantity
from workspaces import kueue_coverage
from workspaces.admin_forms import ResourceFlavorForm, WorkspaceForm
from workspaces.models import (
    Cohort,
    KueueSync,
    Membership,
    PriorityClass,
    ResourceFlavor,
    Role,
    Workspace,
    WorkspaceBudget,
    WorkspaceQuota,
)
from workspaces.signals import kueue_sync_requested


class PlatformScopeMixin:
    """The admin is the platform team's view across all workspaces: read unscoped."""

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        queryset = super().get_queryset(request)  # type: ignore[misc]
        unscoped = getattr(queryset, "unscoped", None)
        return unscoped() if unscoped is not None else queryset  # type: ignore[no-any-return]


class MembershipFormSet(BaseInlineFormSet):  # type: ignore[type-arg]
    """A workspace keeps an admin: a new one is saved with one, and a change of its members
    cannot leave it without (the member page's and the API's last-admin rule)."""

    def clean(self) -> None:
        super().clean()
        if any(self.errors) or not (self.instance._state.adding or self.has_changed()):
            return
        admins = [
            form
            for form in self.forms
            if form.cleaned_data
            and not form.cleaned_data.get("DELETE")
            and form.cleaned_data.get("role") == Role.ADMIN
        ]
        if not admins:
            raise ValidationError(
                "A workspace needs an admin: give at least one member the role admin.",
                code="no_admin",
            )


# One empty row of each inline is on the form from the start; a row left untouched is
# ignored on save (Django skips unchanged extra forms), so it never adds anything.
class MembershipInline(PlatformScopeMixin, admin.TabularInline):  # type: ignore[type-arg]
    model = Membership
    formset = MembershipFormSet
    extra = 1
    autocomplete_fields = ["user"]
    fields = ["user", "role", "member_since"]
    readonly_fields = ["member_since"]

    @admin.display(description="Member since")
    def member_since(self, membership: Membership) -> str:
        # A row not saved yet has no date: its default (now) is not when anyone joined.
        return _when(membership.created_at) if membership.pk else "—"


class BudgetInline(PlatformScopeMixin, admin.TabularInline):  # type: ignore[type-arg]
    model = WorkspaceBudget
    extra = 0
    fields = ["flavor", "gpu_hours", "hard_limit_gpu_hours", "over_limit"]
    verbose_name_plural = (
        "GPU-hour budgets (per calendar month; warnings at 80% and 100%; running runs are "
        "never stopped)"
    )


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


def _latest_sync(field: str) -> Subquery:
    return Subquery(
        KueueSync.objects.filter(scope=KueueSync.Scope.WORKSPACE, workspace_slug=OuterRef("slug"))
        .order_by("-pk")
        .values(field)[:1]
    )


def _when(moment: Any) -> str:
    local = timezone.localtime(moment)
    return local.strftime("%Y-%m-%d %H:%M:%S %Z")


def sync_state_text(
    state: str | None, synced_at: Any, last_error: str, next_try_at: Any, detail: str
) -> str:
    """The latest Kueue sync of a workspace in words: in step (when), syncing, waiting for
    live runs, or the error in Kubernetes' own words."""
    if state is None:
        return "Not synced yet."
    if state == KueueSync.State.SYNCED:
        return f"In step since {_when(synced_at)}."
    if state == KueueSync.State.WAITING:
        return detail or "Waiting for live runs."
    if state == KueueSync.State.FAILED:
        return f"Not in step: {last_error}"
    if last_error:
        return f"Not in step (trying again at {_when(next_try_at)}): {last_error}"
    return "Syncing…"


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
    form = WorkspaceForm
    inlines = [MembershipInline, QuotaInline, BudgetInline]
    readonly_fields = ["created_at", "kueue_sync", "quota_coverage"]
    actions = ["sync_now"]
    fieldsets = [
        (None, {"fields": ["slug", "name", "description", "active"]}),
        (
            "Cluster",
            {
                "fields": [
                    "namespace",
                    "local_queue",
                    "storage_claim",
                    "cohort",
                    "preemption_within_queue",
                    "preemption_reclaim_in_cohort",
                    "endpoint_preemption",
                ]
            },
        ),
        (
            "Run defaults and policy",
            {"fields": ["default_image", "allowed_priorities", "default_priority"]},
        ),
        ("Datasets and models", {"fields": ["storage_quota_bytes"]}),
        ("History", {"fields": ["created_at"]}),
    ]
    # Shown on the Kubernetes backend only (TAU_BACKEND=kubernetes).
    kueue_fieldset = (
        "Kueue",
        {
            "fields": ["kueue_sync", "quota_coverage"],
            "description": (
                "The workspace's Namespace, LocalQueue and ClusterQueue (tau- and the slug) "
                "follow what is saved here within seconds, and a drift check puts back what "
                "someone changes by hand. A change Kueue refuses is not applied at all: the "
                "objects stay as they were and the error below says why, in Kueue's words. "
                "Quotas must cover what runs ask for (cpu and memory always, GPUs with cpu "
                "and memory on the same flavor): Kueue admits nothing else, so such runs are "
                "refused at submission."
            ),
        },
    )

    def get_fieldsets(self, request: HttpRequest, obj: Workspace | None = None) -> Any:
        fieldsets = list(super().get_fieldsets(request, obj))
        if obj is None:
            # A workspace being added has no history: its "created at" would be the moment
            # the empty form was drawn.
            return [fieldset for fieldset in fieldsets if fieldset[0] != "History"]
        if kueue_coverage.kueue_in_use():
            fieldsets.insert(-1, self.kueue_fieldset)  # type: ignore[arg-type]
        return fieldsets

    def get_list_display(self, request: HttpRequest) -> Any:
        columns = list(super().get_list_display(request))
        if kueue_coverage.kueue_in_use():
            columns.insert(columns.index("active"), "kueue_state")
        return columns

    def get_actions(self, request: HttpRequest) -> Any:
        actions = super().get_actions(request)
        if not kueue_coverage.kueue_in_use():
            actions.pop("sync_now", None)
        return actions

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        context = {**(extra_context or {}), "kueue_sync_enabled": kueue_coverage.kueue_in_use()}
        return super().change_view(request, object_id, form_url, extra_context=context)

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        """After the quota rows are saved: say at once what they leave out (Kubernetes)."""
        super().save_related(request, form, formsets, change)
        if kueue_coverage.kueue_in_use():
            for warning in kueue_coverage.quota_warnings(form.instance):
                self.message_user(request, f"{form.instance.slug}: {warning}", messages.WARNING)

    @admin.action(description="Sync with Kueue now")
    def sync_now(
        self, request: HttpRequest, queryset: QuerySet[Workspace]
    ) -> HttpResponseRedirect | None:
        workspaces = list(queryset)
        for workspace in workspaces:
            kueue_sync_requested.send(sender=Workspace, workspace=workspace, by=request.user)
        names = ", ".join(workspace.slug for workspace in workspaces)
        self.message_user(
            request, f"Kueue sync requested for {names}; it runs in seconds.", messages.SUCCESS
        )
        if len(workspaces) == 1 and request.POST.get("_from_change_page"):
            return HttpResponseRedirect(
                reverse("admin:workspaces_workspace_change", args=[workspaces[0].pk])
            )
        return None

    def get_queryset(self, request: HttpRequest) -> QuerySet[Workspace]:
        member_count = (
            Membership.objects.filter(workspace=OuterRef("pk"))
            .values("workspace")
            .annotate(total=Count("pk"))
            .values("total")
        )
        queryset: QuerySet[Workspace] = super().get_queryset(request)
        queryset = queryset.annotate(
            member_count=Coalesce(Subquery(member_count), 0),
            gpu_total=_quota_total(GPU_RESOURCE),
        )
        if kueue_coverage.kueue_in_use():
            queryset = queryset.annotate(
                **{
                    f"kueue_{field}": _latest_sync(field)
                    for field in ("state", "synced_at", "last_error", "next_try_at", "detail")
                }
            )
        return queryset

    def _sync_text(self, workspace: Workspace) -> str:
        values = {
            field: getattr(workspace, f"kueue_{field}", None)
            for field in ("state", "synced_at", "last_error", "next_try_at", "detail")
        }
        if "kueue_state" not in workspace.__dict__:  # not from this admin's queryset
            latest = KueueSync.latest(KueueSync.Scope.WORKSPACE, workspace.slug)
            values = {field: getattr(latest, field) if latest else None for field in values}
        return sync_state_text(
            values["state"],
            values["synced_at"],
            values["last_error"] or "",
            values["next_try_at"],
            values["detail"] or "",
        )

    @admin.display(description="Kueue")
    def kueue_state(self, workspace: Workspace) -> str:
        return Truncator(self._sync_text(workspace)).chars(90)

    @admin.display(description="Kueue sync")
    def kueue_sync(self, workspace: Workspace) -> str:
        return self._sync_text(workspace)

    @admin.display(description="Quotas for runs")
    def quota_coverage(self, workspace: Workspace) -> str:
        warnings = kueue_coverage.quota_warnings(workspace)
        if not warnings:
            return "They cover what runs ask for (cpu and memory, and GPUs where there are any)."
        return format_html(
            '<ul class="messagelist">{}</ul>',
            format_html_join("", '<li class="warning">{}</li>', ((w,) for w in warnings)),
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
    form = ResourceFlavorForm
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
    list_display = ["name", "parent", "workspace_list", "description"]
    search_fields = ["name", "description"]
    list_select_related = ["parent"]

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


@admin.register(PriorityClass)
class PriorityClassAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["name", "value", "description", "allowed_in"]
    search_fields = ["name", "description"]

    @admin.display(description="Allowed in")
    def allowed_in(self, priority_class: PriorityClass) -> str:
        return ", ".join(priority_class.workspaces_using()) or "—"

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        # Workspaces name priority classes in a list, not a foreign key: protect them here.
        for priority_class in objs:
            for slug in priority_class.workspaces_using():
                protected.append(f"Workspace {slug} allows priority {priority_class.name}")
        return deleted, counts, perms_needed, protected
