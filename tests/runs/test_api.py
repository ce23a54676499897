"""The runs API: submission with every problem at once, listing, following, acting, and the
workload-facing endpoints that only a run's own token reaches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from rest_framework.serializers import ModelSerializer
from rest_framework.test import APIClient

from executors.local import backend as local_backend
from runs import run_tokens
from runs.api.serializers import AttemptSerializer, RunDetailSerializer, RunSummarySerializer
from runs.events import verify_event_chain
from runs.logs import LOG_STREAM_BLOCK
from runs.models import Checkpoint, Delivery, MetricPoint, Run, RunAttempt, RunState
from tests.runs.factories import (
    ROOT,
    TINY_FILES,
    TINY_SPEC,
    cluster_quota,
    make_run,
    zip_bytes,
    zip_directory,
)

pytestmark = pytest.mark.django_db

RUNS = reverse("api:run-list", kwargs={"workspace_slug": "alpha"})


def run_url(name: str, view: str = "run-detail") -> str:
    return reverse(f"api:{view}", kwargs={"workspace_slug": "alpha", "run_name": name})


def submit(client: APIClient, spec: bytes, bundle: bytes | None = None) -> Any:
    payload: dict[str, Any] = {"spec": SimpleUploadedFile("tau.yaml", spec)}
    if bundle is not None:
        payload["bundle"] = SimpleUploadedFile("project.zip", bundle)
    return client.post(RUNS, payload, format="multipart")


def test_submit_the_cpu_quickstart(world: Any) -> None:
    example = ROOT / "examples" / "cpu-quickstart"
    response = submit(
        world.api_client_for("researcher"),
        (example / "tau.yaml").read_bytes(),
        zip_directory(example),
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["name"].startswith("cpu-quickstart-")
    assert body["state"] == "pending"
    assert body["url"] == run_url(body["name"])
    assert len(body["spec_hash"]) == 64
    assert body["bundle"]["files"] == 2
    run = Run.objects.for_workspace(world.alpha).get(name=body["name"])
    assert run.submitted_by_username == "rob"
    assert run.spec["runtime"]["image"] == "python:3.12-slim"  # the spec's own value is kept
    # One durable delivery record was written with the run.
    assert Delivery.objects.for_workspace(world.alpha).filter(run=run, action="submit").count() == 1
    detail = world.api_client_for("viewer").get(body["url"]).json()
    assert {"name", "state", "state_reason", "attempts"} <= set(detail)


def test_submit_reports_every_problem_with_lines(world: Any) -> None:
    broken = b"""schema_version: 1
name: Bad_Name
run:
  entrypoint: train.py
compute:
  gpus: -1
  wokers: 2
"""
    response = submit(world.api_client_for("researcher"), broken)
    assert response.status_code == 400
    problems = response.json()["problems"]
    by_path = {p["path"]: p for p in problems}
    assert {"name", "compute.gpus", "compute.wokers"} <= set(by_path)
    assert by_path["compute.wokers"]["line"] == 7
    assert "workers" in (by_path["compute.wokers"]["hint"] or "")
    assert Run.objects.for_workspace(world.alpha).count() == 0


def test_submit_applies_workspace_policy(world: Any) -> None:
    spec = TINY_SPEC + b"queue:\n  priority: urgent\n"
    response = submit(world.api_client_for("researcher"), spec)
    assert response.status_code == 400
    assert response.json()["problems"][0]["path"] == "queue.priority"
    assert Run.objects.for_workspace(world.alpha).count() == 0


def test_a_bad_bundle_changes_nothing(world: Any, settings: Any, tmp_path: Path) -> None:
    settings.VAR_DIR = tmp_path
    response = submit(world.api_client_for("researcher"), TINY_SPEC, b"this is not a zip")
    assert response.status_code == 400
    assert response.json()["problems"] == [
        {
            "path": "bundle",
            "line": None,
            "column": None,
            "message": "The bundle is not a zip file.",
            "hint": None,
        }
    ]
    assert Run.objects.for_workspace(world.alpha).count() == 0
    assert list((tmp_path / "bundles").iterdir()) == []


def test_submit_needs_a_spec_file(world: Any) -> None:
    response = world.api_client_for("researcher").post(RUNS, {}, format="multipart")
    assert response.status_code == 400
    assert "spec" in response.json()


def test_list_filters_and_pages_with_constant_queries(world: Any) -> None:
    client = world.api_client_for("viewer")
    make_run(world)
    with CaptureQueriesContext(connection) as few:
        assert client.get(RUNS).status_code == 200
    for _ in range(7):
        make_run(world)
    make_run(world, who="workspace_admin", state=RunState.FAILED)
    with CaptureQueriesContext(connection) as many:
        page = client.get(RUNS, {"limit": 4}).json()
    assert len(few) == len(many)
    assert len(page["results"]) == 4
    assert page["next"]
    second = client.get(page["next"]).json()
    assert {r["name"] for r in second["results"]}.isdisjoint({r["name"] for r in page["results"]})
    failed = client.get(RUNS, {"state": "failed"}).json()["results"]
    assert [r["submitted_by"] for r in failed] == ["alice"]
    by_alice = client.get(RUNS, {"submitter": "alice"}).json()["results"]
    assert len(by_alice) == 1
    by_name = client.get(RUNS, {"name": "tiny"}).json()["results"]
    assert len(by_name) == 9
    assert client.get(RUNS, {"state": "bogus"}).status_code == 400


def test_a_run_is_found_by_spec_name_as_its_newest_run(world: Any) -> None:
    make_run(world)
    newest = make_run(world)
    response = world.api_client_for("viewer").get(run_url("tiny"))
    assert response.json()["name"] == newest.name


def test_runs_of_another_workspace_are_not_found(world: Any) -> None:
    run = make_run(world)
    outsider = world.api_client_for("outsider")
    beta_url = reverse("api:run-detail", kwargs={"workspace_slug": "beta", "run_name": run.name})
    assert outsider.get(beta_url).status_code == 404
    assert outsider.post(beta_url + "cancel/").status_code == 404


def test_cancel_and_resume(world: Any) -> None:
    run = make_run(world)
    client = world.api_client_for("researcher")
    cancelled = client.post(run_url(run.name, "run-cancel"))
    assert cancelled.status_code == 200
    assert cancelled.json()["state"] == "cancelled"
    again = client.post(run_url(run.name, "run-cancel"))
    assert again.status_code == 409
    assert "already cancelled" in again.json()["detail"]
    resumed = client.post(run_url(run.name, "run-resume"), {}, format="json")
    assert resumed.status_code == 200
    assert resumed.json()["state"] == "queued"
    events = client.get(run_url(run.name, "run-events")).json()
    assert [e["kind"] for e in events] == ["submitted", "cancelled", "resumed"]
    run.refresh_from_db()
    assert verify_event_chain(run)


def test_only_the_submitter_or_an_admin_acts_on_a_run(world: Any) -> None:
    from workspaces.models import Membership

    colleague = world.users["outsider"]
    Membership.objects.create(workspace=world.alpha, user=colleague, role="researcher")
    run = make_run(world)
    assert world.api_client_for("outsider").post(run_url(run.name, "run-cancel")).status_code == 403
    assert (
        world.api_client_for("workspace_admin").post(run_url(run.name, "run-cancel")).status_code
        == 200
    )


def test_resume_from_a_chosen_checkpoint(world: Any, settings: Any, tmp_path: Path) -> None:
    settings.VAR_DIR = tmp_path
    run = make_run(world, state=RunState.FAILED)
    folder = local_backend.checkpoint_dir(run)
    for step in (10, 20):
        (folder / f"step-{step}").mkdir(parents=True)
    early = Checkpoint.objects.create(run=run, attempt=1, step=10, path=str(folder / "step-10"))
    Checkpoint.objects.create(run=run, attempt=1, step=20, path=str(folder / "step-20"))
    gone = Checkpoint.objects.create(run=run, attempt=1, step=5, path=str(folder / "step-5"))
    client = world.api_client_for("researcher")
    refused = client.post(run_url(run.name, "run-resume"), {"checkpoint": gone.pk}, format="json")
    assert refused.status_code == 409
    assert "no longer exists" in refused.json()["detail"]
    response = client.post(run_url(run.name, "run-resume"), {"checkpoint": early.pk}, format="json")
    assert response.status_code == 200
    run.refresh_from_db()
    assert run.resume_from == early
    other = make_run(world, state=RunState.FAILED)
    wrong = client.post(run_url(other.name, "run-resume"), {"checkpoint": early.pk}, format="json")
    assert wrong.status_code == 404
    assert wrong.json() == {"detail": "No such checkpoint of this run."}


def test_logs_tail_and_follow(world: Any, tmp_path: Path) -> None:
    run = make_run(world)
    log = tmp_path / "attempt.log"
    log.write_text("".join(f"line {i}\n" for i in range(1, 501)))
    # The run's first attempt, handed over with it at submission, wrote this log.
    RunAttempt.objects.for_workspace(world.alpha).filter(run=run, number=1).update(
        log_path=str(log)
    )
    client = world.api_client_for("viewer")
    tail = client.get(run_url(run.name, "run-logs"), {"tail": 3}).json()
    assert tail["text"] == "line 498\nline 499\nline 500\n"
    assert tail["next_offset"] == log.stat().st_size
    with log.open("a") as handle:
        handle.write("line 501\n")
    follow = client.get(run_url(run.name, "run-logs"), {"offset": tail["next_offset"]}).json()
    assert follow["text"] == "line 501\n"
    assert follow["complete"] is False
    assert client.get(run_url(run.name, "run-logs"), {"attempt": 9}).status_code == 404
    assert client.get(run_url(run.name, "run-logs"), {"offset": "x"}).status_code == 400


def test_metrics_are_downsampled_in_the_database(world: Any) -> None:
    run = make_run(world)
    MetricPoint.objects.bulk_create(
        [
            MetricPoint(run=run, attempt=1, key="loss", step=step, value=1.0 / (step + 1))
            for step in range(10_000)
        ]
        + [
            MetricPoint(run=run, attempt=1, key="acc", step=step, value=0.5)
            for step in range(0, 100, 10)
        ]
    )
    client = world.api_client_for("viewer")
    body = client.get(run_url(run.name, "run-metrics"), {"max_points": 100}).json()
    assert body["keys"] == ["acc", "loss"]
    loss = body["series"]["loss"]
    assert 50 <= len(loss) <= 100
    assert loss[0] == [0.0, 1.0]  # the first point as it was reported
    assert loss[-1] == [9999.0, 1.0 / 10_000]
    assert body["series"]["acc"] == [[float(step), 0.5] for step in range(0, 100, 10)]
    only = client.get(run_url(run.name, "run-metrics"), {"keys": "acc"}).json()
    assert list(only["series"]) == ["acc"]


def a_thousand_points(run: Run) -> list[tuple[float, float]]:
    """1,000 points of one series, steps 5 to 5,000 by 5, with a spike and a dip inside."""
    values = {step: 1.0 + ((step * 37) % 101) / 1000 for step in range(5, 5001, 5)}
    values[2_500] = 9.0
    values[3_000] = -4.0
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, attempt=1, key="loss", step=step, value=value)
        for step, value in values.items()
    )
    return [(float(step), value) for step, value in sorted(values.items())]


@pytest.mark.parametrize("max_points", [1, 2, 3, 10, 999, 1000, 5000])
def test_max_points_is_a_promise(world: Any, max_points: int) -> None:
    run = make_run(world)
    reported = a_thousand_points(run)
    body = world.api_client_for("viewer").get(
        run_url(run.name, "run-metrics"), {"max_points": max_points}
    )
    assert body.status_code == 200
    loss = [(step, value) for step, value in body.json()["series"]["loss"]]
    assert 1 <= len(loss) <= max_points
    assert loss[-1] == reported[-1]  # the newest step is always there
    if max_points >= 2:
        assert loss[0] == reported[0]
    assert set(loss) <= set(reported)  # real points, not made up
    assert [step for step, _ in loss] == sorted(step for step, _ in loss)
    if max_points >= len(reported):
        assert loss == reported
    elif max_points >= 6:
        # Every step range gives its lowest and highest point: no spike is averaged away.
        assert (2500.0, 9.0) in loss
        assert (3000.0, -4.0) in loss
        assert len(loss) > max_points // 2  # the budget is used, not wasted


def test_max_points_must_be_positive_and_is_capped(world: Any) -> None:
    run = make_run(world)
    a_thousand_points(run)
    client = world.api_client_for("viewer")
    url = run_url(run.name, "run-metrics")
    assert client.get(url, {"max_points": 0}).status_code == 400
    assert client.get(url, {"max_points": -3}).status_code == 400
    assert len(client.get(url, {"max_points": 10**9}).json()["series"]["loss"]) == 1000


def attempt_with_log(
    run: Run, number: int, content: bytes, directory: Path, *, finished: bool = True
) -> RunAttempt:
    log = directory / f"{run.name}-{number}.log"
    log.write_bytes(content)
    attempt, _ = RunAttempt.objects.for_workspace(run.workspace_id).update_or_create(
        run=run,
        number=number,
        defaults={
            "log_path": str(log),
            "log_size": len(content),
            "finished_at": timezone.now() if finished else None,
        },
    )
    return attempt


def test_the_whole_log_as_a_text_download(world: Any, settings: Any, tmp_path: Path) -> None:
    settings.VAR_DIR = tmp_path
    run = make_run(world)
    attempt_with_log(run, 1, b"attempt one\n", tmp_path)
    # Larger than one block, so a streamed answer comes in several pieces.
    newest = "".join(f"step {i} loss 0.{i:04d} — ok\n" for i in range(12_000)).encode()
    attempt_with_log(run, 2, newest, tmp_path)
    client = world.api_client_for("viewer")
    url = run_url(run.name, "run-logs")

    response = client.get(url, {"format": "text"})
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["Content-Disposition"] == f'attachment; filename="{run.name}-attempt-2.log"'
    assert response["Content-Length"] == str(len(newest))
    assert response.streaming  # never read whole into memory
    pieces = list(response.streaming_content)
    assert len(pieces) > 1
    assert max(len(piece) for piece in pieces) <= LOG_STREAM_BLOCK
    assert b"".join(pieces) == newest

    # Accept: text/plain is the same, here for the older attempt.
    older = client.get(url, {"attempt": 1}, HTTP_ACCEPT="text/plain")
    assert older["Content-Type"] == "text/plain; charset=utf-8"
    assert older["Content-Disposition"] == f'attachment; filename="{run.name}-attempt-1.log"'
    assert b"".join(older.streaming_content) == b"attempt one\n"

    # JSON stays the default, for follow and for a browser's Accept alike.
    for accept in (None, "application/json", "text/html,application/xhtml+xml,*/*;q=0.8"):
        headers = {} if accept is None else {"HTTP_ACCEPT": accept}
        chunk = client.get(url, {"tail": 1, "attempt": 1}, **headers)
        assert chunk["Content-Type"] == "application/json", accept
        assert chunk.json()["text"] == "attempt one\n"

    # What goes wrong is said in text to a client that asked for text.
    missing = client.get(url, {"format": "text", "attempt": 9})
    assert missing.status_code == 404
    assert missing["Content-Type"] == "text/plain; charset=utf-8"
    assert f"{run.name} has no attempt 9" in missing.content.decode()
    bad = client.get(url, {"attempt": "x"}, HTTP_ACCEPT="text/plain")
    assert bad.status_code == 400
    assert bad.content.decode() == "attempt: must be a whole number\n"


def test_a_live_log_as_text_stops_before_a_half_written_character(
    world: Any, settings: Any, tmp_path: Path
) -> None:
    settings.VAR_DIR = tmp_path
    run = make_run(world)
    encoded = "loss ↓ 0.31\n".encode()
    cut = encoded.index("↓".encode()) + 2  # the writer is in the middle of "↓"
    attempt_with_log(run, 1, encoded[:cut], tmp_path, finished=False)
    response = world.api_client_for("viewer").get(run_url(run.name, "run-logs"), {"format": "text"})
    assert b"".join(response.streaming_content) == b"loss "
    assert response["Content-Length"] == "5"


def test_a_run_whose_attempt_has_not_started_has_an_empty_text_log(world: Any) -> None:
    run = make_run(world)  # handed over with its first attempt, which waits
    response = world.api_client_for("viewer").get(
        run_url(run.name, "run-logs"), HTTP_ACCEPT="text/plain"
    )
    assert response.status_code == 200
    assert response["Content-Disposition"] == f'attachment; filename="{run.name}-attempt-1.log"'
    assert b"".join(response.streaming_content) == b""
    chunk = world.api_client_for("viewer").get(run_url(run.name, "run-logs")).json()
    assert (chunk["attempt"], chunk["text"], chunk["complete"]) == (1, "", False)


def test_the_schema_documents_the_text_log(world: Any) -> None:
    response = world.api_client_for("researcher").get(
        reverse("api:schema"), HTTP_ACCEPT="application/vnd.oai.openapi+json"
    )
    logs = response.json()["paths"]["/api/v1/workspaces/{workspace_slug}/runs/{run_name}/logs/"][
        "get"
    ]
    formats = {p["name"]: p for p in logs["parameters"]}["format"]
    assert formats["schema"]["enum"] == ["json", "text"]
    assert "text/plain" in formats["description"]
    assert set(logs["responses"]["200"]["content"]) == {"application/json", "text/plain"}


def run_token(world: Any, run: Run) -> str:
    """The token of the run's newest attempt, as the local agent issues it."""
    attempt = (
        RunAttempt.objects.for_workspace(run.workspace_id).filter(run=run).order_by("-number")[0]
    )
    token = run_tokens.issue_run_token(run=run, attempt=attempt, max_runtime_seconds=None)
    assert token is not None
    return token


def bearer(plaintext: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    return client


def test_a_workload_reports_with_its_run_token(world: Any, settings: Any, tmp_path: Path) -> None:
    settings.VAR_DIR = tmp_path
    run = make_run(world)
    client = bearer(run_token(world, run))
    rows = [{"step": 1, "loss": 0.9, "lr": 0.1}, {"step": 2, "loss": 0.7}]
    assert (
        client.post(
            run_url(run.name, "run-report-metrics"), {"rows": rows}, format="json"
        ).status_code
        == 202
    )
    assert MetricPoint.objects.for_workspace(world.alpha).filter(run=run).count() == 3
    bad = client.post(
        run_url(run.name, "run-report-metrics"),
        {"rows": [{"step": "x", "loss": "nan"}]},
        format="json",
    )
    assert bad.status_code == 400
    assert MetricPoint.objects.for_workspace(world.alpha).filter(run=run).count() == 3
    checkpoint = client.post(
        run_url(run.name, "run-report-checkpoints"),
        {"step": 2, "path": str(local_backend.checkpoint_dir(run) / "step-2")},
        format="json",
    )
    assert checkpoint.status_code == 201
    assert checkpoint.json()["path"] == str(
        tmp_path / "runs" / str(run.pk) / "checkpoints" / "step-2"
    )
    event = client.post(
        run_url(run.name, "run-report-events"),
        {"kind": "epoch", "message": "epoch 1 done"},
        format="json",
    )
    assert event.status_code == 201
    assert event.json()["kind"] == "workload.epoch"
    run.refresh_from_db()
    assert verify_event_chain(run)


def test_a_run_token_reaches_nothing_else(world: Any) -> None:
    run = make_run(world)
    other = make_run(world)
    client = bearer(run_token(world, run))
    # Not another run's reports, not the run's own reading endpoints, not any page of the API.
    assert (
        client.post(
            run_url(other.name, "run-report-metrics"), {"rows": []}, format="json"
        ).status_code
        == 404
    )
    assert client.get(run_url(run.name)).status_code == 403
    assert client.get(run_url(other.name, "run-logs")).status_code == 403
    assert client.get(reverse("api:workspace-list")).status_code == 403
    assert (
        client.post(
            RUNS, {"spec": SimpleUploadedFile("tau.yaml", TINY_SPEC)}, format="multipart"
        ).status_code
        == 403
    )
    # Nor the portal's pages: a bearer token is not a session.
    assert client.get(reverse("home")).status_code == 302


def test_bundle_download_for_members_and_its_own_workload(world: Any) -> None:
    run = make_run(world, files={"main.py": "print(1)\n"})
    other = make_run(world, files={"main.py": "print(2)\n"})
    response = world.api_client_for("viewer").get(run_url(run.name, "run-bundle"))
    assert response.status_code == 200
    assert run.bundle is not None
    assert response["X-Content-SHA256"] == run.bundle.sha256
    token = run_token(world, run)
    assert bearer(token).get(run_url(run.name, "run-bundle")).status_code == 200
    assert bearer(token).get(run_url(other.name, "run-bundle")).status_code == 404
    # A client that accepts only zip gets the zip, and a refusal as the API's JSON.
    zipped = bearer(token).get(run_url(run.name, "run-bundle"), HTTP_ACCEPT="application/zip")
    assert zipped.status_code == 200
    assert zipped["Content-Type"] == "application/zip"
    refused = bearer(token).get(run_url(other.name, "run-bundle"), HTTP_ACCEPT="application/zip")
    assert refused.status_code == 404
    assert refused.json()["detail"] == "No such run."


def test_the_kubernetes_backend_takes_submissions(world: Any, settings: Any) -> None:
    # No cluster here: the run and its delivery are written; the delivery reaches the cluster
    # later (tests/executors/kubernetes/test_kube_backend.py does that on the real one).
    settings.TAU_BACKEND = "kubernetes"
    cluster_quota(world.alpha)
    response = submit(world.api_client_for("researcher"), TINY_SPEC)
    assert response.status_code == 201, response.content
    run = Run.objects.for_workspace(world.alpha).get()
    assert run.backend == "kubernetes"
    assert [d.action for d in Delivery.objects.for_workspace(world.alpha).filter(run=run)] == [
        "submit"
    ]


def test_following_a_log_never_splits_a_character(world: Any, tmp_path: Path) -> None:
    run = make_run(world)
    log = tmp_path / "attempt.log"
    text = "loss ↓ 0.31 — ok ✓\n"
    encoded = text.encode()
    cut = encoded.index("↓".encode()) + 1  # the writer is in the middle of "↓"
    log.write_bytes(encoded[:cut])
    # The run's first attempt, handed over with it at submission, wrote this log.
    RunAttempt.objects.for_workspace(world.alpha).filter(run=run, number=1).update(
        log_path=str(log)
    )
    client = world.api_client_for("viewer")
    first = client.get(run_url(run.name, "run-logs"), {"offset": 0}).json()
    assert first["text"] == "loss "
    log.write_bytes(encoded)
    rest = client.get(run_url(run.name, "run-logs"), {"offset": first["next_offset"]}).json()
    assert first["text"] + rest["text"] == text
    assert rest["next_offset"] == len(encoded)


def test_the_answer_to_a_submission_is_the_run_in_full(world: Any) -> None:
    """The 201 is the run's detail (the shape the schema declares), the same as reading the
    run back right after, and what the run may cost (said once, at submission)."""
    client = world.api_client_for("researcher")
    created = submit(client, TINY_SPEC, zip_bytes(TINY_FILES))
    assert created.status_code == 201
    body = created.json()
    cost = body.pop("cost")
    assert body == client.get(body["url"]).json()
    assert set(body) == set(RunDetailSerializer.Meta.fields)
    assert body["bundle"]["files"] == 1
    assert cost["summary"] == "It uses no GPUs, so no GPU-hour budget."


def test_a_submission_costs_a_fixed_number_of_queries(
    world: Any, django_assert_num_queries: Any
) -> None:
    client = world.api_client_for("researcher")
    submit(client, TINY_SPEC, zip_bytes(TINY_FILES))  # the bundle is stored once
    # The caller's workspace and role (1); its quotas, for the policy (1); the bundle, kept
    # once per content, looked up in its own transaction (3: a savepoint in a test); the run,
    # in a transaction (2) with its own savepoint for the name-clash retry (3), its first
    # event (1), its first attempt (1) and the delivery that hands it over (1); the answer's
    # attempts (1).
    with django_assert_num_queries(14):
        response = submit(client, TINY_SPEC, zip_bytes(TINY_FILES))
    assert response.status_code == 201


def test_the_runs_list_reads_each_run_once(world: Any) -> None:
    """A page of summaries is what the generic serializer would give, and its addresses are
    what ``reverse`` gives, without a query per run (nor its spec)."""
    runs = [make_run(world), make_run(world, state=RunState.FAILED)]
    Run.objects.for_workspace(world.alpha).filter(pk=runs[1].pk).update(
        started_at=timezone.now(), finished_at=timezone.now(), queue_position=3
    )
    client = world.api_client_for("viewer")
    with CaptureQueriesContext(connection) as queries:
        page = client.get(RUNS).json()["results"]
    assert not any('"spec_source"' in query["sql"] for query in queries.captured_queries)
    fresh = Run.objects.for_workspace(world.alpha).select_related("workspace").order_by("-id")
    generic = [ModelSerializer.to_representation(RunSummarySerializer(), run) for run in fresh]
    assert page == generic
    assert [r["url"] for r in page] == [run_url(run.name) for run in fresh]


def test_a_run_in_full_is_what_the_generic_serializer_gives(world: Any, tmp_path: Path) -> None:
    run = make_run(world, state=RunState.FAILED)
    attempt_with_log(run, 1, b"log\n", tmp_path)
    Run.objects.for_workspace(world.alpha).filter(pk=run.pk).update(
        queued_at=timezone.now(), cancel_requested_at=timezone.now(), attempt_count=1
    )
    fresh = (
        Run.objects.for_workspace(world.alpha)
        .select_related("workspace", "bundle")
        .prefetch_related("attempts__resume_from")
        .get(pk=run.pk)
    )
    generic = ModelSerializer.to_representation(RunDetailSerializer(), fresh)
    assert RunDetailSerializer(fresh).data == generic
    assert list(RunDetailSerializer(fresh).data) == list(generic)  # the same order too
    assert generic["attempts"][0]["number"] == 1
    assert generic["bundle"]["files"] == 1


def test_an_attempt_is_what_the_generic_serializer_gives(world: Any, tmp_path: Path) -> None:
    run = make_run(world, state=RunState.FAILED)
    checkpoint = Checkpoint.objects.create(run=run, attempt=1, step=40, path="/ckpt/step-40")
    failed = attempt_with_log(run, 7, b"Killed\n", tmp_path)
    RunAttempt.objects.for_workspace(world.alpha).filter(pk=failed.pk).update(
        state=RunAttempt.State.FAILED,
        exit_code=137,
        failure_class="oom_killed",
        failure_message="out of memory",
        retry_reason="oom_killed",
        started_at=timezone.now(),
        resume_from=checkpoint,
    )
    for attempt in RunAttempt.objects.for_workspace(world.alpha).filter(run=run):
        generic = ModelSerializer.to_representation(AttemptSerializer(), attempt)
        assert AttemptSerializer(attempt).data == generic
        assert list(AttemptSerializer(attempt).data) == list(generic)
    failed.refresh_from_db()
    shown = AttemptSerializer(failed).data
    assert (shown["resume_from_step"], shown["exit_code"]) == (40, 137)
    assert shown["failure_hint"]
