"""JSON shapes of endpoints in the REST API."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.urls import reverse
from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from catalog.models import NAME as MODEL_NAME
from runs.api.serializers import ReportDataStagedSerializer, UploadField
from serving.models import NAME_MAX_LENGTH, Endpoint, EndpointEvent, EndpointState
from serving.services import MAX_REPLICAS

if TYPE_CHECKING:
    from drf_spectacular.openapi import AutoSchema
    from drf_spectacular.utils import Direction

METRICS_NOTE = (
    "Null until the endpoint's backend reports traffic (none does before its first "
    "measurement, and a backend that does not measure never does)."
)


#: The model version an endpoint serves, inline and nullable (a $ref cannot be nullable in
#: OpenAPI 3.0, and validators read ``allOf`` + ``nullable`` differently).
MODEL_SCHEMA = {
    "type": "object",
    "nullable": True,
    "description": "The model version it serves; null: none.",
    "properties": {
        "name": {"type": "string", "description": "The model's name in the workspace."},
        "version": {
            "type": "integer",
            "description": "The version it serves: pinned when it was deployed or updated "
            "(an alias resolved then).",
        },
    },
    "required": ["name", "version"],
}

AUTOSCALING_SCHEMA = {
    "type": "object",
    "nullable": True,
    "description": "Ray Serve's autoscaling bounds; null: a fixed number of replicas.",
    "properties": {
        "min_replicas": {"type": "integer"},
        "max_replicas": {"type": "integer"},
        "target_ongoing_requests": {"type": "integer"},
    },
    "required": ["min_replicas", "max_replicas", "target_ongoing_requests"],
}


@extend_schema_field(MODEL_SCHEMA)
class ModelRefField(serializers.JSONField):
    pass


@extend_schema_field(AUTOSCALING_SCHEMA)
class AutoscalingField(serializers.JSONField):
    pass


class EndpointSerializer(serializers.Serializer[Any]):
    """An endpoint as the list and the detail answer it."""

    name = serializers.CharField()
    state = serializers.ChoiceField(
        choices=EndpointState.choices,
        help_text="`deploying` (queued, admitted or starting), `ready`, `updating` (a new "
        "generation rolling out; the one before answers meanwhile), `unhealthy`, `stopped`, "
        "`failed`.",
    )
    state_reason = serializers.CharField(help_text="Why it is in its state, for people.")
    url = serializers.CharField(
        help_text="The address its backend reports (in the cluster, or on this machine); "
        "empty until known. Requests from outside go through `invoke_url`."
    )
    invoke_url = serializers.CharField(
        help_text="The portal's proxy route for it: POST `<invoke_url><path>` with a token "
        "that has the `endpoints:invoke` scope."
    )
    replicas_ready = serializers.IntegerField()
    replicas_desired = serializers.IntegerField(
        help_text="The replicas it runs; with autoscaling, its lower bound."
    )
    autoscaling = AutoscalingField(allow_null=True)
    model = ModelRefField(allow_null=True)
    generation = serializers.IntegerField(
        help_text="1 when deployed; one more with each update or scale."
    )
    backend = serializers.CharField()
    created_by = serializers.CharField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    requests_per_second = serializers.FloatField(allow_null=True, help_text=METRICS_NOTE)
    latency_p95_ms = serializers.FloatField(allow_null=True, help_text=METRICS_NOTE)
    error_rate = serializers.FloatField(
        allow_null=True, help_text=f"The share of requests that failed, 0 to 1. {METRICS_NOTE}"
    )


def endpoint_fields(endpoint: Endpoint, *, workspace_slug: str) -> dict[str, Any]:
    """An endpoint's fields (its model version and that version's model selected along)."""
    version = endpoint.model_version
    serve = endpoint.spec.get("serve") or {}
    return {
        "name": endpoint.name,
        "state": endpoint.state,
        "state_reason": endpoint.state_reason,
        "url": endpoint.url,
        "invoke_url": invoke_url(workspace_slug, endpoint.name),
        "replicas_ready": endpoint.replicas_ready,
        "replicas_desired": endpoint.replicas_desired,
        "autoscaling": serve.get("autoscaling"),
        "model": None
        if version is None
        else {"name": version.asset.name, "version": version.number},
        "generation": endpoint.generation,
        "backend": endpoint.backend,
        "created_by": endpoint.created_by_username,
        "created_at": endpoint.created_at,
        "updated_at": endpoint.updated_at,
        "requests_per_second": endpoint.requests_per_second,
        "latency_p95_ms": endpoint.latency_p95_ms,
        "error_rate": endpoint.error_rate,
    }


def invoke_url(workspace_slug: str, name: str) -> str:
    """``/api/v1/workspaces/<ws>/endpoints/<name>/invoke/``: where requests to it are sent."""
    return reverse(
        "api:endpoint-invoke",
        kwargs={"workspace_slug": workspace_slug, "name": name, "path": ""},
    )


class ModelChoiceSerializer(serializers.Serializer[Any]):
    name = serializers.RegexField(
        rf"^{MODEL_NAME.pattern}$", help_text="A model of the workspace (`tiny-gpt`)."
    )
    version = serializers.RegexField(
        r"^[a-z0-9][a-z0-9._-]{0,62}$",
        help_text="A version number (`3`) or an alias (`production`, `latest`).",
    )

    def to_internal_value(self, data: Any) -> Any:
        # A version given as a number is the same as its text.
        if isinstance(data, dict) and isinstance(data.get("version"), int):
            data = {**data, "version": str(data["version"])}
        return super().to_internal_value(data)


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "description": "The tau.yaml, as text."},
            {"type": "object", "description": "The tau.yaml, as JSON.", "additionalProperties": {}},
        ]
    }
)
class ConfigField(serializers.JSONField):
    """tau.yaml as text or as the same document in JSON."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str | dict):
            raise serializers.ValidationError("Give the tau.yaml as text or as a JSON object.")
        return data


NAME_HELP = (
    f"The endpoint's name: a DNS-1035 label of at most {NAME_MAX_LENGTH} characters "
    "(default: the tau.yaml's `name`)."
)


class DeployFormSerializer(serializers.Serializer[Any]):
    """A deployment, as `curl -F spec=@tau.yaml -F bundle=@project.zip` sends it."""

    spec = UploadField(
        help_text="The tau.yaml (`run.workload_kind: rayservice` with a `serve` block): a file "
        "part, or its text as a plain part. Problems are a 400 listing every one at once."
    )
    bundle = UploadField(
        required=False,
        help_text="The project directory as a zip (optional: the image may hold the "
        "application); the module of `serve.import_path` must be in it.",
    )
    name = serializers.CharField(required=False, help_text=NAME_HELP)


class DeployJSONSerializer(serializers.Serializer[Any]):
    """A deployment from a model version: its serve config and the version to serve."""

    config = ConfigField(
        help_text="The tau.yaml (`run.workload_kind: rayservice`), as text or as JSON."
    )
    model = ModelChoiceSerializer(
        required=False, help_text="The model version to serve, instead of the config's own."
    )
    name = serializers.CharField(required=False, max_length=NAME_MAX_LENGTH, help_text=NAME_HELP)


class EndpointChangeSerializer(serializers.Serializer[Any]):
    """What a PATCH changes: any of ``replicas``, ``model``, ``config``; each change is a new
    generation (one, whatever it changes)."""

    replicas = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_REPLICAS,
        help_text="Run this many replicas (refused, 409, for an endpoint that autoscales).",
    )
    model = ModelChoiceSerializer(required=False, help_text="Serve this model version.")
    config = ConfigField(
        required=False,
        help_text="A new tau.yaml (text or JSON) for it; its `name` is not the endpoint's.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs:
            raise serializers.ValidationError("Give `replicas`, `model` or `config`.")
        return attrs


#: What a change must name at least one of (``EndpointChangeSerializer.validate``).
CHANGES = ("replicas", "model", "config")


class EndpointChangeSchema(OpenApiSerializerExtension):  # type: ignore[no-untyped-call]
    """A change's schema says what ``validate`` refuses, so that a client (and the contract
    test's fuzzer) knows a body that names none of CHANGES is a 400: every field is optional
    alone, one of them is required."""

    target_class = EndpointChangeSerializer

    def map_serializer(self, auto_schema: AutoSchema, direction: Direction) -> dict[str, Any]:
        schema: dict[str, Any] = super().map_serializer(auto_schema, direction)
        schema["anyOf"] = [{"required": [name]} for name in CHANGES]
        return schema


class EndpointLogSerializer(serializers.Serializer[Any]):
    """A piece of a replica's log, for following it."""

    offset = serializers.IntegerField(help_text="Where in the log the text starts (bytes).")
    next_offset = serializers.IntegerField(help_text="Pass as `offset` to read what follows.")
    size = serializers.IntegerField(help_text="The log's size now (bytes).")
    text = serializers.CharField()
    replica = serializers.CharField(help_text="The replica whose log this is.")
    replicas = serializers.ListField(
        child=serializers.CharField(), help_text="Its replicas (pass one as `replica`)."
    )
    note = serializers.CharField(help_text="Why there is no log (yet), when it can be said.")


class EndpointMetricsSerializer(serializers.Serializer[Any]):
    """The traffic it serves now, as its backend measures it (Ray Serve's own metrics)."""

    requests_per_second = serializers.FloatField(allow_null=True)
    latency_p50_ms = serializers.FloatField(allow_null=True)
    latency_p95_ms = serializers.FloatField(allow_null=True)
    error_rate = serializers.FloatField(allow_null=True, help_text="0 to 1.")
    replicas_ready = serializers.IntegerField()
    replicas_desired = serializers.IntegerField()
    gpu_utilization = serializers.FloatField(
        allow_null=True, help_text="Mean GPU utilisation of its pods, 0 to 100."
    )
    window_seconds = serializers.IntegerField(help_text="The window the rates are over.")
    note = serializers.CharField()


class ReportModelStagedSerializer(ReportDataStagedSerializer):
    """What a cluster's stager says when one of the endpoint's pods has its model in place
    (the same report a run's stager makes of its datasets)."""


class EndpointEventSerializer(serializers.ModelSerializer[EndpointEvent]):
    """One event of an endpoint's history."""

    class Meta:
        model = EndpointEvent
        fields = ["seq", "time", "kind", "old_state", "new_state", "message", "data", "hash"]
        read_only_fields = fields
