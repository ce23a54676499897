"""The JSON shapes of the GPU API (documented in the OpenAPI schema, nullable where the
telemetry may not know)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers


class GpuSerializer(serializers.Serializer[Any]):
    """One GPU now. Telemetry fields are null when the exporter does not report them, or
    when Prometheus cannot be reached (``telemetry_notice`` says so)."""

    node = serializers.CharField()
    index = serializers.IntegerField()
    uuid = serializers.CharField()
    model = serializers.CharField()
    utilization = serializers.FloatField(allow_null=True, help_text="Percent, 0-100.")
    memory_used_mib = serializers.FloatField(allow_null=True)
    memory_free_mib = serializers.FloatField(allow_null=True)
    temperature_c = serializers.FloatField(allow_null=True)
    power_w = serializers.FloatField(allow_null=True)
    sm_clock_mhz = serializers.FloatField(allow_null=True)
    xid = serializers.IntegerField(allow_null=True, help_text="The last XID error; 0: none.")
    pod = serializers.CharField(allow_null=True, help_text="The pod holding it, if mapped.")


class ConditionSerializer(serializers.Serializer[Any]):
    type = serializers.CharField()
    status = serializers.CharField()
    reason = serializers.CharField(allow_blank=True)
    message = serializers.CharField(allow_blank=True)
    last_transition_time = serializers.CharField(
        allow_blank=True, help_text="ISO 8601, or empty when Kubernetes gave none."
    )
    gpu = serializers.BooleanField(help_text="A GPU health condition.")
    problem = serializers.BooleanField(help_text="This condition makes the node unhealthy.")


class TaintSerializer(serializers.Serializer[Any]):
    key = serializers.CharField()
    value = serializers.CharField(allow_blank=True)
    effect = serializers.CharField()


class NodeRunSerializer(serializers.Serializer[Any]):
    workspace = serializers.CharField()
    run = serializers.CharField()
    namespace = serializers.CharField()
    pod = serializers.CharField()
    gpus = serializers.IntegerField()


class GpuNodeSerializer(serializers.Serializer[Any]):
    name = serializers.CharField()
    pool = serializers.CharField(allow_blank=True)
    flavor = serializers.CharField(allow_null=True, help_text="The ResourceFlavor, if any.")
    gpu_model = serializers.CharField(allow_blank=True)
    gpus_total = serializers.IntegerField()
    gpus_allocatable = serializers.IntegerField()
    gpus_in_use = serializers.IntegerField()
    ready = serializers.BooleanField()
    healthy = serializers.BooleanField()
    problems = serializers.ListField(child=serializers.CharField())
    unhealthy_since = serializers.DateTimeField(allow_null=True)
    cordoned = serializers.BooleanField()
    conditions = ConditionSerializer(many=True)
    taints = TaintSerializer(many=True)
    runs = NodeRunSerializer(many=True)
    gpus = GpuSerializer(many=True)
    telemetry_notice = serializers.CharField(
        allow_blank=True, help_text="Why `gpus` is empty or partial; empty when all is well."
    )
    updated_at = serializers.DateTimeField(help_text="When the fleet sync last changed it.")

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        fields = super().get_fields()
        # ``source`` is also a Field attribute, so it cannot be declared above.
        fields["source"] = serializers.ChoiceField(
            choices=["kubernetes", "local"],
            help_text="kubernetes: a Node of the cluster; local: this machine (embedded default).",
        )
        return fields


class IdleStretchSerializer(serializers.Serializer[Any]):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    average_utilization = serializers.FloatField()


class IdleSerializer(serializers.Serializer[Any]):
    threshold_percent = serializers.IntegerField()
    threshold_minutes = serializers.IntegerField()
    now = serializers.BooleanField(help_text="The run's GPUs are idle now.")
    minutes = serializers.IntegerField(help_text="Minutes idle in all.")
    stretches = IdleStretchSerializer(many=True)


class EfficiencySerializer(serializers.Serializer[Any]):
    gpus = serializers.IntegerField(help_text="GPUs seen in the telemetry.")
    average_utilization = serializers.FloatField(allow_null=True)
    peak_utilization = serializers.FloatField(allow_null=True)
    memory_high_water_mib = serializers.FloatField(allow_null=True)
    idle = IdleSerializer()


class WindowSerializer(serializers.Serializer[Any]):
    start = serializers.DateTimeField(allow_null=True)
    end = serializers.DateTimeField(allow_null=True)


class RunGpusSerializer(serializers.Serializer[Any]):
    run = serializers.CharField()
    requested_gpus = serializers.IntegerField()
    nodes = serializers.ListField(child=serializers.CharField())
    gpus = GpuSerializer(many=True)
    efficiency = EfficiencySerializer(
        help_text="Over the run's life; `gpus` is 0 while no GPU of it was seen."
    )
    window = WindowSerializer()
    notice = serializers.CharField(allow_blank=True)
