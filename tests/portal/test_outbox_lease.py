"""The guarantees of ``portal.outbox.Lease``, the claim every outbox holds while it works
(deliveries, seals, checks, Kueue syncs): renewed, a claim stays live however long the work
takes; a dead worker's lapses within the lease; a claim taken over from a worker that was only
frozen is neither renewed nor closed by it. Timed with a 3 s lease (renewed every second)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.utils import timezone

from portal import outbox
from runs.models import Delivery
from tests.runs.factories import make_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def claimed(world: Any, settings: Any) -> Delivery:
    """A delivery claimed by "this worker" now, with a 3 s lease."""
    settings.TAU_CLAIM_LEASE_SECONDS = 3
    row = Delivery.objects.unscoped().get(run=make_run(world))
    row.claimed_at = timezone.now()
    row.save(update_fields=["claimed_at"])
    return row


def lapsed(pk: int) -> bool:
    return (
        Delivery.objects.unscoped()
        .filter(pk=pk)
        .filter(outbox.unclaimed_or_lapsed(timezone.now()))
        .exists()
    )


def lease_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("lease ")]


def test_a_renewed_claim_outlives_the_lease_and_is_released_with_the_outcome(
    claimed: Delivery,
) -> None:
    rows = Delivery.objects.unscoped()
    with outbox.Lease(rows, claimed.pk, claimed.claimed_at, what="test") as lease:  # type: ignore[arg-type]
        time.sleep(outbox.lease_seconds() * 1.5)  # longer than the lease: renewed meanwhile
        assert not lapsed(claimed.pk)
        assert lease.claimed_at > claimed.claimed_at  # type: ignore[operator]
        assert lease.release(last_error="done")
    row = rows.get(pk=claimed.pk)
    assert (row.claimed_at, row.last_error) == (None, "done")
    assert not lease.lost
    assert lease_threads() == []  # stopped, its connection closed


def test_a_claim_left_without_release_lapses_after_the_lease(claimed: Delivery) -> None:
    rows = Delivery.objects.unscoped()
    with outbox.Lease(rows, claimed.pk, claimed.claimed_at, what="test"):  # type: ignore[arg-type]
        pass  # the work raised, say: nothing recorded, nothing renewed any more
    assert lease_threads() == []
    assert not lapsed(claimed.pk)
    time.sleep(outbox.lease_seconds() + 0.5)
    assert lapsed(claimed.pk)  # the reconciler takes it over now


def test_a_claim_taken_over_is_neither_renewed_nor_closed_by_its_first_worker(
    claimed: Delivery,
) -> None:
    rows = Delivery.objects.unscoped()
    with outbox.Lease(rows, claimed.pk, claimed.claimed_at, what="test") as lease:  # type: ignore[arg-type]
        # This worker was frozen; its claim lapsed and another worker claimed the row.
        theirs = timezone.now()
        rows.filter(pk=claimed.pk).update(claimed_at=theirs)
        time.sleep(outbox.renew_seconds() * 1.5)
        assert lease.lost
        assert not lease.release(delivered_at=timezone.now())
    row = rows.get(pk=claimed.pk)
    assert (row.claimed_at, row.delivered_at) == (theirs, None)  # the other worker's to close
