"""A sweep's run page and the runs list's experiments in a real browser: the trials table
with the best trial marked, one chart per metric with a line per trial (Plotly, within the
CSP), and both pages clean under axe-core at both widths."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from runs.models import MetricPoint, Run, RunState, RunTrial
from tests.executors.local.agent_harness import Agent, local_quota, submit, wait_until
from tests.pages.browser_support import check_page, log_in, watch_console

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SWEEP = textwrap.dedent(
    """\
    schema_version: 1
    name: lr-grid
    run: {entrypoint: main.py}
    compute: {cpus: 250m, memory: 64Mi}
    experiment: {project: vision, name: resnet-lr, group: sweep-1}
    execution:
      launcher: ray-tune
      metric: loss
      mode: min
      max_concurrent_trials: 2
      configs:
        lr: [0.1, 0.01, 0.001]
    """
).encode()


def test_a_sweep_shows_its_trials_and_their_curves_overlaid(
    world: Any, live_server: Any, page: Any
) -> None:
    problems = watch_console(page)
    local_quota(world.alpha)
    run = submit(world, SWEEP, {"main.py": "print('hi')\n"})
    # What the agent records for a sweep (test_agent.py runs a real one): trials and points.
    finals = {1: 0.9, 2: 0.2, 3: 0.5}
    for number, lr in ((1, 0.1), (2, 0.01), (3, 0.001)):
        RunTrial.objects.for_workspace(world.alpha).create(
            run=run, attempt=1, number=number, config={"lr": lr}, state="succeeded", exit_code=0
        )
        for step in range(1, 6):
            MetricPoint.objects.for_workspace(world.alpha).create(
                run=run,
                attempt=1,
                key=f"trial-{number}/loss",
                step=step,
                value=finals[number] + 1.0 / step,
            )
    log_in(page.context, live_server.url, world.users["researcher"])
    page.goto(f"{live_server.url}/w/alpha/runs/{run.name}/")
    table = page.locator("section.trials table")
    assert table.locator("tbody tr").count() == 3
    best = table.locator("tr.best")
    assert best.count() == 1
    assert best.locator("th").inner_text().startswith("2")
    assert "0.4" in best.inner_text()  # 0.2 + 1/5, the lowest loss
    chart = page.locator("#metrics .chart[aria-label='Chart of loss by step, one line per trial']")
    chart.wait_for(timeout=30_000)
    traces = page.evaluate(
        "() => document.querySelector('#metrics .chart').data.map(t => [t.name, t.x.length])"
    )
    assert traces == [["trial 1", 5], ["trial 2", 5], ["trial 3", 5]]
    assert page.locator("#metrics .chart").count() == 1  # one chart for the metric
    check_page(page, "run-sweep")
    page.goto(f"{live_server.url}/w/alpha/runs/")
    chip = page.get_by_role("navigation", name="Experiments").get_by_role("link")
    assert chip.count() == 1
    assert "vision / resnet-lr · sweep-1 (1 run)" in chip.inner_text()
    check_page(page, "runs-experiments")
    chip.click()
    page.wait_for_url("**project=vision**")
    assert page.locator("table.runs tbody tr").count() == 1
    assert problems == []


RETURNS_ITS_LAST_ROW = textwrap.dedent(
    """\
    import json, os
    import tau

    def train_func(config):
        loss = 1.0
        for step in (10, 20, 30):
            loss = config["start"] / step
            if config["via"] == "sdk":
                tau.log_metrics(step, loss=loss)
            else:  # rows appended to the metrics file, as a script without the SDK writes them
                with open(os.path.join(os.environ["TAU_OUTPUT_DIR"], "metrics.jsonl"), "a") as f:
                    f.write(json.dumps({"step": step, "loss": loss}) + "\\n")
        tau.flush()
        return {"loss": loss / 2}
    """
)


def test_a_trials_returned_mapping_is_the_last_point_of_its_curve(
    world: Any, live_server: Any, machine: Agent, page: Any
) -> None:
    """The mapping ``train_func`` returns is the trial's last row: after the steps it
    reported (31 after 10, 20, 30), through the SDK or its metrics file. It was stored at
    step 0: a stray first point on every trial's curve."""
    sweep = SWEEP.replace(b"lr: [0.1, 0.01, 0.001]", b"start: [1.0, 2.0]\n    via: [sdk, file]")
    run = submit(world, sweep, {"main.py": RETURNS_ITS_LAST_ROW})
    wait_until(
        lambda: (
            Run.objects.for_workspace(world.alpha).get(pk=run.pk).state
            in {RunState.SUCCEEDED, RunState.FAILED}
        ),
        timeout=120,
        what="the sweep to end",
        agent=machine,
    )
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED, run.state_reason
    points = MetricPoint.objects.for_workspace(world.alpha).filter(run=run)
    steps = {
        key: sorted(points.filter(key=key).values_list("step", flat=True))
        for key in sorted(set(points.values_list("key", flat=True)))
    }
    assert steps == {f"trial-{number}/loss": [10, 20, 30, 31] for number in (1, 2, 3, 4)}
    final = points.get(key="trial-1/loss", step=31)
    assert final.value == pytest.approx(1.0 / 30 / 2)

    log_in(page.context, live_server.url, world.users["researcher"])
    page.goto(f"{live_server.url}/w/alpha/runs/{run.name}/")
    page.locator("#metrics .chart").wait_for(timeout=30_000)
    page.wait_for_function(
        "() => { const c = document.querySelector('#metrics .chart');"
        " return c && c.data && c.data.length === 4; }"
    )
    curves = page.evaluate(
        "() => document.querySelector('#metrics .chart').data.map(t => [t.name, t.x])"
    )
    assert curves == [[f"trial {number}", [10, 20, 30, 31]] for number in (1, 2, 3, 4)]
