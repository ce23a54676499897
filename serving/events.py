"""An endpoint's history: append-only events in a hash chain, linked and checked as a run's
are (``portal.event_chain``; the content names the endpoint as ``endpoint``). Events are
appended under the endpoint's row lock (``serving.state.lock_endpoint``), so two writers
never give two events the same place."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from portal.event_chain import chain_is_whole, json_data, link
from serving.models import Endpoint, EndpointEvent, EndpointEventKind

#: What an endpoint's events name it by in their hashed content (``tau.evidence.chain``).
SUBJECT = "endpoint"


def append_event(
    endpoint: Endpoint,
    kind: EndpointEventKind,
    *,
    message: str = "",
    data: dict[str, Any] | None = None,
    old_state: str = "",
    new_state: str = "",
    first: bool = False,
) -> EndpointEvent:
    """Add an event to the endpoint's chain. The caller holds the endpoint's row lock (or has
    just created the endpoint, which then has no events yet: ``first``)."""
    last = (
        None
        if first
        else EndpointEvent.objects.for_workspace(endpoint.workspace_id)
        .filter(endpoint=endpoint)
        .order_by("-seq")
        .first()
    )
    event = EndpointEvent(
        endpoint=endpoint,
        time=timezone.now(),
        kind=EndpointEventKind(kind).value,
        old_state=old_state,
        new_state=new_state,
        message=message,
        data=json_data(data),
    )
    link(event, last=last, subject=SUBJECT, subject_id=endpoint.pk)
    event.save()
    return event


def verify_event_chain(endpoint: Endpoint) -> bool:
    """Whether the endpoint's events form an unbroken chain from the first one."""
    events = (
        EndpointEvent.objects.for_workspace(endpoint.workspace_id)
        .filter(endpoint=endpoint)
        .order_by("seq")
    )
    return chain_is_whole(events, subject=SUBJECT, subject_id=endpoint.pk)
