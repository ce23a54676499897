"""The migrations of issue 12 on a database with history: runs that wait get the attempt they
are handed over with; run tokens move from ``ApiToken.run`` (the identity app pointing at
runs) to the attempt that holds them, still working (a token no attempt can hold is revoked,
and that is audited); API tokens and identities move from the kernel to the identity app."""

from __future__ import annotations

import secrets
import string
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone
from rest_framework.test import APIClient

from identity import tokens
from identity.models import ApiToken
from portal.models import AuditEvent
from runs.models import Delivery, Run, RunAttempt
from tests.runs.test_api import run_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BEFORE = [("runs", "0002_attempt_counts_against_retries"), ("portal", "0004_apitoken_run")]


def migrate(targets: list[tuple[str, str]]) -> Any:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return MigrationExecutor(connection).loader.project_state(targets).apps


@pytest.fixture
def before() -> Iterator[Any]:
    """The schema as it was before issue 12; the latest again afterwards, whatever happens."""
    apps = migrate(BEFORE)
    try:
        yield apps
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


def old_run(apps: Any, world: Any, name: str, state: str, attempts: int = 0) -> Any:
    run = apps.get_model("runs", "Run")._default_manager.create(
        workspace_id=world.alpha.pk,
        name=name,
        spec_name=name,
        spec={},
        spec_hash="0" * 64,
        spec_source="",
        submitted_by_id=world.users["researcher"].pk,
        submitted_by_username="rob",
        backend="local",
        state=state,
        attempt_count=attempts,
    )
    for number in range(1, attempts + 1):
        apps.get_model("runs", "RunAttempt")._default_manager.create(
            run_id=run.pk,
            number=number,
            state="running" if state == "running" else "failed",
        )
    return run


def old_token(apps: Any, world: Any, run: Any, name: str) -> str:
    """A run token as the agent issued it before: ``ApiToken.run`` set. Its plaintext."""
    key = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(12))
    secret = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(40))
    pepper_id = max(tokens._peppers())
    apps.get_model("portal", "ApiToken")._default_manager.create(
        user_id=world.users["researcher"].pk,
        name=name,
        kind="run",
        key=key,
        secret_hash=tokens._digest(tokens._peppers()[pepper_id], key, secret),
        pepper_id=pepper_id,
        workspace_id=world.alpha.pk,
        run_id=run.pk,
        expires_at=timezone.now() + timedelta(days=2),
    )
    return f"tau_{key}_{secret}"


def test_waiting_runs_and_run_tokens_come_through(world: Any, before: Any) -> None:
    pending = old_run(before, world, "pending-1", "pending")
    before.get_model("runs", "Delivery")._default_manager.create(run_id=pending.pk, action="submit")
    retrying = old_run(before, world, "retrying-1", "queued", attempts=1)
    running = old_run(before, world, "running-1", "running", attempts=2)
    working = old_token(before, world, running, "run running-1 attempt 2")
    unnamed = old_token(before, world, running, "run running-1")  # no attempt in its name
    leftover = old_token(before, world, running, "run running-1 attempt 2")

    migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

    # A run that waits is handed over with its next attempt, named by its delivery.
    for run, number in ((pending, 1), (retrying, 2)):
        fresh = Run.objects.for_workspace(world.alpha).get(pk=run.pk)
        newest = RunAttempt.objects.for_workspace(world.alpha).filter(run=fresh).latest("number")
        assert (fresh.attempt_count, newest.number, newest.state) == (number, number, "waiting")
    handed = Delivery.objects.for_workspace(world.alpha).get(run_id=pending.pk)
    assert handed.attempt is not None
    assert handed.attempt.number == 1
    # A running run keeps its attempts as they were.
    assert RunAttempt.objects.for_workspace(world.alpha).filter(run_id=running.pk).count() == 2

    # The token of attempt 2 is held by attempt 2 and still reports on its run.
    second = RunAttempt.objects.for_workspace(world.alpha).get(run_id=running.pk, number=2)
    first = RunAttempt.objects.for_workspace(world.alpha).get(run_id=running.pk, number=1)
    held = {second.token_id, first.token_id}
    by_key = {
        plaintext: ApiToken.objects.get(key=tokens.key_of(plaintext))
        for plaintext in (working, unnamed, leftover)
    }
    assert by_key[working].pk == second.token_id
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {working}")
    reported = client.post(
        run_url("running-1", "run-report-metrics"), {"rows": [{"step": 1, "x": 1}]}, format="json"
    )
    assert reported.status_code == 202, reported.content
    # The one without a number goes to the run's newest attempt, which holds one already,
    # as does the attempt the third names: both revoked, each revocation audited.
    assert first.token_id is None
    for plaintext in (unnamed, leftover):
        token = by_key[plaintext]
        assert token.revoked_at is not None
        assert token.pk not in held
        assert tokens.verify_token(plaintext) is None
        assert (
            AuditEvent.objects.for_workspace(world.alpha)
            .filter(action="token.revoke", object_id=str(token.pk))
            .count()
            == 1
        )


def test_tokens_move_to_the_identity_app_with_their_permissions(world: Any, before: Any) -> None:
    """ApiToken and OIDCIdentity change app, not table: rows stay, and the content types (so
    the permissions granted on them) are renamed rather than left behind."""
    running = old_run(before, world, "running-2", "running", attempts=1)
    plaintext = old_token(before, world, running, "run running-2 attempt 1")
    # (contenttypes and auth have not changed since: their models of today serve.)
    # A fresh test database holds the new content type already (post_migrate made it); a
    # database with history has the old one, which permissions point at.
    ContentType.objects.filter(app_label="identity", model="apitoken").delete()
    stale = ContentType.objects.get_or_create(app_label="portal", model="apitoken")[0]
    permission = Permission.objects.create(
        content_type=stale, codename="audit_apitoken", name="Can audit API tokens"
    )

    migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

    ContentType.objects.clear_cache()
    moved = ContentType.objects.get(pk=stale.pk)
    assert (moved.app_label, moved.model) == ("identity", "apitoken")
    assert moved.model_class() is ApiToken
    assert Permission.objects.get(pk=permission.pk).content_type_id == moved.pk
    assert tokens.verify_token(plaintext) is not None
    assert ApiToken._meta.db_table == "portal_apitoken"
