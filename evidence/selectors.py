"""Reads of evidence, already scoped to a run's workspace."""

from __future__ import annotations

from evidence.models import EvidenceRecord, SealRequest
from runs.models import TERMINAL_STATES, Run


def current_record(run: Run) -> EvidenceRecord | None:
    """The record of the run's present ending: the newest one, if it seals the run's newest
    terminal event. None while the run is live or its latest ending is still being sealed
    (an older record of an earlier ending does not describe the run as it is)."""
    if run.state not in TERMINAL_STATES:
        return None
    newest = (
        EvidenceRecord.objects.for_workspace(run.workspace_id)
        .filter(run=run)
        .order_by("-terminal_seq")
        .first()
    )
    if newest is None:
        return None
    pending = (
        SealRequest.objects.for_workspace(run.workspace_id)
        .filter(run=run, sealed_at__isnull=True, terminal_seq__gt=newest.terminal_seq)
        .exists()
    )
    return None if pending else newest
