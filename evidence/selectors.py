"""Reads of evidence, already scoped to a run's workspace."""

from __future__ import annotations

from dataclasses import dataclass

from evidence.models import EvidenceRecord, SealRequest
from runs.models import TERMINAL_STATES, Run

#: Endings listed on the run page (the newest first); the API lists every one.
ENDINGS_ON_PAGE = 20


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


def record_at(run: Run, terminal_seq: int) -> EvidenceRecord | None:
    """The record of the ending that the run's event ``terminal_seq`` recorded, if sealed."""
    return (
        EvidenceRecord.objects.for_workspace(run.workspace_id)
        .filter(run=run, terminal_seq=terminal_seq)
        .first()
    )


def file_name(run: Run, attempts: int) -> str:
    """What the export of a record is called: the run, and the attempt its ending came after
    (the record's ``attempt_count``). A resumed run ends once per resume, each time after a new
    attempt, so each of its records has its own name: ``train-7-attempt-1.evidence.tar``,
    ``train-7-attempt-3.evidence.tar``."""
    return f"{run.name}-attempt-{attempts}.evidence.tar"


@dataclass(frozen=True)
class Ending:
    """One ending of a run and its evidence: sealed (``record``), still being sealed, or
    given up (``not_sealed`` says why)."""

    terminal_seq: int
    attempts: int
    record: EvidenceRecord | None
    not_sealed: str | None
    file_name: str

    @property
    def sealing(self) -> bool:
        return self.record is None and self.not_sealed is None


@dataclass(frozen=True)
class RunEvidence:
    """What the run page shows of a run's evidence: its newest ending (None while the run is
    live again after a resume), the earlier ones (the newest first), and whether there are
    more than the page lists (the API lists every one)."""

    newest: Ending | None
    earlier: list[Ending]
    more: bool

    @property
    def changing(self) -> bool:
        """Worth polling: the newest ending is being sealed, or its record checked."""
        newest = self.newest
        return newest is not None and (
            newest.sealing or (newest.record is not None and newest.record.verifying)
        )


def endings(run: Run, *, limit: int | None = None) -> list[Ending]:
    """The run's endings with their evidence, the newest first (at most ``limit``). Two
    queries, whatever the number; records without their manifest and signature (a page or a
    list needs neither)."""
    listed = list(
        SealRequest.objects.for_workspace(run.workspace_id)
        .filter(run=run)
        .order_by("-terminal_seq")
        .values_list("terminal_seq", "attempt_count", "given_up_at", "last_error")[:limit]
    )
    if not listed:
        return []
    records = {
        record.terminal_seq: record
        for record in EvidenceRecord.objects.for_workspace(run.workspace_id)
        .filter(run=run, terminal_seq__in=[seq for seq, *_ in listed])
        .defer("manifest", "signature")
    }
    return [
        Ending(
            terminal_seq=seq,
            attempts=attempts,
            record=records.get(seq),
            not_sealed=(last_error or "an unknown error")
            if given_up_at is not None and seq not in records
            else None,
            file_name=file_name(run, attempts),
        )
        for seq, attempts, given_up_at, last_error in listed
    ]


def run_evidence(run: Run) -> RunEvidence | None:
    """The run page's evidence section; None when the run has never ended (nothing to say).
    While the run is live again after a resume, only its earlier endings are listed."""
    live = run.state not in TERMINAL_STATES
    if live and run.attempt_count <= 1:
        return None  # a first attempt still going: no ending yet, and no query to learn it
    found = endings(run, limit=ENDINGS_ON_PAGE + 1)
    if not found:
        return None
    more = len(found) > ENDINGS_ON_PAGE
    found = found[:ENDINGS_ON_PAGE]
    if live:
        return RunEvidence(newest=None, earlier=found, more=more)
    return RunEvidence(newest=found[0], earlier=found[1:], more=more)
