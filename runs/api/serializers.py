"""JSON shapes of runs, attempts, events, checkpoints in the REST API."""

from __future__ import annotations

import json
from typing import Any

from django.urls import reverse
from rest_framework import serializers

from runs.models import Checkpoint, Run, RunAttempt, RunEvent

#: Steps and sizes are stored as 64-bit integers.
MAX_STEP = 2**63 - 1
#: A workload's event: its message and its data, serialized, at most this many bytes, and
#: its data nested at most this deep. An event is a line on the run's timeline, not storage.
MAX_EVENT_BYTES = 16 * 1024
MAX_EVENT_DEPTH = 8


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
    step = serializers.IntegerField(min_value=0, max_value=MAX_STEP)
    path = serializers.CharField(
        max_length=1000,
        help_text="Inside the run's checkpoint folder (`TAU_CHECKPOINT_DIR`): absolute, or "
        "relative to it. No `..`, no symbolic links on the way.",
    )
    complete = serializers.BooleanField(default=True)
    size = serializers.IntegerField(min_value=0, max_value=MAX_STEP, required=False)


def _depth(value: Any) -> int:
    """How deep JSON data nests (a scalar is 0, ``{}`` is 1), counted without recursion."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth + 1)
            children = item.values() if isinstance(item, dict) else item
            pending.extend((child, depth + 1) for child in children)
    return deepest


class ReportEventSerializer(serializers.Serializer[Any]):
    kind = serializers.RegexField(r"^[a-z][a-z0-9_.-]{0,39}$")
    message = serializers.CharField(max_length=2000, allow_blank=True, default="")
    # DRF's metaclass takes declared fields off the class, so this does not shadow .data.
    data = serializers.DictField(  # type: ignore[assignment]
        required=False,
        default=dict,
        help_text=f"Any JSON object, nested at most {MAX_EVENT_DEPTH} levels; with the "
        f"message, at most {MAX_EVENT_BYTES // 1024} KiB as compact JSON.",
    )

    def validate_data(self, value: dict[str, Any]) -> dict[str, Any]:
        if _depth(value) > MAX_EVENT_DEPTH:
            raise serializers.ValidationError(
                f"An event's data may nest at most {MAX_EVENT_DEPTH} levels."
            )
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        size = len(attrs.get("message", "").encode()) + len(
            json.dumps(attrs.get("data") or {}, separators=(",", ":"), ensure_ascii=False).encode()
        )
        if size > MAX_EVENT_BYTES:
            raise serializers.ValidationError(
                f"An event (message and data) is at most {MAX_EVENT_BYTES // 1024} KiB as "
                f"JSON; this one is {size} bytes. Keep large results in TAU_OUTPUT_DIR."
            )
        return attrs
