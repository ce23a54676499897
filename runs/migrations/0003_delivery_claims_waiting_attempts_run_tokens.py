"""Deliveries are claimed, bounded and name the attempt they hand over; every live run that
waits has its waiting attempt; run tokens are held by their attempt (``RunAttempt.token``)
instead of pointing at their run from the identity app (``ApiToken.run``, removed by
portal 0005, which runs after this one).

Existing run tokens keep working: each goes to the attempt its name gives ("run <name>
attempt <n>"), or the run's newest attempt. One that finds no free attempt is revoked, and
the revocation is audited like any other.
"""

import re

import django.db.models.deletion
from django.db import migrations, models
from django.utils import timezone

WAITING_RUN_STATES = ("pending", "queued", "preempted", "evicted")
ATTEMPT_IN_NAME = re.compile(r"attempt (\d+)$")


def waiting_attempts(apps, schema_editor):
    """A run that waits is handed over with its next attempt: give one to every run that
    waits without it, and name it in its undelivered submit deliveries."""
    Run = apps.get_model("runs", "Run")
    RunAttempt = apps.get_model("runs", "RunAttempt")
    Delivery = apps.get_model("runs", "Delivery")
    for run in Run._default_manager.filter(state__in=WAITING_RUN_STATES).order_by("pk"):
        attempts = RunAttempt._default_manager.filter(run_id=run.pk)
        if attempts.filter(state__in=["waiting", "starting", "running"]).exists():
            continue
        number = run.attempt_count + 1
        attempt = RunAttempt._default_manager.create(
            run_id=run.pk,
            number=number,
            state="waiting",
            resume_from_id=run.resume_from_id,
            retry_reason=run.retry_reason,
        )
        Run._default_manager.filter(pk=run.pk).update(attempt_count=number)
        Delivery._default_manager.filter(
            run_id=run.pk, action="submit", delivered_at__isnull=True, attempt__isnull=True
        ).update(attempt=attempt)


def tokens_to_attempts(apps, schema_editor):
    ApiToken = apps.get_model("portal", "ApiToken")
    AuditEvent = apps.get_model("portal", "AuditEvent")
    RunAttempt = apps.get_model("runs", "RunAttempt")
    # Oldest first: an attempt keeps the token it was issued first.
    tokens = (
        ApiToken.objects.filter(kind="run", run__isnull=False)
        .select_related("user", "workspace")
        .order_by("pk")
    )
    for token in tokens.iterator():
        attempts = RunAttempt._default_manager.filter(run_id=token.run_id)
        match = ATTEMPT_IN_NAME.search(token.name)
        attempt = attempts.filter(number=int(match.group(1))).first() if match else None
        attempt = attempt or attempts.order_by("-number").first()
        if attempt is not None and attempt.token_id is None:
            attempt.token_id = token.pk
            attempt.save(update_fields=["token"])
            continue
        if token.revoked_at is None:
            token.revoked_at = timezone.now()
            token.save(update_fields=["revoked_at"])
            AuditEvent._default_manager.create(
                time=token.revoked_at,
                action="token.revoke",
                source="system",
                workspace_id=token.workspace_id,
                workspace_slug=token.workspace.slug if token.workspace_id else "",
                object_type="portal.apitoken",
                object_id=str(token.pk),
                object_repr=(
                    f"{token.name} (tau_{token.key}_…) of {token.user.username}: no attempt "
                    "of its run to hold it"
                )[:200],
            )


def tokens_to_runs(apps, schema_editor):
    ApiToken = apps.get_model("portal", "ApiToken")
    RunAttempt = apps.get_model("runs", "RunAttempt")
    for attempt in RunAttempt._default_manager.filter(token__isnull=False).iterator():
        ApiToken.objects.filter(pk=attempt.token_id).update(run_id=attempt.run_id)


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0004_apitoken_run"),
        ("runs", "0002_attempt_counts_against_retries"),
    ]
    # The tokens are moved before the identity app drops ApiToken.run (its migration need
    # not know about runs).
    run_before = [("portal", "0005_remove_apitoken_run")]

    operations = [
        migrations.RemoveIndex(
            model_name="delivery",
            name="delivery_due",
        ),
        migrations.AddField(
            model_name="delivery",
            name="attempt",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="runs.runattempt",
            ),
        ),
        migrations.AddField(
            model_name="delivery",
            name="claimed_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="delivery",
            name="given_up_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="runattempt",
            name="token",
            field=models.OneToOneField(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="portal.apitoken",
            ),
        ),
        migrations.AlterField(
            model_name="runattempt",
            name="state",
            field=models.CharField(
                choices=[
                    ("waiting", "Waiting"),
                    ("starting", "Starting"),
                    ("running", "Running"),
                    ("succeeded", "Succeeded"),
                    ("failed", "Failed"),
                    ("cancelled", "Cancelled"),
                ],
                default="waiting",
                max_length=20,
            ),
        ),
        migrations.AddIndex(
            model_name="delivery",
            index=models.Index(
                condition=models.Q(("delivered_at__isnull", True), ("given_up_at__isnull", True)),
                fields=["next_try_at"],
                name="delivery_due",
            ),
        ),
        migrations.RunPython(waiting_attempts, migrations.RunPython.noop),
        migrations.RunPython(tokens_to_attempts, tokens_to_runs),
    ]
