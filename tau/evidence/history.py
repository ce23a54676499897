"""An endpoint's exported history (``GET …/endpoints/{name}/evidence/``), client side: its
format and its offline check (``python -m tau.evidence verify FILE`` tells it from a run's
record by its first byte).

The file is JSON lines, every line exactly as :func:`tau.evidence.chain.event_line` writes
it (keys sorted, no whitespace, ASCII): first a header, then the endpoint's events in ``seq``
order, each carrying the content its hash covers, ``prev_hash`` and ``hash``::

    {"endpoint":{"id":7,"name":"chat",…},"event_count":5,"format":"taugrid-endpoint-history/1",…}
    {"data":{…},"endpoint":7,"hash":"…","kind":"deployed",…,"prev_hash":"000…","seq":1,…}

The check finds any changed byte: a line not in its one written form, a broken chain (an
edited, dropped, inserted or reordered event), a header that does not say what the events
say (the endpoint, how many events, the last hash, its state and generation, whether it was
deleted). The history is not signed yet: the check proves the file whole and the chain
unbroken, not who wrote it (a run's record is signed; docs/evidence.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tau.evidence.chain import ChainChecker, event_line

__all__ = [
    "FORMAT",
    "HistoryReport",
    "check_history",
    "header_line",
    "is_history",
    "verify_history_file",
]

FORMAT = "taugrid-endpoint-history/1"
#: The most a history file may hold, read whole (a million events of a few hundred bytes).
MAX_BYTES = 1 << 30


def header_line(header: Mapping[str, Any]) -> bytes:
    """The header as its line of the file (the same form as an event's)."""
    return event_line(header)


def is_history(first_bytes: bytes) -> bool:
    """Whether a file that starts with ``first_bytes`` is an endpoint history (JSON lines)
    rather than a run's record (a tar)."""
    return first_bytes.lstrip()[:1] == b"{"


@dataclass
class HistoryReport:
    path: str
    problems: list[str] = field(default_factory=list)
    endpoint: dict[str, Any] = field(default_factory=dict)
    workspace: str = ""
    events: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "file": self.path,
            "ok": self.ok,
            "format": FORMAT,
            "problems": self.problems,
            "signer": None,
            "endpoint": {**self.endpoint, "workspace": self.workspace},
            "counts": {"events": self.events},
        }

    def text(self) -> str:
        if not self.ok:
            lines = [f"FAILED {self.path}: {len(self.problems)} problem(s)"]
            lines += [f"  - {problem}" for problem in self.problems]
            return "\n".join(lines)
        endpoint = self.endpoint
        return "\n".join(
            [
                f"OK {self.path} ({FORMAT})",
                f"  endpoint   {self.workspace}/{endpoint.get('name')} (id {endpoint.get('id')}), "
                f"state {endpoint.get('state')}, generation {endpoint.get('generation')}",
                f"  verified   {self.events} events (chain), each line in its written form",
                "  signed     no: an endpoint's history is not signed yet",
            ]
        )


def check_history(lines: Iterable[bytes]) -> tuple[list[str], dict[str, Any]]:
    """Every problem of an endpoint history given as its lines (each with its newline), and
    its header (empty when the first line is not one)."""
    problems: list[str] = []
    parsed: list[dict[str, Any]] = []
    for number, raw in enumerate(lines, start=1):
        try:
            value = json.loads(raw)
        except ValueError as error:
            problems.append(f"line {number}: not JSON ({error})")
            continue
        if not isinstance(value, dict):
            problems.append(f"line {number}: not a JSON object")
            continue
        try:
            written = event_line(value)
        except (TypeError, ValueError) as error:
            problems.append(f"line {number}: cannot be written back ({error})")
            continue
        if written != raw:
            problems.append(f"line {number}: not in its written form (a byte was changed)")
        parsed.append(value)
    if not parsed:
        return [*problems, "the file holds no header"], {}
    header, events = parsed[0], parsed[1:]
    if header.get("format") != FORMAT:
        problems.append(f"header: format is {header.get('format')!r}, not {FORMAT!r}")
        return problems, header
    endpoint = header.get("endpoint")
    if not isinstance(endpoint, dict):
        return [*problems, "header: no endpoint"], header
    checker = ChainChecker("endpoint")
    for event in events:
        checker.add(event)
        if event.get("endpoint") != endpoint.get("id"):
            problems.append(f"event seq {event.get('seq')}: of another endpoint")
    problems += checker.problems
    if header.get("event_count") != checker.count:
        problems.append(
            f"header: says {header.get('event_count')} events, the file holds {checker.count}"
        )
    if header.get("head") != checker.head:
        problems.append("header: its head is not the hash of the last event")
    problems += _header_agrees(header, endpoint, events)
    return problems, header


#: What a header holds, exactly (each held to what the events say).
HEADER_KEYS = {"format", "workspace", "endpoint", "event_count", "head"}
ENDPOINT_KEYS = {
    "id",
    "name",
    "backend",
    "state",
    "generation",
    "created_by",
    "created_at",
    "deleted_at",
}


def _header_agrees(
    header: Mapping[str, Any], endpoint: Mapping[str, Any], events: list[dict[str, Any]]
) -> list[str]:
    """What the header says that its events do not: every field of it is held to them."""
    problems: list[str] = []
    if set(header) != HEADER_KEYS:
        problems.append(f"header: holds {sorted(header)}, not {sorted(HEADER_KEYS)}")
    if set(endpoint) != ENDPOINT_KEYS:
        problems.append(f"header: its endpoint holds {sorted(endpoint)}")
    if not events:
        return [*problems, "the file holds no events: an endpoint's history starts deployed"]
    first = events[0]
    given = first.get("data")
    data: dict[str, Any] = given if isinstance(given, dict) else {}
    if first.get("kind") != "deployed":
        problems.append("event seq 1: not the deployment")
    said = {
        "name": (endpoint.get("name"), data.get("name")),
        "backend": (endpoint.get("backend"), data.get("backend")),
        "created_by": (endpoint.get("created_by"), data.get("by")),
        "created_at": (endpoint.get("created_at"), first.get("time")),
        "workspace": (header.get("workspace"), data.get("workspace")),
    }
    for key, (in_header, in_events) in said.items():
        if in_header != in_events:
            problems.append(f"header: {key} {in_header!r}, the deployment says {in_events!r}")
    states = [event.get("new_state") for event in events if event.get("new_state")]
    if states and endpoint.get("state") != states[-1]:
        problems.append(f"header: state {endpoint.get('state')!r}, the events end {states[-1]!r}")
    generations = [
        event["data"]["generation"]
        for event in events
        if isinstance(event.get("data"), dict) and isinstance(event["data"].get("generation"), int)
    ]
    if generations and endpoint.get("generation") != max(generations):
        problems.append(
            f"header: generation {endpoint.get('generation')!r}, the events reach "
            f"{max(generations)}"
        )
    deleted = [event.get("time") for event in events if event.get("kind") == "deleted"]
    if endpoint.get("deleted_at") != (deleted[-1] if deleted else None):
        problems.append("header: when it was deleted is not what the events say")
    return problems


def verify_history_file(path: str | Path) -> HistoryReport:
    """Check the endpoint history at ``path``. Raises ``OSError`` when it cannot be read."""
    report = HistoryReport(path=str(path))
    with open(path, "rb") as handle:
        content = handle.read(MAX_BYTES + 1)
    if len(content) > MAX_BYTES:
        report.problems.append(f"larger than {MAX_BYTES} bytes: not an endpoint history")
        return report
    if content and not content.endswith(b"\n"):
        report.problems.append("the last line has no newline (the file was cut short?)")
    lines = content.splitlines(keepends=True)
    problems, header = check_history(lines)
    report.problems += problems
    endpoint = header.get("endpoint")
    report.endpoint = dict(endpoint) if isinstance(endpoint, dict) else {}
    report.workspace = str(header.get("workspace", ""))
    report.events = max(0, len(lines) - 1)
    return report
