"""The portal's own check of a sealed record: the run page's "verified" state.

A record is checked the way anyone would check it offline: its export file is written out
exactly as ``GET …/evidence/`` streams it and read back by ``tau.evidence.verify`` against the
portal's keyring (the current key and every earlier one). So "verified" on the run page
means what ``python -m tau.evidence verify`` would say about a download at that moment — a
log changed on disk, a bundle or an artifact gone, a signature by a key the portal no longer
trusts all show up as problems, named as the verifier names them.

A record is checked once after sealing (the seal task asks, after its commit) and again
whenever someone asks from the run page. The worker checking a record holds a claim on it
(``check_claimed_at``, a lease renewed while the check runs: ``portal.outbox.Lease``), so two
workers never check one record at once; a check asked for and lost (a broker outage, a worker
killed while checking) is picked up by the reconciler once it is ``GRACE`` old and no live
worker holds it — within about half a minute of a killed worker's last renewal.
"""

from __future__ import annotations

import logging
import os
import tempfile
from datetime import timedelta
from pathlib import Path

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from evidence import keys
from evidence.export import FileGone, export_stream
from evidence.models import EvidenceRecord
from portal.outbox import Lease, Skipped, claim, unclaimed_or_lapsed
from tau.evidence import archive
from tau.evidence.keys import key_id, public_key_bytes
from tau.evidence.verify import verify_file

logger = logging.getLogger(__name__)

#: The Celery task that checks one record (``evidence.tasks``), published by name.
VERIFY_TASK = "evidence.tasks.verify"
#: A check asked for this long ago and not done (its task lost) is done by the reconciler,
#: unless a live worker is doing it; the same for a record never checked, after sealing.
GRACE = timedelta(seconds=30)
#: The record's claim column (``portal.outbox.Lease``).
CLAIM_FIELD = "check_claimed_at"


def request_verification(record: EvidenceRecord) -> bool:
    """Ask for a check of ``record``. False when one is already asked for and not done yet
    (asking twice does not check twice: the one asked for is done, by its task or, if that
    was lost, by the reconciler)."""
    now = timezone.now()
    asked = (
        EvidenceRecord.objects.unscoped()
        .filter(pk=record.pk, verify_requested_at__isnull=True)
        .update(verify_requested_at=now)
    )
    if asked:
        record.verify_requested_at = now
        publish(record.pk)
    return bool(asked)


def publish(record_id: int) -> None:
    """Ask a worker to check now. Failing is fine: the reconciler will."""
    try:
        current_app.send_task(VERIFY_TASK, args=(record_id,), retry=False)
    except Exception as exc:  # the broker is down: verify_requested_at is the durable mark
        logger.warning("could not enqueue the check of evidence %s (%s)", record_id, exc)


def due_checks(*, limit: int = 20) -> list[int]:
    """Records the reconciler should check: sealed but never checked, or asked for and not
    done, for at least ``GRACE``, and not being checked by a live worker."""
    now = timezone.now()
    return list(
        EvidenceRecord.objects.unscoped()
        .filter(
            # Sealed before checks were asked for at sealing (older records), given the
            # moment a fresh seal's own request has; or asked for and lost.
            Q(
                verified_at__isnull=True,
                verify_requested_at__isnull=True,
                sealed_at__lte=now - GRACE,
            )
            | Q(verify_requested_at__lte=now - GRACE)
        )
        .filter(unclaimed_or_lapsed(now, CLAIM_FIELD))
        .order_by("sealed_at")
        .values_list("pk", flat=True)[:limit]
    )


def trusted_keys() -> dict[str, bytes]:
    """The keys a record of this portal may be signed with: the current and every earlier."""
    current = public_key_bytes(keys.signing_key())
    return {**keys.previous_public_keys(), key_id(current): current}


def verify(record_id: int) -> list[str] | None:
    """Check one record now and store what was found; the problems (empty: verified), or None
    when it was not checked here (the record no longer exists, or a live worker is checking
    it, or took the check over from this one)."""
    record = _claim(record_id)
    if record is None:
        return None
    assert record.check_claimed_at is not None
    rows = EvidenceRecord.objects.unscoped()
    what = f"check of evidence {record.pk} (run {record.run_id})"
    with Lease(rows, record.pk, record.check_claimed_at, what=what, field=CLAIM_FIELD) as lease:
        started = timezone.now()
        problems = _problems(record)
        if problems:
            logger.warning(
                "evidence of run %s (record %s) does not verify: %s",
                record.run_id,
                record.pk,
                "; ".join(problems),
            )
        lease.stop()
        with transaction.atomic():
            if not lease.release(verified_at=timezone.now(), verification_problems=problems):
                return None
            # A check asked for while this one ran stays asked for: it may have been asked
            # because of a change this check did not see.
            EvidenceRecord.objects.unscoped().filter(
                pk=record.pk, verify_requested_at__lte=started
            ).update(verify_requested_at=None)
    return problems


def _claim(record_id: int) -> EvidenceRecord | None:
    """The record, claimed for this check, or None (gone, or a live worker checks it). A
    check is not counted or backed off: it is asked for again instead."""
    claimed = claim(
        EvidenceRecord.objects.unscoped().select_related("run__workspace"),
        record_id,
        settled=lambda record: None,
        field=CLAIM_FIELD,
        tries=None,
        due=None,
        lock_of=("self",),
    )
    return None if isinstance(claimed, Skipped) else claimed


def _problems(record: EvidenceRecord) -> list[str]:
    root = Path(settings.VAR_DIR) / "evidence-checks"
    root.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=f"record-{record.pk}-", suffix=".tar", dir=root)
    try:
        with os.fdopen(handle, "wb") as out:
            try:
                _length, chunks = export_stream(record)
                for chunk in chunks:
                    out.write(chunk)
            except FileGone as gone:
                return [str(gone)]
            except archive.MemberSizeError as changed:  # it names the member
                return [f"{changed} (changed since it was sealed)"]
        return list(verify_file(name, trusted_keys()).problems)
    finally:
        Path(name).unlink(missing_ok=True)
