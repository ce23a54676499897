"""A run's history: append-only events in a hash chain.

Each event stores the hash of the one before and a hash over its own canonical content, so
any change to the history (an edited message, a deleted event) breaks the chain, and
``verify_event_chain`` says so. Events are appended under the run's row lock (``runs.state``
takes it), so two writers never give two events the same place.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.utils import timezone

from runs.models import WORKLOAD_EVENT_PREFIX, EventKind, Run, RunEvent
from tau.evidence.chain import GENESIS_HASH, event_hash

# The hash is tau.evidence.chain's so that the offline verifier recomputes it with the same
# code; _event_content holds JSON types only (data has been through the JSON encoder).


def _event_content(event: RunEvent) -> dict[str, Any]:
    return {
        "run": event.run_id,
        "seq": event.seq,
        "time": event.time.isoformat(),
        "kind": event.kind,
        "old_state": event.old_state,
        "new_state": event.new_state,
        "message": event.message,
        "data": event.data,
    }


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
        seq=(last.seq + 1) if last else 1,
        time=timezone.now(),
        kind=kind,
        old_state=old_state,
        new_state=new_state,
        message=message,
        data=json.loads(json.dumps(data or {}, cls=DjangoJSONEncoder)),
        prev_hash=last.hash if last else GENESIS_HASH,
    )
    event.hash = event_hash(event.prev_hash, _event_content(event))
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
    prev = GENESIS_HASH
    expected_seq = 1
    for event in RunEvent.objects.for_workspace(run.workspace_id).filter(run=run).order_by("seq"):
        if event.seq != expected_seq or event.prev_hash != prev:
            return False
        if event.hash != event_hash(prev, _event_content(event)):
            return False
        prev = event.hash
        expected_seq += 1
    return True
