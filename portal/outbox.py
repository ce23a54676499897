"""What every outbox in TauGrid shares (run deliveries, evidence seals and checks, Kueue syncs,
notifications): a row is claimed by the worker that acts on it, the claim is a short lease the
worker keeps renewing while it works (:class:`Lease`), so that the claim of a worker that died
(kill -9, a lost node, Celery's hard time limit) lapses within ``TAU_CLAIM_LEASE_SECONDS`` and
the next reconcile takes the row over; and a failed try waits twice as long as the one before,
up to a cap.

The rule the outboxes exist for is each app's own: write the row in the transaction of the
change, act on it outside any transaction, record the outcome.

How a claim works
=================

A claim is the row's ``claimed_at``: NULL when no worker holds it, else when its worker last
said it was alive. Taking one (each outbox's own ``_claim``, in a short transaction that locks
that row only) sets it to now; :class:`Lease` then moves it forward every third of the lease
from a small thread for as long as the work runs, each time only if it still holds the value
it wrote last (a conditional update), and the outcome is written by :meth:`Lease.release`
under the same condition. So:

* a live worker's claim never lapses, however long its work takes (a 1 GiB log hashed, a slow
  cluster): ``claim_is_live`` is true while it is renewed;
* a dead worker's claim lapses ``TAU_CLAIM_LEASE_SECONDS`` after its last renewal, and the
  reconciler (every ``TAU_RECONCILE_SECONDS``) takes it over: a row waits at most about the
  sum of the two (15 + 15 s by default), not the Celery time limit;
* a worker that was only frozen (a long pause) and whose claim was taken over meanwhile finds
  its renewal and its release refused: it records nothing, and the worker that took the row
  over records the outcome (no row is closed twice; the actions themselves are idempotent).

Times are the workers' clocks (``timezone.now()``), compared by the reconciler's: keep the
machines' clocks in step (NTP) well within the lease.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, TypeVar

from django.conf import settings
from django.db import connection, connections, transaction
from django.db.models import Model, Q, QuerySet
from django.utils import timezone

logger = logging.getLogger(__name__)


def lease_seconds() -> float:
    """How long a claim holds without being renewed (``TAU_CLAIM_LEASE_SECONDS``)."""
    return float(getattr(settings, "TAU_CLAIM_LEASE_SECONDS", 15))


def renew_seconds() -> float:
    """How often a :class:`Lease` renews its claim: a third of the lease, so that two renewals
    in a row can be late (a loaded machine, a slow database) before the claim lapses."""
    return lease_seconds() / 3


def claim_is_live(claimed_at: datetime | None, now: datetime) -> bool:
    """Whether a worker holds the row now (claimed, and renewed recently enough)."""
    return claimed_at is not None and claimed_at > now - timedelta(seconds=lease_seconds())


def unclaimed_or_lapsed(now: datetime, field: str = "claimed_at") -> Q:
    """The rows no live worker holds, for a reconciler's query (``field``: the claim's
    column, where a model names it otherwise)."""
    lapsed = now - timedelta(seconds=lease_seconds())
    return Q(**{f"{field}__isnull": True}) | Q(**{f"{field}__lt": lapsed})


def due(open_rows: QuerySet[Any], *, grace_seconds: int, limit: int) -> list[int]:
    """The ids of an outbox's rows a reconciler should take now, longest waiting first:
    of ``open_rows`` (those neither done nor given up), the ones due, not claimed by a live
    worker, and older than a short grace period (so a task published right after commit
    gets its chance first)."""
    now = timezone.now()
    return list(
        open_rows.filter(
            next_try_at__lte=now, created_at__lte=now - timedelta(seconds=grace_seconds)
        )
        .filter(unclaimed_or_lapsed(now))
        .order_by("next_try_at")
        .values_list("pk", flat=True)[:limit]
    )


Row = TypeVar("Row", bound=Model)


class Skip(enum.Enum):
    """Why a worker did not take a row (:func:`claim`)."""

    MISSING = "missing"  # no such row (deleted, or never committed)
    LOCKED = "locked"  # another worker is claiming it at this very moment
    SETTLED = "settled"  # nothing is left to do: done, or given up (the outbox says which)
    IN_PROGRESS = "in-progress"  # a live worker holds its claim
    NOT_DUE = "not-due"  # it waits (a retry's back-off, or a first try held back)
    REFUSED = "refused"  # the outbox's own condition (a busy endpoint): it says why


@dataclass(frozen=True)
class Skipped:
    """A claim not taken: the reason, and the outbox's words for it where it has its own
    (which outcome a settled row had, what its own condition found)."""

    reason: Skip
    detail: str = ""


def claim(
    rows: QuerySet[Row],
    pk: int,
    *,
    settled: Callable[[Row], str | None],
    field: str = "claimed_at",
    tries: str | None = "tries",
    due: str | None = "next_try_at",
    lock_of: tuple[str, ...] = (),
    refuse: Callable[[Row, datetime], str | None] | None = None,
    also: Callable[[Row, datetime], list[str]] | None = None,
) -> Row | Skipped:
    """Take the claim on one outbox row for this worker, or say why not: the step every
    outbox starts with, in a short transaction that locks that row only (``SKIP LOCKED``, so
    a worker never waits on another's claim; ``lock_of``: the row's own table, when
    ``rows`` joins others).

    In order: a row gone is ``MISSING``, one another transaction holds is ``LOCKED``; one
    ``settled`` names a word for (done, given up) is ``SETTLED``; one a live worker holds
    (``field``, :func:`claim_is_live`) is ``IN_PROGRESS``; one whose ``due`` time is ahead
    is ``NOT_DUE``; ``refuse`` (the outbox's own condition, in the same transaction) may
    still say no. Otherwise the claim is set to now, the try counted (``tries``), ``also``
    sets what else the outbox records at a claim (it returns the fields it set), and the
    row comes back, claimed: hold it with a :class:`Lease` while working on it."""
    now = timezone.now()
    with transaction.atomic():
        row = rows.select_for_update(skip_locked=True, of=lock_of).filter(pk=pk).first()
        if row is None:
            exists = rows.model._base_manager.filter(pk=pk).exists()
            return Skipped(Skip.LOCKED if exists else Skip.MISSING)
        word = settled(row)
        if word is not None:
            return Skipped(Skip.SETTLED, word)
        if claim_is_live(getattr(row, field), now):
            return Skipped(Skip.IN_PROGRESS)
        if due is not None and getattr(row, due) > now:
            return Skipped(Skip.NOT_DUE)
        if refuse is not None:
            why = refuse(row, now)
            if why is not None:
                return Skipped(Skip.REFUSED, why)
        changed = [field]
        setattr(row, field, now)
        if tries is not None:
            setattr(row, tries, getattr(row, tries) + 1)
            changed.append(tries)
        if also is not None:
            changed.extend(also(row, now))
        row.save(update_fields=changed)
    return row


class Lease:
    """A worker's claim on one outbox row, kept alive while it works on the row.

    ``rows`` is the model's unscoped queryset (``Delivery.objects.unscoped()``), ``pk`` the
    row, ``claimed_at`` the value the claim wrote into the row's ``claimed_at`` (``field``
    names the column where a model calls it otherwise)::

        row = _claim(pk)                      # your short transaction: claimed_at = now
        with Lease(Model.objects.unscoped(), row.pk, row.claimed_at, what=f"seal {pk}") as lease:
            do_the_work(row)                  # outside any transaction, as long as it takes
            lease.release(done_at=timezone.now())   # False: the claim was taken over

    While the block runs, a thread renews the claim every :func:`renew_seconds` (an UPDATE of
    that row only, on its own database connection, conditional on the claim still being this
    one). :meth:`release` stops the renewing and writes the outcome with ``claimed_at`` set
    back to NULL, under the same condition; to write it yourself (in a transaction of yours,
    with other changes), call :meth:`stop` and filter on :meth:`held`. Leaving the block
    without releasing stops the renewing and leaves the claim to lapse (an unexpected error:
    the row is tried again by the reconciler once it has, after its own back-off).

    ``lost`` says that a renewal found the claim taken over (this worker was frozen for longer
    than the lease): the work may go on, but its outcome will not be recorded.
    """

    def __init__(
        self,
        rows: QuerySet[Any],
        pk: int,
        claimed_at: datetime,
        *,
        what: str,
        field: str = "claimed_at",
    ) -> None:
        self._rows = rows
        self._field = field
        self._pk = pk
        self._claimed_at = claimed_at
        self._what = what
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost = False

    @property
    def claimed_at(self) -> datetime:
        """The claim's value in the row now (it moves with each renewal)."""
        return self._claimed_at

    def held(self) -> QuerySet[Any]:
        """The row, if this lease still holds it: filter for a conditional update (after
        :meth:`stop`, so that no renewal moves the claim under it)."""
        return self._rows.filter(pk=self._pk, **{self._field: self._claimed_at})

    def __enter__(self) -> Lease:
        self._thread = threading.Thread(
            target=self._renew_until_stopped, name=f"lease {self._what}", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop renewing (waits for a renewal under way). Safe to call more than once."""
        self._stopping.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def release(self, **fields: Any) -> bool:
        """Stop renewing and write ``fields`` with the claim cleared, if the claim is still
        this lease's. False when it is not (it lapsed and another worker took the row over:
        that worker records the outcome)."""
        self.stop()
        updated = self.held().update(**{self._field: None}, **fields)
        if not updated:
            logger.warning(
                "%s: the claim lapsed while this worker held it; another worker took it over",
                self._what,
            )
        return bool(updated)

    def _renew_until_stopped(self) -> None:
        try:
            while not self._stopping.wait(renew_seconds()):
                if not self._renew():
                    return
        finally:
            # This thread's own connection (Django's are per thread): closed, never leaked.
            connections.close_all()

    def _renew(self) -> bool:
        """Move the claim forward; False once it is not this lease's any more."""
        now = timezone.now()
        try:
            renewed = self.held().update(**{self._field: now})
        except Exception as error:  # the database is away or busy: try again at the next tick
            logger.warning("%s: could not renew the claim (%s); trying again", self._what, error)
            return True
        if not renewed:
            self.lost = True
            logger.warning(
                "%s: the claim was taken over by another worker (this one was too slow to "
                "renew it); its outcome will not be recorded here",
                self._what,
            )
            return False
        self._claimed_at = now
        return True


def doubling_delay(tries: int, *, first_seconds: int, max_seconds: int) -> timedelta:
    """The wait after the ``tries``-th failed try: ``first_seconds`` after the first,
    doubling with each try, at most ``max_seconds``."""
    return timedelta(seconds=min(max_seconds, first_seconds * 2 ** min(max(tries - 1, 0), 30)))


@dataclass(frozen=True)
class Retries:
    """How an outbox tries a row again after a failed try: ``first_seconds`` after the first,
    doubling with each further failure up to ``max_seconds``, and ``max_tries`` tries in
    all: then it gives up (:func:`record_failure`), and says so where someone sees it."""

    first_seconds: int
    max_seconds: int
    max_tries: int

    def delay(self, tries: int) -> timedelta:
        """The wait after the ``tries``-th failed try."""
        return doubling_delay(tries, first_seconds=self.first_seconds, max_seconds=self.max_seconds)

    def next_try(self, tries: int, now: datetime) -> datetime | None:
        """When to try again after the ``tries``-th failed try, or None: give up."""
        return None if tries >= self.max_tries else now + self.delay(tries)


def record_failure(
    lease: Lease,
    *,
    policy: Retries,
    tries: int,
    error: str,
    what: str,
    retry: bool = True,
    retrying: Mapping[str, Any] | None = None,
    giving_up: Mapping[str, Any] | Callable[[datetime], object] | None = None,
    exc_info: BaseException | None = None,
    advice: str = "",
) -> datetime | None:
    """Record a failed try of the row ``lease`` holds, as every outbox does: the row is tried
    again after ``policy``'s wait, or given up after its ``tries``-th try was its last (or at
    once when ``retry`` is false: an error no retry mends). Returns when it is tried again;
    None when it was given up.

    Either way ``last_error`` keeps ``error`` and the log has one line: a warning per retry,
    an error at the give-up (with ``advice``, what a person can do then), the traceback of
    ``exc_info`` only with the first try and the give-up. A retry writes ``next_try_at`` and
    ``retrying``'s fields; a give-up writes ``given_up_at`` (now), or ``giving_up``'s fields
    instead, or, when ``giving_up`` is a function, calls it with the time instead of writing
    anything: the renewing is stopped, and it records the give-up itself through
    ``lease.held()``, in the transaction of whatever else a give-up changes (a run failed)."""
    now = timezone.now()
    retry_at = policy.next_try(tries, now) if retry else None
    if retry_at is not None:
        logger.warning(
            "%s failed, try %d of %d; trying again in %ds: %s",
            what,
            tries,
            policy.max_tries,
            (retry_at - now).total_seconds(),
            error,
            exc_info=exc_info if tries <= 1 else None,
        )
        lease.release(last_error=error, next_try_at=retry_at, **(retrying or {}))
        return retry_at
    said = f"failed {tries} times; giving up" if retry else "failed; not trying it again"
    logger.error(
        "%s %s%s: %s", what, said, f" ({advice})" if advice else "", error, exc_info=exc_info
    )
    if callable(giving_up):
        lease.stop()
        giving_up(now)
    else:
        lease.release(last_error=error, **(giving_up or {"given_up_at": now}))
    return None


class _OnCommit:
    """The on-commit callback for one row (a class, so that one already registered in this
    transaction can be recognised and not registered twice)."""

    def __init__(self, key: str, row_id: int, send: Callable[[int], None]) -> None:
        self.key = key
        self.row_id = row_id
        self.send = send

    def __call__(self) -> None:
        self.send(self.row_id)


def once_on_commit(key: str, row_id: int, send: Callable[[int], None]) -> None:
    """``send(row_id)`` when the transaction commits, once however often it is asked for in
    that transaction (a row folded into three times is published once). ``key`` names the
    outbox, so rows of two outboxes with the same id are told apart."""
    for entry in getattr(connection, "run_on_commit", None) or []:
        # Django keeps (savepoint ids, callback, robust) per registered callback.
        callback = entry[1] if isinstance(entry, tuple) and len(entry) > 1 else None
        if isinstance(callback, _OnCommit) and (callback.key, callback.row_id) == (key, row_id):
            return
    transaction.on_commit(_OnCommit(key, row_id, send))
