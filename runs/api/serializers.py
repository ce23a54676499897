"""JSON shapes of runs, attempts, events, checkpoints in the REST API."""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from rest_framework import serializers

from runs.models import Checkpoint, Run, RunAttempt, RunEvent


class AttemptSerializer(serializers.ModelSerializer[RunAttempt]):
    failure_hint = serializers.CharField(read_only=True)
    resume_from_step = serializers.SerializerMethodField()

    class Meta:
        model = RunAttempt
        fields = [
            "number",
            "state",
            "exit_code",
            "failure_class",
            "failure_message",
            "failure_hint",
            "retry_reason",
            "resume_from_step",
            "created_at",
            "started_at",
            "finished_at",
        ]

    def get_resume_from_step(self, attempt: RunAttempt) -> int | None:
        return attempt.resume_from.step if attempt.resume_from else None


class RunSummarySerializer(serializers.ModelSerializer[Run]):
    url = serializers.SerializerMethodField()
    submitted_by = serializers.CharField(source="submitted_by_username")

    class Meta:
        model = Run
        fields = [
            "name",
            "spec_name",
            "state",
            "state_reason",
            "queue_position",
            "priority",
            "backend",
            "attempt_count",
            "failure_class",
            "submitted_by",
            "created_at",
            "started_at",
            "finished_at",
            "url",
        ]

    def get_url(self, run: Run) -> str:
        return reverse(
            "api:run-detail", kwargs={"workspace_slug": run.workspace.slug, "run_name": run.name}
        )


class RunDetailSerializer(RunSummarySerializer):
    attempts = AttemptSerializer(many=True, read_only=True)
    bundle = serializers.SerializerMethodField()

    class Meta(RunSummarySerializer.Meta):
        fields = [
            *RunSummarySerializer.Meta.fields,
            "spec_hash",
            "spec",
            "bundle",
            "queued_at",
            "admitted_at",
            "cancel_requested_at",
            "attempts",
        ]

    def get_bundle(self, run: Run) -> dict[str, Any] | None:
        if run.bundle is None:
            return None
        return {
            "sha256": run.bundle.sha256,
            "size": run.bundle.size,
            "files": run.bundle.file_count,
        }


class EventSerializer(serializers.ModelSerializer[RunEvent]):
    class Meta:
        model = RunEvent
        fields = ["seq", "time", "kind", "old_state", "new_state", "message", "data", "hash"]


class LogChunkSerializer(serializers.Serializer[Any]):
    """A piece of an attempt's log (the logs route's JSON answer), for following it."""

    attempt = serializers.IntegerField(
        allow_null=True, help_text="The attempt read; null before the first one."
    )
    offset = serializers.IntegerField(help_text="Where in the file the text starts (bytes).")
    next_offset = serializers.IntegerField(help_text="Pass as `offset` to read what follows.")
    size = serializers.IntegerField(help_text="The file's size now (bytes).")
    complete = serializers.BooleanField(help_text="The attempt is over and all of it is read.")
    text = serializers.CharField()


class CheckpointSerializer(serializers.ModelSerializer[Checkpoint]):
    class Meta:
        model = Checkpoint
        fields = ["id", "attempt", "step", "path", "complete", "size", "created_at"]


class SubmitSerializer(serializers.Serializer[Any]):
    spec = serializers.FileField(help_text="The tau.yaml file.")
    bundle = serializers.FileField(required=False, help_text="The project directory as a zip.")


class ResumeSerializer(serializers.Serializer[Any]):
    checkpoint = serializers.IntegerField(
        required=False, help_text="Checkpoint id; default: the newest."
    )


class ReportMetricsSerializer(serializers.Serializer[Any]):
    rows = serializers.ListField(
        child=serializers.DictField(),
        max_length=5000,
        help_text='[{"step": 10, "loss": 0.31}, ...]',
    )


class ReportCheckpointSerializer(serializers.Serializer[Any]):
    step = serializers.IntegerField(min_value=0)
    path = serializers.CharField(max_length=1000)
    complete = serializers.BooleanField(default=True)
    size = serializers.IntegerField(min_value=0, required=False)


class ReportEventSerializer(serializers.Serializer[Any]):
    kind = serializers.RegexField(r"^[a-z][a-z0-9_.-]{0,39}$")
    message = serializers.CharField(max_length=2000, allow_blank=True, default="")
    # DRF's metaclass takes declared fields off the class, so this does not shadow .data.
    data = serializers.DictField(required=False, default=dict)  # type: ignore[assignment]
