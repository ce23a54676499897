"""The sync's writes are bounded (gpus/fleet.py ``sync_fleet``), and syncs do not pile up
(gpus/tasks.py).

The 1,000-node fleet comes from a stand-in for the Kubernetes client that answers the sync's
two lists with copies of the test cluster's ``gpu-h100-1`` (deploy/cluster/nodes): a fast unit
test of the database side, with a real PostgreSQL; the same path against the real API server
is tests/gpus/test_fleet_cluster.py. The task is the real Celery task, called in this process
with the real cache (Redis) and the real local sync (this machine has no GPU).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gpus import tasks
from gpus.fleet import UNFINISHED_PODS, sync_fleet
from gpus.models import GpuNode
from tests.gpus.test_fleet_table import h100_node, pod

pytestmark = pytest.mark.django_db

FLEET_SIZE = 1000


class ListingClient:
    """Answers ``list`` as the API server would for these nodes and pods; nothing else."""

    def __init__(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        self.nodes = nodes
        self.pods = pods
        self.calls: list[tuple[str, str | None]] = []

    def list(self, api_version: str, kind: str, **options: Any) -> list[dict[str, Any]]:
        self.calls.append((kind, options.get("field_selector")))
        return copy.deepcopy(self.nodes if kind == "Node" else self.pods)


def fleet(size: int) -> list[dict[str, Any]]:
    nodes = []
    template = h100_node()
    for index in range(size):
        node = copy.deepcopy(template)
        node["metadata"]["name"] = f"gpu-{index:04d}"
        nodes.append(node)
    return nodes


def gpunode_writes(queries: CaptureQueriesContext) -> list[str]:
    return [
        query["sql"].split(" ", 1)[0]
        for query in queries.captured_queries
        if '"gpus_gpunode"' in query["sql"]
        and query["sql"].startswith(("INSERT", "UPDATE", "DELETE"))
    ]


def test_a_sync_of_1000_nodes_writes_only_what_changed(settings: Any) -> None:
    settings.TAU_BACKEND = "kubernetes"
    settings.TAU_GPU_AUTO_CORDON = False
    client = ListingClient(fleet(FLEET_SIZE), [])

    with CaptureQueriesContext(connection) as first:
        created = sync_fleet(client=client)  # type: ignore[arg-type]
    assert created.ok, created.error
    assert created.created == FLEET_SIZE
    assert GpuNode.objects.count() == FLEET_SIZE
    assert gpunode_writes(first) == ["INSERT"]
    # The flavors, the rows, one INSERT, the FleetSync row (made by the first sync), and the
    # test transaction's SAVEPOINT/RELEASE around the sync's own transaction.
    assert len(first.captured_queries) == 7
    assert client.calls == [("Node", None), ("Pod", UNFINISHED_PODS)]

    with CaptureQueriesContext(connection) as unchanged:
        same = sync_fleet(client=client)  # type: ignore[arg-type]
    assert (same.created, same.updated, same.deleted) == (0, 0, 0)
    assert gpunode_writes(unchanged) == []
    assert len(unchanged.captured_queries) == 5

    # Three nodes get a run's pod, one turns unhealthy, two are gone: one UPDATE, one DELETE.
    client.pods = [
        pod(f"train-{index}-a1-0", node=f"gpu-{index:04d}", run=("alpha", f"train-{index}"))
        for index in (1, 2, 3)
    ]
    client.nodes[7]["status"]["conditions"].append(
        {
            "type": "XIDErrors",
            "status": "True",
            "message": "XID 79",
            "lastTransitionTime": "2026-12-01T12:03:00Z",
        }
    )
    del client.nodes[-2:]
    with CaptureQueriesContext(connection) as changed:
        moved = sync_fleet(client=client)  # type: ignore[arg-type]
    assert (moved.created, moved.updated, moved.deleted) == (0, 4, 2)
    assert gpunode_writes(changed) == ["UPDATE", "DELETE"]
    assert len(changed.captured_queries) == 7
    assert GpuNode.objects.get(name="gpu-0002").gpus_in_use == 4
    unhealthy = GpuNode.objects.get(name="gpu-0007")
    assert unhealthy.healthy is False
    assert unhealthy.unhealthy_since is not None
    assert GpuNode.objects.count() == FLEET_SIZE - 2
    assert (
        GpuNode.objects.get(name="gpu-0500").updated_at
        == GpuNode.objects.get(name="gpu-0500").first_seen_at
    ), "an unchanged node was written"


def test_a_sync_still_running_makes_the_next_one_skip(settings: Any) -> None:
    settings.TAU_BACKEND = "local"
    cache.delete(tasks.LOCK_KEY)
    try:
        cache.add(tasks.LOCK_KEY, "another worker's sync", timeout=60)
        skipped = tasks.sync_fleet()
        assert skipped["skipped"] is True
        assert cache.get(tasks.LOCK_KEY) == "another worker's sync", "took someone else's lock"
    finally:
        cache.delete(tasks.LOCK_KEY)

    done = tasks.sync_fleet()
    assert done["skipped"] is False
    assert done["ok"] is True
    assert done["source"] == "local"
    assert cache.get(tasks.LOCK_KEY) is None, "the lock outlived the sync"


def test_the_task_is_the_one_beat_fires(settings: Any) -> None:
    from portal.celery import app

    assert settings.CELERY_BEAT_SCHEDULE["sync-gpu-fleet"]["task"] == tasks.SYNC_TASK
    task = app.tasks[tasks.SYNC_TASK]
    assert task.name == "gpus.tasks.sync_fleet"
    assert task.expires == float(settings.TAU_GPU_SYNC_SECONDS)
