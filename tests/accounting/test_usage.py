"""GPU-, CPU- and memory-hours from attempts: retries and preemptions count (and are shown
apart), months and days are cut in the accounting time zone, running attempts count to now."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest

from runs import accounting
from runs.accounting import Outcome, Period
from runs.models import RunAttempt
from tests.accounting.helpers import CPU_SPEC, PREEMPTED, USER_ERROR, attempt_at, gpu_run
from tests.runs.factories import cluster_quota, make_run

pytestmark = pytest.mark.django_db

DEC = Period(2026, 12)


@pytest.fixture(autouse=True)
def _gpus_here(settings: Any) -> None:
    settings.TAU_LOCAL_GPUS = 8
    settings.TAU_LOCAL_CPUS = 64
    settings.TAU_LOCAL_MEMORY = "512Gi"
    settings.TAU_ACCOUNTING_TIME_ZONE = "UTC"


def at(day: int, hour: int, minute: int = 0, month: int = 12) -> datetime:
    return datetime(2026, month, day, hour, minute, tzinfo=UTC)


def test_retries_and_preemption_all_count_and_are_shown_apart(world: Any) -> None:
    run = gpu_run(world)  # 2 GPUs x 2 workers = 4 GPUs, 8 CPUs, 32 GiB
    attempt_at(run, 1, at(3, 10), at(3, 11), **PREEMPTED)  # 1 h preempted
    attempt_at(run, 2, at(3, 12), at(3, 12, 30), **USER_ERROR)  # 30 min failed
    attempt_at(run, 3, at(3, 13), at(3, 15))  # 2 h succeeded

    usage = accounting.usage_in(DEC, workspace_ids=[world.alpha.pk], now=at(20, 0))

    assert usage.total.gpu_hours == pytest.approx(4 * 3.5)
    assert usage.total.cpu_hours == pytest.approx(8 * 3.5)
    assert usage.total.memory_gib_hours == pytest.approx(32 * 3.5)
    assert usage.by_outcome[Outcome.PREEMPTED].gpu_hours == pytest.approx(4.0)
    assert usage.by_outcome[Outcome.FAILED].gpu_hours == pytest.approx(2.0)
    assert usage.by_outcome[Outcome.SUCCEEDED].gpu_hours == pytest.approx(8.0)
    assert usage.lost().gpu_hours == pytest.approx(6.0)
    assert dict(usage.by_user)["rob"].gpu_hours == pytest.approx(14.0)
    # A local run is on the machine's flavor.
    assert list(usage.by_flavor) == ["local"]


def test_attribution_by_user_and_kueue_flavor(world: Any, settings: Any) -> None:
    settings.TAU_BACKEND = "kubernetes"
    cluster_quota(world.alpha)
    mine = gpu_run(world)
    theirs = gpu_run(world, who="workspace_admin")
    for run in (mine, theirs):
        run.backend = "kubernetes"
        run.save(update_fields=["backend"])
    attempt_at(mine, 1, at(5, 0), at(5, 1), flavors={"nvidia.com/gpu": "h100", "cpu": "cpu"})
    attempt_at(theirs, 1, at(5, 0), at(5, 3), flavors={"nvidia.com/gpu": "a100", "cpu": "cpu"})

    usage = accounting.usage_in(DEC, workspace_ids=[world.alpha.pk], now=at(20, 0))

    assert usage.by_user["rob"].gpu_hours == pytest.approx(4.0)
    assert usage.by_user["alice"].gpu_hours == pytest.approx(12.0)
    assert usage.by_flavor["h100"].gpu_hours == pytest.approx(4.0)
    assert usage.by_flavor["a100"].gpu_hours == pytest.approx(12.0)


def test_a_cpu_run_uses_no_gpu_hours(world: Any) -> None:
    run = make_run(world, spec=CPU_SPEC)
    attempt_at(run, 1, at(2, 8), at(2, 10))
    usage = accounting.usage_in(DEC, workspace_ids=[world.alpha.pk], now=at(20, 0))
    assert usage.total.gpu_hours == 0
    assert usage.total.cpu_hours == pytest.approx(4.0)


def test_an_attempt_across_a_month_end_is_split(world: Any) -> None:
    run = gpu_run(world)
    attempt_at(run, 1, at(30, 23, month=11), at(1, 1))  # 1 h in November, 1 h in December

    november = accounting.usage_in(Period(2026, 11), workspace_ids=[world.alpha.pk], now=at(20, 0))
    december = accounting.usage_in(DEC, workspace_ids=[world.alpha.pk], now=at(20, 0))

    assert november.total.gpu_hours == pytest.approx(4.0)
    assert december.total.gpu_hours == pytest.approx(4.0)
    assert sorted(november.by_day_user) == [date(2026, 11, 30)]
    assert sorted(december.by_day_user) == [date(2026, 12, 1)]


def test_months_and_days_are_the_accounting_time_zones(world: Any, settings: Any) -> None:
    """In Berlin (UTC+1 in winter) December starts at 23:00 UTC on 30 November: the same
    attempt is all December's there, and its day is the 1st."""
    settings.TAU_ACCOUNTING_TIME_ZONE = "Europe/Berlin"
    run = gpu_run(world)
    attempt_at(run, 1, at(30, 23, month=11), at(1, 1))

    november = accounting.usage_in(Period(2026, 11), workspace_ids=[world.alpha.pk], now=at(20, 0))
    december = accounting.usage_in(DEC, workspace_ids=[world.alpha.pk], now=at(20, 0))

    assert november.total.gpu_hours == 0
    assert december.total.gpu_hours == pytest.approx(8.0)
    assert sorted(december.by_day_user) == [date(2026, 12, 1)]
    assert Period(2026, 12).start == datetime(2026, 11, 30, 23, tzinfo=UTC)


def test_an_attempt_over_midnight_is_split_between_days(world: Any) -> None:
    run = gpu_run(world)
    attempt_at(run, 1, at(4, 22), at(5, 1))
    usage = accounting.usage_in(DEC, workspace_ids=[world.alpha.pk], now=at(20, 0))
    days = {day: users["rob"].gpu_hours for day, users in usage.by_day_user.items()}
    assert days == {date(2026, 12, 4): pytest.approx(8.0), date(2026, 12, 5): pytest.approx(4.0)}


def test_a_running_attempt_counts_up_to_now_and_a_waiting_one_not_at_all(world: Any) -> None:
    running = gpu_run(world)
    attempt_at(running, 1, at(10, 8), None)
    waiting = gpu_run(world)  # its first attempt waits: it never got resources
    assert RunAttempt.objects.unscoped().get(run=waiting).state == RunAttempt.State.WAITING

    usage = accounting.usage_in(DEC, workspace_ids=[world.alpha.pk], now=at(10, 9, 30))

    assert usage.total.gpu_hours == pytest.approx(4 * 1.5)
    assert usage.by_outcome[Outcome.RUNNING].gpu_hours == pytest.approx(6.0)
    assert {use.run_id for use in usage.uses} == {running.pk}


def test_another_workspace_is_not_counted(world: Any) -> None:
    run = gpu_run(world)
    attempt_at(run, 1, at(3, 0), at(3, 1))
    assert accounting.usage_in(DEC, workspace_ids=[world.beta.pk], now=at(20, 0)).uses == []
    everyone = accounting.usage_in(DEC, workspace_ids=None, now=at(20, 0))
    assert everyone.by_workspace[world.alpha.pk].gpu_hours == pytest.approx(4.0)


def test_a_future_month_is_empty_and_a_malformed_one_refused() -> None:
    assert accounting.usage_in(Period(2027, 3), workspace_ids=None, now=at(20, 0)).uses == []
    for text in ("2026-13", "2026-1", "december", "2026-12-01", "", "9999-12", "1999-12"):
        with pytest.raises(accounting.MonthRefused, match="YYYY-MM"):
            Period.parse(text)
    assert Period.parse("2026-12").previous() == Period(2026, 11)
    assert Period.parse("2026-01").previous() == Period(2025, 12)
    assert Period.parse("2026-12").next() == Period(2027, 1)
    assert len(Period(2026, 2).days()) == 28


def test_admission_is_stamped_when_the_backend_admits(world: Any) -> None:
    """admit_attempt records admission (Kueue's time when given, never before the attempt
    existed nor in the future); the accounting counts from it."""
    from runs.attempts import admit_attempt
    from runs.models import RunState
    from runs.state import transition

    run = make_run(world, spec=CPU_SPEC)
    transition(run, RunState.QUEUED, reason="test")
    attempt = RunAttempt.objects.unscoped().get(run=run)
    created = attempt.created_at - timedelta(hours=1)
    RunAttempt.objects.unscoped().filter(pk=attempt.pk).update(created_at=created)
    kueue_says = created + timedelta(minutes=10)
    admitted = admit_attempt(run=run, admitted_at=kueue_says)
    admitted.refresh_from_db()
    assert admitted.admitted_at == kueue_says
    assert admitted.state == RunAttempt.State.STARTING


@pytest.mark.parametrize("skew", ["before it existed", "in the future"])
def test_an_admission_time_out_of_bounds_is_clamped(world: Any, skew: str) -> None:
    from django.utils import timezone

    from runs.attempts import admit_attempt
    from runs.models import RunState
    from runs.state import transition

    run = make_run(world, spec=CPU_SPEC)
    transition(run, RunState.QUEUED, reason="test")
    attempt = RunAttempt.objects.unscoped().get(run=run)
    said = (
        attempt.created_at - timedelta(days=1)
        if skew == "before it existed"
        else timezone.now() + timedelta(days=1)
    )
    before = timezone.now()
    admitted = admit_attempt(run=run, admitted_at=said)
    admitted.refresh_from_db()
    assert admitted.admitted_at is not None
    if skew == "before it existed":
        assert admitted.admitted_at == attempt.created_at
    else:
        assert before <= admitted.admitted_at <= timezone.now()
