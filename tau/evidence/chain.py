"""An event chain (a run's history, an endpoint's): each event's hash covers the hash before it
and its own content, so editing, dropping, inserting or reordering any event breaks every
hash after it.

The portal computes the hashes when it appends events (``portal.event_chain``, for
``runs.events`` and ``serving.events``) and the verifier recomputes them from the export
(a run's ``events.jsonl``, an endpoint's history); both call ``event_hash`` here. An event's
content names what it is the history of by its first field: ``run`` (the run's id) or
``endpoint`` (the endpoint's id), its *subject*. The serialisation is
Python's ``json.dumps`` with sorted keys, not RFC 8785: it is what the portal has hashed
since its first event, and changing it would break every chain already stored.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "CONTENT_FIELDS",
    "GENESIS_HASH",
    "SUBJECTS",
    "ChainChecker",
    "check_chain",
    "content_fields",
    "event_hash",
    "event_line",
]

# The prev_hash of a run's first event.
GENESIS_HASH = "0" * 64

# What a run's event's hash covers (besides the hash before it).
CONTENT_FIELDS = ("run", "seq", "time", "kind", "old_state", "new_state", "message", "data")

#: What a chain can be the history of: the first field of its events' content.
SUBJECTS = ("run", "endpoint", "pipeline")


def content_fields(subject: str = "run") -> tuple[str, ...]:
    """What the hash of an event of ``subject``'s history covers: the subject's id, then the
    same fields as a run's."""
    if subject not in SUBJECTS:
        raise ValueError(f"no chain of {subject!r}: one of {', '.join(SUBJECTS)}")
    return (subject, *CONTENT_FIELDS[1:])


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def event_hash(prev_hash: str, content: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of ``prev_hash``, a newline and the content's JSON (sorted keys, no
    whitespace, ASCII escapes). ``content`` holds JSON types only (``time`` already a string)."""
    return hashlib.sha256(f"{prev_hash}\n{_dumps(dict(content))}".encode()).hexdigest()


def event_line(event: Mapping[str, Any]) -> bytes:
    """An event (the content fields plus ``prev_hash`` and ``hash``) as its ``events.jsonl``
    line, newline included. Written the way the hash reads it, not as RFC 8785, so every
    number keeps its form: canonical JSON writes the float ``1.0`` as ``1``, which reads
    back as an integer that ``json.dumps`` writes as ``1``, and the hash would not match."""
    return (_dumps(dict(event)) + "\n").encode("ascii")


class ChainChecker:
    """Checks events one at a time, in the order given, so a long history need not be held
    in memory. ``problems`` names each break by the event's ``seq``; ``count`` and ``head``
    (the last event's hash, ``GENESIS_HASH`` before any) are what the manifest should say.
    ``subject``: what the chain is the history of (``run``, ``endpoint``)."""

    def __init__(self, subject: str = "run") -> None:
        self.fields = content_fields(subject)
        self.problems: list[str] = []
        self.count = 0
        self.head = GENESIS_HASH

    def add(self, event: Mapping[str, Any]) -> None:
        position = self.count + 1
        self.count = position
        missing = [field for field in (*self.fields, "prev_hash", "hash") if field not in event]
        if missing:
            self.problems.append(f"event #{position}: missing {', '.join(missing)}")
            self.head = str(event.get("hash", ""))
            return
        label = f"event seq {event['seq']}"
        if event["seq"] != position:
            self.problems.append(f"{label}: expected seq {position} at line {position}")
        if event["prev_hash"] != self.head:
            self.problems.append(f"{label}: prev_hash is not the hash of the event before it")
        content = {field: event[field] for field in self.fields}
        try:
            recomputed = event_hash(str(event["prev_hash"]), content)
        except (TypeError, ValueError) as error:
            self.problems.append(f"{label}: content is not JSON ({error})")
        else:
            if recomputed != event["hash"]:
                self.problems.append(f"{label}: hash does not match its content")
        self.head = str(event["hash"])


def check_chain(events: Iterable[Mapping[str, Any]], subject: str = "run") -> list[str]:
    """Every break in a chain of ``subject`` (wrong ``seq``, a ``prev_hash`` that is not the
    hash before, a ``hash`` that does not match the content); empty when the chain is whole."""
    checker = ChainChecker(subject)
    for event in events:
        checker.add(event)
    return checker.problems
