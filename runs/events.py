"""A run's history: append-only events in a hash chain.

Each event stores the hash of the one before and a hash over its own canonical content, so
any change to the history (an edited message, a deleted event) breaks the chain, and
``verify_event_chain`` says so. Events are appended under the run's row lock (``runs.state``
takes it), so two writers never give two events the same place.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from portal.event_chain import chain_is_whole, json_data, link
from runs.models import WORKLOAD_EVENT_PREFIX, EventKind, Run, RunEvent

# Linked and checked by portal.event_chain, whose hashes are tau.evidence.chain's: the offline
# verifier recomputes them with the same code. A run's events name it as ``run``.
SUBJECT = "run"


def _append(
    run: Run,
    kind: str,
    *,
    message: str,
    data: dict[str, Any] | None,
    old_state: str,
    new_state: str,
    first: bool,
) -> RunEvent:
    last = (
        None
        if first
        else RunEvent.objects.for_workspace(run.workspace_id)
        .filter(run=run)
        .order_by("-seq")
        .first()
    )
    event = RunEvent(
        run=run,
        time=timezone.now(),
        kind=kind,
        old_state=old_state,
        new_state=new_state,
        message=message,
        data=json_data(data),
    )
    link(event, last=last, subject=SUBJECT, subject_id=run.pk)
    event.save()
    return event


def append_event(
    run: Run,
    kind: EventKind,
    *,
    message: str = "",
    data: dict[str, Any] | None = None,
    old_state: str = "",
    new_state: str = "",
    first: bool = False,
) -> RunEvent:
    """Add an event to the run's chain. The caller holds the run's row lock (or has just
    created the run, which then has no events yet: ``first``)."""
    return _append(
        run,
        EventKind(kind).value,
        message=message,
        data=data,
        old_state=old_state,
        new_state=new_state,
        first=first,
    )


def append_workload_event(
    run: Run, own_kind: str, *, message: str, data: dict[str, Any] | None = None
) -> RunEvent:
    """An event the workload reports itself, kept as ``workload.<its kind>``: it never
    passes for one of TauGrid's own (``EventKind``). The caller holds the run's row lock."""
    return _append(
        run,
        f"{WORKLOAD_EVENT_PREFIX}{own_kind}",
        message=message,
        data=data,
        old_state="",
        new_state="",
        first=False,
    )


def verify_event_chain(run: Run) -> bool:
    """Whether the run's events form an unbroken chain from the first one."""
    events = RunEvent.objects.for_workspace(run.workspace_id).filter(run=run).order_by("seq")
    return chain_is_whole(events, subject=SUBJECT, subject_id=run.pk)
