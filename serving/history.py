"""An endpoint's history as an export (``GET …/endpoints/{name}/evidence/``): a header, then
every event with its hashes, as JSON lines in the one form ``tau.evidence.history`` checks
offline (``python -m tau.evidence verify FILE``, ``tau evidence verify FILE``).

The header and the events are one snapshot: the endpoint's row and its last event are read
under the endpoint's lock (every writer takes it), and only the events up to that one are
written. Events never change once written, so they are then streamed outside any
transaction, a few thousand at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from django.db import transaction

from portal.event_chain import export_line
from serving.events import SUBJECT
from serving.models import Endpoint, EndpointEvent, EndpointEventKind
from serving.state import lock_endpoint
from tau.evidence.chain import GENESIS_HASH, event_line
from tau.evidence.history import FORMAT, header_line

#: Events read per query while streaming.
PAGE = 2000


def _time(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def history_export(endpoint: Endpoint) -> Iterator[bytes]:
    """The export of ``endpoint``'s history, line by line (module docstring). The header
    says nothing its events do not say too, so that the offline check can hold every byte of
    it to them: its times are those of its ``deployed`` and ``deleted`` events."""
    with transaction.atomic():
        locked = lock_endpoint(endpoint.pk)
        events = EndpointEvent.objects.for_workspace(locked.workspace_id).filter(endpoint=locked)
        last = events.order_by("-seq").only("seq", "hash").first()
        first = events.filter(seq=1).only("time").first()
        deleted = events.filter(kind=EndpointEventKind.DELETED).only("time").first()
    count = last.seq if last is not None else 0
    header = {
        "format": FORMAT,
        "workspace": locked.workspace.slug,
        "endpoint": {
            "id": locked.pk,
            "name": locked.name,
            "backend": locked.backend,
            "state": locked.state,
            "generation": locked.generation,
            "created_by": locked.created_by_username,
            "created_at": _time(first.time if first is not None else None),
            "deleted_at": _time(deleted.time if deleted is not None else None),
        },
        "event_count": count,
        "head": last.hash if last is not None else GENESIS_HASH,
    }
    return _lines(locked, header, count)


def _lines(endpoint: Endpoint, header: dict[str, object], count: int) -> Iterator[bytes]:
    yield header_line(header)
    after = 0
    while after < count:
        # A page at a time by seq (no server-side cursor left open by a client that stops
        # reading).
        page = list(
            EndpointEvent.objects.for_workspace(endpoint.workspace_id)
            .filter(endpoint=endpoint, seq__gt=after, seq__lte=count)
            .order_by("seq")[:PAGE]
        )
        if not page:
            return
        for event in page:
            yield event_line(export_line(event, subject=SUBJECT, subject_id=endpoint.pk))
        after = page[-1].seq
