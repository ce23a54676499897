"""Tenancy: workspaces, their members, and the GPU/CPU/memory quotas they get from Kueue.

A workspace maps to one Kubernetes namespace and one Kueue LocalQueue; its quotas become the
resource groups of its ClusterQueue. Flavors and cohorts are platform-wide. Validation here
follows Kueue's own rules, so what the platform team saves is what Kueue will accept.
"""

from __future__ import annotations

import fnmatch
from decimal import Decimal
from typing import TYPE_CHECKING, Any, ClassVar, Final

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from portal import usernames
from portal.audit import AuditedModel
from portal.tenancy import TenantModel, TenantQuerySet
from tau.k8s_names import (
    dns1123_label_problem,
    dns1123_subdomain_problem,
    label_key_problem,
    label_value_problem,
    resource_name_problem,
)
from tau.printable import hidden_character_problem
from tau.quantity import format_quantity
from workspaces.fields import QuantityField

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User

# Resources Kubernetes allows fractions of; every other (extended) resource is whole units.
FRACTIONAL_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})
BYTE_RESOURCES = frozenset({"memory", "ephemeral-storage"})


def validate_dns1123_label(value: str) -> None:
    problem = dns1123_label_problem(value)
    if problem:
        raise ValidationError(f"{value!r} {problem}.", code="invalid")


def validate_dns1123_subdomain(value: str) -> None:
    problem = dns1123_subdomain_problem(value)
    if problem:
        raise ValidationError(f"{value!r} {problem}.", code="invalid")


def validate_priority_class_names(value: Any) -> None:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValidationError("Give a list of WorkloadPriorityClass names.", code="invalid")
    for name in value:
        problem = dns1123_subdomain_problem(name)
        if problem:
            raise ValidationError(f"Priority {name!r} {problem}.", code="invalid")
    if len(set(value)) != len(value):
        raise ValidationError("Each priority may be listed only once.", code="duplicate")


class Role(models.TextChoices):
    """What a member may do in a workspace, lowest first."""

    VIEWER = "viewer", "Viewer"
    RESEARCHER = "researcher", "Researcher"
    ADMIN = "admin", "Admin"

    @property
    def rank(self) -> int:
        return _ROLE_RANK[self]

    def includes(self, other: Role) -> bool:
        return self.rank >= other.rank


_ROLE_RANK = {Role.VIEWER: 1, Role.RESEARCHER: 2, Role.ADMIN: 3}


class Cohort(AuditedModel):
    """Workspaces in one cohort may borrow each other's unused quota (a Kueue Cohort)."""

    name = models.CharField(
        max_length=63,
        unique=True,
        validators=[validate_dns1123_label],
        help_text="Kueue cohort name; lower-case letters, digits and '-'.",
    )
    parent = models.ForeignKey(
        "self",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="children",
        help_text=(
            "A cohort inside another one (Kueue's nested cohorts): its workspaces may also "
            "borrow what the parent's other members leave unused."
        ),
    )
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        # Kueue refuses a cycle of parents (the whole tree stops admitting): refuse it here.
        seen = {self.pk} if self.pk is not None else set()
        ancestor = self.parent
        while ancestor is not None:
            if ancestor.pk in seen or ancestor.name == self.name:
                raise ValidationError(
                    {"parent": "A cohort cannot be inside itself, directly or through others."}
                )
            seen.add(ancestor.pk)
            ancestor = ancestor.parent


class PriorityClass(AuditedModel):
    """A priority runs may ask for (a Kueue WorkloadPriorityClass), with one value everywhere.

    Kueue orders and preempts by a number that is the same for a class name in every
    workspace; workspaces choose which classes their members may use
    (``Workspace.allowed_priorities`` names rows of this table).
    """

    name = models.CharField(
        max_length=253,
        unique=True,
        help_text="WorkloadPriorityClass name, e.g. low, normal, high.",
    )
    value = models.IntegerField(
        validators=[MinValueValidator(-(2**31)), MaxValueValidator(1_000_000_000)],
        help_text="Higher values are admitted first and may preempt lower ones.",
    )
    description = models.CharField(max_length=2048, blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["-value", "name"]
        verbose_name = "priority class"
        verbose_name_plural = "priority classes"

    def __str__(self) -> str:
        return f"{self.name} ({self.value})"

    def clean(self) -> None:
        problem = dns1123_subdomain_problem(self.name) if self.name else None
        if problem:
            raise ValidationError({"name": f"{self.name!r} {problem}."})

    def workspaces_using(self) -> list[str]:
        """Slugs of the workspaces whose allowed priorities name this class."""
        return [
            slug
            for slug, allowed in Workspace.unscoped_objects.values_list(
                "slug", "allowed_priorities"
            )
            if isinstance(allowed, list) and self.name in allowed
        ]


class ResourceFlavor(AuditedModel):
    """A kind of node capacity (a Kueue ResourceFlavor), e.g. H100 nodes or CPU-only nodes."""

    name = models.CharField(
        max_length=63,
        unique=True,
        validators=[validate_dns1123_label],
        help_text="Kueue ResourceFlavor name, e.g. h100 or cpu.",
    )
    gpu_model = models.CharField(
        max_length=100,
        blank=True,
        help_text="GPU product on these nodes (the nvidia.com/gpu.product label), if any.",
    )
    node_labels = models.JSONField(
        default=dict,
        blank=True,
        help_text=(
            "Labels that select these nodes, e.g. "
            '{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}.'
        ),
    )
    tolerations = models.JSONField(
        default=list,
        blank=True,
        help_text=(
            "Tolerations for these nodes' taints, e.g. "
            '[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}].'
        ),
    )
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        errors: dict[str, list[str]] = {}
        if not isinstance(self.node_labels, dict):
            errors["node_labels"] = [
                'Give an object of label keys to values, e.g. {"pool": "gpu"}.'
            ]
        else:
            problems = []
            for key, value in self.node_labels.items():
                if not isinstance(value, str):
                    problems.append(f"Label {key!r}: the value must be a string.")
                    continue
                key_problem = label_key_problem(key)
                if key_problem:
                    problems.append(f"Label key {key!r} {key_problem}.")
                value_problem = label_value_problem(value)
                if value_problem:
                    problems.append(f"Label {key!r}: value {value!r} {value_problem}.")
            if problems:
                errors["node_labels"] = problems
        toleration_problems = _toleration_problems(self.tolerations)
        if toleration_problems:
            errors["tolerations"] = toleration_problems
        if errors:
            raise ValidationError(errors)


_TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
_TOLERATION_EFFECTS = {"NoSchedule", "PreferNoSchedule", "NoExecute"}


def _toleration_problems(tolerations: Any) -> list[str]:
    if not isinstance(tolerations, list):
        return ["Give a list of tolerations."]
    problems = []
    for index, toleration in enumerate(tolerations, start=1):
        where = f"Toleration {index}"
        if not isinstance(toleration, dict):
            problems.append(f"{where}: must be an object with key, operator, value, effect.")
            continue
        unknown = set(toleration) - _TOLERATION_KEYS
        if unknown:
            problems.append(f"{where}: unknown field(s) {', '.join(sorted(unknown))}.")
        operator = toleration.get("operator", "Equal")
        if operator not in {"Equal", "Exists"}:
            problems.append(f"{where}: operator must be Equal or Exists, not {operator!r}.")
        if operator == "Exists" and toleration.get("value"):
            problems.append(f"{where}: operator Exists takes no value.")
        effect = toleration.get("effect")
        if effect is not None and effect not in _TOLERATION_EFFECTS:
            problems.append(
                f"{where}: effect must be one of {', '.join(sorted(_TOLERATION_EFFECTS))}."
            )
        key = toleration.get("key")
        if key is not None and (not isinstance(key, str) or label_key_problem(key)):
            problems.append(f"{where}: key {key!r} is not a valid label key.")
    return problems


def default_namespace(slug: str) -> str:
    """The namespace a workspace gets when the platform team names none."""
    return f"tau-{slug}"


#: The namespace TauGrid itself runs in (its secrets, the watcher's leader lease): never a
#: workspace's. The shipped RBAC binds the portal's account here (``executors.kubernetes.rbac``
#: spells it too, as it runs without Django; a test holds the two equal).
PORTAL_NAMESPACE: Final = "taugrid"


def namespace_refusal(namespace: str) -> str | None:
    """Why a workspace may not have ``namespace``, or None. A workspace's members run code in
    its namespace and TauGrid creates, labels and may delete objects there, so it may not be
    a namespace of the cluster itself or of its operators (``TAU_WORKSPACE_NAMESPACES_DENIED``,
    glob patterns: ``kube-*``, ``default``, ``kueue-system`` … by default), nor the portal's
    own (``TAU_KUBE_WATCHER_LEASE_NAMESPACE``, where its secrets and its leader lease are;
    always refused, whatever the list says)."""
    own = {PORTAL_NAMESPACE, settings.TAU_KUBE_WATCHER_LEASE_NAMESPACE}
    if namespace in own:
        return (
            f"{namespace!r} is the namespace TauGrid itself runs in; a workspace needs a "
            "namespace of its own (leave this empty for tau- and the slug)."
        )
    for pattern in settings.TAU_WORKSPACE_NAMESPACES_DENIED:
        if fnmatch.fnmatchcase(namespace, pattern):
            return (
                f"{namespace!r} is a namespace of the cluster or of its operators (it matches "
                f"{pattern!r} in TAU_WORKSPACE_NAMESPACES_DENIED); a workspace needs a namespace "
                "of its own (leave this empty for tau- and the slug)."
            )
    return None


def cluster_queue_name(slug: str) -> str:
    """The Kueue ClusterQueue of the workspace ``slug``: ``tau-<slug>``."""
    return f"tau-{slug}"


def default_local_queue(slug: str) -> str:
    """The LocalQueue a workspace gets when the platform team names none."""
    return slug


class WithinClusterQueue(models.TextChoices):
    """Kueue's ``preemption.withinClusterQueue``: may a waiting run of this workspace
    preempt the workspace's own admitted runs?"""

    NEVER = "Never", "Never"
    LOWER_PRIORITY = "LowerPriority", "Runs of lower priority"
    LOWER_OR_NEWER_EQUAL_PRIORITY = (
        "LowerOrNewerEqualPriority",
        "Runs of lower priority, or of equal priority that started later",
    )


class ReclaimWithinCohort(models.TextChoices):
    """Kueue's ``preemption.reclaimWithinCohort``: may a waiting run of this workspace take
    back its lent quota by preempting the borrowers' runs in its cohort?"""

    NEVER = "Never", "Never"
    LOWER_PRIORITY = "LowerPriority", "Borrowers' runs of lower priority"
    ANY = "Any", "Any borrower's run"


class EndpointPreemption(models.TextChoices):
    """May the workspace's endpoints be preempted (on Kubernetes, by Kueue)? ``never`` keeps
    them out of Kueue's reach (``serving.preemption``: the workspace's top priority and,
    in a cohort, within its own nominal quota); ``allowed`` treats them like runs."""

    NEVER = "never", "Never: endpoints keep their GPUs"
    ALLOWED = "allowed", "Allowed, like runs"


class WorkspaceQuerySet(TenantQuerySet["Workspace"]):
    """Workspaces are listed only through a user's access (or explicitly across all)."""

    def visible_to(self, user: User | AnonymousUser) -> WorkspaceQuerySet:
        if not user.is_authenticated:
            return self.none()
        queryset = self.filter(active=True)
        if not user.is_staff:
            queryset = queryset.filter(memberships__user=user)
        return queryset._mark_scoped()


class WorkspaceManager(models.Manager["Workspace"]):
    def get_queryset(self) -> WorkspaceQuerySet:
        return WorkspaceQuerySet(self.model, using=self._db)

    def visible_to(self, user: User | AnonymousUser) -> WorkspaceQuerySet:
        return self.get_queryset().visible_to(user)

    def unscoped(self) -> WorkspaceQuerySet:
        return self.get_queryset().unscoped()


class Workspace(AuditedModel):
    """A team's place: its namespace and queue on the cluster, its members, its quotas."""

    tenant_path: ClassVar[str | None] = None

    slug = models.SlugField(
        max_length=40,
        unique=True,
        validators=[validate_dns1123_label],
        help_text="Short name used in URLs, the CLI and object names, e.g. vision-team.",
    )
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    # Blank in a form means "the default": see fill_cluster_defaults().
    namespace = models.CharField(
        max_length=63,
        unique=True,
        blank=True,
        validators=[validate_dns1123_label],
        # The admin shows help text as HTML: no angle brackets.
        help_text=(
            "Kubernetes namespace the workspace's runs are created in. "
            "Leave empty for tau- and the slug, e.g. tau-vision-team."
        ),
    )
    local_queue = models.CharField(
        "LocalQueue name",
        max_length=63,
        blank=True,
        validators=[validate_dns1123_label],
        help_text=(
            "Kueue LocalQueue in that namespace that runs are submitted to. "
            "Leave empty to use the slug."
        ),
    )
    storage_claim = models.CharField(
        "storage (PersistentVolumeClaim)",
        max_length=253,
        blank=True,
        validators=[validate_dns1123_subdomain],
        help_text=(
            "A ReadWriteMany PersistentVolumeClaim in the workspace's namespace that holds its "
            "runs' outputs and checkpoints (each run in its own folder, runs/ and the run's "
            "name). Without one, Kubernetes runs write to a scratch volume that is lost when an "
            "attempt ends: they cannot resume from a checkpoint."
        ),
    )
    cohort = models.ForeignKey(
        Cohort,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="workspaces",
        help_text="Workspaces in the same cohort can borrow each other's unused quota.",
    )
    default_image = models.CharField(
        max_length=255, blank=True, help_text="Image for runs whose tau.yaml names none."
    )
    allowed_priorities = models.JSONField(
        default=list,
        blank=True,
        validators=[validate_priority_class_names],
        help_text='Kueue WorkloadPriorityClass names members may use, e.g. ["low", "normal"].',
    )
    default_priority = models.CharField(
        max_length=253,
        blank=True,
        help_text="Priority for runs that name none; must be one of the allowed priorities.",
    )
    storage_quota_bytes = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text="The most bytes its datasets and models may keep (each file once); empty: "
        "no limit. An upload or a run's output that would pass it is refused up front.",
    )
    # Blank in a form means TauGrid's default (the field's default): see clean().
    preemption_within_queue = models.CharField(
        "preempt within the workspace",
        max_length=32,
        choices=WithinClusterQueue.choices,
        default=WithinClusterQueue.LOWER_PRIORITY,
        blank=True,
        help_text=(
            "Kueue withinClusterQueue: which of the workspace's own admitted runs a waiting "
            "run may preempt. Empty: runs of lower priority."
        ),
    )
    preemption_reclaim_in_cohort = models.CharField(
        "reclaim lent quota",
        max_length=32,
        choices=ReclaimWithinCohort.choices,
        default=ReclaimWithinCohort.ANY,
        blank=True,
        help_text=(
            "Kueue reclaimWithinCohort: whose runs a waiting run may preempt to take back "
            "quota lent to its cohort. Empty: any borrower's."
        ),
    )
    endpoint_preemption = models.CharField(
        "endpoint preemption",
        max_length=16,
        choices=EndpointPreemption.choices,
        default=EndpointPreemption.NEVER,
        blank=True,
        help_text=(
            "Never: an endpoint runs at the workspace's highest allowed priority and, in a "
            "cohort, only within the workspace's own nominal quota (so no run and no lender "
            "taking its quota back preempts it); a deployment that would break either is "
            "refused. Allowed: endpoints queue, borrow and may be preempted like runs. "
            "Empty: never."
        ),
    )
    active = models.BooleanField(
        default=True,
        help_text=(
            "Inactive workspaces are hidden and accept no runs; on Kubernetes their Kueue "
            "queues are removed once no run is live."
        ),
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    # Only reads that went through a user's access (or unscoped()) may run; Django's own
    # machinery (uniqueness checks, the admin) uses the plain manager below.
    objects = WorkspaceManager()
    unscoped_objects = models.Manager()

    class Meta:
        ordering = ["slug"]
        default_manager_name = "unscoped_objects"

    def __str__(self) -> str:
        return self.slug

    def get_absolute_url(self) -> str:
        return reverse("workspace-home", kwargs={"workspace_slug": self.slug})

    def audit_workspace(self) -> Workspace:
        return self

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self._state.adding:
            self.fill_cluster_defaults()
        super().save(*args, **kwargs)

    def fill_cluster_defaults(self) -> list[str]:
        """Give a new workspace the conventional namespace and queue where none was named.

        The convention is namespace ``tau-<slug>`` and LocalQueue ``<slug>``. Returns the
        fields that were filled in.
        """
        if not self.slug or dns1123_label_problem(self.slug):
            return []  # the slug's own check reports it; nothing sensible to derive
        filled = []
        if not self.namespace:
            self.namespace = default_namespace(self.slug)
            filled.append("namespace")
        if not self.local_queue:
            self.local_queue = default_local_queue(self.slug)
            filled.append("local_queue")
        return filled

    def _cluster_name_errors(self) -> dict[str, str]:
        errors: dict[str, str] = {}
        if self.namespace:
            # Checked when named or renamed: a workspace already there is not refused every
            # other change (moving it is the platform team's decision).
            before = (
                None
                if self._state.adding
                else Workspace.unscoped_objects.filter(pk=self.pk)
                .values_list("namespace", flat=True)
                .first()
            )
            refusal = namespace_refusal(self.namespace) if self.namespace != before else None
            if refusal:
                errors["namespace"] = refusal
        if self._state.adding:
            filled = self.fill_cluster_defaults()
            if (
                "namespace" in filled
                and Workspace.unscoped_objects.filter(namespace=self.namespace).exists()
            ):
                errors["namespace"] = (
                    f"The default namespace {self.namespace!r} is already used by another "
                    "workspace; type a namespace for this one."
                )
        else:
            # Clearing the name of a namespace or queue that already holds runs would move
            # the workspace without saying so: an existing workspace must name them.
            for field, what in (("namespace", "namespace"), ("local_queue", "LocalQueue")):
                if not getattr(self, field):
                    current = (
                        Workspace.unscoped_objects.filter(pk=self.pk)
                        .values_list(field, flat=True)
                        .first()
                    )
                    errors[field] = (
                        f"An existing workspace keeps its {what}; type it "
                        f"(it is {current!r} now) or the new one."
                    )
        return errors

    @property
    def cluster_queue(self) -> str:
        """The name of the workspace's Kueue ClusterQueue: ``tau-<slug>`` (cluster-wide, so
        the prefix keeps it apart from ClusterQueues the platform team made by hand)."""
        return cluster_queue_name(self.slug)

    def clean(self) -> None:
        errors: dict[str, str] = self._cluster_name_errors()
        hidden = hidden_character_problem(self.name or "", "A workspace's name")
        if hidden:
            errors["name"] = f"{hidden}."
        if not self.preemption_within_queue:
            self.preemption_within_queue = WithinClusterQueue.LOWER_PRIORITY
        if not self.preemption_reclaim_in_cohort:
            self.preemption_reclaim_in_cohort = ReclaimWithinCohort.ANY
        if not self.endpoint_preemption:
            self.endpoint_preemption = EndpointPreemption.NEVER
        if isinstance(self.allowed_priorities, list):
            names = [name for name in self.allowed_priorities if isinstance(name, str)]
            known = set(PriorityClass.objects.filter(name__in=names).values_list("name", flat=True))
            unknown = [name for name in names if name not in known]
            if unknown:
                errors["allowed_priorities"] = (
                    f"No priority class called {', '.join(repr(name) for name in unknown)}; "
                    "add it under Priority classes first (each name has one value everywhere)."
                )
        if self.default_priority and self.default_priority not in (self.allowed_priorities or []):
            errors["default_priority"] = (
                f"{self.default_priority!r} is not one of the allowed priorities; "
                "add it there or clear this field."
            )
        if self.pk and self.cohort_id is None:
            # Leaving a cohort: limits that only make sense inside one must go first.
            with_limits = (
                WorkspaceQuota.objects.for_workspace(self)
                .filter(Q(borrowing_limit__isnull=False) | Q(lending_limit__isnull=False))
                .count()
            )
            if with_limits:
                errors["cohort"] = (
                    f"{with_limits} quota row(s) have a borrowing or lending limit, which only "
                    "apply inside a cohort; clear those limits before removing the cohort."
                )
        if errors:
            raise ValidationError(errors)


class MembershipSource(models.TextChoices):
    """Where a membership comes from: an admin, or the identity provider's groups (kept in
    step at each login; a manual one is never changed by a login)."""

    MANUAL = "manual", "Added by an admin"
    OIDC = "oidc", "From identity-provider groups"


class Membership(AuditedModel, TenantModel):
    """A user's role in one workspace."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=20, choices=Role.choices, default=Role.RESEARCHER)
    source = models.CharField(
        max_length=10,
        choices=MembershipSource.choices,
        default=MembershipSource.MANUAL,
        help_text="Memberships from provider groups are kept in step with them at each login.",
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta(TenantModel.Meta):
        ordering = ["workspace", "user"]
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "user"],
                name="membership_unique_user_per_workspace",
                violation_error_message="This user is already a member of this workspace.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.workspace} ({self.role})"

    @property
    def role_enum(self) -> Role:
        return Role(self.role)

    def audit_workspace(self) -> Workspace:
        return self.workspace


class WorkspaceQuota(AuditedModel, TenantModel):
    """How much of one resource on one flavor a workspace is guaranteed, may borrow and lends.

    Rules (Kueue's): quotas are never negative; borrowing and lending limits only exist for
    a workspace in a cohort; a lending limit cannot exceed the nominal quota; extended
    resources such as ``nvidia.com/gpu`` come in whole units.
    """

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="quotas")
    flavor = models.ForeignKey(ResourceFlavor, on_delete=models.PROTECT, related_name="quotas")
    resource = models.CharField(
        max_length=253,
        help_text="cpu, memory, nvidia.com/gpu, or another resource name.",
    )
    nominal = QuantityField(
        "nominal quota", help_text="Guaranteed amount, e.g. 8 (GPUs), 64 (CPUs), 512Gi (memory)."
    )
    borrowing_limit = QuantityField(
        null=True,
        blank=True,
        help_text="How much more it may borrow from its cohort; empty means no limit.",
    )
    lending_limit = QuantityField(
        null=True,
        blank=True,
        help_text="How much of its nominal quota others may borrow; empty means all of it.",
    )

    class Meta(TenantModel.Meta):
        ordering = ["workspace", "flavor", "resource"]
        verbose_name = "quota"
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "flavor", "resource"],
                name="quota_unique_resource_per_flavor",
                violation_error_message=(
                    "This workspace already has a quota for this resource on this flavor; "
                    "edit that row instead of adding another."
                ),
            ),
        ]

    def __str__(self) -> str:
        amount = self.display_amount(self.nominal)
        return f"{self.workspace}: {amount} {self.resource} on {self.flavor}"

    def audit_workspace(self) -> Workspace:
        return self.workspace

    def display_amount(self, value: Decimal | None) -> str:
        if value is None:
            return "unlimited"
        return format_quantity(value, binary=self.resource in BYTE_RESOURCES)

    def audit_value(self, field: models.Field[Any, Any], value: Any) -> Any:
        # Amounts go into the audit log as Kubernetes quantities ("4Gi", "500m", "8"),
        # the way the platform team typed them, not as a bare decimal number of bytes.
        if isinstance(field, QuantityField) and value is not None:
            try:
                amount = field.to_python(value)
            except ValidationError:
                return super().audit_value(field, value)
            return format_quantity(amount, binary=self.resource in BYTE_RESOURCES)
        return super().audit_value(field, value)

    def clean(self) -> None:
        errors: dict[str, str] = {}
        if self.resource:
            problem = resource_name_problem(self.resource)
            if problem:
                errors["resource"] = f"{self.resource!r} is not a resource name: {problem}."
        whole_units = bool(self.resource) and self.resource not in FRACTIONAL_RESOURCES
        for field in ("nominal", "borrowing_limit", "lending_limit"):
            value: Decimal | None = getattr(self, field)
            if value is None:
                continue
            if value < 0:
                errors[field] = "Must be zero or more."
            elif whole_units and value != value.to_integral_value():
                errors[field] = f"{self.resource} comes in whole units; use a whole number."
        try:
            workspace: Workspace | None = self.workspace
        except Workspace.DoesNotExist:  # not chosen yet; the field's own check reports that
            workspace = None
        in_cohort = workspace is not None and workspace.cohort_id is not None
        if not in_cohort:
            if self.borrowing_limit is not None:
                errors.setdefault(
                    "borrowing_limit",
                    "Borrowing needs a cohort: put the workspace in a cohort, or clear the limit.",
                )
            if self.lending_limit is not None:
                errors.setdefault(
                    "lending_limit",
                    "Lending needs a cohort: put the workspace in a cohort, or clear the limit.",
                )
        if (
            self.lending_limit is not None
            and self.nominal is not None
            and self.lending_limit > self.nominal
            and "lending_limit" not in errors
        ):
            errors["lending_limit"] = (
                f"Cannot lend more than the nominal quota ({self.display_amount(self.nominal)})."
            )
        if errors:
            raise ValidationError(errors)


class KueueSync(models.Model):
    """Outbox: the cluster's Kueue objects must be brought in step with these rows
    (``executors.kubernetes.kueue_sync``).

    A change to a workspace, its quotas, a flavor, a cohort or a priority class writes one in
    the transaction of the change, for one workspace (``scope`` workspace, by slug: the row
    outlives a deleted workspace, whose objects must then be removed) or for the cluster-wide
    objects (``scope`` cluster: flavors, cohorts, priority classes). A worker *claims* it
    (``claimed_at``) for one sync, made outside any database transaction, and records how it
    ended: ``synced`` (in step, ``synced_at``), ``waiting`` (an archived workspace's queues
    wait for its live runs; tried again later), or an error (``last_error``, in Kubernetes'
    words), tried again with backoff while ``state`` stays ``pending``, and ``failed`` after
    the last try or at once when retrying cannot help (Kueue refused the object).
    """

    class Scope(models.TextChoices):
        WORKSPACE = "workspace", "Workspace"
        CLUSTER = "cluster", "Cluster-wide objects"

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        WAITING = "waiting", "Waiting for live runs"
        SYNCED = "synced", "In step"
        FAILED = "failed", "Failed"

    scope = models.CharField(max_length=20, choices=Scope.choices)
    workspace_slug = models.CharField(max_length=40, blank=True)
    state = models.CharField(max_length=20, choices=State.choices, default=State.PENDING)
    reason = models.CharField(max_length=200, blank=True, help_text="What asked for it.")
    attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    next_try_at = models.DateTimeField(default=timezone.now)
    claimed_at = models.DateTimeField(null=True, blank=True)
    synced_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    detail = models.TextField(blank=True, help_text="What the last try did, or waits for.")

    class Meta:
        verbose_name = "Kueue sync"
        indexes = [
            models.Index(fields=["scope", "workspace_slug", "-id"], name="kueuesync_latest"),
            models.Index(
                fields=["next_try_at"],
                name="kueuesync_due",
                condition=Q(state__in=["pending", "waiting"]),
            ),
        ]

    def __str__(self) -> str:
        target = self.workspace_slug if self.scope == self.Scope.WORKSPACE else "cluster"
        return f"Kueue sync {self.pk} of {target} ({self.state})"

    @property
    def unfinished(self) -> bool:
        return self.state in (self.State.PENDING, self.State.WAITING)

    @classmethod
    def latest(cls, scope: str, workspace_slug: str = "") -> KueueSync | None:
        """The newest row of a target: how its last sync went, or the one on its way."""
        return (
            cls.objects.filter(scope=scope, workspace_slug=workspace_slug).order_by("-pk").first()
        )


# Usernames are ASCII only (portal/usernames.py: no look-alikes from other scripts).
# Installed here because every process, commands included, loads this module once the user
# model exists; PortalConfig.ready() would be the natural home.
usernames.install()


class OverBudget(models.TextChoices):
    """What happens to a new GPU run once a workspace has used its month's hard limit. A run
    that is already running is never stopped by a budget, whichever is chosen."""

    REFUSE = "refuse", "Refuse new GPU runs"
    LOWEST_PRIORITY = "lowest_priority", "Submit them at the lowest priority"
    ALLOW = "allow", "Allow them"


class WorkspaceBudget(AuditedModel, TenantModel):
    """How many GPU-hours a workspace may use in a calendar month, on one flavor or on all.

    Quotas limit how many GPUs a workspace holds at once; a budget limits what it burns over
    a month. The soft limit (``gpu_hours``) warns at 80% and 100%; past the hard limit
    (``hard_limit_gpu_hours``, the soft limit when empty) new GPU runs meet the policy the
    platform team chose. Months are calendar months in ``TAU_ACCOUNTING_TIME_ZONE``.
    """

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="budgets")
    flavor = models.ForeignKey(
        ResourceFlavor,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="budgets",
        help_text="Only GPU-hours on this flavor count; empty: GPU-hours on every flavor.",
    )
    gpu_hours = models.DecimalField(
        "GPU-hours per month",
        max_digits=12,
        decimal_places=1,
        validators=[MinValueValidator(Decimal("0.1"))],
        help_text="The soft limit: its admins are warned at 80% and 100% of it.",
    )
    hard_limit_gpu_hours = models.DecimalField(
        "hard limit (GPU-hours)",
        max_digits=12,
        decimal_places=1,
        null=True,
        blank=True,
        help_text="Where the policy below starts to apply; empty: at the soft limit.",
    )
    over_limit = models.CharField(
        "past the hard limit",
        max_length=20,
        choices=OverBudget.choices,
        default=OverBudget.REFUSE,
    )

    class Meta(TenantModel.Meta):
        ordering = ["workspace", "flavor"]
        verbose_name = "GPU-hour budget"
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "flavor"],
                condition=Q(flavor__isnull=False),
                name="budget_unique_flavor",
                violation_error_message=(
                    "This workspace already has a budget for this flavor; edit that one "
                    "instead of adding another."
                ),
            ),
            # Partial, not nulls_distinct=False: SQLite (the embedded default) has no such thing.
            models.UniqueConstraint(
                fields=["workspace"],
                condition=Q(flavor__isnull=True),
                name="budget_unique_all_flavors",
                violation_error_message=(
                    "This workspace already has a budget for all flavors; edit that one "
                    "instead of adding another."
                ),
            ),
        ]

    def __str__(self) -> str:
        on = f" on {self.flavor}" if self.flavor_id else ""
        return f"{self.workspace}: {self.gpu_hours} GPU-hours a month{on}"

    def audit_workspace(self) -> Workspace:
        return self.workspace

    @property
    def hard_limit(self) -> Decimal:
        return self.gpu_hours if self.hard_limit_gpu_hours is None else self.hard_limit_gpu_hours

    def clean(self) -> None:
        if (
            self.hard_limit_gpu_hours is not None
            and self.gpu_hours is not None
            and self.hard_limit_gpu_hours < self.gpu_hours
        ):
            raise ValidationError(
                {
                    "hard_limit_gpu_hours": (
                        f"The hard limit cannot be below the soft limit ({self.gpu_hours}); "
                        "leave it empty to stop at the soft limit."
                    )
                }
            )
