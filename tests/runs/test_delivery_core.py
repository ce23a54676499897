"""The outbox against the real database (issue 12): every change a backend must act on is a
delivery; the backend is called outside any transaction; a delivery locks its own row only,
and one that delivers nothing says why; one that keeps failing is given up after bounded
tries, failing the run with the backend's own message.

The backend here is a double that records what it is asked and in what circumstances: the
subject is the core's side of the interface, which no real backend could show as plainly
(the local backend's calls are themselves database writes)."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from executors.local.backend import LocalBackend
from portal import outbox
from runs import attempts, delivery, lifecycle
from runs.events import verify_event_chain
from runs.models import (
    Delivery,
    EventKind,
    FailureClass,
    Run,
    RunAttempt,
    RunEvent,
    RunState,
)
from runs.state import transition
from tests.runs.factories import make_run
from workspaces.models import Workspace

pytestmark = pytest.mark.django_db(transaction=True)

RETRY_ON_FAILURE = b"""schema_version: 1
name: flaky
run:
  entrypoint: main.py
  workload_kind: job
compute:
  cpus: 1
  memory: 256Mi
resilience:
  max_retries: 2
  retry_on: [user_error]
  backoff: {initial: 30s, max: 60s}
"""


@dataclass
class Call:
    action: str
    run: str
    attempt: int | None
    in_transaction: bool


class RecordingBackend(LocalBackend):
    """A backend double: records every instruction, whether a transaction was open when it
    came, and fails with ``failure`` when one is set (everything else it answers as this
    machine's backend does)."""

    def __init__(self, failure: str | None = None) -> None:
        self.failure = failure
        self.calls: list[Call] = []

    def submit(self, run: Run, attempt: RunAttempt) -> None:
        self._called("submit", run, attempt.number)

    def cancel(self, run: Run) -> None:
        self._called("cancel", run, None)

    def _called(self, action: str, run: Run, attempt: int | None) -> None:
        self.calls.append(Call(action, run.name, attempt, connection.in_atomic_block))
        if self.failure is not None:
            raise RuntimeError(self.failure)


@pytest.fixture
def published(monkeypatch: Any) -> list[int]:
    """Deliveries published after commit (the test delivers them itself)."""
    ids: list[int] = []
    monkeypatch.setattr(delivery, "publish", ids.append)
    return ids


def deliver_all(run: Run, backend: RecordingBackend) -> list[bool]:
    pending = Delivery.objects.for_workspace(run.workspace_id).filter(
        run=run, delivered_at__isnull=True, given_up_at__isnull=True
    )
    return [
        delivery.deliver(pk, backend_for=lambda _run: backend)
        for pk in pending.order_by("pk").values_list("pk", flat=True)
    ]


def test_the_backend_is_called_outside_any_transaction(world: Any, published: list[int]) -> None:
    backend = RecordingBackend()
    run = make_run(world)
    (handed,) = Delivery.objects.for_workspace(world.alpha).filter(run=run)
    assert published == [handed.pk]  # published once the submission had committed
    assert delivery.deliver(handed.pk, backend_for=lambda _run: backend)
    lifecycle.cancel_run(run=run, user=world.users["researcher"])
    assert deliver_all(run, backend) == [True]
    assert [(c.action, c.attempt) for c in backend.calls] == [("submit", 1), ("cancel", None)]
    assert not any(call.in_transaction for call in backend.calls)
    handed.refresh_from_db()
    assert handed.delivered_at is not None
    assert handed.claimed_at is None
    assert handed.tries == 1


def test_the_attempt_exists_when_the_run_is_handed_over(world: Any, published: list[int]) -> None:
    """Numbered before the backend hears of it (cluster objects carry the number); the local
    agent later starts that attempt instead of making one."""
    run = make_run(world)
    (first,) = RunAttempt.objects.for_workspace(world.alpha).filter(run=run)
    assert (first.number, first.state, run.attempt_count) == (1, RunAttempt.State.WAITING, 1)
    handed = Delivery.objects.for_workspace(world.alpha).get(run=run)
    assert (handed.action, handed.attempt_id) == (Delivery.Action.SUBMIT, first.pk)
    run = transition(run, RunState.QUEUED)
    admitted = attempts.admit_attempt(run=run)
    assert admitted.pk == first.pk
    assert admitted.state == RunAttempt.State.STARTING
    assert RunAttempt.objects.for_workspace(world.alpha).filter(run=run).count() == 1


def test_a_resume_hands_the_backend_its_new_attempt(world: Any, published: list[int]) -> None:
    backend = RecordingBackend()
    run = make_run(world)
    assert deliver_all(run, backend) == [True]
    run = transition(run, RunState.QUEUED)
    attempt = attempts.admit_attempt(run=run)
    attempts.attempt_running(attempt=attempt)
    run = attempts.finish_attempt(attempt=attempt, outcome=attempts.AttemptOutcome(succeeded=True))
    assert run.state == RunState.SUCCEEDED
    before = len(published)

    run = lifecycle.resume_run(run=run, user=world.users["researcher"])
    handed = Delivery.objects.for_workspace(world.alpha).filter(run=run).latest("pk")
    assert (handed.action, handed.delivered_at) == (Delivery.Action.SUBMIT, None)
    assert handed.attempt is not None
    assert (handed.attempt.number, handed.attempt.state) == (2, RunAttempt.State.WAITING)
    assert handed.attempt.retry_reason == "manual_resume"
    assert published[before:] == [handed.pk]
    assert deliver_all(run, backend) == [True]
    assert [(c.action, c.attempt) for c in backend.calls] == [("submit", 1), ("submit", 2)]
    assert not any(call.in_transaction for call in backend.calls)
    assert verify_event_chain(run)


def test_an_automatic_retry_hands_the_backend_its_new_attempt(
    world: Any, published: list[int]
) -> None:
    backend = RecordingBackend()
    run = make_run(world, spec=RETRY_ON_FAILURE)
    assert deliver_all(run, backend) == [True]
    run = transition(run, RunState.QUEUED)
    attempt = attempts.admit_attempt(run=run)
    attempts.attempt_running(attempt=attempt)
    run = attempts.finish_attempt(
        attempt=attempt,
        outcome=attempts.AttemptOutcome(succeeded=False, exit_code=1, failure_class="user_error"),
    )
    assert run.state == RunState.QUEUED
    handed = Delivery.objects.for_workspace(world.alpha).filter(run=run).latest("pk")
    assert handed.action == Delivery.Action.SUBMIT
    assert handed.attempt is not None
    assert (handed.attempt.number, handed.attempt.retry_reason) == (2, "user_error")
    assert published[-1] == handed.pk
    # Handed over once the retry's backoff is over, not before (a cluster would start it).
    assert run.not_before is not None
    assert run.not_before > timezone.now() + timedelta(seconds=20)
    assert handed.next_try_at == run.not_before
    assert deliver_all(run, backend) == [False]
    assert delivery.due_deliveries(grace_seconds=0) == []
    Delivery.objects.for_workspace(world.alpha).filter(pk=handed.pk).update(
        next_try_at=timezone.now()
    )
    assert delivery.due_deliveries(grace_seconds=0) == [handed.pk]
    assert deliver_all(run, backend) == [True]
    assert [(c.action, c.attempt) for c in backend.calls] == [("submit", 1), ("submit", 2)]
    assert not any(call.in_transaction for call in backend.calls)
    # The local agent starts the attempt the retry handed over.
    second = attempts.admit_attempt(run=run)
    assert second.pk == handed.attempt_id


def test_a_backend_that_always_fails_fails_the_run_after_bounded_tries(
    world: Any, published: list[int], settings: Any
) -> None:
    settings.TAU_DELIVERY_MAX_TRIES = 4
    settings.TAU_DELIVERY_RETRY_SECONDS = 10
    settings.TAU_DELIVERY_RETRY_MAX_SECONDS = 25
    backend = RecordingBackend(failure="the API server said: namespace tau-alpha not found")
    run = make_run(world)
    handed = Delivery.objects.for_workspace(world.alpha).get(run=run)
    waits = []
    for tries in range(1, 5):
        started = timezone.now()
        assert not delivery.deliver(handed.pk, backend_for=lambda _run: backend)
        handed.refresh_from_db()
        assert handed.tries == tries
        assert handed.claimed_at is None
        assert "namespace tau-alpha not found" in handed.last_error
        if tries < 4:
            waits.append(round((handed.next_try_at - started).total_seconds()))
            assert handed.given_up_at is None
            # Not due yet: a duplicate task does not try early.
            assert not delivery.deliver(handed.pk, backend_for=lambda _run: backend)
            assert len(backend.calls) == tries
            assert handed.pk not in delivery.due_deliveries(grace_seconds=0)
            # Time passes.
            Delivery.objects.for_workspace(world.alpha).filter(pk=handed.pk).update(
                next_try_at=timezone.now() - timedelta(seconds=1)
            )
            assert handed.pk in delivery.due_deliveries(grace_seconds=0)
    assert waits == [10, 20, 25]  # doubling, capped
    assert handed.given_up_at is not None
    run.refresh_from_db()
    assert run.state == RunState.FAILED
    assert run.failure_class == FailureClass.INFRASTRUCTURE
    assert "the API server said: namespace tau-alpha not found" in run.state_reason
    (attempt,) = RunAttempt.objects.for_workspace(world.alpha).filter(run=run)
    assert attempt.state == RunAttempt.State.FAILED
    assert attempt.failure_class == FailureClass.INFRASTRUCTURE
    assert "namespace tau-alpha not found" in attempt.failure_message
    last = RunEvent.objects.for_workspace(world.alpha).filter(run=run).latest("seq")
    assert last.kind == EventKind.DELIVERY_FAILED
    assert verify_event_chain(run)

    # Nothing is tried after that: not by the reconciler, not by a late duplicate task.
    assert handed.pk not in delivery.due_deliveries(grace_seconds=0)
    assert not delivery.deliver(handed.pk, backend_for=lambda _run: backend)
    assert len(backend.calls) == 4
    assert not any(call.in_transaction for call in backend.calls)

    # The run page says what the backend said.
    page = world.client_for("researcher").get(f"/w/alpha/runs/{run.name}/").content.decode()
    assert "namespace tau-alpha not found" in page
    assert "Could not start" in page  # the infrastructure class, in words


class RowLocks:
    """Rows locked by another connection, as a concurrent transition or claim holds them,
    until the block ends."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self.held = threading.Event()
        self.release = threading.Event()
        self.thread = threading.Thread(target=self._hold)

    def _hold(self) -> None:
        try:
            with transaction.atomic():
                self.lock()
                self.held.set()
                self.release.wait(30)
        finally:
            close_old_connections()
            connection.close()

    def __enter__(self) -> RowLocks:
        self.thread.start()
        assert self.held.wait(10)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release.set()
        self.thread.join(10)


def test_a_delivery_locks_its_own_row_only(world: Any, published: list[int]) -> None:
    """Every transition locks the run (and reads the workspace with it): a delivery that
    locked those rows too was skipped whenever any of them was busy, and waited for the
    reconciler."""
    backend = RecordingBackend()
    run = make_run(world)
    handed = Delivery.objects.for_workspace(world.alpha).get(run=run)

    def lock_run_and_workspace() -> None:
        Run.objects.unscoped().select_for_update().get(pk=run.pk)
        Workspace.objects.unscoped().select_for_update().get(pk=world.alpha.pk)

    with RowLocks(lock_run_and_workspace):
        assert delivery.deliver(handed.pk, backend_for=lambda _run: backend)
    assert len(backend.calls) == 1


@pytest.fixture
def counted() -> dict[str, int]:
    """The skipped-delivery counters before the test (they are shared, not per test)."""
    return delivery.skipped_counts()


def test_a_skipped_delivery_says_why(
    world: Any, published: list[int], caplog: Any, counted: dict[str, int]
) -> None:
    backend = RecordingBackend()
    run = make_run(world)
    handed = Delivery.objects.for_workspace(world.alpha).get(run=run)
    caplog.set_level(logging.INFO, logger="runs.delivery")

    def lock_delivery() -> None:
        Delivery.objects.unscoped().select_for_update().get(pk=handed.pk)

    with RowLocks(lock_delivery):
        assert not delivery.deliver(handed.pk, backend_for=lambda _run: backend)
    assert f"delivery {handed.pk} skipped: another worker is claiming it" in caplog.text

    # Claimed by a worker that is calling the backend right now.
    Delivery.objects.for_workspace(world.alpha).filter(pk=handed.pk).update(
        claimed_at=timezone.now()
    )
    assert not delivery.deliver(handed.pk, backend_for=lambda _run: backend)
    assert "another worker is delivering it (in-progress)" in caplog.text
    assert handed.pk not in delivery.due_deliveries(grace_seconds=0)
    assert backend.calls == []

    # A claim whose worker died lapses; the reconciler takes it over.
    Delivery.objects.for_workspace(world.alpha).filter(pk=handed.pk).update(
        claimed_at=timezone.now() - timedelta(seconds=outbox.lease_seconds() + 1)
    )
    assert handed.pk in delivery.due_deliveries(grace_seconds=0)
    assert delivery.deliver(handed.pk, backend_for=lambda _run: backend)
    assert not delivery.deliver(handed.pk, backend_for=lambda _run: backend)
    assert "it was delivered already (delivered)" in caplog.text
    now = delivery.skipped_counts()
    for reason in ("locked", "in-progress", "delivered"):
        assert now[reason] == counted[reason] + 1, reason


def test_a_submit_the_run_has_moved_past_is_not_made(world: Any, published: list[int]) -> None:
    """Cancelled before it was handed over: the backend is told to cancel, never to start."""
    backend = RecordingBackend()
    run = make_run(world)
    lifecycle.cancel_run(run=run, user=world.users["researcher"])
    run.refresh_from_db()
    assert run.state == RunState.CANCELLED
    (first,) = RunAttempt.objects.for_workspace(world.alpha).filter(run=run)
    assert first.state == RunAttempt.State.CANCELLED  # it never started, and never will
    assert deliver_all(run, backend) == [False, True]
    assert [call.action for call in backend.calls] == ["cancel"]
    assert (
        not Delivery.objects.for_workspace(world.alpha)
        .filter(run=run, delivered_at__isnull=True)
        .exists()
    )
