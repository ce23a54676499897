"""Sealing: a run that ends gets its evidence record, durably and exactly once per ending.

``request_seal`` runs inside the transaction that moves a run into a terminal state (the
``runs.state.run_ended`` signal) and writes a :class:`SealRequest` keyed by the terminal
event; after commit a Celery task seals it, and the reconciler (Celery beat, ``make run``'s
worker and beat included: the embedded default processes seals the same way as deliveries)
seals whatever a lost task, a down broker or a crash left behind (``due_seals``).

Sealing is three steps, like a delivery, so that no lock is held while files are hashed:

1. *claim* the request (``FOR UPDATE SKIP LOCKED`` of that row only), counting the try;
2. build and sign the manifest outside any transaction (reading a 1 GiB log takes seconds);
3. store the record and close the request in one short transaction.

The record is unique per (run, terminal event): a worker that crashed after step 3's commit
left a closed request; one that crashed before it left nothing, and the next try seals again
(with its own ``sealed_at``). If two workers race past a lapsed claim, the database keeps
the first record and the second one's insert is dropped — never two records for one ending.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from celery import current_app
from django.db import IntegrityError, transaction
from django.utils import timezone

from evidence import keys, verification
from evidence.manifest import Coverage, build_manifest
from evidence.models import EvidenceRecord, SealRequest
from portal.outbox import claim_is_live, doubling_delay, unclaimed_or_lapsed
from runs.models import Backend, Run, RunEvent
from tau.evidence.canonical import canonical_json
from tau.evidence.keys import key_id, public_key_bytes, signature_document

logger = logging.getLogger(__name__)

#: The Celery task that seals one request (``evidence.tasks``), published by name.
SEAL_TASK = "evidence.tasks.seal"
RETRY_FIRST_SECONDS = 10
RETRY_MAX_SECONDS = 600
#: How long sealing waits for the logs of a cluster run's attempts. The Kubernetes watcher
#: keeps an attempt's log right after the change that ended it has committed (before the
#: cluster deletes the pods), so a seal published at that commit may come first; after
#: this long the record is sealed without a log that never came.
LOG_WAIT = timedelta(minutes=5)


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
    now = timezone.now()
    return list(
        SealRequest.objects.unscoped()
        .filter(
            sealed_at__isnull=True,
            next_try_at__lte=now,
            created_at__lte=now - timedelta(seconds=grace_seconds),
        )
        .filter(unclaimed_or_lapsed(now))
        .order_by("next_try_at")
        .values_list("pk", flat=True)[:limit]
    )


def seal(request_id: int) -> bool:
    """Seal one request. True if this call stored the record."""
    request = _claim(request_id)
    if request is None:
        return False
    try:
        record = _sealed_record(request)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:2000]
        delay = doubling_delay(
            request.tries, first_seconds=RETRY_FIRST_SECONDS, max_seconds=RETRY_MAX_SECONDS
        )
        logger.warning(
            "sealing run %s (request %s) failed, try %d; trying again in %ds: %s",
            request.run_id,
            request.pk,
            request.tries,
            delay.total_seconds(),
            error,
            exc_info=exc,
        )
        SealRequest.objects.unscoped().filter(pk=request.pk, claimed_at=request.claimed_at).update(
            claimed_at=None, last_error=error, next_try_at=timezone.now() + delay
        )
        return False
    with transaction.atomic():
        stored = _store(record)
        SealRequest.objects.unscoped().filter(pk=request.pk).update(
            claimed_at=None, last_error="", sealed_at=record.sealed_at
        )
        if stored:
            # The run page says "verified" once the record, as it exports, has been checked.
            transaction.on_commit(lambda: verification.publish(record.pk))
    return stored


def _claim(request_id: int) -> SealRequest | None:
    now = timezone.now()
    with transaction.atomic():
        request = (
            SealRequest.objects.unscoped()
            .select_for_update(skip_locked=True)
            .filter(pk=request_id)
            .first()
        )
        if request is None or request.sealed_at is not None:
            return None
        if claim_is_live(request.claimed_at, now) or request.next_try_at > now:
            return None
        request.tries += 1
        request.claimed_at = now
        request.save(update_fields=["tries", "claimed_at"])
    return request


def _sealed_record(request: SealRequest) -> EvidenceRecord:
    """The record for ``request``, built and signed, not yet stored."""
    run = Run.objects.unscoped().select_related("workspace", "bundle").get(pk=request.run_id)
    terminal = RunEvent.objects.unscoped().get(run=run, seq=request.terminal_seq)
    # What existed when the run ended, not what a resume added since.
    coverage = Coverage(attempt_count=request.attempt_count, event_count=request.terminal_seq)
    if run.backend == Backend.KUBERNETES and request.created_at > timezone.now() - LOG_WAIT:
        waiting = run.attempts.filter(
            number__lte=coverage.attempt_count, started_at__isnull=False, log_path=""
        ).values_list("number", flat=True)
        if waiting:
            raise LogNotKeptYet(f"waiting for the log of attempt {', '.join(map(str, waiting))}")
    sealed_at = timezone.now().replace(microsecond=0)
    manifest = canonical_json(
        build_manifest(run, coverage, state=terminal.new_state, sealed_at=sealed_at)
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
