"""One mechanism for every outbox: run deliveries, notifications, seals, evidence checks and
Kueue syncs all take a row with ``portal.outbox.claim`` and try a failed one again by a
``portal.outbox.Retries`` policy, and each guarantee is checked here on each of them, on real
rows in the real database:

- a due row is taken by one worker, its try counted; while that claim is live nobody else
  takes it, and once it has lapsed (a dead worker) the next one does;
- a row another transaction is claiming is skipped at once, never waited for;
- a settled row (done, or given up) and a row waiting out its back-off are not taken;
- a row that does not exist is said to be missing, and nothing is written;
- a failed row is tried again after a doubling wait, capped, and given up after a bounded
  number of tries; every failed try is recorded the same way (``portal.outbox.record_failure``:
  its error kept, the claim released, the next try's time set) and the last one gives the row
  up where people see it: the run failed, the notification and the seal marked given up, the
  sync failed (the pages showing those are each outbox's own tests).

The lease that keeps a claim alive while the work runs is ``test_outbox_lease.py``'s.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from itertools import pairwise
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models import Model
from django.utils import timezone

from evidence import sealing, verification
from evidence.models import EvidenceRecord, SealRequest
from executors.kubernetes import kueue_sync
from executors.kubernetes.kueue_cluster import SyncProblem
from notifications import delivery as notification_delivery
from notifications.models import NotificationDelivery
from portal import outbox
from runs import delivery as run_delivery
from runs.models import Delivery, Run, RunState
from tests.runs.factories import make_run
from workspaces.models import KueueSync

# Each test in a transaction rolled back at its end, as the database tier's tests are; the
# test of a row another worker is claiming commits (transaction=True, the tables emptied
# after it): the worker holding the row is another thread on its own connection.
pytestmark = pytest.mark.django_db


@dataclass(frozen=True)
class Outbox:
    """One outbox as these tests drive it: a due row, its claim, how it becomes settled, and
    its retry policy (None: a row is asked for again, not retried)."""

    model: type[Model]
    make: Callable[[Any], int]
    take: Callable[[int], object]
    field: str = "claimed_at"
    tries: str | None = "tries"
    due: str | None = "next_try_at"
    settle: dict[str, Callable[[], object]] | None = None
    retries: Callable[[], outbox.Retries] | None = None
    #: The outbox's own record of a failed try (the row, its lease, the error), and what
    #: shows that it gave the row up.
    fail: Callable[[Any, outbox.Lease, Exception], None] | None = None
    given_up: Callable[[Any], bool] | None = None

    def rows(self) -> Any:
        return self.model._base_manager.all()


def _run_delivery(world: Any) -> int:
    return Delivery.objects.unscoped().get(run=make_run(world)).pk


def _notification(world: Any) -> int:
    return NotificationDelivery.objects.create(
        workspace=world.alpha, channel="email", user=world.users["researcher"], event="run.failed"
    ).pk


def _seal(world: Any) -> int:
    return SealRequest.objects.create(run=make_run(world), terminal_seq=1, attempt_count=1).pk


def _check(world: Any) -> int:
    return EvidenceRecord.objects.create(
        run=make_run(world),
        terminal_seq=1,
        state="succeeded",
        attempt_count=1,
        event_count=1,
        manifest=b"{}",
        signature=b"{}",
        key_id="test",
        sealed_at=timezone.now(),
        verify_requested_at=timezone.now(),
    ).pk


def _kueue_sync(world: Any) -> int:
    return KueueSync.objects.create(
        scope=KueueSync.Scope.WORKSPACE, workspace_slug=world.alpha.slug
    ).pk


OUTBOXES = {
    "run delivery": Outbox(
        Delivery,
        _run_delivery,
        run_delivery._claim,
        settle={"delivered_at": timezone.now, "given_up_at": timezone.now},
        retries=run_delivery.retries,
        fail=lambda row, lease, exc: run_delivery._failed(row, lease, row.run, exc),
        given_up=lambda row: (
            row.given_up_at is not None
            and Run.objects.unscoped().get(pk=row.run_id).state == RunState.FAILED
        ),
    ),
    "notification": Outbox(
        NotificationDelivery,
        _notification,
        notification_delivery._claim,
        settle={"delivered_at": timezone.now, "given_up_at": timezone.now},
        retries=notification_delivery.retries,
        fail=lambda row, lease, exc: notification_delivery._failed(
            row, lease, str(exc), status_code=503
        ),
        given_up=lambda row: row.given_up_at is not None and row.status == "given up",
    ),
    "seal": Outbox(
        SealRequest,
        _seal,
        sealing._claim,
        settle={"sealed_at": timezone.now, "given_up_at": timezone.now},
        retries=lambda: sealing.RETRIES,
        fail=sealing._failed,
        given_up=lambda row: row.given_up_at is not None,
    ),
    # A check is asked for again rather than retried: no tries, no back-off, nothing settles.
    "evidence check": Outbox(
        EvidenceRecord,
        _check,
        verification._claim,
        field=verification.CLAIM_FIELD,
        tries=None,
        due=None,
    ),
    "kueue sync": Outbox(
        KueueSync,
        _kueue_sync,
        kueue_sync._claim,
        tries="attempts",
        settle={"state": lambda: KueueSync.State.SYNCED},
        retries=kueue_sync.retries,
        fail=lambda row, lease, exc: kueue_sync._failed(
            row, lease, SyncProblem(str(exc), retry=True)
        ),
        given_up=lambda row: row.state == KueueSync.State.FAILED,
    ),
}
EVERY = pytest.mark.parametrize("name", sorted(OUTBOXES))
SETTLED = [
    (name, field) for name, box in sorted(OUTBOXES.items()) for field in sorted(box.settle or {})
]
WITH_BACK_OFF = sorted(name for name, box in OUTBOXES.items() if box.due is not None)


def taken(box: Outbox, result: object) -> bool:
    return isinstance(result, box.model)


@EVERY
def test_a_due_row_is_taken_once_with_its_try_counted(world: Any, name: str) -> None:
    box = OUTBOXES[name]
    pk = box.make(world)
    before = box.rows().get(pk=pk)
    first = box.take(pk)
    assert taken(box, first), first
    row = box.rows().get(pk=pk)
    assert getattr(row, box.field) is not None
    if box.tries is not None:
        assert getattr(row, box.tries) == getattr(before, box.tries) + 1
    # While that claim is live, nobody takes the row, and nothing about it changes.
    second = box.take(pk)
    assert not taken(box, second), second
    again = box.rows().get(pk=pk)
    assert getattr(again, box.field) == getattr(row, box.field)
    if box.tries is not None:
        assert getattr(again, box.tries) == getattr(row, box.tries)


@EVERY
def test_a_claim_a_dead_worker_left_is_taken_over_once_it_lapsed(
    world: Any, name: str, settings: Any
) -> None:
    box = OUTBOXES[name]
    pk = box.make(world)
    settings.TAU_CLAIM_LEASE_SECONDS = 15
    box.rows().filter(pk=pk).update(**{box.field: timezone.now() - timedelta(seconds=10)})
    assert not taken(box, box.take(pk))  # renewed 10 s ago: alive
    box.rows().filter(pk=pk).update(**{box.field: timezone.now() - timedelta(seconds=16)})
    assert taken(box, box.take(pk))  # lapsed: its worker died


@EVERY
@pytest.mark.django_db(transaction=True)
def test_a_row_another_worker_is_claiming_is_skipped_not_waited_for(world: Any, name: str) -> None:
    box = OUTBOXES[name]
    pk = box.make(world)
    locked, done = threading.Event(), threading.Event()

    def hold_the_row() -> None:
        try:
            with transaction.atomic():
                box.rows().select_for_update().get(pk=pk)
                locked.set()
                done.wait(30)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_row)
    holder.start()
    try:
        assert locked.wait(30)
        # Waiting on the lock would hang here until ``done`` (the test's timeout, at worst).
        result = box.take(pk)
    finally:
        done.set()
        holder.join()
    assert not taken(box, result), result
    assert getattr(box.rows().get(pk=pk), box.field) is None


@pytest.mark.parametrize(("name", "field"), SETTLED)
def test_a_settled_row_is_never_taken(world: Any, name: str, field: str) -> None:
    box = OUTBOXES[name]
    assert box.settle is not None
    pk = box.make(world)
    box.rows().filter(pk=pk).update(**{field: box.settle[field]()})
    assert not taken(box, box.take(pk))
    assert getattr(box.rows().get(pk=pk), box.field) is None


@pytest.mark.parametrize("name", WITH_BACK_OFF)
def test_a_row_waiting_out_its_back_off_is_not_taken_before_its_time(world: Any, name: str) -> None:
    box = OUTBOXES[name]
    assert box.due is not None
    pk = box.make(world)
    box.rows().filter(pk=pk).update(**{box.due: timezone.now() + timedelta(minutes=5)})
    assert not taken(box, box.take(pk))
    assert getattr(box.rows().get(pk=pk), box.field) is None
    box.rows().filter(pk=pk).update(**{box.due: timezone.now() - timedelta(seconds=1)})
    assert taken(box, box.take(pk))


@EVERY
def test_a_row_that_does_not_exist_is_missing(world: Any, name: str) -> None:
    box = OUTBOXES[name]
    pk = box.make(world)
    box.rows().filter(pk=pk).delete()
    assert not taken(box, box.take(pk))


RETRYING = sorted(name for name, box in OUTBOXES.items() if box.retries is not None)


@pytest.mark.parametrize("name", RETRYING)
def test_a_failed_row_waits_longer_each_time_and_is_given_up_after_its_last_try(
    name: str,
) -> None:
    retries = OUTBOXES[name].retries
    assert retries is not None
    policy = retries()
    assert 1 < policy.max_tries < 100
    now = timezone.now()
    waits = [policy.next_try(tries, now) for tries in range(1, policy.max_tries)]
    assert None not in waits
    delays = [(wait - now).total_seconds() for wait in waits if wait is not None]
    assert delays[0] == policy.first_seconds
    for before, after in pairwise(delays):
        assert after == min(2 * before, policy.max_seconds)
    assert max(delays) <= policy.max_seconds
    # The last try, and any counted beyond it (a row taken over after its last claim lapsed).
    assert policy.next_try(policy.max_tries, now) is None
    assert policy.next_try(policy.max_tries + 3, now) is None


@pytest.mark.parametrize("name", RETRYING)
def test_every_failed_try_is_recorded_and_the_last_gives_the_row_up_where_people_see_it(
    world: Any, name: str
) -> None:
    box = OUTBOXES[name]
    assert box.retries is not None
    assert box.fail is not None
    assert box.given_up is not None
    policy = box.retries()
    pk = box.make(world)
    for number in range(1, policy.max_tries + 1):
        row = box.take(pk)
        assert taken(box, row), f"try {number}: {row}"
        claimed_at = getattr(row, box.field)
        with outbox.Lease(box.rows(), pk, claimed_at, what=f"{name} {pk}") as lease:
            started = timezone.now()
            box.fail(row, lease, RuntimeError(f"the far end said no, time {number}"))
        after = box.rows().get(pk=pk)
        assert getattr(after, box.field) is None  # the claim is released with the record
        assert f"the far end said no, time {number}" in after.last_error
        if number < policy.max_tries:
            assert not box.given_up(after), f"given up after try {number}"
            assert after.next_try_at >= started + policy.delay(number)
            assert not taken(box, box.take(pk))  # it waits out its back-off
            box.rows().filter(pk=pk).update(next_try_at=timezone.now() - timedelta(seconds=1))
    given_up = box.rows().get(pk=pk)
    assert box.given_up(given_up)
    assert not taken(box, box.take(pk))  # never taken again by itself


def test_the_policies_read_their_settings(settings: Any) -> None:
    settings.TAU_DELIVERY_RETRY_SECONDS = 3
    settings.TAU_DELIVERY_RETRY_MAX_SECONDS = 7
    settings.TAU_DELIVERY_MAX_TRIES = 5
    assert run_delivery.retries() == outbox.Retries(first_seconds=3, max_seconds=7, max_tries=5)
    assert [run_delivery.retry_delay(tries).total_seconds() for tries in (1, 2, 3)] == [3, 6, 7]


def test_the_claim_says_why_it_took_nothing(world: Any) -> None:
    """The reasons themselves, on the run outbox's rows: the words each outbox logs and
    counts come from these."""
    rows = Delivery.objects.unscoped()
    pk = _run_delivery(world)

    def settled(row: Delivery) -> str | None:
        return "delivered" if row.delivered_at else None

    assert isinstance(outbox.claim(rows, pk, settled=settled), Delivery)
    assert outbox.claim(rows, pk, settled=settled) == outbox.Skipped(outbox.Skip.IN_PROGRESS)
    rows.filter(pk=pk).update(claimed_at=None, next_try_at=timezone.now() + timedelta(hours=1))
    assert outbox.claim(rows, pk, settled=settled) == outbox.Skipped(outbox.Skip.NOT_DUE)
    refused = outbox.claim(rows, pk, settled=settled, due=None, refuse=lambda row, now: "busy")
    assert refused == outbox.Skipped(outbox.Skip.REFUSED, "busy")
    rows.filter(pk=pk).update(delivered_at=timezone.now())
    assert outbox.claim(rows, pk, settled=settled) == outbox.Skipped(
        outbox.Skip.SETTLED, "delivered"
    )
    assert outbox.claim(rows, pk + 10_000, settled=settled) == outbox.Skipped(outbox.Skip.MISSING)
    assert rows.get(pk=pk).tries == 1
