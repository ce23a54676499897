"""Endpoints: one row per deployed model endpoint (a Ray Serve application, ``run.workload_kind:
rayservice``), its sealed event history, and the outbox rows that hand its instructions to a
backend.

An endpoint's state lives in ``Endpoint.state`` and is changed only by
``serving.state.transition``, which checks the transition table below and writes an
:class:`EndpointEvent` in the same transaction. Events form a hash chain per endpoint, like a
run's (``portal.event_chain``), so the history can be exported and checked offline.

Deleting an endpoint keeps its row and its history (``deleted_at``): who deployed which model
version with which config, every scale and update, and every change of state, stay on record.
"""

from __future__ import annotations

import enum
from typing import ClassVar

from django.conf import settings
from django.db import models
from django.utils import timezone

from portal.tenancy import TenantModel
from runs.models import Backend

#: An endpoint's name: a DNS-1035 label (it names the backend's objects, a RayService and its
#: Service), short enough for the suffixes KubeRay adds to the names it derives from it.
NAME_MAX_LENGTH = 40


class EndpointState(models.TextChoices):
    DEPLOYING = "deploying", "Deploying"  # handed to the backend: queued, admitted or starting
    READY = "ready", "Ready"  # answering requests
    UPDATING = "updating", "Updating"  # a new generation rolling out; the old one answers
    UNHEALTHY = "unhealthy", "Unhealthy"  # running, but Ray Serve says it is not healthy
    STOPPED = "stopped", "Stopped"  # stopped by someone; holds no resources
    FAILED = "failed", "Failed"  # could not be deployed or kept running


#: Something runs (or is being started) for the endpoint: its logs and metrics can be asked.
LIVE_STATES = frozenset(
    {
        EndpointState.DEPLOYING,
        EndpointState.READY,
        EndpointState.UPDATING,
        EndpointState.UNHEALTHY,
    }
)
#: Requests reach it: the states the invoke route forwards in (during an update the generation
#: before answers until the new one is ready).
SERVING_STATES = frozenset({EndpointState.READY, EndpointState.UPDATING})

# Which state may follow which. Anything else is a bug and raises IllegalTransition. Staying
# in a state is no transition (an observation that repeats the state changes only what it
# says); a stopped or failed endpoint is started again by an update (a new generation).
TRANSITIONS: dict[EndpointState, frozenset[EndpointState]] = {
    EndpointState.DEPLOYING: frozenset(
        {EndpointState.READY, EndpointState.UNHEALTHY, EndpointState.FAILED, EndpointState.STOPPED}
    ),
    EndpointState.READY: frozenset(
        {
            EndpointState.UPDATING,
            EndpointState.UNHEALTHY,
            EndpointState.FAILED,
            EndpointState.STOPPED,
        }
    ),
    EndpointState.UPDATING: frozenset(
        {EndpointState.READY, EndpointState.UNHEALTHY, EndpointState.FAILED, EndpointState.STOPPED}
    ),
    EndpointState.UNHEALTHY: frozenset(
        {EndpointState.READY, EndpointState.UPDATING, EndpointState.FAILED, EndpointState.STOPPED}
    ),
    EndpointState.STOPPED: frozenset({EndpointState.DEPLOYING}),
    # A failed endpoint may still hold what the backend made of it: stopping frees that.
    EndpointState.FAILED: frozenset({EndpointState.DEPLOYING, EndpointState.STOPPED}),
}


class EndpointEventKind(enum.StrEnum):
    """What an event of an endpoint's history records."""

    DEPLOYED = "deployed"  # who, model version, spec hash, image, replicas
    UPDATED = "updated"  # a new model version and/or spec and bundle: a new generation
    SCALED = "scaled"  # a new number of replicas: a new generation
    STATE = "state"  # a plain change of state (from → to, and why)
    STOPPED = "stopped"  # someone stopped it
    DELETED = "deleted"  # someone deleted it (its record stays)
    MODEL_STAGED = "model_staged"  # a pod's stager put the model in place: files, bytes, seconds


class Endpoint(TenantModel):
    """A model endpoint of a workspace, deployed from a tau.yaml with a ``serve`` block."""

    workspace = models.ForeignKey(
        "workspaces.Workspace", on_delete=models.PROTECT, related_name="endpoints"
    )
    name = models.CharField(
        max_length=NAME_MAX_LENGTH,
        help_text="A DNS-1035 label; unique in the workspace among endpoints not deleted.",
    )
    spec = models.JSONField(help_text="The normalised tau.yaml, with workspace defaults applied.")
    spec_hash = models.CharField(max_length=64)
    spec_source = models.TextField(help_text="The tau.yaml exactly as deployed (or updated).")
    # The project zip, kept as a run's is (runs.bundles: once per content per workspace).
    bundle = models.ForeignKey(
        "runs.CodeBundle", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    # The model version it serves, resolved from serve.model when deployed (an alias pinned
    # then, never again: a restart serves the same bytes). PROTECT: it stays in the record.
    model_version = models.ForeignKey(
        "catalog.AssetVersion",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="endpoints",
    )
    #: What the spec (or the request) asked for: a number, an alias, ``latest``.
    model_asked = models.CharField(max_length=63, blank=True)
    backend = models.CharField(max_length=20, choices=Backend.choices)
    priority = models.CharField(max_length=253, blank=True)
    priority_value = models.IntegerField(default=0)

    state = models.CharField(
        max_length=20, choices=EndpointState.choices, default=EndpointState.DEPLOYING
    )
    state_reason = models.TextField(blank=True)
    replicas_desired = models.PositiveIntegerField()
    replicas_ready = models.PositiveIntegerField(default=0)
    generation = models.PositiveIntegerField(
        default=1, help_text="1 when deployed; one more with each update or scale."
    )
    url = models.CharField(
        max_length=500, blank=True, help_text="The address the backend reports; empty until known."
    )
    # What the backend last reported of its traffic (null until it reports any).
    requests_per_second = models.FloatField(null=True, blank=True)
    latency_p95_ms = models.FloatField(null=True, blank=True)
    error_rate = models.FloatField(null=True, blank=True)
    metrics_at = models.DateTimeField(null=True, blank=True)
    # When a request last reached it, to the minute (serving.services.note_request): through
    # the portal's proxy, or as its backend's traffic figures show. What "idle" is read from.
    last_request_at = models.DateTimeField(null=True, blank=True)

    # The token its pods fetch its project zip and model with (``TAU_RUN_TOKEN`` in their
    # init containers): it reaches this endpoint's workload routes only, one live at a time,
    # and is revoked when the endpoint is stopped or deleted (serving.workload_tokens).
    token = models.OneToOneField(
        "identity.ApiToken", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    created_by_username = models.CharField(max_length=150)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta(TenantModel.Meta):
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "name"],
                condition=models.Q(deleted_at__isnull=True),
                name="endpoint_name_once_per_workspace",
            )
        ]
        indexes = [
            models.Index(fields=["workspace", "-created_at", "-id"], name="endpoint_list"),
            models.Index(fields=["backend", "state"], name="endpoint_backend_state"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def is_deleted(self) -> bool:
        return self.deleted_at is not None


class EndpointEvent(TenantModel):
    """Append-only history of an endpoint. ``hash`` = SHA-256 over the previous event's hash
    and this event's canonical content (``portal.event_chain``), as for a run."""

    tenant_path: ClassVar[str | None] = "endpoint__workspace"

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField()
    time = models.DateTimeField(default=timezone.now)
    kind = models.CharField(max_length=40)
    old_state = models.CharField(max_length=20, blank=True)
    new_state = models.CharField(max_length=20, blank=True)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    class Meta(TenantModel.Meta):
        ordering = ["endpoint", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["endpoint", "seq"], name="endpoint_event_unique_seq")
        ]

    def __str__(self) -> str:
        return f"{self.endpoint_id}#{self.seq} {self.kind}"


class EndpointDelivery(TenantModel):
    """Outbox: an instruction for the endpoint's backend, written in the same transaction as
    the change that needs it and retried until the backend has it (``serving.delivery``, on
    the claims and leases of ``portal.outbox``).

    ``deploy`` makes sure the backend runs generation ``generation`` of the endpoint (a first
    deployment, an update, a scale); ``stop`` makes sure it runs nothing of it. Both are
    idempotent on the backend's side, and a ``deploy`` of a generation older than the
    endpoint's is not delivered at all (a newer one says more)."""

    tenant_path: ClassVar[str | None] = "endpoint__workspace"

    class Action(models.TextChoices):
        DEPLOY = "deploy", "Deploy"
        STOP = "stop", "Stop"

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="deliveries")
    action = models.CharField(max_length=10, choices=Action.choices)
    generation = models.PositiveIntegerField()
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)
    tries = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    next_try_at = models.DateTimeField(default=timezone.now)
    claimed_at = models.DateTimeField(null=True, blank=True)
    given_up_at = models.DateTimeField(null=True, blank=True)

    class Meta(TenantModel.Meta):
        verbose_name_plural = "endpoint deliveries"
        indexes = [
            models.Index(
                fields=["next_try_at"],
                name="endpoint_delivery_due",
                condition=models.Q(delivered_at__isnull=True, given_up_at__isnull=True),
            )
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.endpoint_id} generation {self.generation}"
