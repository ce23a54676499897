"""What Kueue has reserved of each workspace's quota, from its ClusterQueues' status.

On a cluster the quota in use is Kueue's to say: ``status.flavorsReservation`` lists, per
flavor and resource, what admitted workloads hold (``borrowed`` is the part above the nominal
quota). The queue pages and the workspace home show these amounts when
``TAU_BACKEND=kubernetes``; the local executor keeps counting its own runs.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from decimal import Decimal
from typing import Any

import kube
from executors.kubernetes.kueue import (
    KUEUE_API,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    WORKSPACE_LABEL,
    is_managed,
)
from kube import KubeError
from tau.quantity import QuantityError, parse_quantity
from workspaces.models import Workspace

logger = logging.getLogger(__name__)

#: (flavor name, resource name) → amount, e.g. ``{("h100", "nvidia.com/gpu"): Decimal(8)}``.
Reserved = dict[tuple[str, str], Decimal]


def reserved_from_status(cluster_queue: Mapping[str, Any]) -> Reserved:
    """The amounts one ClusterQueue's status reports as reserved by admitted workloads."""
    reserved: Reserved = {}
    status = cluster_queue.get("status") or {}
    for flavor in status.get("flavorsReservation") or []:
        for resource in flavor.get("resources") or []:
            try:
                amount = parse_quantity(str(resource.get("total", "0")))
            except QuantityError:
                logger.warning("ClusterQueue reports an unreadable amount: %r", resource)
                continue
            key = (str(flavor.get("name", "")), str(resource.get("name", "")))
            reserved[key] = reserved.get(key, Decimal(0)) + amount
    return reserved


def reserved_by_workspace(workspace_ids: Collection[int] | None) -> dict[int, Reserved]:
    """Kueue's reservations for each workspace (all when ``workspace_ids`` is None), read in
    one list call. When the cluster cannot be asked, nothing is in use as far as the pages
    know; the reason goes to the log."""
    try:
        queues = kube.client().list(
            KUEUE_API, "ClusterQueue", label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}"
        )
    except KubeError as exc:
        logger.warning("quota use not read from Kueue: %s", exc)
        return {}
    slugs = Workspace.unscoped_objects.all()
    if workspace_ids is not None:
        slugs = slugs.filter(pk__in=list(workspace_ids))
    by_slug = dict(slugs.values_list("slug", "pk"))
    found: dict[int, Reserved] = {}
    for queue in queues:
        if not is_managed(queue):
            continue  # another installation's workspace of the same name
        slug = ((queue.get("metadata") or {}).get("labels") or {}).get(WORKSPACE_LABEL)
        if slug in by_slug:
            found[by_slug[slug]] = reserved_from_status(queue)
    return found
