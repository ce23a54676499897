"""The portal's own check of a sealed record (the run page's "verified" state): asked for by
sealing, done by ``evidence.verification`` on the export as it downloads now, against the
portal's keyring; what it finds is on the run page, a change on disk is named as the offline
verifier names it, and a check asked for and lost is done by the reconciler."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.utils import timezone

from evidence import verification
from evidence.models import EvidenceRecord
from evidence.tasks import reconcile_seals
from portal import outbox
from runs.models import RunState
from tests.evidence.helpers import seal_all
from tests.evidence.test_records import finish
from tests.runs.factories import make_run

pytestmark = pytest.mark.django_db

LOG = b"step 1: loss 0.70\nstep 2: loss 0.41\n"


def sealed(world: Any, tmp_path: Path) -> tuple[Any, EvidenceRecord, Path]:
    log = tmp_path / "attempt-1.log"
    log.write_bytes(LOG)
    run = finish(make_run(world), RunState.SUCCEEDED, log)
    (record,) = seal_all(run)
    return run, record, log


def evidence_section(client: Any, run: Any) -> str:
    response = client.get(f"/w/alpha/runs/{run.name}/evidence/")
    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    return str(response.content.decode())


def test_a_sealed_record_is_checked_and_the_page_says_verified(
    world: Any,
    var_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    asked: list[int] = []
    monkeypatch.setattr(verification, "publish", asked.append)
    with django_capture_on_commit_callbacks(execute=True):
        run, record, _log = sealed(world, tmp_path)
    client = world.client_for("viewer")
    # Sealing asked for a check (published once its transaction committed).
    assert record.verify_requested_at == record.sealed_at
    assert record.verified_at is None
    assert asked == [record.pk]
    section = evidence_section(client, run)
    assert "Checking the sealed record" in section
    assert "data-poll-url" in section  # the section polls until the check is done

    assert verification.verify(record.pk) == []
    record.refresh_from_db()
    assert record.verified_at is not None
    assert record.verify_requested_at is None
    assert record.verification_problems == []
    section = evidence_section(client, run)
    assert "Verified" in section
    assert "data-poll-url" not in section
    assert "Does not verify" not in section
    # The full run page says the same.
    assert b"Verified" in client.get(f"/w/alpha/runs/{run.name}/").content
    # Nothing left behind under var/.
    assert list((var_dir / "evidence-checks").iterdir()) == []


@pytest.mark.parametrize(
    ("change", "named"),
    [
        # One byte changed in place: the size is the same, the digest is not.
        (
            lambda log: log.write_bytes(LOG.replace(b"0.41", b"0.40")),
            "attempts/1/log.txt: SHA-256 does not match",
        ),
        # A line added: the file is longer than the record says.
        (
            lambda log: log.write_bytes(LOG + b"step 3: loss 0.10\n"),
            "attempts/1/log.txt: the file holds more than",
        ),
        # The log deleted.
        (lambda log: log.unlink(), "attempts/1/log.txt is no longer kept"),
    ],
    ids=["byte-changed", "line-added", "deleted"],
)
def test_a_change_on_disk_is_found_when_checked_again_and_named(
    world: Any, var_dir: Path, tmp_path: Path, change: Any, named: str
) -> None:
    run, record, log = sealed(world, tmp_path)
    assert verification.verify(record.pk) == []
    change(log)
    client = world.client_for("viewer")

    response = client.post(f"/w/alpha/runs/{run.name}/evidence/")
    assert response.status_code == 302
    assert response["Location"] == f"/w/alpha/runs/{run.name}/#evidence-heading"
    record.refresh_from_db()
    assert record.verifying
    # Asked again before the check ran: one check, not two.
    assert not verification.request_verification(record)
    assert "Checking again" in evidence_section(client, run)

    problems = verification.verify(record.pk)
    assert problems, "the change was not found"
    assert any(named in problem for problem in problems), problems
    record.refresh_from_db()
    assert record.verification_problems == problems
    section = evidence_section(client, run)
    assert "Does not verify" in section
    assert named.split(":")[0] in section
    assert "data-poll-url" not in section


def test_a_record_signed_by_a_key_the_portal_no_longer_trusts_does_not_verify(
    world: Any, var_dir: Path, tmp_path: Path, settings: Any
) -> None:
    _run, record, _log = sealed(world, tmp_path)
    # The signing key replaced without keeping the old public key in the keyring.
    settings.TAU_EVIDENCE_SIGNING_KEY = (
        Ed25519PrivateKey.generate()
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        .decode()
    )
    problems = verification.verify(record.pk)
    assert problems is not None
    assert any(record.key_id in p and "not among the trusted keys" in p for p in problems)


def test_a_lost_check_is_done_by_the_reconciler(world: Any, var_dir: Path, tmp_path: Path) -> None:
    _run, record, _log = sealed(world, tmp_path)
    # Fresh: the task published after sealing has its chance first.
    assert record.pk not in verification.due_checks()
    # Asked for a while ago and not done: a live worker is checking it (its claim renewed),
    # then that worker was killed (its claim lapses) or the broker lost the task.
    long_ago = timezone.now() - verification.GRACE - timedelta(seconds=1)
    rows = EvidenceRecord.objects.unscoped().filter(pk=record.pk)
    rows.update(verify_requested_at=long_ago, check_claimed_at=timezone.now())
    assert verification.due_checks() == []
    assert verification.verify(record.pk) is None  # not checked twice at once
    lapsed = timezone.now() - timedelta(seconds=outbox.lease_seconds() + 1)
    rows.update(check_claimed_at=lapsed)
    assert verification.due_checks() == [record.pk]
    rows.update(check_claimed_at=None)
    assert verification.due_checks() == [record.pk]
    reconcile_seals()
    record.refresh_from_db()
    assert record.verified_at is not None
    assert record.verification_problems == []
    assert record.verify_requested_at is None
    assert record.check_claimed_at is None
    assert verification.due_checks() == []
    # A record never asked for (sealed before sealing asked for checks) is due once older
    # than a fresh seal's own request would be.
    EvidenceRecord.objects.unscoped().filter(pk=record.pk).update(verified_at=None)
    assert verification.due_checks() == []
    EvidenceRecord.objects.unscoped().filter(pk=record.pk).update(sealed_at=long_ago)
    assert verification.due_checks() == [record.pk]


def test_no_record_yet_is_said_and_nothing_is_asked(world: Any, var_dir: Path) -> None:
    run = finish(make_run(world), RunState.FAILED)
    client = world.client_for("viewer")
    response = client.post(f"/w/alpha/runs/{run.name}/evidence/", follow=True)
    assert b"has no sealed evidence to check yet" in response.content
    assert "Sealing" in evidence_section(client, run)
    assert verification.verify(10**9) is None  # a record that no longer exists
