"""Reads of the fleet for pages and the API: a fixed number of queries, whatever its size."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from django.db import connection
from django.db.models import Count, Max

from gpus.models import FleetSync, GpuNode, NodeSource


class FleetNode(NamedTuple):
    """What the fleet page shows of a node: its row's fields, no model instance (a thousand
    of those cost more to build than the query that reads them)."""

    name: str
    source: str
    pool: str
    flavor_name: str
    gpu_model: str
    gpus_total: int
    gpus_allocatable: int
    gpus_in_use: int
    other_gpus_in_use: int
    ready: bool
    healthy: bool
    cordoned: bool
    problems: list[str]
    taints: list[dict[str, Any]]
    runs: list[dict[str, Any]]
    unhealthy_since: datetime | None
    updated_at: datetime


@dataclass
class Pool:
    """The nodes of one pool (a flavor, or a ``taugrid.io/node-pool``), with their totals."""

    name: str
    nodes: list[FleetNode] = field(default_factory=list)

    @property
    def flavor_name(self) -> str:
        return next((node.flavor_name for node in self.nodes if node.flavor_name), "")

    @property
    def gpus_total(self) -> int:
        return sum(node.gpus_total for node in self.nodes)

    @property
    def gpus_allocatable(self) -> int:
        return sum(node.gpus_allocatable for node in self.nodes)

    @property
    def gpus_in_use(self) -> int:
        return sum(node.gpus_in_use for node in self.nodes)

    @property
    def unhealthy(self) -> int:
        return sum(not node.healthy for node in self.nodes)

    @property
    def cordoned(self) -> int:
        return sum(node.cordoned for node in self.nodes)

    @property
    def percent_in_use(self) -> int:
        return round(100 * self.gpus_in_use / self.gpus_allocatable) if self.gpus_allocatable else 0


@dataclass
class Fleet:
    pools: list[Pool]
    sync: FleetSync | None

    @property
    def nodes(self) -> list[FleetNode]:
        return [node for pool in self.pools for node in pool.nodes]

    @property
    def unhealthy_nodes(self) -> list[FleetNode]:
        return [node for node in self.nodes if not node.healthy]

    @property
    def gpus_total(self) -> int:
        return sum(pool.gpus_total for pool in self.pools)

    @property
    def gpus_allocatable(self) -> int:
        return sum(pool.gpus_allocatable for pool in self.pools)

    @property
    def gpus_in_use(self) -> int:
        return sum(pool.gpus_in_use for pool in self.pools)

    @property
    def local(self) -> bool:
        return self.sync is not None and self.sync.source == NodeSource.LOCAL


def fleet_sync() -> FleetSync | None:
    return FleetSync.objects.filter(pk=1).first()


def fleet_state() -> tuple[int, object]:
    """What the fleet page's ETag follows: how many nodes, and when one last changed."""
    found = GpuNode.objects.aggregate(count=Count("id"), changed=Max("updated_at"))
    return (found["count"], found["changed"])


def grouped(nodes: Iterable[FleetNode]) -> list[Pool]:
    """Nodes by pool (in the order given), pools by name with the unnamed pool last."""
    pools: dict[str, Pool] = {}
    for node in nodes:
        pools.setdefault(node.pool, Pool(node.pool)).nodes.append(node)
    return sorted(pools.values(), key=lambda pool: (pool.name == "", pool.name))


def fleet(sync: FleetSync | None = None) -> Fleet:
    """Every GPU node, grouped by pool: one query (two without ``sync``)."""
    rows = GpuNode.objects.order_by("pool", "name").values_list(
        *(name if name != "flavor_name" else "flavor__name" for name in FleetNode._fields)
    )
    nodes = [FleetNode._make((*row[:3], row[3] or "", *row[4:])) for row in rows]
    return Fleet(pools=grouped(nodes), sync=sync if sync is not None else fleet_sync())


def node_named(name: str) -> GpuNode | None:
    if "\x00" in name:
        return None
    return GpuNode.objects.select_related("flavor").filter(name=name).first()


def nodes_of_run(workspace_slug: str, run_name: str) -> list[GpuNode]:
    """The nodes whose pods hold GPUs for this run now (the last sync's view): one query."""
    wanted = {"workspace": workspace_slug, "run": run_name}
    nodes = GpuNode.objects.only("name", "runs", "labels").order_by("name")
    if connection.vendor == "postgresql":
        return list(nodes.filter(runs__contains=[wanted]))
    # SQLite has no JSON containment; there the fleet is this one machine.
    return [
        node
        for node in nodes
        if any({key: entry.get(key) for key in wanted} == wanted for entry in node.runs)
    ]
