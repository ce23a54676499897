"""Quota use on a cluster is what Kueue reports: a ClusterQueue's flavorsReservation (on the
real cluster: tests/executors/kubernetes/test_kueue_sync.py,
``test_quota_in_use_on_the_pages_is_what_kueue_reserved``)."""

from __future__ import annotations

from decimal import Decimal

from executors.kubernetes.kueue_usage import reserved_from_status


def test_reservations_are_read_per_flavor_and_resource() -> None:
    # As Kueue v1beta2 reports it for a queue with two admitted workloads, one borrowing.
    cluster_queue = {
        "status": {
            "admittedWorkloads": 2,
            "flavorsReservation": [
                {
                    "name": "h100",
                    "resources": [
                        {"name": "cpu", "total": "1500m", "borrowed": "0"},
                        {"name": "memory", "total": "96Gi", "borrowed": "0"},
                        {"name": "nvidia.com/gpu", "total": "12", "borrowed": "4"},
                    ],
                },
                {"name": "cpu-pool", "resources": [{"name": "cpu", "total": "4"}]},
            ],
            "flavorsUsage": [],
        }
    }
    assert reserved_from_status(cluster_queue) == {
        ("h100", "cpu"): Decimal("1.5"),
        ("h100", "memory"): Decimal(96 * 2**30),
        ("h100", "nvidia.com/gpu"): Decimal(12),
        ("cpu-pool", "cpu"): Decimal(4),
    }


def test_a_queue_kueue_has_not_reported_on_uses_nothing() -> None:
    assert reserved_from_status({}) == {}
    assert reserved_from_status({"status": {"flavorsReservation": None}}) == {}
    odd = {
        "status": {
            "flavorsReservation": [
                {"name": "h100", "resources": [{"name": "cpu", "total": "lots"}]}
            ]
        }
    }
    assert reserved_from_status(odd) == {}
