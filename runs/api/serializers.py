"""JSON shapes of runs, attempts, events, checkpoints in the REST API."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime, tzinfo
from functools import cached_property
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.urls import reverse
from django.utils import timezone
from django.utils.http import RFC3986_SUBDELIMS
from drf_spectacular.utils import extend_schema_field
from rest_framework import ISO_8601, serializers
from rest_framework.settings import api_settings

from runs import metric_rules
from runs.backends import BackendUnavailable
from runs.backends.registry import backend_for_run
from runs.models import Artifact, Checkpoint, Run, RunAttempt, RunEvent, RunTrial
from tau.spec.schema import MAX_TRIALS

#: Steps and sizes end up in the run's evidence, which holds integers exactly up to 2^53 - 1
#: (``runs.metric_rules.MAX_STEP``): a larger one would make it impossible to seal.
MAX_STEP = metric_rules.MAX_STEP
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
        read_only_fields = fields
        # Read-only fields lose DRF's allow_blank, which the schema's enum needs ("" = none).
        extra_kwargs = {"failure_class": {"allow_blank": True}}

    def get_resume_from_step(self, attempt: RunAttempt) -> int | None:
        return attempt.resume_from.step if attempt.resume_from else None

    def to_representation(self, instance: RunAttempt) -> dict[str, Any]:
        """The fields above, read straight off the attempt: every submission answers with
        its run's attempts, and DRF's generic walk built a dozen field objects for that
        (tests/runs/test_api.py checks that both give the same answer)."""
        zone = _zone()
        return {
            "number": instance.number,
            "state": instance.state,
            "exit_code": instance.exit_code,
            "failure_class": instance.failure_class,
            "failure_message": instance.failure_message,
            "failure_hint": instance.failure_hint,
            "retry_reason": instance.retry_reason,
            "resume_from_step": self.get_resume_from_step(instance),
            "created_at": _time(instance.created_at, zone),
            "started_at": _time(instance.started_at, zone),
            "finished_at": _time(instance.finished_at, zone),
        }


#: How DRF writes a time (ISO 8601 in the current time zone, ``Z`` for UTC), for the runs
#: list's direct representation below.
_TIME = serializers.DateTimeField()


class RunSummarySerializer(serializers.ModelSerializer[Run]):
    """A run in the runs list. The list reads it from the run's own row only: ``url`` comes
    from the workspace in the context (``{"workspace": …}``) when given, else from the run's
    workspace."""

    url = serializers.SerializerMethodField()
    submitted_by = serializers.CharField(source="submitted_by_username", read_only=True)

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
        read_only_fields = fields
        # Read-only fields lose DRF's allow_blank, which the schema's enum needs ("" = none).
        extra_kwargs = {"failure_class": {"allow_blank": True}}

    def to_representation(self, instance: Run | Mapping[str, Any]) -> dict[str, Any]:
        """The fields above, read straight off the run, or off a row of its columns
        (:data:`SUMMARY_COLUMNS`, as the runs list reads them): a list page holds 50, and
        DRF's generic walk over the fields cost more than the rest of the request together
        (tests/runs/test_api.py checks that both give the same answer)."""
        row = instance if isinstance(instance, Mapping) else instance.__dict__
        zone = self._time_zone
        return {
            "name": row["name"],
            "spec_name": row["spec_name"],
            "state": row["state"],
            "state_reason": row["state_reason"],
            "queue_position": row["queue_position"],
            "priority": row["priority"],
            "backend": row["backend"],
            "attempt_count": row["attempt_count"],
            "failure_class": row["failure_class"],
            "submitted_by": row["submitted_by_username"],
            "created_at": _time(row["created_at"], zone),
            "started_at": _time(row["started_at"], zone),
            "finished_at": _time(row["finished_at"], zone),
            "url": self._url(row["workspace_id"], row["name"], instance),
        }

    def get_url(self, run: Run) -> str:
        return self._url(run.workspace_id, run.name, run)

    @cached_property
    def _time_zone(self) -> tzinfo | None:
        """:func:`_zone`, once per serializer (a list page has 50 runs)."""
        return _zone()

    @cached_property
    def _runs_urls(self) -> dict[int, str]:
        """Each workspace's runs list address, reversed once per serializer."""
        return {}

    def _url(self, workspace_id: int, name: str, run: Run | Mapping[str, Any]) -> str:
        """The run's API address: its workspace's runs list plus its name (``runs/api/urls.py``
        spells the detail route so), the list's address reversed once per serializer."""
        prefixes = self._runs_urls
        prefix = prefixes.get(workspace_id)
        if prefix is None:
            workspace = self.context.get("workspace")
            if workspace is None or workspace.pk != workspace_id:
                assert isinstance(run, Run), "a row needs its workspace in the context"
                workspace = run.workspace
            prefix = reverse("api:run-list", kwargs={"workspace_slug": workspace.slug})
            prefixes[workspace_id] = prefix
        if not _PLAIN_NAME.fullmatch(name):
            name = quote(name, safe=RFC3986_SUBDELIMS + "~:@")
        return f"{prefix}{name}/"


#: Run names as tau.yaml allows them, which need no quoting in a URL.
_PLAIN_NAME = re.compile(r"[a-z0-9-]+")

#: The columns a summary is made of (with the id and creation time the runs list pages by).
SUMMARY_COLUMNS = (
    "id",
    "workspace_id",
    "name",
    "spec_name",
    "state",
    "state_reason",
    "queue_position",
    "priority",
    "backend",
    "attempt_count",
    "failure_class",
    "submitted_by_username",
    "created_at",
    "started_at",
    "finished_at",
)


def _zone() -> tzinfo | None:
    """The time zone times are written in, when DRF would write them the common way (ISO
    8601, aware): looked up once per run rather than once per time (the lookup is not free)."""
    if settings.USE_TZ and api_settings.DATETIME_FORMAT == ISO_8601:
        return timezone.get_current_timezone()
    return None


def _time(value: datetime | None, zone: tzinfo | None) -> str | None:
    """What DRF's DateTimeField gives, without its generic path when the answer is the
    common one (an aware time, ISO 8601, ``zone`` from :func:`_zone`)."""
    if value is None:
        return None
    if zone is not None and value.tzinfo is not None:
        text = value.astimezone(zone).isoformat()
        return text[:-6] + "Z" if text.endswith("+00:00") else text
    represented: str | None = _TIME.to_representation(value)
    return represented


#: A run's code bundle, or null. Written out rather than a nullable reference to a component:
#: in OpenAPI 3.0 ``nullable`` beside ``allOf: [$ref]`` does not admit null.
BUNDLE_SCHEMA = {
    "type": "object",
    "nullable": True,
    "readOnly": True,
    "description": "The project zip it was submitted with; null without one.",
    "properties": {
        "sha256": {"type": "string"},
        "size": {"type": "integer", "description": "Bytes."},
        "files": {"type": "integer"},
    },
    "required": ["sha256", "size", "files"],
}


class RunDetailSerializer(RunSummarySerializer):
    """A run with its spec, bundle and attempts (``attempts`` prefetched by the caller)."""

    attempts = AttemptSerializer(many=True, read_only=True)
    bundle = serializers.SerializerMethodField()
    warnings = serializers.SerializerMethodField(
        help_text="What the run should know about where it runs, e.g. that its workspace has "
        "no storage to keep checkpoints between attempts on Kubernetes."
    )

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
            "warnings",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_warnings(self, run: Run) -> list[str]:
        try:
            warning = backend_for_run(run).storage_warning(run.workspace)
        except BackendUnavailable:
            return []
        return [warning] if warning else []

    @extend_schema_field(BUNDLE_SCHEMA)
    def get_bundle(self, run: Run) -> dict[str, Any] | None:
        bundle = run.bundle
        if bundle is None:
            return None
        return {"sha256": bundle.sha256, "size": bundle.size, "files": bundle.file_count}

    def to_representation(self, instance: Run | Mapping[str, Any]) -> dict[str, Any]:
        """The summary's fields and the rest, read straight off the run (every submission
        answers with this; DRF would build a dozen field objects for it each time)."""
        assert isinstance(instance, Run), "a run's detail is made from the run itself"
        data = super().to_representation(instance)
        zone = _zone()
        data.update(
            {
                "spec_hash": instance.spec_hash,
                "spec": instance.spec,
                "bundle": self.get_bundle(instance),
                "queued_at": _time(instance.queued_at, zone),
                "admitted_at": _time(instance.admitted_at, zone),
                "cancel_requested_at": _time(instance.cancel_requested_at, zone),
                "attempts": AttemptSerializer(instance.attempts.all(), many=True).data,
                "warnings": self.get_warnings(instance),
            }
        )
        return data


class BudgetStandingSerializer(serializers.Serializer[Any]):
    flavor = serializers.CharField(help_text='The budget\'s flavor, or "all flavors".')
    used_gpu_hours = serializers.FloatField(help_text="Used this month so far.")
    gpu_hours = serializers.FloatField(help_text="The month's budget (the soft limit).")
    hard_limit_gpu_hours = serializers.FloatField()
    left_gpu_hours = serializers.FloatField()
    over_limit = serializers.ChoiceField(
        choices=["refuse", "lowest_priority", "allow"],
        help_text="What happens to new GPU runs past the hard limit.",
    )


class CostSerializer(serializers.Serializer[Any]):
    """What a run may cost in GPU-hours, and the budgets it draws on."""

    gpus = serializers.IntegerField(help_text="GPUs it holds while it runs (all workers).")
    max_gpu_hours = serializers.FloatField(
        allow_null=True, help_text="If it runs to its max_runtime; null without one."
    )
    summary = serializers.CharField(
        help_text='In words, e.g. "Up to 16 GPU-hours if it runs to its max_runtime; 120 of '
        '400 left this month (all flavors)."'
    )
    budgets = BudgetStandingSerializer(many=True)


class RunCreatedSerializer(RunDetailSerializer):
    """The run just submitted, and what it may cost."""

    cost = CostSerializer(read_only=True, allow_null=True)

    class Meta(RunDetailSerializer.Meta):
        fields = [*RunDetailSerializer.Meta.fields, "cost"]
        read_only_fields = fields

    def to_representation(self, instance: Run | Mapping[str, Any]) -> dict[str, Any]:
        data = super().to_representation(instance)
        assert isinstance(instance, Run)
        data["cost"] = instance.submitted_cost
        return data


class EventSerializer(serializers.ModelSerializer[RunEvent]):
    class Meta:
        model = RunEvent
        fields = ["seq", "time", "kind", "old_state", "new_state", "message", "data", "hash"]
        read_only_fields = fields


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
    pod = serializers.CharField(
        help_text="On Kubernetes, the pod whose log this is; empty where an attempt has one log."
    )
    pods = serializers.ListField(
        child=serializers.CharField(),
        help_text="On Kubernetes, the attempt's pods (pass one as `pod` to read its log).",
    )
    note = serializers.CharField(
        help_text="Why there is no log (yet), when it can be said: a pod that has not started "
        "(scheduling, its image), a log that is gone. Empty otherwise."
    )


class CheckpointSerializer(serializers.ModelSerializer[Checkpoint]):
    class Meta:
        model = Checkpoint
        fields = ["id", "attempt", "step", "path", "complete", "size", "created_at"]
        read_only_fields = fields


class MetricsSerializer(serializers.Serializer[Any]):
    """A run's metric series (the metrics route's answer)."""

    keys = serializers.ListField(
        child=serializers.CharField(), read_only=True, help_text="Every metric name of the run."
    )
    series = serializers.DictField(
        child=serializers.ListField(
            child=serializers.ListField(child=serializers.FloatField(), min_length=2, max_length=2)
        ),
        read_only=True,
        help_text="Per name asked for: `[step, value]` points in step order, downsampled.",
    )


class MetricsRecordedSerializer(serializers.Serializer[Any]):
    recorded = serializers.IntegerField(read_only=True, help_text="Points recorded.")


@extend_schema_field({"type": "string", "format": "binary"})
class UploadField(serializers.FileField):
    """A part of a multipart form: bytes (drf-spectacular would say a URI, as FileField
    answers)."""


class SubmitSerializer(serializers.Serializer[Any]):
    """A submission, as `curl -F spec=@tau.yaml -F bundle=@project.zip` sends it."""

    spec = UploadField(
        help_text="The tau.yaml: a file part, or its text as a plain part; UTF-8 text of at "
        "most 256 KiB and 4,000 keys, values and list items. Anything else (other bytes, "
        "invalid YAML, a spec the server's checker refuses) is a 400 listing every problem."
    )
    bundle = UploadField(required=False, help_text="The project directory as a zip (optional).")


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


MAX_TRIAL_CONFIG_BYTES = 16 * 1024


class TrialReportSerializer(serializers.Serializer[Any]):
    trial = serializers.IntegerField(min_value=1, max_value=MAX_TRIALS, help_text="1, 2, …")
    config = serializers.DictField(help_text="The trial's values (`execution.configs`).")
    state = serializers.ChoiceField(choices=RunTrial.State.choices)
    exit_code = serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=-(2**31), max_value=2**31 - 1
    )
    started_at = serializers.FloatField(
        required=False, allow_null=True, default=None, help_text="Unix time."
    )
    finished_at = serializers.FloatField(
        required=False, allow_null=True, default=None, help_text="Unix time."
    )

    def validate_config(self, value: dict[str, Any]) -> dict[str, Any]:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise serializers.ValidationError("A trial's values must be valid text.") from None
        if "\x00" in text or "\\u0000" in text:
            raise serializers.ValidationError("A trial's values cannot contain NUL characters.")
        if size > MAX_TRIAL_CONFIG_BYTES:
            raise serializers.ValidationError(
                f"A trial's values are at most {MAX_TRIAL_CONFIG_BYTES} bytes as JSON."
            )
        if _depth(value) > MAX_EVENT_DEPTH:
            raise serializers.ValidationError(
                f"A trial's values may nest at most {MAX_EVENT_DEPTH} levels."
            )
        return value


class ReportTrialsSerializer(serializers.Serializer[Any]):
    """A sweep's trials as its driver sees them (the Ray Tune driver on a cluster)."""

    trials = serializers.ListField(
        child=TrialReportSerializer(), min_length=1, max_length=MAX_TRIALS
    )


class TrialsRecordedSerializer(serializers.Serializer[Any]):
    recorded = serializers.IntegerField(help_text="Trials created or changed.")


class ReportDataStagedSerializer(serializers.Serializer[Any]):
    """What a cluster's stager says when an attempt's datasets are in place."""

    files = serializers.IntegerField(min_value=0, max_value=10**9)
    bytes = serializers.IntegerField(min_value=0, max_value=2**63 - 1)
    seconds = serializers.FloatField(min_value=0, max_value=10**7)


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


class ArtifactSerializer(serializers.ModelSerializer[Artifact]):
    """A kept artifact of the run in the context (``run``); ``download`` is where its bytes
    are."""

    download = serializers.SerializerMethodField()

    class Meta:
        model = Artifact
        fields = ["path", "attempt", "size", "sha256", "created_at", "download"]
        read_only_fields = fields

    def get_download(self, artifact: Artifact) -> str:
        run: Run = self.context["run"]
        return reverse(
            "api:run-artifact",
            kwargs={
                "workspace_slug": run.workspace.slug,
                "run_name": run.name,
                "artifact_path": artifact.path,
            },
        )
