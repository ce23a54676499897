"""Append-only histories in a hash chain, for every record that keeps one: a run's events
(``runs.events``) and an endpoint's (``serving.events``).

An event stores the hash of the one before it and a hash over its own canonical content
(``tau.evidence.chain``, the code the offline verifier runs too), so any change to a history
(an edited message, a deleted event) breaks the chain. What differs between the histories is
only the row and what the chain is the history of (its *subject*: ``run``, ``endpoint``,
the first field of the content); linking an event and checking a chain are written here
once. The caller appends under the subject's row lock, so two writers never give two events
the same place.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Protocol

from django.core.serializers.json import DjangoJSONEncoder

from tau.evidence.chain import GENESIS_HASH, content_fields, event_hash


class ChainedEvent(Protocol):
    """What an event row of a chained history has (``runs.RunEvent``, ``serving.EndpointEvent``)."""

    seq: int
    time: datetime
    kind: str
    old_state: str
    new_state: str
    message: str
    data: Any
    prev_hash: str
    hash: str


def json_data(data: dict[str, Any] | None) -> dict[str, Any]:
    """``data`` as it is kept and hashed: JSON types only (times, decimals and UUIDs as
    Django's JSON encoder writes them), so that what is hashed is what is read back."""
    loaded: dict[str, Any] = json.loads(json.dumps(data or {}, cls=DjangoJSONEncoder))
    return loaded


def content(event: ChainedEvent, *, subject: str, subject_id: int) -> dict[str, Any]:
    """The event's content as its hash covers it: the subject's id, then its fields (the time
    as ``isoformat()``). JSON types only (``data`` has been through :func:`json_data`)."""
    values = {
        subject: subject_id,
        "seq": event.seq,
        "time": event.time.isoformat(),
        "kind": event.kind,
        "old_state": event.old_state,
        "new_state": event.new_state,
        "message": event.message,
        "data": event.data,
    }
    assert tuple(values) == content_fields(subject)
    return values


def link(event: ChainedEvent, *, last: ChainedEvent | None, subject: str, subject_id: int) -> None:
    """Give ``event`` its place after ``last`` (None: it is the first): its ``seq``,
    ``prev_hash`` and ``hash``. Its other fields are set already; the caller saves it."""
    event.seq = (last.seq + 1) if last is not None else 1
    event.prev_hash = last.hash if last is not None else GENESIS_HASH
    event.hash = event_hash(event.prev_hash, content(event, subject=subject, subject_id=subject_id))


def chain_is_whole(events: Iterable[ChainedEvent], *, subject: str, subject_id: int) -> bool:
    """Whether ``events`` (in ``seq`` order, all of one subject's) form an unbroken chain from
    the first one."""
    prev = GENESIS_HASH
    expected_seq = 1
    for event in events:
        if event.seq != expected_seq or event.prev_hash != prev:
            return False
        if event.hash != event_hash(prev, content(event, subject=subject, subject_id=subject_id)):
            return False
        prev = event.hash
        expected_seq += 1
    return True


def export_line(event: ChainedEvent, *, subject: str, subject_id: int) -> dict[str, Any]:
    """The event as an export carries it: its content, ``prev_hash`` and ``hash`` (what
    ``tau.evidence.chain.ChainChecker`` reads)."""
    return {
        **content(event, subject=subject, subject_id=subject_id),
        "prev_hash": event.prev_hash,
        "hash": event.hash,
    }
