"""An endpoint's state: the one writer of ``Endpoint.state`` and of what is said about it.

``transition`` is the only code that changes ``Endpoint.state``. It locks the row, checks the
transition table (``serving.models.TRANSITIONS``) and appends a hash-chained event in the
same transaction, as ``runs.state.transition`` does for runs.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from serving.events import append_event
from serving.models import TRANSITIONS, Endpoint, EndpointEventKind, EndpointState


class IllegalTransition(RuntimeError):
    """A state change the transition table does not allow: a bug, never user input."""


class EndpointActionRefused(ValueError):
    """A request that makes no sense for the endpoint's state or settings (scale an endpoint
    that autoscales, say): the message says why, for people."""


def lock_endpoint(endpoint_id: int) -> Endpoint:
    """The endpoint, locked for update until the surrounding transaction ends. Every write to
    an endpoint (its state, its history, its generation) takes this lock first. Only the
    endpoint's row is locked (``OF self``), as an update that keeps its key (``NO KEY
    UPDATE``): rows that point at it or its workspace are never held up (runs.state.lock_run
    says why that matters)."""
    return (
        Endpoint.objects.unscoped()
        .select_for_update(of=("self",), no_key=True)
        .select_related("workspace")
        .get(pk=endpoint_id)
    )


@transaction.atomic
def transition(
    endpoint: Endpoint,
    new_state: EndpointState,
    *,
    reason: str = "",
    message: str = "",
    data: dict[str, Any] | None = None,
    kind: EndpointEventKind = EndpointEventKind.STATE,
    changes: dict[str, Any] | None = None,
) -> Endpoint:
    """Move the endpoint to ``new_state`` (row-locked, checked, recorded) and return it fresh.
    ``reason`` is what the endpoint says about its state from now on; ``changes`` are other
    fields written with the move (replicas ready, its address), in the same save."""
    locked = lock_endpoint(endpoint.pk)
    old_state = EndpointState(locked.state)
    if new_state not in TRANSITIONS[old_state]:
        raise IllegalTransition(f"endpoint {locked.name}: {old_state} → {new_state} is not allowed")
    locked.state = new_state
    locked.state_reason = reason
    for field, value in (changes or {}).items():
        setattr(locked, field, value)
    locked.save()
    append_event(
        locked,
        kind,
        message=message or reason,
        data=data,
        old_state=old_state,
        new_state=new_state,
    )
    return locked
