"""What a run token can send is bounded (issue 11, section 3): metric names per run and per
row, printable names only, reports per minute, event size and depth, pages of events, and
checkpoint paths inside the run's own checkpoint folder. Each test replays an attack that
used to succeed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from executors.local import backend as local_backend
from executors.local.agent.collect import MetricsReader
from runs import metric_points as metrics
from runs import selectors
from runs.api import views as api_views
from runs.api.serializers import MAX_EVENT_BYTES, MAX_EVENT_DEPTH
from runs.checkpoints import checkpoint_exists, newest_checkpoint
from runs.events import verify_event_chain
from runs.metric_rules import MAX_KEYS_PER_RUN, MAX_VALUES_PER_ROW, metric_key_problem
from runs.models import Checkpoint, MetricPoint, Run, RunEvent, RunState
from tests.runs.factories import make_run
from tests.runs.test_api import bearer, run_token, run_url

pytestmark = pytest.mark.django_db


def report_metrics(client: Any, run: Run, rows: list[dict[str, Any]]) -> Any:
    return client.post(run_url(run.name, "run-report-metrics"), {"rows": rows}, format="json")


def from_file(run: Run, path: Path) -> tuple[MetricsReader, metrics.MetricsRecorded]:
    """Read a metrics file as the local agent does, and keep what it holds as the agent does
    (through the same service as the API's reports, leniently)."""
    reader = MetricsReader(path)
    batch = reader.read()
    recorded = metrics.record_metrics(run=run, attempt=1, rows=batch.rows, all_or_nothing=False)
    reader.skipped(recorded.rows_skipped, recorded.problems[0] if recorded.problems else None)
    return reader, recorded


def points_of(run: Run) -> list[tuple[str, int, float]]:
    return sorted(
        MetricPoint.objects.for_workspace(run.workspace_id)
        .filter(run=run)
        .values_list("key", "step", "value")
    )


def names_of(run: Run) -> set[str]:
    return set(
        MetricPoint.objects.for_workspace(run.workspace_id)
        .filter(run=run)
        .values_list("key", flat=True)
        .distinct()
    )


# --- metric names ------------------------------------------------------------------------------


def test_a_run_takes_at_most_its_cap_of_metric_names(world: Any) -> None:
    run = make_run(world)
    client = bearer(run_token(world, run))
    # The attack: one report with 3,000 distinct names (15 rows of 200, within the row cap).
    names = [f"m{index:04d}" for index in range(3000)]
    rows = [
        {"step": 1, **dict.fromkeys(names[start : start + MAX_VALUES_PER_ROW], 1.0)}
        for start in range(0, len(names), MAX_VALUES_PER_ROW)
    ]
    refused = report_metrics(client, run, rows)
    assert refused.status_code == 400
    assert f"at most {MAX_KEYS_PER_RUN} metric names" in refused.json()["problems"][0]
    assert names_of(run) == set()  # nothing of a refused report is kept

    # Up to the cap is fine, and the names it has keep taking values.
    first = names[:MAX_KEYS_PER_RUN]
    assert (
        report_metrics(client, run, [{"step": 1, **dict.fromkeys(first, 1.0)}]).status_code == 202
    )
    again = report_metrics(client, run, [{"step": 2, **dict.fromkeys(first, 2.0)}])
    assert again.status_code == 202, again.json()
    one_more = report_metrics(client, run, [{"step": 3, "loss": 0.5, first[0]: 3.0}])
    assert one_more.status_code == 400
    problem = one_more.json()["problems"][0]
    assert f"at most {MAX_KEYS_PER_RUN} metric names" in problem
    assert "'loss'" in problem
    assert names_of(run) == set(first)
    assert MetricPoint.objects.for_workspace(world.alpha).filter(run=run).count() == 400


def test_a_row_holds_at_most_the_same_number_of_values_as_a_metrics_file_line(
    world: Any, tmp_path: Path
) -> None:
    run = make_run(world)
    client = bearer(run_token(world, run))
    too_many = {"step": 1, **{f"k{index}": 1.0 for index in range(MAX_VALUES_PER_ROW + 1)}}
    refused = report_metrics(client, run, [too_many])
    assert refused.status_code == 400
    assert f"at most {MAX_VALUES_PER_ROW} values" in refused.json()["problems"][0]
    # A line of the metrics file gives the same number (one rule, one service, both roads),
    # and the line counts as not wholly read.
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(too_many) + "\n")
    reader, recorded = from_file(run, path)
    assert recorded.recorded == MAX_VALUES_PER_ROW
    assert reader.bad_lines == 1
    assert f"at most {MAX_VALUES_PER_ROW} values" in reader.first_problem


@pytest.mark.parametrize(
    "name",
    [
        "loss\u202e",  # right-to-left override (Cf)
        "\u2066lr\u2069",  # bidi isolates (Cf)
        "acc\u200b",  # zero-width space (Cf)
        "bell\x07",  # a control character (Cc)
        "tab\tname",  # Cc
        "line\u2028two",  # line separator (Zl)
        "",
        "x" * 101,
    ],
)
def test_metric_names_must_be_printable_text(world: Any, tmp_path: Path, name: str) -> None:
    assert metric_key_problem(name) is not None
    run = make_run(world)
    client = bearer(run_token(world, run))
    refused = report_metrics(client, run, [{"step": 1, name: 1.0, "loss": 0.5}])
    assert refused.status_code == 400
    assert names_of(run) == set()
    # From the agent's metrics file the name is skipped, the rest of the line kept, and why
    # is said.
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, name: 1.0, "loss": 0.5}) + "\n")
    reader, _ = from_file(run, path)
    assert points_of(run) == [("loss", 1, 0.5)]
    assert reader.bad_lines == 1
    assert "skipped" in reader.first_problem


def test_printable_names_in_any_script_are_fine(world: Any) -> None:
    run = make_run(world)
    client = bearer(run_token(world, run))
    names = ["loss", "val/accuracy", "Verlust (ü)", "损失", "📉 loss", "a b"]
    assert all(metric_key_problem(name) is None for name in names)
    response = report_metrics(client, run, [{"step": 1, **dict.fromkeys(names, 1.0)}])
    assert response.status_code == 202
    assert names_of(run) == set(names)


def test_the_metrics_file_takes_at_most_the_cap_of_names(world: Any, tmp_path: Path) -> None:
    run = make_run(world)
    path = tmp_path / "metrics.jsonl"
    lines = [
        json.dumps({"step": 1, **{f"m{start + i}": 1.0 for i in range(MAX_VALUES_PER_ROW)}})
        for start in range(0, 2 * MAX_KEYS_PER_RUN, MAX_VALUES_PER_ROW)
    ]
    lines.append(json.dumps({"step": 2, "m0": 2.0, "brand-new": 1.0}))
    path.write_text("\n".join(lines) + "\n")
    reader, _ = from_file(run, path)
    points = points_of(run)
    assert len({key for key, _, _ in points}) == MAX_KEYS_PER_RUN
    assert ("m0", 2, 2.0) in points  # a name it has keeps its values
    assert all(key != "brand-new" for key, _, _ in points)
    assert f"at most {MAX_KEYS_PER_RUN} metric names" in reader.first_problem


def test_the_cap_of_names_is_the_runs_whichever_road_they_came_by(
    world: Any, tmp_path: Path
) -> None:
    """One writer for metric points: names reported over the API and names in the metrics
    file count against the same cap, decided under the run's lock."""
    run = make_run(world)
    client = bearer(run_token(world, run))
    first = {f"api{index}": 1.0 for index in range(MAX_KEYS_PER_RUN - 10)}
    assert report_metrics(client, run, [{"step": 1, **first}]).status_code == 202
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 2, **{f"file{index}": 1.0 for index in range(20)}}) + "\n")
    reader, recorded = from_file(run, path)
    assert recorded.recorded == 10
    assert len(names_of(run)) == MAX_KEYS_PER_RUN
    assert reader.bad_lines == 1
    # And the other way round: the API now refuses any new name.
    refused = report_metrics(client, run, [{"step": 3, "late": 1.0}])
    assert refused.status_code == 400
    assert f"at most {MAX_KEYS_PER_RUN} metric names" in refused.json()["problems"][0]


def test_huge_values_and_steps_are_refused_not_a_server_error(world: Any, tmp_path: Path) -> None:
    run = make_run(world)
    client = bearer(run_token(world, run))
    for row in ({"step": 2**63, "loss": 1.0}, {"step": -(2**63), "loss": 1.0}):
        response = report_metrics(client, run, [row])
        assert response.status_code == 400
        assert "at most 2^53 - 1" in response.json()["problems"][0]
    huge = client.post(
        run_url(run.name, "run-report-metrics"),
        '{"rows": [{"step": 1, "loss": 1' + "0" * 400 + "}]}",
        content_type="application/json",
    )
    assert huge.status_code == 400
    assert "finite number" in huge.json()["problems"][0]
    assert report_metrics(client, run, [{"step": 2**53 - 1, "loss": 1.0}]).status_code == 202
    # The file reader skips such a value instead of failing.
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 1' + "0" * 400 + ', "ok": 1}\n')
    assert MetricsReader(path).read().points == [("ok", 1, 1.0)]


# --- reading metrics stays bounded -------------------------------------------------------------


def test_reading_metrics_is_bounded_whatever_was_written(world: Any) -> None:
    """Written before names were capped (or straight into the table): 9,000 names. The read
    returns the capped number, in a fixed number of queries."""
    run = make_run(world)
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, attempt=1, key=f"m{index:05d}", step=1, value=1.0)
        for index in range(9000)
    )
    assert selectors.metric_keys(run) == [f"m{index:05d}" for index in range(MAX_KEYS_PER_RUN)]
    client = world.api_client_for("viewer")
    with CaptureQueriesContext(connection) as queries:
        body = client.get(run_url(run.name, "run-metrics"), {"max_points": 1000}).json()
    assert len(body["keys"]) == MAX_KEYS_PER_RUN
    assert len(body["series"]) == MAX_KEYS_PER_RUN
    assert len(queries) <= 8, [q["sql"][:120] for q in queries]


def test_one_answer_holds_a_bounded_number_of_points(world: Any, monkeypatch: Any) -> None:
    run = make_run(world)
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, attempt=1, key=key, step=step, value=float(step))
        for key in ("a", "b", "c", "d")
        for step in range(100)
    )
    monkeypatch.setattr(api_views, "MAX_METRIC_POINTS_PER_ANSWER", 100)
    body = world.api_client_for("viewer").get(run_url(run.name, "run-metrics")).json()
    assert sum(len(points) for points in body["series"].values()) <= 100
    assert all(points[-1] == [99.0, 99.0] for points in body["series"].values())


@pytest.mark.parametrize("which", ["names", "series"])
def test_the_metrics_queries_can_use_the_series_index(world: Any, which: str) -> None:
    """Where the plan is the point: with sequential scans off, PostgreSQL can answer with the
    ``metric_series`` index (a query shape that cannot use it would still scan the table)."""
    if connection.vendor != "postgresql":
        pytest.skip("plans are PostgreSQL's")
    run = make_run(world)
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, attempt=1, key=f"k{index % 20}", step=index, value=1.0)
        for index in range(2000)
    )
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("ANALYZE runs_metricpoint")
    with CaptureQueriesContext(connection) as queries:
        if which == "names":
            selectors.metric_keys(run)
        else:
            selectors.metric_series(run, [f"k{index}" for index in range(20)], max_points=10)
    for query in queries:
        sql = query["sql"]
        if "runs_metricpoint" not in sql or "SET" in sql:
            continue
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN " + sql)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        # Never every run's points: this run's, through an index.
        assert "Seq Scan on runs_metricpoint" not in plan, plan
        if which == "names":
            assert "metric_series" in plan, plan  # the loose index scan needs it


# --- reports per minute ------------------------------------------------------------------------


def test_reports_are_rate_limited_per_run_token(world: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(api_views, "REPORTS_PER_MINUTE", 3)
    run = make_run(world)
    other = make_run(world)
    client = bearer(run_token(world, run))
    rows = [{"step": 1, "loss": 1.0}]
    assert [report_metrics(client, run, rows).status_code for _ in range(3)] == [202] * 3
    limited = client.post(run_url(run.name, "run-report-events"), {"kind": "x"}, format="json")
    assert limited.status_code == 429
    assert 1 <= int(limited["Retry-After"]) <= 61
    assert "at most 3 times a minute" in limited.json()["detail"]
    # Another run's token has its own budget.
    assert report_metrics(bearer(run_token(world, other)), other, rows).status_code == 202


# --- events ------------------------------------------------------------------------------------


def report_event(client: Any, run: Run, body: Any) -> Any:
    return client.post(
        run_url(run.name, "run-report-events"),
        body if isinstance(body, str) else json.dumps(body),
        content_type="application/json",
    )


def test_an_event_is_bounded_in_size_and_depth(world: Any) -> None:
    run = make_run(world)
    client = bearer(run_token(world, run))
    big = report_event(client, run, {"kind": "dump", "data": {"blob": "x" * (2 * 2**20)}})
    assert big.status_code == 400
    assert f"at most {MAX_EVENT_BYTES // 1024} KiB" in json.dumps(big.json())
    just_over = {"kind": "dump", "data": {"blob": "x" * MAX_EVENT_BYTES}}
    assert report_event(client, run, just_over).status_code == 400
    nested: dict[str, Any] = {}
    inner = nested
    for _ in range(MAX_EVENT_DEPTH):
        inner["a"] = {}
        inner = inner["a"]
    deep = report_event(client, run, {"kind": "deep", "data": nested})
    assert deep.status_code == 400
    assert f"at most {MAX_EVENT_DEPTH} levels" in json.dumps(deep.json())
    # ~1,000 levels used to crash the JSON parser (RecursionError, a 500).
    very_deep = '{"kind": "deep", "data": ' + '{"a": ' * 1000 + "1" + "}" * 1001
    refused = report_event(client, run, very_deep)
    assert refused.status_code == 400
    assert "nested deeper" in refused.json()["detail"]
    fine = report_event(client, run, {"kind": "epoch", "message": "ok", "data": {"n": [1, {}]}})
    assert fine.status_code == 201
    assert RunEvent.objects.for_workspace(world.alpha).filter(run=run).count() == 2
    run.refresh_from_db()
    assert verify_event_chain(run)


def test_a_json_body_is_refused_by_its_declared_size_unread(world: Any, settings: Any) -> None:
    run = make_run(world)
    client = bearer(run_token(world, run))
    body = json.dumps({"kind": "x", "message": "y" * 100})
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 50
    response = report_event(client, run, body)
    assert response.status_code == 413
    assert "at most 50 bytes" in response.json()["detail"]


def test_events_come_in_bounded_pages(world: Any, monkeypatch: Any) -> None:
    run = make_run(world)  # one event: submitted
    client = bearer(run_token(world, run))
    for index in range(6):
        data = {"blob": "x" * 6000, "n": index}
        assert report_event(client, run, {"kind": "big", "data": data}).status_code == 201
    reader = world.api_client_for("viewer")
    url = run_url(run.name, "run-events")
    everything = reader.get(url)
    assert everything.status_code == 200
    assert isinstance(everything.json(), list)  # a list, as before
    assert [event["seq"] for event in everything.json()] == list(range(1, 8))
    assert "Link" not in everything

    first = reader.get(url, {"limit": 3})
    assert [event["seq"] for event in first.json()] == [1, 2, 3]
    assert first["Link"].endswith('?after=3&limit=3>; rel="next"')
    following = first["Link"][1 : first["Link"].index(">")]
    assert [event["seq"] for event in reader.get(following).json()] == [4, 5, 6]
    assert [event["seq"] for event in reader.get(url, {"after": 6}).json()] == [7]

    assert len(reader.get(url, {"limit": 10**6}).json()) == 7  # capped, not refused
    for bad in ({"limit": 0}, {"limit": "x"}, {"after": "x"}, {"after": -1}):
        assert reader.get(url, bad).status_code == 400, bad

    # A page ends early when its events would carry too many bytes.
    monkeypatch.setattr(api_views, "MAX_EVENT_PAGE_BYTES", 13_000)
    budgeted = reader.get(url)
    assert [event["seq"] for event in budgeted.json()] == [1, 2, 3]
    assert "after=3" in budgeted["Link"]
    monkeypatch.setattr(api_views, "MAX_EVENT_PAGE_BYTES", 10)
    assert [event["seq"] for event in reader.get(url, {"after": 1}).json()] == [2]  # never empty


def test_the_schema_says_how_to_page_events(world: Any) -> None:
    response = world.api_client_for("researcher").get(
        reverse("api:schema"), HTTP_ACCEPT="application/vnd.oai.openapi+json"
    )
    events = response.json()["paths"][
        "/api/v1/workspaces/{workspace_slug}/runs/{run_name}/events/"
    ]["get"]
    assert {"after", "limit"} <= {p["name"] for p in events["parameters"]}
    assert "Link" in events["responses"]["200"]["headers"]


# --- checkpoint paths --------------------------------------------------------------------------


def report_checkpoint(client: Any, run: Run, path: str, step: int = 1) -> Any:
    return client.post(
        run_url(run.name, "run-report-checkpoints"), {"step": step, "path": path}, format="json"
    )


@pytest.fixture
def runs_dir(settings: Any, tmp_path: Path) -> Path:
    settings.VAR_DIR = tmp_path / "var"
    (tmp_path / "var" / "runs").mkdir(parents=True)
    return tmp_path / "var" / "runs"


def test_a_checkpoint_must_lie_in_the_runs_own_folder(world: Any, runs_dir: Path) -> None:
    run = make_run(world)
    other = make_run(world)
    client = bearer(run_token(world, run))
    folder = local_backend.checkpoint_dir(run)
    folder.mkdir(parents=True)
    secret = runs_dir.parent / "secret_key"
    secret.write_text("s3cr3t")
    (local_backend.checkpoint_dir(other)).mkdir(parents=True)
    (folder / "escape").symlink_to(runs_dir.parent)
    (folder / "step-9").symlink_to(secret)
    for attack in (
        str(secret),  # the attack: any host path
        "/etc/passwd",
        str(folder / ".." / ".." / ".." / "secret_key"),
        "../../../secret_key",
        str(local_backend.checkpoint_dir(other) / "step-1"),  # another run's folder
        str(folder / "escape" / "secret_key"),  # through a link
        str(folder / "step-9"),  # a link itself
        str(folder),  # the folder, not a checkpoint in it
        "s3://bucket/step-1",
        "",
    ):
        response = report_checkpoint(client, run, attack)
        assert response.status_code == 400, attack
    assert Checkpoint.objects.for_workspace(world.alpha).filter(run=run).count() == 0

    (folder / "step-100").mkdir()
    inside = report_checkpoint(client, run, str(folder / "step-100"), step=100)
    assert inside.status_code == 201
    assert inside.json()["path"] == str(folder / "step-100")
    relative = report_checkpoint(client, run, "nested/./step-200", step=200)
    assert relative.status_code == 201
    assert relative.json()["path"] == str(folder / "nested" / "step-200")


def test_a_checkpoint_folder_replaced_by_a_link_is_refused(world: Any, runs_dir: Path) -> None:
    run = make_run(world)
    client = bearer(run_token(world, run))
    folder = local_backend.checkpoint_dir(run)
    folder.parent.mkdir(parents=True)
    folder.symlink_to("/")
    response = report_checkpoint(client, run, str(folder / "etc" / "passwd"))
    assert response.status_code == 400
    assert "symbolic link" in response.json()["path"][0]


def test_whether_a_host_file_exists_is_never_asked(
    world: Any, runs_dir: Path, monkeypatch: Any
) -> None:
    """A checkpoint recorded before paths were checked points at a host file: it is shown
    as not resumable, and no file outside the run's checkpoint folder is looked at."""
    run = make_run(world, state=RunState.FAILED)
    secret = runs_dir.parent / "secret_key"
    secret.write_text("s3cr3t")
    legacy = Checkpoint.objects.create(run=run, attempt=1, step=5, path=str(secret))
    folder = local_backend.checkpoint_dir(run)
    (folder / "step-7").mkdir(parents=True)
    real = Checkpoint.objects.create(run=run, attempt=1, step=7, path=str(folder / "step-7"))
    looked_at: list[str] = []
    for name in ("stat", "lstat"):
        original = getattr(os, name)

        def spy(path: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            looked_at.append(os.fspath(path))
            return _original(path, *args, **kwargs)

        monkeypatch.setattr(os, name, spy)
    assert checkpoint_exists(run, legacy) is False
    assert checkpoint_exists(run, real) is True
    assert newest_checkpoint(run) == real
    page = world.client_for("researcher").get(
        reverse("run-page", kwargs={"workspace_slug": "alpha", "run_name": run.name})
    )
    assert page.status_code == 200
    allowed = str(folder)
    area = str(runs_dir.parent)  # this test's var/: the secret is there too
    for path in (path for path in looked_at if path.startswith(area)):
        # Only the run's folder and what is inside it, or the folders above it.
        assert path.startswith(allowed) or allowed.startswith(path), path
    assert str(secret) not in looked_at
    assert any(path.startswith(allowed) for path in looked_at)  # the spy saw the real one
