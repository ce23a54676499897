"""Sealing and export on PostgreSQL, with runs moved through ``runs.state.transition`` (the
one writer of a run's state, as every backend uses it): one request per ending, written with
it; idempotent sealing; a crash while sealing sealed later; a resumed run's second record
beside the first; the export verified by ``tau.evidence.verify``; key rotation; who may
download; the public keyring; the run page's evidence section and its query count."""

from __future__ import annotations

import base64
import io
import json
import tarfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from evidence import keys, sealing
from evidence.export import export_stream
from evidence.manifest import build_manifest
from evidence.models import SealRequest
from evidence.tasks import reconcile_seals
from runs import lifecycle
from runs.artifacts import content_path, store_artifact
from runs.models import Artifact, MetricPoint, Run, RunAttempt, RunState
from runs.state import transition
from tau.evidence.keys import key_id, load_trusted_keys, public_key_bytes
from tau.evidence.verify import verify_file
from tests.evidence.helpers import (
    download,
    export_url,
    manifest_of,
    member_names,
    records_of,
    seal_all,
)
from tests.runs.factories import TINY_SPEC, make_run
from tests.runs.test_api import bearer, run_token

pytestmark = pytest.mark.django_db


def finish(run: Run, end: RunState, log: Path | None = None) -> Run:
    """Take a submitted run through its life to ``end``; its attempt writes ``log``."""
    transition(run, RunState.QUEUED)
    if end == RunState.CANCELLED:
        return transition(run, RunState.CANCELLED, reason="cancelled while queued")
    transition(run, RunState.ADMITTED)
    transition(run, RunState.RUNNING)
    attempt = RunAttempt.objects.for_workspace(run.workspace_id).get(run=run, number=1)
    if log is not None:
        attempt.log_path = str(log)
        attempt.log_size = log.stat().st_size
    attempt.state = RunAttempt.State.SUCCEEDED if end == RunState.SUCCEEDED else "failed"
    attempt.exit_code = 0 if end == RunState.SUCCEEDED else 1
    attempt.started_at = attempt.finished_at = timezone.now()
    attempt.save()
    return transition(run, end)


def test_every_ending_writes_one_request_and_seals_one_verifiable_record(
    world: Any, var_dir: Path, tmp_path: Path
) -> None:
    for end in (RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED):
        run = make_run(
            world,
            spec=b"schema_version: 1\nname: e-%b\nrun:\n  entrypoint: main.py\n"
            b"  workload_kind: job\ncompute:\n  cpus: 1\n  memory: 256Mi\n" % end.encode(),
        )
        log = tmp_path / f"{end}.log"
        log.write_bytes(b"step 1\nstep 2\n")
        run = finish(run, end, log)
        (request,) = SealRequest.objects.for_workspace(world.alpha).filter(run=run)
        assert request.sealed_at is None
        (record,) = seal_all(run)
        manifest = manifest_of(record)
        assert manifest["run"]["state"] == end == record.state
        assert manifest["run"]["name"] == run.name
        assert manifest["events"]["count"] == run.events.count() == record.event_count
        exported = download(world.api_client_for("viewer"), run, tmp_path / f"{end}.tar")
        report = verify_file(exported, load_trusted_keys(json.dumps(keys.keyring()).encode()))
        assert report.ok, report.problems
        assert report.trusted is True
        has_log = end != RunState.CANCELLED
        assert ("attempts/1/log.txt" in member_names(exported)) is has_log


def test_sealing_twice_keeps_one_record_and_the_same_bytes(world: Any, var_dir: Path) -> None:
    run = finish(make_run(world), RunState.SUCCEEDED)
    (request,) = SealRequest.objects.for_workspace(world.alpha).filter(run=run)
    assert sealing.seal(request.pk)
    assert not sealing.seal(request.pk)  # sealed already: nothing happens
    (record,) = records_of(run)
    first = bytes(record.manifest), bytes(record.signature)
    assert sealing.due_seals(grace_seconds=0) == []
    # A second worker that raced past a lapsed claim builds its own: the first one stays.
    again = sealing._sealed_record(request)
    assert not sealing._store(again)
    (record,) = records_of(run)
    assert (bytes(record.manifest), bytes(record.signature)) == first


def test_a_crash_while_sealing_is_sealed_later(
    world: Any, var_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = finish(make_run(world), RunState.FAILED)
    (request,) = SealRequest.objects.for_workspace(world.alpha).filter(run=run)

    def crash(*args: Any, **kwargs: Any) -> Any:
        raise OSError("disk gone")

    monkeypatch.setattr(sealing, "build_manifest", crash)
    assert not sealing.seal(request.pk)
    request.refresh_from_db()
    assert request.sealed_at is None
    assert request.claimed_at is None
    assert "disk gone" in request.last_error
    assert records_of(run) == []
    monkeypatch.setattr(sealing, "build_manifest", build_manifest)
    # Due again after its backoff: the reconciler seals it.
    SealRequest.objects.unscoped().filter(pk=request.pk).update(
        next_try_at=timezone.now(), created_at=timezone.now() - timedelta(minutes=1)
    )
    assert sealing.due_seals() == [request.pk]
    assert reconcile_seals() == 1
    assert len(records_of(run)) == 1


def test_a_resumed_run_that_ends_again_gets_a_second_record(
    world: Any, var_dir: Path, tmp_path: Path
) -> None:
    run = finish(make_run(world), RunState.FAILED)
    (first,) = seal_all(run)
    MetricPoint.objects.create(run=run, attempt=2, key="loss", step=1, value=0.5)
    resumed = lifecycle.resume_run(run=run, user=world.users["researcher"])
    # While it runs again, its page and its export say nothing of the old ending.
    response = world.api_client_for("researcher").get(export_url(run))
    assert response.status_code == 409
    assert "not finished" in response.json()["detail"]
    transition(resumed, RunState.CANCELLED)
    older, newer = seal_all(run)
    assert older.pk == first.pk
    assert bytes(older.manifest) == bytes(first.manifest)
    assert (older.attempt_count, newer.attempt_count) == (1, 2)
    assert manifest_of(older)["metrics"]["count"] == 0
    assert manifest_of(newer)["metrics"]["count"] == 1
    assert newer.terminal_seq > older.terminal_seq
    report = verify_file(download(world.api_client_for("viewer"), run, tmp_path / "r.tar"))
    assert report.ok, report.problems


def test_not_yet_sealed_is_a_conflict(world: Any, var_dir: Path) -> None:
    run = finish(make_run(world), RunState.SUCCEEDED)
    response = world.api_client_for("viewer").get(export_url(run))
    assert response.status_code == 409
    assert "being sealed" in response.json()["detail"]


def test_a_client_that_accepts_only_tar_gets_the_tar_and_json_problems(
    world: Any, var_dir: Path
) -> None:
    """``Accept: application/x-tar`` (what ``tau evidence pull`` sends) is answered with the
    file, and a refusal with the API's JSON problem, never a 406."""
    run = finish(make_run(world), RunState.SUCCEEDED)
    client = world.api_client_for("viewer")
    early = client.get(export_url(run), HTTP_ACCEPT="application/x-tar")
    assert early.status_code == 409
    assert early["Content-Type"] == "application/json"
    assert "being sealed" in early.json()["detail"]
    seal_all(run)
    response = client.get(export_url(run), HTTP_ACCEPT="application/x-tar")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/x-tar"
    assert b"".join(response.streaming_content)[257:262] == b"ustar"


def test_outsiders_get_404_and_run_tokens_are_refused(world: Any, var_dir: Path) -> None:
    run = finish(make_run(world), RunState.SUCCEEDED)
    seal_all(run)
    assert world.api_client_for("outsider").get(export_url(run)).status_code == 404
    assert world.api_client_for("anonymous").get(export_url(run)).status_code == 401
    response = bearer(run_token(world, run)).get(export_url(run))
    assert response.status_code == 403
    assert "report on its run" in response.json()["detail"]


def pem(private: Ed25519PrivateKey) -> str:
    return private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def test_key_rotation_keeps_older_records_verifying(
    world: Any, var_dir: Path, settings: Any, tmp_path: Path, client: Any
) -> None:
    old, new = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    settings.TAU_EVIDENCE_SIGNING_KEY = pem(old)
    run = finish(make_run(world), RunState.SUCCEEDED)
    (record,) = seal_all(run)
    assert record.key_id == key_id(public_key_bytes(old))
    exported = download(world.api_client_for("viewer"), run, tmp_path / "old.tar")

    # Rotate: a new signing key; the old public key kept in the keyring file.
    settings.TAU_EVIDENCE_SIGNING_KEY = pem(new)
    ring = tmp_path / "older-keys.json"
    ring.write_text(
        json.dumps(
            {
                "keys": [
                    {
                        "key_id": key_id(public_key_bytes(old)),
                        "algorithm": "Ed25519",
                        "public_key": base64.b64encode(public_key_bytes(old)).decode(),
                        "current": True,
                    }
                ]
            }
        )
    )
    settings.TAU_EVIDENCE_PUBLIC_KEYS_FILE = str(ring)
    published = client.get("/api/v1/evidence/keys/")
    assert published.status_code == 200
    document = published.json()
    assert {(entry["key_id"], entry["current"]) for entry in document["keys"]} == {
        (key_id(public_key_bytes(new)), True),
        (key_id(public_key_bytes(old)), False),
    }
    trusted = load_trusted_keys(published.content)
    assert verify_file(exported, trusted).ok
    # A record signed by a key the keyring does not hold is refused.
    only_new = {key_id(public_key_bytes(new)): public_key_bytes(new)}
    refused = verify_file(exported, only_new)
    assert not refused.ok
    assert refused.trusted is False
    # New records are signed with the new key.
    second = finish(make_run(world), RunState.SUCCEEDED)
    (record,) = seal_all(second)
    assert record.key_id == key_id(public_key_bytes(new))


def test_the_generated_key_is_private_and_stable(world: Any, var_dir: Path) -> None:
    first = public_key_bytes(keys.signing_key())
    path = var_dir / "evidence_signing_key.pem"
    assert path.stat().st_mode & 0o777 == 0o600
    assert public_key_bytes(keys.signing_key()) == first


#: The run page of a finished run with its evidence: session, user, navigation, access,
#: resolve run, attempts, events, checkpoints, artifacts, the data it read and made, the
#: pipeline stage it is (tests/pages/test_page_queries.py), plus the evidence section's newest
#: record and its check for a newer ending still sealing.
FINISHED_RUN_PAGE_QUERIES = 14


def page_queries(client: Any, run: Run) -> tuple[int, bytes]:
    with CaptureQueriesContext(connection) as queries:
        page = client.get(f"/w/alpha/runs/{run.name}/")
    assert page.status_code == 200
    return len(queries), page.content


def test_the_run_page_shows_the_evidence_at_a_fixed_query_count(world: Any, var_dir: Path) -> None:
    client = world.client_for("viewer")
    live = make_run(world)
    _, content = page_queries(client, live)
    assert b"evidence-heading" not in content  # nothing to say while it runs
    run = finish(make_run(world), RunState.SUCCEEDED)
    _, content = page_queries(client, run)
    assert b"Sealing" in content
    (record,) = seal_all(run)
    few, content = page_queries(client, run)
    assert record.key_id.encode() in content
    assert export_url(run).encode() in content
    # More endings, more records: the same number of queries.
    for _ in range(3):
        resumed = lifecycle.resume_run(run=run, user=world.users["researcher"])
        transition(resumed, RunState.CANCELLED)
        seal_all(run)
    many, content = page_queries(client, run)
    assert few == many == FINISHED_RUN_PAGE_QUERIES
    assert b"Sealing" not in content


def test_an_older_record_keeps_its_artifacts_after_a_later_attempt_replaced_them(
    world: Any, var_dir: Path, tmp_path: Path
) -> None:
    run = make_run(world, spec=TINY_SPEC + b"outputs:\n  artifacts: [model/**]\n")
    store_artifact(run=run, attempt=1, name="model/w.pt", source=io.BytesIO(b"first"))
    run = finish(run, RunState.SUCCEEDED)
    assert len(seal_all(run)) == 1
    resumed = lifecycle.resume_run(run=run, user=world.users["researcher"])
    store_artifact(run=resumed, attempt=2, name="model/w.pt", source=io.BytesIO(b"second!"))
    transition(resumed, RunState.CANCELLED)
    older, newer = seal_all(run)
    assert manifest_of(older)["artifacts"][0]["size"] == len(b"first")
    assert manifest_of(newer)["artifacts"][0]["size"] == len(b"second!")
    # The export is the newest record's; the older one still exports as it was sealed.
    exported = tmp_path / "older.tar"
    length, chunks = export_stream(older)
    exported.write_bytes(b"".join(chunks))
    assert exported.stat().st_size == length
    assert verify_file(exported).ok
    with tarfile.open(exported) as tar:
        member = tar.extractfile("artifacts/model/w.pt")
        assert member is not None
        assert member.read() == b"first"
    assert verify_file(download(world.api_client_for("viewer"), run, tmp_path / "new.tar")).ok


def test_a_file_no_longer_kept_is_a_conflict_before_any_byte(
    world: Any, var_dir: Path, tmp_path: Path
) -> None:
    log = tmp_path / "gone.log"
    log.write_bytes(b"a log\n")
    run = finish(
        make_run(world, spec=TINY_SPEC + b"outputs:\n  artifacts: [model/**]\n"),
        RunState.SUCCEEDED,
        log,
    )
    store_artifact(run=run, attempt=1, name="model/w.pt", source=io.BytesIO(b"weights"))
    seal_all(run)
    (artifact,) = Artifact.objects.for_workspace(world.alpha).filter(run=run)
    content_path(artifact.sha256).unlink()
    response = world.api_client_for("viewer").get(export_url(run))
    assert response.status_code == 409
    assert "artifacts/model/w.pt is no longer kept" in response.json()["detail"]


def test_a_cluster_run_is_sealed_once_its_logs_are_kept(
    world: Any, var_dir: Path, tmp_path: Path
) -> None:
    run = finish(make_run(world), RunState.FAILED)
    Run.objects.unscoped().filter(pk=run.pk).update(backend="kubernetes")
    (request,) = SealRequest.objects.for_workspace(world.alpha).filter(run=run)
    assert not sealing.seal(request.pk)
    request.refresh_from_db()
    assert "waiting for the log of attempt 1" in request.last_error
    # The watcher keeps it: the next try seals it, with the log.
    log = tmp_path / "pod.log"
    log.write_bytes(b"from the pod\n")
    RunAttempt.objects.unscoped().filter(run=run).update(log_path=str(log), log_size=13)
    SealRequest.objects.unscoped().filter(pk=request.pk).update(next_try_at=timezone.now())
    assert sealing.seal(request.pk)
    (record,) = records_of(run)
    assert manifest_of(record)["attempts"][0]["log"] == "attempts/1/log.txt"


def test_a_log_that_never_comes_does_not_hold_the_record_forever(world: Any, var_dir: Path) -> None:
    run = finish(make_run(world), RunState.FAILED)
    Run.objects.unscoped().filter(pk=run.pk).update(backend="kubernetes")
    (request,) = SealRequest.objects.for_workspace(world.alpha).filter(run=run)
    SealRequest.objects.unscoped().filter(pk=request.pk).update(
        created_at=timezone.now() - sealing.LOG_WAIT - timedelta(seconds=1)
    )
    assert sealing.seal(request.pk)
    (record,) = records_of(run)
    assert manifest_of(record)["attempts"][0]["log"] is None
