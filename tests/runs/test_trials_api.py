"""``POST …/runs/{run}/report/trials/``: a sweep's driver (``tau.ray_tune`` on a cluster)
tells the portal its trials. Only the run's own token may; what it sends is checked."""

from __future__ import annotations

from typing import Any

import pytest

from runs.models import RunTrial
from tests.runs.factories import make_run
from tests.runs.test_api import bearer, run_token

pytestmark = pytest.mark.django_db

SWEEP = (
    b"schema_version: 1\nname: sweep\nrun: {entrypoint: main.py}\n"
    b"compute: {cpus: 1, memory: 256Mi}\n"
    b"execution: {launcher: ray-tune, metric: loss, configs: {lr: [0.1, 0.01]}}\n"
)


def url(run: Any) -> str:
    return f"/api/v1/workspaces/alpha/runs/{run.name}/report/trials/"


def test_the_run_token_reports_trials_and_a_later_report_updates_them(world: Any) -> None:
    run = make_run(world, spec=SWEEP)
    client = bearer(run_token(world, run))
    first = client.post(
        url(run),
        {
            "trials": [
                {"trial": 1, "config": {"lr": 0.1}, "state": "running", "started_at": 1.8e9},
                {"trial": 2, "config": {"lr": 0.01}, "state": "pending"},
            ]
        },
        format="json",
    )
    assert (first.status_code, first.json()) == (202, {"recorded": 2})
    again = client.post(
        url(run),
        {"trials": [{"trial": 1, "config": {"lr": 0.1}, "state": "succeeded", "exit_code": 0}]},
        format="json",
    )
    assert (again.status_code, again.json()) == (202, {"recorded": 1})
    rows = RunTrial.objects.for_workspace(world.alpha).filter(run=run).order_by("number")
    assert [(row.number, row.state, row.exit_code) for row in rows] == [
        (1, "succeeded", 0),
        (2, "pending", None),
    ]
    assert rows[0].attempt == 1


def test_a_report_of_an_earlier_moment_arriving_last_never_moves_a_trial_back(
    world: Any,
) -> None:
    """A driver that gave up waiting on a request and went on can have that request answered
    after its next one (seen under load: a trial left "running" in a succeeded sweep)."""
    run = make_run(world, spec=SWEEP)
    client = bearer(run_token(world, run))
    ended = {"trial": 1, "config": {"lr": 0.1}, "state": "succeeded", "exit_code": 0}
    late = {"trial": 1, "config": {"lr": 0.1}, "state": "running", "started_at": 1.8e9}
    assert client.post(url(run), {"trials": [ended]}, format="json").status_code == 202
    answer = client.post(
        url(run),
        {"trials": [late, {"trial": 2, "config": {"lr": 0.01}, "state": "running"}]},
        format="json",
    )
    assert (answer.status_code, answer.json()) == (202, {"recorded": 1})
    rows = RunTrial.objects.for_workspace(world.alpha).filter(run=run).order_by("number")
    assert [(row.number, row.state, row.exit_code) for row in rows] == [
        (1, "succeeded", 0),
        (2, "running", None),
    ]


def test_only_the_runs_own_token_may_report(world: Any) -> None:
    run = make_run(world, spec=SWEEP)
    other = make_run(world, spec=SWEEP)
    body = {"trials": [{"trial": 1, "config": {}, "state": "running"}]}
    # A member's own API token is not a run token.
    member = world.api_client_for("researcher").post(url(run), body, format="json")
    assert member.status_code == 403
    # Another run's token does not reach this run.
    elsewhere = bearer(run_token(world, other)).post(url(run), body, format="json")
    assert elsewhere.status_code == 404
    assert not RunTrial.objects.for_workspace(world.alpha).exists()


@pytest.mark.parametrize(
    ("trials", "field"),
    [
        ([{"trial": 1, "config": {}, "state": "exploded"}], "state"),
        ([{"trial": 0, "config": {}, "state": "running"}], "trial"),
        ([{"trial": 1, "config": {"x": "y" * 20_000}, "state": "running"}], "config"),
        ([], None),
    ],
)
def test_what_is_not_a_trial_report_is_refused_and_changes_nothing(
    world: Any, trials: list[dict[str, Any]], field: str | None
) -> None:
    run = make_run(world, spec=SWEEP)
    response = bearer(run_token(world, run)).post(url(run), {"trials": trials}, format="json")
    assert response.status_code == 400
    if field is not None:
        assert field in response.json()["trials"]["0"], response.json()
    assert not RunTrial.objects.for_workspace(world.alpha).exists()
