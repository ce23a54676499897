"""Reads of endpoints for the portal's pages, already scoped: a workspace's endpoints (with
whether each is idle), one by its name, its history, the endpoints that served a model
version, and every workspace's running ones for platform staff.

"Idle" is one rule, written once as a condition the database evaluates (:func:`idle_q`), so
the workspace's list, an endpoint's page and the platform admin's filter cannot disagree: a
running endpoint (``ready``, ``updating`` or ``unhealthy``: it holds what it was given) that
no request has reached for ``TAU_ENDPOINT_IDLE_HOURS`` hours. When a request last reached it
is ``last_request_at`` (the proxy notes it; so does its backend's traffic figure); one never
used counts from when it was deployed.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Case, Q, QuerySet, Value, When
from django.http import Http404
from django.utils import timezone

from catalog.models import AssetVersion
from serving.models import LIVE_STATES, Endpoint, EndpointEvent, EndpointEventKind, EndpointState
from workspaces.models import Workspace

#: The states in which an endpoint runs and holds its resources: the ones that can be idle.
RUNNING_STATES = (EndpointState.READY, EndpointState.UPDATING, EndpointState.UNHEALTHY)
#: Events of an endpoint's history that name the model version it serves from then on.
MODEL_EVENTS = (EndpointEventKind.DEPLOYED, EndpointEventKind.UPDATED)
#: The most endpoints a model version's page names.
SERVED_BY_SHOWN = 50


def idle_hours() -> int:
    return int(settings.TAU_ENDPOINT_IDLE_HOURS)


def idle_q(now: datetime | None = None) -> Q:
    """The endpoints that are idle at ``now`` (module docstring)."""
    cutoff = (now or timezone.now()) - timedelta(hours=idle_hours())
    return Q(state__in=RUNNING_STATES) & (
        Q(last_request_at__lt=cutoff) | Q(last_request_at__isnull=True, created_at__lt=cutoff)
    )


def with_idle(endpoints: QuerySet[Endpoint], now: datetime | None = None) -> QuerySet[Endpoint]:
    """``endpoints``, each with ``idle`` (True or False) read with it."""
    # Case, not the bare condition: the database says NULL (not false) for an endpoint never
    # used, and NULL sorts before true.
    return endpoints.annotate(idle=Case(When(idle_q(now), then=Value(True)), default=Value(False)))


def endpoints_of(workspace: Workspace) -> QuerySet[Endpoint]:
    """The workspace's endpoints not deleted, newest first, with the model version each
    serves (and its model) and whether it is idle: one query a page."""
    return with_idle(
        Endpoint.objects.for_workspace(workspace)
        .filter(deleted_at__isnull=True)
        .select_related("model_version__asset")
        .order_by("-created_at", "-id")
    )


def endpoint_or_404(workspace: Workspace, name: str) -> Endpoint:
    """The workspace's endpoint ``name`` (not deleted); another workspace's, or none, is a 404."""
    endpoint = None if "\x00" in name else endpoints_of(workspace).filter(name=name).first()
    if endpoint is None:
        raise Http404(f"This workspace has no endpoint named {name!r}.")
    endpoint.workspace = workspace
    return endpoint


def history_of(endpoint: Endpoint, *, limit: int) -> list[EndpointEvent]:
    """The endpoint's newest ``limit`` events, newest first."""
    return list(
        EndpointEvent.objects.for_workspace(endpoint.workspace_id)
        .filter(endpoint=endpoint)
        .order_by("-seq")[:limit]
    )


def served_by(version: AssetVersion) -> list[dict[str, Any]]:
    """The endpoints of the version's workspace whose record names the version: those that
    serve it now (``Endpoint.model_version``) and those whose history says they served it
    (a ``deployed`` or ``updated`` event naming its ref and manifest digest), deleted ones
    included, newest first. Each as {"endpoint", "now"}. Two queries."""
    workspace_id = version.asset.workspace_id
    ref = version.ref
    named = (
        EndpointEvent.objects.for_workspace(workspace_id)
        .filter(kind__in=MODEL_EVENTS, data__model__ref=ref)
        .values_list("endpoint_id", "data__model__manifest_digest")
    )
    past = {
        endpoint_id
        for endpoint_id, digest in named
        # The same ref of a model deleted and made again is another version.
        if not version.manifest_digest or digest in (None, version.manifest_digest)
    }
    endpoints = (
        Endpoint.objects.for_workspace(workspace_id)
        .filter(Q(model_version=version) | Q(pk__in=past))
        .order_by("-created_at", "-id")[:SERVED_BY_SHOWN]
    )
    return [
        {
            "endpoint": endpoint,
            "now": endpoint.model_version_id == version.pk and endpoint.deleted_at is None,
        }
        for endpoint in endpoints
    ]


#: The most endpoints the platform's page lists.
PLATFORM_SHOWN = 500


def platform_endpoints() -> list[Endpoint]:
    """Every workspace's endpoints that run or are being deployed, for platform staff: idle
    ones first, then by workspace and name, each with its workspace and ``idle``. One query."""
    # unscoped(): the platform team's view across all workspaces.
    return list(
        with_idle(
            Endpoint.objects.unscoped().filter(
                deleted_at__isnull=True, state__in=LIVE_STATES, workspace__active=True
            )
        )
        .select_related("workspace")
        .order_by("-idle", "workspace__slug", "name")[:PLATFORM_SHOWN]
    )
