"""The GPU fleet as the last sync saw it.

Platform-level data (not a tenant model): the fleet pages are for platform staff. What a
workspace member may see of it is decided by the views (their own runs only), never by
handing them these rows.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class NodeSource(models.TextChoices):
    KUBERNETES = "kubernetes", "Kubernetes"
    LOCAL = "local", "This machine"


class GpuNode(models.Model):
    """One node with GPUs: its Kubernetes Node (capacity, allocatable, conditions, taints,
    ``spec.unschedulable``) and the pods bound to it, or, on the embedded default, this
    machine with the GPUs NVML finds.

    JSON shapes (written by ``gpus.fleet``, read by pages and the API):

    - ``conditions``: ``[{"type", "status", "reason", "message", "last_transition_time"
      (ISO 8601 or ""), "gpu": bool (a GPU health condition, TAU_GPU_HEALTH_CONDITIONS),
      "problem": bool (this condition makes the node unhealthy)}]``
    - ``taints``: ``[{"key", "value", "effect"}]``
    - ``runs``: ``[{"workspace": slug, "run": run name, "namespace", "pod", "gpus": int}]``
      from the ``taugrid.io/workspace`` and ``taugrid.io/run`` labels of the pods bound to it
      that hold GPUs; ``other_gpus_in_use`` counts GPUs held by pods that are not TauGrid's.
    """

    name = models.CharField(max_length=253, unique=True)
    source = models.CharField(max_length=20, choices=NodeSource.choices)
    pool = models.CharField(
        max_length=253,
        blank=True,
        help_text="The taugrid.io/node-pool label, else the flavor it belongs to, else empty.",
    )
    flavor = models.ForeignKey(
        "workspaces.ResourceFlavor",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        help_text="The ResourceFlavor whose node labels this node carries, if one does.",
    )
    gpu_model = models.CharField(max_length=200, blank=True)
    gpus_total = models.PositiveIntegerField(default=0, help_text="capacity nvidia.com/gpu")
    gpus_allocatable = models.PositiveIntegerField(default=0)
    gpus_in_use = models.PositiveIntegerField(
        default=0, help_text="GPUs requested by the unfinished pods bound to it."
    )
    other_gpus_in_use = models.PositiveIntegerField(
        default=0, help_text="Of those, GPUs held by pods that are not TauGrid runs."
    )
    ready = models.BooleanField(default=False)
    healthy = models.BooleanField(default=False)
    cordoned = models.BooleanField(default=False, help_text="spec.unschedulable")
    conditions = models.JSONField(default=list, blank=True)
    problems = models.JSONField(
        default=list, blank=True, help_text="Why it is unhealthy, a sentence each."
    )
    taints = models.JSONField(default=list, blank=True)
    runs = models.JSONField(default=list, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    unhealthy_since = models.DateTimeField(null=True, blank=True)
    auto_cordon_seen = models.JSONField(
        default=list,
        blank=True,
        help_text=(
            "The True GPU conditions (types) auto-cordon has already answered: a node staff "
            "uncordoned is not cordoned again for one of them until it clears and comes back."
        ),
    )
    first_seen_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["pool", "name"]
        indexes = [models.Index(fields=["healthy", "pool", "name"], name="gpunode_health_pool")]

    def __str__(self) -> str:
        return self.name


class FleetSync(models.Model):
    """How the last syncs went (one row, ``pk=1``): pages say how fresh the fleet is and
    why it is not, when Kubernetes (or NVML) could not be read."""

    source = models.CharField(max_length=20, choices=NodeSource.choices, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    node_count = models.PositiveIntegerField(default=0)
    took_ms = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"fleet sync ({self.source or 'never'})"
