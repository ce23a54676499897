"""The usage API, pages, CSV export and admin: the same numbers, only to those allowed, with
a fixed number of queries whatever the number of runs."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from runs.accounting import Period
from tests.accounting.helpers import PREEMPTED, attempt_at, gpu_run
from workspaces.models import WorkspaceBudget

pytestmark = pytest.mark.django_db

USAGE = "/api/v1/workspaces/{}/usage/"


@pytest.fixture(autouse=True)
def _gpus_here(settings: Any) -> None:
    settings.TAU_LOCAL_GPUS = 8
    settings.TAU_LOCAL_CPUS = 64
    settings.TAU_LOCAL_MEMORY = "512Gi"
    settings.TAU_ACCOUNTING_TIME_ZONE = "UTC"


def november(world: Any, *, runs: int = 1) -> None:
    """``runs`` runs of rob's in November 2026: each 1 h succeeded and 30 min preempted on
    4 GPUs (6 GPU-hours each, 2 of them lost)."""
    for _ in range(runs):
        run = gpu_run(world)
        attempt_at(
            run,
            1,
            datetime(2026, 11, 3, 10, tzinfo=UTC),
            datetime(2026, 11, 3, 10, 30, tzinfo=UTC),
            **PREEMPTED,
        )
        attempt_at(
            run, 2, datetime(2026, 11, 4, 10, tzinfo=UTC), datetime(2026, 11, 4, 11, tzinfo=UTC)
        )


def test_the_usage_api_gives_totals_by_user_and_flavor(world: Any) -> None:
    november(world)
    WorkspaceBudget.objects.create(workspace=world.alpha, gpu_hours=Decimal("100"))
    response = world.api_client_for("viewer").get(USAGE.format("alpha"), {"month": "2026-11"})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["workspace"] == "alpha"
    assert body["month"] == "2026-11"
    assert body["gpu_hours"] == 6.0
    assert body["cpu_hours"] == 12.0
    assert body["lost"]["gpu_hours"] == 2.0
    assert body["by_user"] == [
        {"user": "rob", "gpu_hours": 6.0, "cpu_hours": 12.0, "memory_gib_hours": 48.0}
    ]
    assert body["by_flavor"][0]["flavor"] == "local"
    assert {row["outcome"]: row["gpu_hours"] for row in body["by_outcome"]} == {
        "succeeded": 4.0,
        "preempted": 2.0,
    }
    assert [day["date"] for day in body["by_day"]] == ["2026-11-03", "2026-11-04"]
    assert body["start"] == "2026-11-01T00:00:00+00:00"
    # Where the (monthly) budget stood in that month.
    assert body["budgets"][0]["gpu_hours"] == 100.0
    assert body["budgets"][0]["used_gpu_hours"] == 6.0
    assert body["budgets"][0]["left_gpu_hours"] == 94.0


def test_the_default_month_is_this_one_and_a_wrong_one_is_a_400(world: Any) -> None:
    client = world.api_client_for("researcher")
    body = client.get(USAGE.format("alpha")).json()
    assert body["month"] == Period.containing(timezone.now()).key
    wrong = client.get(USAGE.format("alpha"), {"month": "2026-13"})
    assert wrong.status_code == 400
    assert "YYYY-MM" in str(wrong.json())


@pytest.mark.parametrize("who", ["outsider", "anonymous"])
def test_another_workspace_s_usage_is_404_or_needs_login(world: Any, who: str) -> None:
    november(world)
    response = world.api_client_for(who).get(USAGE.format("alpha"), {"month": "2026-11"})
    assert response.status_code == (404 if who == "outsider" else 401)
    assert "gpu_hours" not in response.content.decode()


def test_a_token_for_another_workspace_sees_no_usage(world: Any) -> None:
    from identity.tokens import issue_token
    from workspaces.models import Membership, Role

    november(world)
    Membership.objects.create(
        workspace=world.beta, user=world.users["researcher"], role=Role.VIEWER
    )
    issued = issue_token(user=world.users["researcher"], name="beta-only", workspace=world.beta)
    client = world.api_client_for("anonymous")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.plaintext}")
    assert client.get(USAGE.format("beta"), {"month": "2026-11"}).status_code == 200
    assert client.get(USAGE.format("alpha"), {"month": "2026-11"}).status_code == 404


def _queries(world: Any, runs: int, path: str, who: str = "viewer", api: bool = True) -> int:
    november(world, runs=runs)
    client = world.api_client_for(who) if api else world.client_for(who)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(path, {"month": "2026-11"})
    assert response.status_code == 200
    return len(queries)


@pytest.mark.parametrize(
    ("path", "who", "api"),
    [
        (USAGE.format("alpha"), "viewer", True),
        ("/w/alpha/usage/", "viewer", False),
        ("/w/alpha/usage.csv", "viewer", False),
        ("/usage/", "platform_admin", False),
    ],
)
def test_usage_costs_a_fixed_number_of_queries(world: Any, path: str, who: str, api: bool) -> None:
    few = _queries(world, 1, path, who, api)
    many = _queries(world, 6, path, who, api)
    assert many == few
    assert few <= 12


def test_the_page_shows_the_month_and_the_budget(world: Any) -> None:
    november(world)
    WorkspaceBudget.objects.create(
        workspace=world.alpha, gpu_hours=Decimal("400"), over_limit="lowest_priority"
    )
    html = world.client_for("viewer").get("/w/alpha/usage/", {"month": "2026-11"}).content.decode()
    assert "Usage in November 2026" in html
    assert 'id="usage-chart"' in html
    assert 'id="usage-chart-data"' in html
    assert "6 of 400 GPU-hours used, 394 left" in html
    assert "preempted or evicted" in html
    empty = world.client_for("viewer").get("/w/alpha/usage/", {"month": "2026-10"}).content.decode()
    assert "No run of this workspace held resources in October 2026" in empty
    assert world.client_for("viewer").get("/w/alpha/usage/", {"month": "x"}).status_code == 404
    assert world.client_for("outsider").get("/w/alpha/usage/").status_code == 404


def test_the_csv_has_one_row_per_attempt_that_adds_up(world: Any) -> None:
    november(world, runs=2)
    response = world.client_for("viewer").get("/w/alpha/usage.csv", {"month": "2026-11"})
    assert response["Content-Type"].startswith("text/csv")
    assert 'filename="taugrid-usage-alpha-2026-11.csv"' in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert len(rows) == 4
    assert {row["outcome"] for row in rows} == {"preempted", "succeeded"}
    assert sum(float(row["gpu_hours"]) for row in rows) == pytest.approx(12.0)
    assert rows[0]["workspace"] == "alpha"
    assert rows[0]["user"] == "rob"


def test_an_attempt_over_a_month_end_is_split_between_the_exports(world: Any) -> None:
    run = gpu_run(world)
    attempt_at(run, 1, datetime(2026, 10, 31, 23, tzinfo=UTC), datetime(2026, 11, 1, 1, tzinfo=UTC))
    client = world.client_for("viewer")
    parts = []
    for month in ("2026-10", "2026-11"):
        body = b"".join(client.get("/w/alpha/usage.csv", {"month": month}).streaming_content)
        [row] = list(csv.DictReader(io.StringIO(body.decode())))
        parts.append(float(row["gpu_hours"]))
    assert parts == [4.0, 4.0]


def test_the_platform_page_is_for_staff_and_lists_every_workspace(world: Any) -> None:
    november(world)
    other = gpu_run(world)
    from runs.models import Run

    Run.objects.unscoped().filter(pk=other.pk).update(workspace=world.beta)
    attempt_at(other, 1, datetime(2026, 11, 9, tzinfo=UTC), datetime(2026, 11, 9, 2, tzinfo=UTC))
    assert world.client_for("researcher").get("/usage/").status_code == 403
    html = world.client_for("platform_admin").get("/usage/", {"month": "2026-11"}).content.decode()
    assert "Usage of every workspace in November 2026" in html
    assert reverse("workspace-usage", args=["alpha"]) in html
    assert reverse("workspace-usage", args=["beta"]) in html
    body = b"".join(
        world.client_for("platform_admin").get("/usage.csv", {"month": "2026-11"}).streaming_content
    ).decode()
    assert {row["workspace"] for row in csv.DictReader(io.StringIO(body))} == {"alpha", "beta"}
    assert world.client_for("researcher").get("/usage.csv").status_code == 403
    from accounting.reports import platform_report

    chart = platform_report(Period(2026, 11), now=datetime(2026, 12, 1, tzinfo=UTC)).chart()
    assert [series["name"] for series in chart["series"]] == ["beta", "alpha"]  # most first
    assert {series["name"]: sum(series["gpu_hours"]) for series in chart["series"]} == {
        "alpha": pytest.approx(6.0),
        "beta": pytest.approx(8.0),
    }


def test_the_admin_shows_each_workspace_s_month(world: Any) -> None:
    run = gpu_run(world)
    now = timezone.now()
    attempt_at(run, 1, now - timedelta(minutes=30), now - timedelta(minutes=15))  # 1 GPU-hour
    WorkspaceBudget.objects.create(workspace=world.alpha, gpu_hours=Decimal("10"))
    client = world.client_for("platform_admin")
    html = client.get(reverse("admin:accounting_workspaceusage_changelist")).content.decode()
    assert "all flavors: 1 of 10" in html
    change = client.get(reverse("admin:workspaces_workspace_change", args=[world.alpha.pk]))
    assert "GPU-hour budgets" in change.content.decode()


def test_the_pages_show_the_months_before(world: Any) -> None:
    november(world)
    run = gpu_run(world)
    attempt_at(run, 1, datetime(2026, 9, 30, 23, tzinfo=UTC), datetime(2026, 10, 1, 1, tzinfo=UTC))
    from accounting.reports import months_before

    lines = months_before(
        Period(2026, 11),
        workspace_ids=[world.alpha.pk],
        count=3,
        now=datetime(2026, 12, 1, tzinfo=UTC),
    )
    assert [line.period.key for line in lines] == ["2026-11", "2026-10", "2026-09"]
    assert [line.totals.gpu_hours for line in lines] == [
        pytest.approx(6.0),
        pytest.approx(4.0),
        pytest.approx(4.0),
    ]
    assert lines[0].lost_gpu_hours == pytest.approx(2.0)
    html = world.client_for("viewer").get("/w/alpha/usage/", {"month": "2026-11"}).content.decode()
    assert 'href="?month=2026-09"' in html
