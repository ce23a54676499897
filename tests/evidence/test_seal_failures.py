"""Sealing that cannot succeed, and sealing that must not wait (issue 30).

* The attack: a step of 2^53 + 1 was accepted (steps < 2^63) and made the run's evidence
  unsealable forever (canonical JSON holds integers exactly only up to 2^53). Such a step is
  now refused where it arrives — the API, checkpoints, the agent's metrics file — and a seal
  that fails anyway is given up after ``sealing.MAX_TRIES`` tries, said on the run page, by
  the API and in the admin, and sealed again by staff once the cause is fixed.
* A cluster attempt whose pods were gone when it ended (a cancel while it ran) has no log to
  keep: the watcher says so, and the evidence is sealed at once with that reason instead of
  waiting (with a traceback per retry) for a log that cannot come.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from evidence import sealing
from evidence.models import SealRequest
from executors.kubernetes.watcher import AttemptKey, KubeWatcher
from executors.local.agent.collect import MetricsReader, checkpoint_step
from kube import KubeError
from portal.models import AuditEvent
from runs.metric_rules import MAX_STEP
from runs.models import Checkpoint, MetricPoint, Run, RunAttempt, RunState
from runs.state import transition
from tau.evidence.canonical import MAX_SAFE_INTEGER
from tests.evidence.helpers import export_url, manifest_of, records_of
from tests.evidence.test_records import finish
from tests.runs.factories import make_run
from tests.runs.test_api import bearer, run_token, run_url

pytestmark = pytest.mark.django_db

TOO_BIG = 2**53 + 1


def _report(client: Any, run: Run, rows: list[dict[str, Any]]) -> Any:
    return client.post(run_url(run.name, "run-report-metrics"), {"rows": rows}, format="json")


def test_a_step_the_evidence_cannot_hold_is_refused_where_it_arrives(
    world: Any, var_dir: Path, tmp_path: Path
) -> None:
    assert MAX_STEP == MAX_SAFE_INTEGER == 2**53 - 1
    run = make_run(world)
    client = bearer(run_token(world, run))
    refused = _report(client, run, [{"step": TOO_BIG, "loss": 1.0}])
    assert refused.status_code == 400, refused.content
    assert "at most 2^53 - 1 (9007199254740991)" in refused.json()["problems"][0]
    refused = _report(client, run, [{"step": -TOO_BIG, "loss": 1.0}])
    assert refused.status_code == 400
    assert _report(client, run, [{"step": MAX_STEP, "loss": 1.0}]).status_code == 202
    # A checkpoint's step and size end up in the record too.
    for body in ({"step": TOO_BIG, "path": "step-1"}, {"step": 1, "path": "s", "size": TOO_BIG}):
        answer = client.post(run_url(run.name, "run-report-checkpoints"), body, format="json")
        assert answer.status_code == 400, (body, answer.content)
    assert not Checkpoint.objects.unscoped().filter(run=run).exists()
    # The agent's metrics file: the line is skipped and says why; its other lines are kept.
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        json.dumps({"step": TOO_BIG, "loss": 1.0})
        + "\n"
        + json.dumps({"step": 3, "loss": 0.5})
        + "\n"
    )
    batch = MetricsReader(path).read()
    assert [row.step for row in batch.rows] == [3]
    assert "at most 2^53 - 1" in batch.problems[0]
    # A checkpoint folder named with such a step is not a checkpoint's.
    assert checkpoint_step(f"step-{TOO_BIG}") is None
    assert checkpoint_step(f"step-{MAX_STEP}") == MAX_STEP

    # The run ends: its evidence seals, and the largest step comes back exactly.
    run = finish(run, RunState.SUCCEEDED)
    (request,) = SealRequest.objects.unscoped().filter(run=run)
    assert sealing.seal(request.pk)
    (record,) = records_of(run)
    assert manifest_of(record)["metrics"]["count"] == 1
    metrics = world.api_client_for("viewer").get(run_url(run.name, "run-metrics")).json()
    (point,) = metrics["series"]["loss"]
    assert point[0] == MAX_STEP  # not rounded on the way


def _fail_until_given_up(request: SealRequest) -> int:
    """Seal ``request`` as the reconciler would, each try as soon as it is due; the tries."""
    tries = 0
    for _ in range(sealing.MAX_TRIES + 3):
        SealRequest.objects.unscoped().filter(pk=request.pk).update(next_try_at=timezone.now())
        assert not sealing.seal(request.pk)
        tries += 1
        request.refresh_from_db()
        if request.given_up_at is not None:
            break
    return tries


def test_a_seal_that_keeps_failing_is_given_up_said_and_sealed_again_by_staff(
    world: Any, var_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A point stored before steps were bounded (or written straight into the table).
    run = make_run(world)
    MetricPoint.objects.create(run=run, attempt=1, key="loss", step=TOO_BIG, value=1.0)
    run = finish(run, RunState.FAILED)
    (request,) = SealRequest.objects.unscoped().filter(run=run)
    caplog.set_level(logging.INFO, logger="evidence.sealing")

    assert _fail_until_given_up(request) == sealing.MAX_TRIES
    assert request.given_up_at is not None
    assert request.claimed_at is None
    assert "cannot be held exactly by an IEEE 754 double" in request.last_error
    # One line per try; the traceback with the first and the last only.
    tries = [r for r in caplog.records if f"seal {request.pk}" in r.getMessage()]
    assert len(tries) == sealing.MAX_TRIES
    assert sum(r.exc_info is not None for r in tries) == 2
    assert "giving up" in tries[-1].getMessage()
    # Never tried again by itself.
    assert request.pk not in sealing.due_seals(grace_seconds=0)
    SealRequest.objects.unscoped().filter(pk=request.pk).update(next_try_at=timezone.now())
    assert not sealing.seal(request.pk)
    request.refresh_from_db()
    assert request.tries == sealing.MAX_TRIES

    # Said where people look: the run page, the API, the admin.
    page = world.client_for("viewer").get(f"/w/alpha/runs/{run.name}/").content.decode()
    assert "could not be sealed" in page
    assert "cannot be held exactly" in page
    assert "data-poll-url" not in page.split('id="evidence"')[1].split(">")[0]
    answer = world.api_client_for("viewer").get(export_url(run))
    assert answer.status_code == 409
    assert answer.json()["detail"].startswith("The run's evidence could not be sealed: ValueError")
    listed = world.api_client_for("viewer").get(
        reverse("api:run-evidence-records", args=["alpha", run.name])
    )
    assert [(e["status"], e["error"][:10]) for e in listed.json()] == [("not_sealed", "ValueError")]
    staff = world.client_for("platform_admin")
    admin_list = reverse("admin:evidence_sealrequest_changelist")
    shown = staff.get(f"{admin_list}?status=given-up").content.decode()
    assert run.name in shown
    assert "could not be sealed (given up)" in shown

    # The cause fixed, staff seal it again: it is sealed, and that is audited.
    MetricPoint.objects.unscoped().filter(run=run).update(step=5)
    answer = staff.post(
        admin_list, {"action": "seal_again", "_selected_action": [request.pk]}, follow=True
    )
    assert "Sealing again 1 record(s)" in answer.content.decode()
    request.refresh_from_db()
    assert request.given_up_at is None
    assert request.tries == 0
    assert AuditEvent.objects.unscoped().filter(
        action="evidence.seal_again", object_id=str(request.pk)
    )
    assert request.pk in sealing.due_seals(grace_seconds=0)
    assert sealing.seal(request.pk)
    assert len(records_of(run)) == 1


def _ended_on_the_cluster(world: Any) -> tuple[Run, SealRequest]:
    """A run whose one attempt ran on the cluster and was cancelled; no log kept (yet)."""
    run = finish(make_run(world), RunState.FAILED)
    Run.objects.unscoped().filter(pk=run.pk).update(backend="kubernetes")
    (request,) = SealRequest.objects.unscoped().filter(run=run)
    return run, request


def test_waiting_for_the_watcher_is_one_line_and_no_failed_try(
    world: Any, var_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _run, request = _ended_on_the_cluster(world)
    caplog.set_level(logging.INFO, logger="evidence.sealing")
    for _ in range(3):
        SealRequest.objects.unscoped().filter(pk=request.pk).update(next_try_at=timezone.now())
        assert not sealing.seal(request.pk)
    request.refresh_from_db()
    assert request.tries == 0
    assert request.claimed_at is None
    assert request.last_error == "waiting for the log of attempt 1"
    said = [r for r in caplog.records if r.name == "evidence.sealing"]
    assert len(said) == 3
    assert all(r.levelno == logging.INFO and r.exc_info is None for r in said)


def test_an_attempt_whose_pods_were_gone_is_sealed_at_once_saying_why(
    world: Any, var_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, request = _ended_on_the_cluster(world)
    watcher = KubeWatcher(client=None, resync_seconds=300)  # type: ignore[arg-type]
    kept = "executors.kubernetes.watcher.KubernetesBackend.archive_log"

    # The cluster does not answer: nobody knows yet whether there is a log; sealing waits.
    def no_answer(self: Any, run: Run, attempt: RunAttempt) -> None:
        raise KubeError("the API server did not answer")

    monkeypatch.setattr(kept, no_answer)
    watcher._keep_log(AttemptKey(run.pk, 1))
    assert RunAttempt.objects.unscoped().get(run=run).log_note == ""
    assert not sealing.seal(request.pk)

    # No pod of the attempt remains (the cancel deleted them): the watcher says so.
    monkeypatch.setattr(kept, lambda self, run, attempt: None)
    watcher._keep_log(AttemptKey(run.pk, 1))
    attempt = RunAttempt.objects.unscoped().get(run=run)
    assert attempt.log_path == ""
    assert attempt.log_note.startswith("no log was kept: no pod of attempt 1 remained")
    # Sealed at once, with the reason in the record.
    SealRequest.objects.unscoped().filter(pk=request.pk).update(next_try_at=timezone.now())
    assert sealing.seal(request.pk)
    (record,) = records_of(run)
    (entry,) = manifest_of(record)["attempts"]
    assert entry["log"] is None
    assert entry["log_note"] == attempt.log_note


def test_an_attempt_that_never_started_is_sealed_saying_no_log_was_written(
    world: Any, var_dir: Path
) -> None:
    run = make_run(world)
    transition(run, RunState.QUEUED)
    run = transition(run, RunState.CANCELLED, reason="cancelled while queued")
    Run.objects.unscoped().filter(pk=run.pk).update(backend="kubernetes")
    (request,) = SealRequest.objects.unscoped().filter(run=run)
    assert sealing.seal(request.pk)
    (entry,) = manifest_of(records_of(run)[0])["attempts"]
    assert entry["log_note"] == "no log was written: the attempt never started"


def test_a_seal_that_fails_halfway_through_the_metrics_leaves_no_cursor_open(
    world: Any, var_dir: Path
) -> None:
    """A half-read server-side cursor left to the garbage collector is closed later, inside
    whatever transaction the connection is in then, and aborts it (a worker's next task, or
    in the suite, the next test's admin request): sealing closes its cursors when it fails."""
    from django.db import connection

    run = make_run(world)
    MetricPoint.objects.create(run=run, attempt=1, key="a", step=1, value=1.0)
    MetricPoint.objects.create(run=run, attempt=1, key="b", step=TOO_BIG, value=1.0)
    MetricPoint.objects.create(run=run, attempt=1, key="c", step=1, value=1.0)
    run = finish(run, RunState.FAILED)
    (request,) = SealRequest.objects.unscoped().filter(run=run)
    assert not sealing.seal(request.pk)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_cursors")
        (open_cursors,) = cursor.fetchone()
    assert open_cursors == 0
