"""Reads of the fleet for pages and the API: a fixed number of queries, whatever its size."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db import connection
from django.db.models import Count, Max

from gpus.models import FleetSync, GpuNode, NodeSource


@dataclass
class Pool:
    """The nodes of one pool (a flavor, or a ``taugrid.io/node-pool``), with their totals."""

    name: str
    nodes: list[GpuNode] = field(default_factory=list)

    @property
    def flavor_name(self) -> str:
        for node in self.nodes:
            if node.flavor is not None:
                return node.flavor.name
        return ""

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
    def nodes(self) -> list[GpuNode]:
        return [node for pool in self.pools for node in pool.nodes]

    @property
    def unhealthy_nodes(self) -> list[GpuNode]:
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


def grouped(nodes: Iterable[GpuNode]) -> list[Pool]:
    """Nodes by pool (in the order given), pools by name with the unnamed pool last."""
    pools: dict[str, Pool] = {}
    for node in nodes:
        pools.setdefault(node.pool, Pool(node.pool)).nodes.append(node)
    return sorted(pools.values(), key=lambda pool: (pool.name == "", pool.name))


#: What the fleet page shows of a node (conditions and labels are its own page's).
FLEET_FIELDS = (
    "name",
    "source",
    "pool",
    "flavor__name",
    "gpu_model",
    "gpus_total",
    "gpus_allocatable",
    "gpus_in_use",
    "other_gpus_in_use",
    "ready",
    "healthy",
    "cordoned",
    "problems",
    "taints",
    "runs",
    "unhealthy_since",
    "updated_at",
)


def fleet(sync: FleetSync | None = None) -> Fleet:
    """Every GPU node, grouped by pool: one query (two without ``sync``)."""
    nodes = GpuNode.objects.select_related("flavor").only(*FLEET_FIELDS).order_by("pool", "name")
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
