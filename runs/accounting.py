"""What runs used: GPU-, CPU- and memory-seconds per attempt, and totals over a period.

An attempt uses its resources from its admission (Kueue's admission time on a cluster, the
local agent's on one machine) to its end; one still holding them counts up to now. Every
attempt that got resources counts — a preempted or failed one used the hardware too — and
how it ended is kept, so pages can show that waste apart. Amounts are what the run asked
for (``runs.policy.requested_totals``; on a cluster with a RayJob's head and submitter, as
Kueue reserves them), on the flavor Kueue assigned (the machine's flavor locally).

Periods are cut in ``TAU_ACCOUNTING_TIME_ZONE``: a month or a day is the calendar's there,
so an attempt that runs across midnight or a month's end is split between the two.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from runs.models import Backend, FailureClass, RunAttempt
from runs.policy import run_totals
from tau.k8s_names import GPU_RESOURCE
from tau.spec import spec_from_dict

GIB = Decimal(2**30)


class Outcome(enum.StrEnum):
    """How an attempt that used resources ended, as the usage pages group it."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"  # preempted or evicted by the platform
    CANCELLED = "cancelled"


#: The outcomes whose hours bought nothing the run keeps (unless it checkpointed).
LOST = frozenset({Outcome.FAILED, Outcome.PREEMPTED})


def accounting_zone() -> ZoneInfo:
    return ZoneInfo(settings.TAU_ACCOUNTING_TIME_ZONE)


class MonthRefused(ValueError):
    """A month that is not ``YYYY-MM``."""


@dataclass(frozen=True)
class Period:
    """A calendar month in the accounting time zone, as aware datetimes (half-open)."""

    year: int
    month: int

    @classmethod
    def parse(cls, text: str) -> Period:
        try:
            year_text, month_text = text.split("-")
            if len(year_text) != 4 or len(month_text) != 2:
                raise ValueError
            year, month = int(year_text), int(month_text)
            if not 1 <= month <= 12 or not 2000 <= year <= 2999:
                raise ValueError
        except ValueError:
            raise MonthRefused(
                f"{text!r} is not a month; give it as YYYY-MM, e.g. 2026-12."
            ) from None
        return cls(year, month)

    @classmethod
    def containing(cls, moment: datetime) -> Period:
        local = moment.astimezone(accounting_zone())
        return cls(local.year, local.month)

    @property
    def key(self) -> str:
        return f"{self.year:04d}-{self.month:02d}"

    @property
    def label(self) -> str:
        return date(self.year, self.month, 1).strftime("%B %Y")

    @property
    def start(self) -> datetime:
        return datetime(self.year, self.month, 1, tzinfo=accounting_zone())

    @property
    def end(self) -> datetime:
        return self.next().start

    def next(self) -> Period:
        return Period(self.year + self.month // 12, self.month % 12 + 1)

    def previous(self) -> Period:
        return Period(self.year - (self.month == 1), (self.month - 2) % 12 + 1)

    def days(self) -> list[date]:
        first = date(self.year, self.month, 1)
        last = self.end.date() - timedelta(days=1)
        return [first + timedelta(days=n) for n in range((last - first).days + 1)]


def outcome_of(state: str, failure_class: str) -> Outcome:
    if state in {RunAttempt.State.STARTING, RunAttempt.State.RUNNING}:
        return Outcome.RUNNING
    if state == RunAttempt.State.SUCCEEDED:
        return Outcome.SUCCEEDED
    if state == RunAttempt.State.CANCELLED:
        return Outcome.CANCELLED
    if failure_class in {FailureClass.PREEMPTED, FailureClass.EVICTED}:
        return Outcome.PREEMPTED
    return Outcome.FAILED


@dataclass(frozen=True)
class AttemptUse:
    """One attempt's hold on resources: what, where, whose, from when to when."""

    attempt_id: int
    run_id: int
    run_name: str
    number: int
    workspace_id: int
    user: str
    flavor: str
    outcome: Outcome
    start: datetime
    end: datetime | None  # None: it holds them still
    gpus: int
    cpus: Decimal
    memory: Decimal  # bytes

    def seconds_within(self, since: datetime, until: datetime) -> float:
        start = max(self.start, since)
        end = min(self.end or until, until)
        return max(0.0, (end - start).total_seconds())


def _amounts(spec: dict[str, Any], backend: str) -> tuple[int, Decimal, Decimal]:
    parsed = spec_from_dict(spec)
    totals = run_totals(parsed, backend)
    return (
        int(totals.get(GPU_RESOURCE, 0)),
        totals.get("cpu", Decimal(0)),
        totals.get("memory", Decimal(0)),
    )


def _flavor(flavors: dict[str, str] | None, backend: str, gpus: int) -> str:
    if backend == Backend.LOCAL:
        return str(settings.TAU_LOCAL_FLAVOR)
    chosen = flavors or {}
    if gpus and chosen.get(GPU_RESOURCE):
        return chosen[GPU_RESOURCE]
    return chosen.get("cpu") or next(iter(chosen.values()), "") or "unassigned"


def attempt_uses(
    *, workspace_ids: Collection[int] | None, since: datetime, until: datetime
) -> list[AttemptUse]:
    """Every attempt that held resources at some time in ``[since, until)``, of the given
    workspaces (None: all of them). One query; the spec of each run is read once."""
    attempts = (
        RunAttempt.objects.unscoped()
        .filter(admitted_at__isnull=False, admitted_at__lt=until)
        .filter(Q(finished_at__isnull=True) | Q(finished_at__gt=since))
        .exclude(state=RunAttempt.State.WAITING)
    )
    if workspace_ids is not None:
        attempts = attempts.filter(run__workspace_id__in=list(workspace_ids))
    rows = attempts.order_by("admitted_at", "pk").values_list(
        "pk",
        "run_id",
        "run__name",
        "number",
        "run__workspace_id",
        "run__submitted_by_username",
        "run__backend",
        "run__spec",
        "flavors",
        "state",
        "failure_class",
        "admitted_at",
        "finished_at",
    )
    amounts: dict[int, tuple[int, Decimal, Decimal]] = {}
    uses = []
    for (
        pk,
        run_id,
        run_name,
        number,
        workspace_id,
        user,
        backend,
        spec,
        flavors,
        state,
        failure_class,
        admitted_at,
        finished_at,
    ) in rows:
        if admitted_at is None:  # excluded by the query; for the type checker
            continue
        if run_id not in amounts:
            amounts[run_id] = _amounts(spec, backend)
        gpus, cpus, memory = amounts[run_id]
        outcome = outcome_of(state, failure_class)
        uses.append(
            AttemptUse(
                attempt_id=pk,
                run_id=run_id,
                run_name=run_name,
                number=number,
                workspace_id=workspace_id,
                user=user,
                flavor=_flavor(flavors, backend, gpus),
                outcome=outcome,
                start=admitted_at,
                # An attempt that ended without an end time (a bug, or a row from before
                # ends were stamped) counts as ending when it was admitted: never forever.
                end=finished_at or (None if outcome == Outcome.RUNNING else admitted_at),
                gpus=gpus,
                cpus=cpus,
                memory=memory,
            )
        )
    return uses


@dataclass
class Totals:
    gpu_seconds: float = 0.0
    cpu_seconds: float = 0.0
    memory_gib_seconds: float = 0.0

    def add(self, use: AttemptUse, seconds: float) -> None:
        self.gpu_seconds += use.gpus * seconds
        self.cpu_seconds += float(use.cpus) * seconds
        self.memory_gib_seconds += float(use.memory / GIB) * seconds

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600

    @property
    def cpu_hours(self) -> float:
        return self.cpu_seconds / 3600

    @property
    def memory_gib_hours(self) -> float:
        return self.memory_gib_seconds / 3600

    def as_dict(self) -> dict[str, float]:
        return {
            "gpu_hours": round(self.gpu_hours, 3),
            "cpu_hours": round(self.cpu_hours, 3),
            "memory_gib_hours": round(self.memory_gib_hours, 3),
        }


@dataclass
class Usage:
    """Totals over a period, and the same split by user, flavor, outcome, workspace, day."""

    since: datetime
    until: datetime  # the period's end, or now if that is earlier
    total: Totals = field(default_factory=Totals)
    by_user: dict[str, Totals] = field(default_factory=lambda: defaultdict(Totals))
    by_flavor: dict[str, Totals] = field(default_factory=lambda: defaultdict(Totals))
    by_outcome: dict[Outcome, Totals] = field(default_factory=lambda: defaultdict(Totals))
    by_workspace: dict[int, Totals] = field(default_factory=lambda: defaultdict(Totals))
    #: day -> user -> totals (a day is the accounting time zone's).
    by_day_user: dict[date, dict[str, Totals]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(Totals))
    )
    #: day -> workspace id -> totals.
    by_day_workspace: dict[date, dict[int, Totals]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(Totals))
    )
    uses: list[AttemptUse] = field(default_factory=list)

    def lost(self) -> Totals:
        lost = Totals()
        for outcome in LOST:
            part = self.by_outcome.get(outcome)
            if part is not None:
                lost.gpu_seconds += part.gpu_seconds
                lost.cpu_seconds += part.cpu_seconds
                lost.memory_gib_seconds += part.memory_gib_seconds
        return lost


def _days(start: datetime, end: datetime) -> Iterator[tuple[date, datetime, datetime]]:
    """(local day, its part of [start, end)) for each day the interval touches."""
    zone = accounting_zone()
    day = start.astimezone(zone).date()
    while True:
        day_start = datetime.combine(day, time(), tzinfo=zone)
        day_end = datetime.combine(day + timedelta(days=1), time(), tzinfo=zone)
        if day_start >= end:
            return
        yield day, max(start, day_start), min(end, day_end)
        day += timedelta(days=1)


def summarize(uses: list[AttemptUse], *, since: datetime, until: datetime) -> Usage:
    usage = Usage(since=since, until=until)
    for use in uses:
        seconds = use.seconds_within(since, until)
        if seconds <= 0:
            continue
        usage.uses.append(use)
        usage.total.add(use, seconds)
        usage.by_user[use.user].add(use, seconds)
        usage.by_flavor[use.flavor].add(use, seconds)
        usage.by_outcome[use.outcome].add(use, seconds)
        usage.by_workspace[use.workspace_id].add(use, seconds)
        start = max(use.start, since)
        end = min(use.end or until, until)
        for day, part_start, part_end in _days(start, end):
            part = (part_end - part_start).total_seconds()
            usage.by_day_user[day][use.user].add(use, part)
            usage.by_day_workspace[day][use.workspace_id].add(use, part)
    return usage


def usage_in(
    period: Period, *, workspace_ids: Collection[int] | None, now: datetime | None = None
) -> Usage:
    """What the workspaces used in the month, up to now if it is the current one."""
    now = now or timezone.now()
    until = min(period.end, now)
    since = period.start
    if until <= since:
        return Usage(since=since, until=since)
    return summarize(
        attempt_uses(workspace_ids=workspace_ids, since=since, until=until),
        since=since,
        until=until,
    )


def gpu_hours_used(
    workspace_id: int, period: Period, *, flavor: str | None = None, now: datetime | None = None
) -> float:
    """GPU-hours the workspace used in the month so far (on one flavor, or all)."""
    usage = usage_in(period, workspace_ids=[workspace_id], now=now)
    if flavor is None:
        return usage.total.gpu_hours
    part = usage.by_flavor.get(flavor)
    return part.gpu_hours if part is not None else 0.0
