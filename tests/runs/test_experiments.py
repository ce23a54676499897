"""Experiment groups: the runs list names each experiment (project / name · group) with its
run count and filters by project, name and group; the API filters the same way; runs
stored before the columns existed are labelled by the migration."""

from __future__ import annotations

import re
from typing import Any

import pytest

from runs.models import Run
from tests.runs.factories import make_run

pytestmark = pytest.mark.django_db


def labelled(
    world: Any, project: str, name: str = "", group: str = "", *, direct: bool = False
) -> Run:
    if direct:
        # The reference CLI's dialect: experiment.{project,name,group} carry over.
        spec = (
            "name: tiny\nengine: job\nentrypoint: main.py\n"
            "compute: {cpu_request: 1, memory_request: 256Mi}\n"
            f"experiment: {{project: {project}, name: {name}, group: {group}}}\n"
        )
    else:
        lines = [f"  project: {project}"]
        if name:
            lines.append(f"  name: {name}")
        if group:
            lines.append(f"  group: {group}")
        spec = (
            "schema_version: 1\nname: tiny\nrun: {entrypoint: main.py, workload_kind: job}\n"
            "compute: {cpus: 1, memory: 256Mi}\nexperiment:\n" + "\n".join(lines) + "\n"
        )
    return make_run(world, spec=spec.encode())


@pytest.fixture
def three_experiments(world: Any) -> dict[str, list[Run]]:
    return {
        "lr": [labelled(world, "vision", "resnet-lr", "sweep-1") for _ in range(2)],
        "depth": [labelled(world, "vision", "resnet-depth", "ablation", direct=True)],
        "text": [labelled(world, "Tau Local", "smoke")],
        "none": [make_run(world)],
    }


def names_in(html: str) -> set[str]:
    return set(re.findall(r'class="mono">(tiny-[a-z0-9]+)</a>', html))


def test_runs_carry_their_experiment_labels(three_experiments: dict[str, list[Run]]) -> None:
    (depth,) = three_experiments["depth"]
    assert (depth.experiment_project, depth.experiment_name, depth.experiment_group) == (
        "vision",
        "resnet-depth",
        "ablation",
    )
    (unlabelled,) = three_experiments["none"]
    assert (unlabelled.experiment_project, unlabelled.experiment_name) == ("", "")


def test_the_runs_list_names_each_experiment_with_its_runs(
    world: Any, three_experiments: dict[str, list[Run]]
) -> None:
    html = world.client_for("viewer").get("/w/alpha/runs/").content.decode()
    panel = html[html.index('aria-label="Experiments"') :]
    panel = panel[: panel.index("</nav>")]
    assert 'vision / <strong>resnet-lr</strong> · <span class="muted">sweep-1</span>' in panel
    assert "(2 runs)" in panel
    assert "Tau Local / <strong>smoke</strong>" in panel
    # One chip per experiment, the most recent first; the unlabelled run has none.
    chips = re.findall(r'<li><a href="\?([^"]+)"', panel)
    assert chips == [
        "project=Tau+Local&amp;experiment=smoke",
        "project=vision&amp;experiment=resnet-depth&amp;group=ablation",
        "project=vision&amp;experiment=resnet-lr&amp;group=sweep-1",
    ]
    # The table shows each run's experiment.
    assert html.count("<strong>resnet-lr</strong>") == 1 + 2


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"project": "vision"}, {"lr", "depth"}),
        ({"project": "vision", "experiment": "resnet-lr"}, {"lr"}),
        ({"group": "ablation"}, {"depth"}),
        ({"experiment": "smoke"}, {"text"}),
        ({"project": "nobody"}, set()),
    ],
)
def test_the_runs_list_and_the_api_filter_by_experiment(
    world: Any, three_experiments: dict[str, list[Run]], query: dict[str, str], expected: set[str]
) -> None:
    wanted = {run.name for key in expected for run in three_experiments[key]}
    page = world.client_for("viewer").get("/w/alpha/runs/", query)
    assert page.status_code == 200
    html = page.content.decode()
    assert names_in(html) == wanted
    if not wanted:
        assert "No runs match these filters" in html
    api = world.api_client_for("viewer").get("/api/v1/workspaces/alpha/runs/", query)
    assert api.status_code == 200, api.content
    assert {row["name"] for row in api.json()["results"]} == wanted


def test_another_workspace_s_experiments_stay_out_of_sight(
    world: Any, three_experiments: dict[str, list[Run]]
) -> None:
    html = world.client_for("outsider").get("/w/alpha/runs/", {"project": "vision"})
    assert html.status_code in (403, 404)
    beta = world.client_for("platform_admin").get("/w/beta/runs/").content.decode()
    assert "resnet-lr" not in beta


def test_a_nul_in_an_experiment_filter_is_refused_clearly(world: Any) -> None:
    page = world.client_for("viewer").get("/w/alpha/runs/", {"project": "a\x00b"})
    assert page.status_code == 400
    assert "project: a search cannot contain NUL characters" in page.content.decode()
    api = world.api_client_for("viewer").get("/api/v1/workspaces/alpha/runs/", {"group": "a\x00"})
    assert api.status_code == 400
    assert "group" in api.json()


def test_the_migration_labels_runs_stored_before_the_columns(world: Any) -> None:
    import importlib

    from django.apps import apps

    run = labelled(world, "vision", "resnet-lr", "sweep-1")
    Run.objects.for_workspace(world.alpha).filter(pk=run.pk).update(
        experiment_project="", experiment_name="", experiment_group=""
    )
    migration = importlib.import_module("runs.migrations.0008_run_experiment")
    migration.backfill(apps, None)
    run.refresh_from_db()
    assert (run.experiment_project, run.experiment_name, run.experiment_group) == (
        "vision",
        "resnet-lr",
        "sweep-1",
    )
