"""Comparing two runs (``runs.compare``, ``/w/<ws>/runs/compare/``): spec, code, environment
and outcome differences, escaped; only runs of the workspace the viewer reads; a fixed number
of queries however many files differ. The chart is checked in a browser (test_browser_compare)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs import compare
from runs.models import FailureClass, Run, RunAttempt, RunState
from tests.runs.factories import TINY_SPEC, make_run

pytestmark = pytest.mark.django_db

NEWER_SPEC = TINY_SPEC.replace(b"cpus: 1", b"cpus: 2") + (
    b"runtime:\n  image: python:3.12-slim\n  env:\n    LR: '0.1'\n"
)


def pair(world: Any, *, extra_files: int = 0) -> tuple[Run, Run]:
    a = make_run(
        world,
        files={
            "main.py": "print('hello')\nlr = 0.01\n",
            "gone.txt": "removed later\n",
            "weights.bin": "\x00\x01",
        },
    )
    b_files = {
        "main.py": "print('hello')\nlr = 0.1  # <script>alert(1)</script>\n",
        "weights.bin": "\x00\x02",
        **{f"extra/{index}.py": f"x = {index}\n" for index in range(extra_files)},
    }
    b = make_run(world, spec=NEWER_SPEC, files=b_files)
    now = timezone.now()
    ran(a, timedelta(minutes=5), now=now, state=RunState.SUCCEEDED)
    ran(b, timedelta(seconds=30), now=now, state=RunState.FAILED)
    a.refresh_from_db()
    b.refresh_from_db()
    return a, b


def ran(run: Run, *durations: timedelta, now: Any, state: RunState) -> None:
    """The run ended in ``state`` after attempts that ran for ``durations``, one after the
    other up to ``now`` (the run row says only when the newest started)."""
    start = now - sum(durations, timedelta())
    for number, duration in enumerate(durations, start=1):
        RunAttempt.objects.for_workspace(run.workspace).update_or_create(
            run=run,
            number=number,
            defaults={"state": "succeeded", "started_at": start, "finished_at": start + duration},
        )
        start += duration
    Run.objects.for_workspace(run.workspace).filter(pk=run.pk).update(
        state=state,
        failure_class=FailureClass.USER_ERROR if state == RunState.FAILED else "",
        attempt_count=len(durations),
        started_at=now - durations[-1],
        finished_at=now,
    )


def test_spec_differences_by_path() -> None:
    a = {"compute": {"cpus": 1, "gpus": 0}, "runtime": {"env": {}}, "tags": ["x"]}
    b = {"compute": {"cpus": 2, "gpus": 0}, "runtime": {"env": {"LR": "0.1"}}, "tags": ["y"]}
    assert compare.spec_differences(a, b) == [
        compare.SpecDifference("compute.cpus", "1", "2"),
        compare.SpecDifference("runtime.env", "{}", ""),
        compare.SpecDifference("runtime.env.LR", "", '"0.1"'),
        compare.SpecDifference("tags", '["x"]', '["y"]'),
    ]


def test_code_changes_with_text_diffs(world: Any) -> None:
    a, b = pair(world)
    changes = {change.path: change for change in compare.code_changes(a, b)}
    assert {path: change.status for path, change in changes.items()} == {
        "gone.txt": "removed",
        "main.py": "changed",
        "weights.bin": "changed",
    }
    assert "+lr = 0.1  # <script>alert(1)</script>" in changes["main.py"].diff
    assert "-lr = 0.01" in changes["main.py"].diff
    assert compare.code_changes(a, a) == []


def test_the_page_shows_every_difference_escaped(world: Any) -> None:
    a, b = pair(world)
    page = world.client_for("viewer").get(f"/w/alpha/runs/compare/?a={a.name}&b={b.name}")
    assert page.status_code == 200
    html = page.content.decode()
    assert "compute.<wbr>cpus" in html  # a path wraps at its dots
    assert "python:3.12-slim" in html  # the image differs: spec and environment
    assert "+lr = 0.1  # &lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script>alert(1)</script>" not in html
    assert "gone.txt" in html
    assert "weights.bin" in html
    assert '<td class="duration">5 min</td>' in html  # A's duration, in words
    assert '<td class="duration">30 s</td>' in html
    assert "0:05:00" not in html
    assert "Succeeded" in html
    assert "Failed" in html
    assert f'data-a-url="/api/v1/workspaces/alpha/runs/{a.name}/metrics/"' in html
    # The runs list's checkboxes send two ``run`` values, newest first: the older is A, in
    # the table and in the form's A field alike.
    chosen = world.client_for("viewer").get(f"/w/alpha/runs/compare/?run={b.name}&run={a.name}")
    assert chosen.status_code == 200
    shown = chosen.content.decode()
    assert "compute.<wbr>cpus" in shown
    assert f'id="compare-a" name="a" value="{a.name}"' in shown
    assert f'id="compare-b" name="b" value="{b.name}"' in shown
    assert shown.index(f"A · {a.name}") < shown.index(f"B · {b.name}")


def test_durations_add_up_every_attempt(world: Any) -> None:
    """A resumed run ran for all of its attempts, not only its newest."""
    a, b = pair(world)
    ran(
        b,
        timedelta(minutes=20),
        timedelta(minutes=1, seconds=55.434714),
        now=timezone.now(),
        state=RunState.FAILED,
    )
    html = (
        world.client_for("viewer")
        .get(f"/w/alpha/runs/compare/?a={a.name}&b={b.name}")
        .content.decode()
    )
    assert "21 min 55 s" in html
    assert "the newest attempt 1 min 55 s" in html
    assert "0:01:55" not in html


def test_only_runs_of_the_workspace(world: Any, tmp_path: Path) -> None:
    a, b = pair(world)
    outsider = world.client_for("outsider")
    assert outsider.get(f"/w/alpha/runs/compare/?a={a.name}&b={b.name}").status_code == 404
    viewer = world.client_for("viewer")
    missing = viewer.get(f"/w/alpha/runs/compare/?a={a.name}&b=nothing-here")
    assert missing.status_code == 404
    assert "There is no run called &#x27;nothing-here&#x27; in Alpha." in missing.content.decode()
    form = viewer.get("/w/alpha/runs/compare/")
    assert form.status_code == 200
    assert 'name="a"' in form.content.decode()
    three = viewer.get(f"/w/alpha/runs/compare/?run={a.name}&run={b.name}&run={a.name}")
    assert three.status_code == 400


def test_the_page_costs_a_fixed_number_of_queries(world: Any) -> None:
    viewer = world.client_for("viewer")

    def count(a: Run, b: Run) -> int:
        with CaptureQueriesContext(connection) as queries:
            assert viewer.get(f"/w/alpha/runs/compare/?a={a.name}&b={b.name}").status_code == 200
        return len(queries)

    few = count(*pair(world))
    many = count(*pair(world, extra_files=30))
    # Session, user, navigation, access, recent runs, both runs, their bundles, attempts.
    assert few == many == 9
