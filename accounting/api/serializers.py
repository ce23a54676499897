"""The usage API's shapes (for the schema; the numbers are ``accounting.reports``')."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from runs.api.serializers import BudgetStandingSerializer


class HoursSerializer(serializers.Serializer[Any]):
    gpu_hours = serializers.FloatField()
    cpu_hours = serializers.FloatField()
    memory_gib_hours = serializers.FloatField()


class UserHoursSerializer(HoursSerializer):
    user = serializers.CharField()


class FlavorHoursSerializer(HoursSerializer):
    flavor = serializers.CharField()


class OutcomeHoursSerializer(HoursSerializer):
    outcome = serializers.ChoiceField(
        choices=["running", "succeeded", "failed", "preempted", "cancelled"],
        help_text="How the attempts ended (preempted: preempted or evicted by the platform).",
    )


class DayHoursSerializer(HoursSerializer):
    date = serializers.DateField()


class UsageSerializer(HoursSerializer):
    """A month of a workspace's use: every attempt from its admission to its end (or now),
    preempted and failed attempts included."""

    workspace = serializers.CharField()
    month = serializers.CharField(help_text="YYYY-MM")
    time_zone = serializers.CharField(help_text="The zone months and days are cut in.")
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    counted_until = serializers.DateTimeField(help_text="The month's end, or now.")
    lost = HoursSerializer(help_text="The part used by attempts that failed or were preempted.")
    by_user = UserHoursSerializer(many=True)
    by_flavor = FlavorHoursSerializer(many=True)
    by_outcome = OutcomeHoursSerializer(many=True)
    by_day = DayHoursSerializer(many=True, help_text="Days with any use only.")
    budgets = BudgetStandingSerializer(many=True)
