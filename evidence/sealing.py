"""Sealing: a run that ends gets its evidence record, durably and exactly once per ending.

``request_seal`` runs inside the transaction that moves a run into a terminal state (the
``runs.state.run_ended`` signal) and writes a :class:`SealRequest` keyed by the terminal
event; after commit a Celery task seals it, and the reconciler (Celery beat, ``make run``'s
worker and beat included: the embedded default processes seals the same way as deliveries)
seals whatever a lost task, a down broker or a crash left behind (``due_seals``).

Sealing is three steps, like a delivery, so that no lock is held while files are hashed:

1. *claim* the request (``FOR UPDATE SKIP LOCKED`` of that row only), counting the try;
2. build and sign the manifest outside any transaction (reading a 1 GiB log takes seconds),
   holding the claim as a lease renewed meanwhile (``portal.outbox.Lease``): a worker killed
   while sealing leaves a claim that lapses within ``TAU_CLAIM_LEASE_SECONDS``, and the
   reconciler seals the request at its next pass;
3. store the record and close the request in one short transaction.

A try that fails is tried again after a doubling delay; after ``MAX_TRIES`` failed tries the
request is *given up*: the run page, the API and the admin say "the evidence could not be
sealed" with the reason, and nothing is tried again until staff ask for it (the admin's "Seal
again", :func:`seal_again`) — a record that cannot be built (data it cannot hold, a file that
is gone) fails the same way every time, and must not be retried forever. Each failed try is
one line in the log (the traceback once, with the first).

A cluster run's logs are kept by the Kubernetes watcher when its attempts end
(``executors.kubernetes.watcher``), and sealing waits for that (``LogNotKeptYet``, not a failure):
for an ended attempt that ran, until the watcher has either kept its log (``log_path``) or said why
there is none to keep (``log_note``: its pods were gone, or never started) — never longer
than ``LOG_WAIT``, so a watcher that is down does not hold the record either. An attempt
without a log is sealed with the reason in its ``log_note``.

The record is unique per (run, terminal event): a worker that crashed after step 3's commit
left a closed request; one that crashed before it left nothing, and the next try seals again
(with its own ``sealed_at``). If two workers race past a lapsed claim, the database keeps
the first record and the second one's insert is dropped — never two records for one ending.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from functools import partial
from typing import Any

from celery import current_app
from django.db import IntegrityError, transaction
from django.utils import timezone

from evidence import keys, verification
from evidence.manifest import Coverage, build_manifest
from evidence.models import EvidenceRecord, SealRequest
from portal import audit
from portal.outbox import Lease, Retries, Skipped, claim, due, record_failure
from runs.models import Backend, Run, RunEvent
from tau.evidence.canonical import canonical_json
from tau.evidence.keys import key_id, public_key_bytes, signature_document

logger = logging.getLogger(__name__)

#: The Celery task that seals one request (``evidence.tasks``), published by name.
SEAL_TASK = "evidence.tasks.seal"
#: Tries before a request is given up: 10 s doubling to 10 min between them, about 20
#: minutes in all, long enough for a database or a volume to come back.
RETRIES = Retries(first_seconds=10, max_seconds=600, max_tries=8)
MAX_TRIES = RETRIES.max_tries
#: How long sealing waits at most for the watcher to keep the logs of a cluster run's
#: attempts (it does so right after the change that ended the attempt has committed, before
#: the cluster deletes the pods, so a seal published at that commit may come first), and how
#: often it looks meanwhile. Waiting is not a failed try.
LOG_WAIT = timedelta(minutes=5)
LOG_RECHECK = timedelta(seconds=5)
#: What the record says of an attempt whose log the watcher neither kept nor explained.
LOG_NOT_KEPT = "no log was kept: the portal had not kept it {minutes} minutes after the run ended"


class LogNotKeptYet(Exception):
    """An ended attempt of a cluster run whose log the watcher has not kept yet."""


def request_seal(sender: Any, *, run: Run, event: RunEvent, **_: Any) -> None:
    """``run_ended`` receiver: record that ``run`` must be sealed for the ending ``event``
    recorded, in the caller's transaction; ask a worker once it commits."""
    request = SealRequest.objects.create(
        run=run, terminal_seq=event.seq, attempt_count=run.attempt_count
    )
    transaction.on_commit(lambda: publish(request.pk))


def publish(request_id: int) -> None:
    """Ask a worker to seal now. Failing is fine: the reconciler will."""
    try:
        current_app.send_task(SEAL_TASK, args=(request_id,), retry=False)
    except Exception as exc:  # the broker is down: the request row is the durable record
        logger.warning("could not enqueue seal %s (%s); the reconciler will", request_id, exc)


def due_seals(*, grace_seconds: int = 5, limit: int = 200) -> list[int]:
    """Requests the reconciler should seal now: not sealed, due, unclaimed, and old enough that
    the task published at commit had its chance first."""
    return due(
        SealRequest.objects.unscoped().filter(sealed_at__isnull=True, given_up_at__isnull=True),
        grace_seconds=grace_seconds,
        limit=limit,
    )


def seal(request_id: int) -> bool:
    """Seal one request. True if this call stored the record."""
    request = _claim(request_id)
    if request is None:
        return False
    assert request.claimed_at is not None
    rows = SealRequest.objects.unscoped()
    what = f"seal {request.pk} (run {request.run_id})"
    with Lease(rows, request.pk, request.claimed_at, what=what) as lease:
        try:
            record = _sealed_record(request)
        except LogNotKeptYet as waiting:
            logger.info(
                "run %s (seal %s): %s; looking again in %ds",
                request.run_id,
                request.pk,
                waiting,
                LOG_RECHECK.total_seconds(),
            )
            # Not a failed try: the try this claim counted is given back.
            lease.release(
                tries=request.tries - 1,
                last_error=str(waiting),
                next_try_at=timezone.now() + LOG_RECHECK,
            )
            return False
        except Exception as exc:
            _failed(request, lease, exc)
            return False
        lease.stop()
        with transaction.atomic():
            stored = _store(record)
            SealRequest.objects.unscoped().filter(pk=request.pk).update(
                claimed_at=None, last_error="", sealed_at=record.sealed_at
            )
            if stored:
                # The run page says "verified" once the record, as it exports, has been checked.
                transaction.on_commit(lambda: verification.publish(record.pk))
        return stored


def _failed(request: SealRequest, lease: Lease, exc: Exception) -> None:
    """Record a failed try: tried again after a doubling delay, given up after ``MAX_TRIES``."""
    record_failure(
        lease,
        policy=RETRIES,
        tries=request.tries,
        error=f"{type(exc).__name__}: {exc}"[:2000],
        what=f"sealing the evidence of run {request.run_id} (seal {request.pk})",
        exc_info=exc,
        advice="staff can seal it again from the admin once the cause is fixed",
    )


@transaction.atomic
def seal_again(*, request_ids: list[int], by: Any) -> int:
    """Staff's "Seal again" for requests that were given up (once the cause is fixed): each
    gets ``MAX_TRIES`` new tries, starting now; audited. Returns how many were given up."""
    reopened = list(
        SealRequest.objects.unscoped()
        .select_for_update(of=("self",))
        .select_related("run__workspace")
        .filter(pk__in=request_ids, sealed_at__isnull=True, given_up_at__isnull=False)
    )
    for request in reopened:
        SealRequest.objects.unscoped().filter(pk=request.pk).update(
            given_up_at=None, tries=0, next_try_at=timezone.now(), claimed_at=None
        )
        audit.record(
            action="evidence.seal_again",
            workspace=request.run.workspace,
            object_type="evidence.sealrequest",
            object_id=str(request.pk),
            object_repr=f"evidence of {request.run.name} (event {request.terminal_seq})",
            before={
                "given_up_at": request.given_up_at.isoformat() if request.given_up_at else None,
                "last_error": request.last_error,
            },
            after={"given_up_at": None},
            actor=by,
        )
        transaction.on_commit(partial(publish, request.pk))
    return len(reopened)


def _claim(request_id: int) -> SealRequest | None:
    """The request, claimed for this call (its try counted), or None (sealed or given up
    already, being sealed by a live worker, or waiting out its back-off)."""
    claimed = claim(SealRequest.objects.unscoped(), request_id, settled=_settled)
    return None if isinstance(claimed, Skipped) else claimed


def _settled(request: SealRequest) -> str | None:
    if request.sealed_at is not None:
        return "sealed"
    if request.given_up_at is not None:
        return "given up"
    return None


def _sealed_record(request: SealRequest) -> EvidenceRecord:
    """The record for ``request``, built and signed, not yet stored."""
    run = Run.objects.unscoped().select_related("workspace", "bundle").get(pk=request.run_id)
    terminal = RunEvent.objects.unscoped().get(run=run, seq=request.terminal_seq)
    # What existed when the run ended, not what a resume added since.
    coverage = Coverage(attempt_count=request.attempt_count, event_count=request.terminal_seq)
    log_notes: dict[int, str] = {}
    if run.backend == Backend.KUBERNETES:
        # Ended attempts that ran, whose log the watcher has neither kept nor explained.
        waiting = list(
            run.attempts.filter(
                number__lte=coverage.attempt_count,
                started_at__isnull=False,
                log_path="",
                log_note="",
            ).values_list("number", flat=True)
        )
        if waiting and request.created_at > timezone.now() - LOG_WAIT:
            raise LogNotKeptYet(f"waiting for the log of attempt {', '.join(map(str, waiting))}")
        minutes = int(LOG_WAIT.total_seconds() // 60)
        log_notes = {number: LOG_NOT_KEPT.format(minutes=minutes) for number in waiting}
    sealed_at = timezone.now().replace(microsecond=0)
    manifest = canonical_json(
        build_manifest(
            run, coverage, state=terminal.new_state, sealed_at=sealed_at, log_notes=log_notes
        )
    )
    private_key = keys.signing_key()
    return EvidenceRecord(
        run=run,
        terminal_seq=request.terminal_seq,
        state=terminal.new_state,
        attempt_count=coverage.attempt_count,
        event_count=coverage.event_count,
        manifest=manifest,
        signature=signature_document(private_key, manifest),
        key_id=key_id(public_key_bytes(private_key)),
        sealed_at=sealed_at,
        verify_requested_at=sealed_at,  # checked once stored (``verification``)
    )


def _store(record: EvidenceRecord) -> bool:
    """Insert the record unless one for its ending exists (a lapsed claim raced this one)."""
    try:
        with transaction.atomic():
            record.save()
    except IntegrityError:
        logger.info(
            "run %s: evidence for event %s was sealed already", record.run_id, record.terminal_seq
        )
        return False
    return True
