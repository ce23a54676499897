"""Where queued Kubernetes runs stand in Kueue's queue, from Kueue's visibility API.

Kueue orders a LocalQueue's pending Workloads itself (priority, then creation time, with its
own rules for requeued and inadmissible ones) and says so through its visibility API:
``GET /apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/<ns>/localqueues/<lq>/
pendingworkloads`` lists them with ``positionInLocalQueue`` (0-based) and the
``ownerReferences`` of each Workload, which name the RayJob or Job it was made for. A run's
current attempt's workload is named :func:`executors.kubernetes.render.workload_name` of the run and
its attempt, so the owner's name leads back to the run.

Pages and the API read positions here when they show queued runs: **one call per
LocalQueue** (a workspace has one), whatever the number of runs shown, and nothing is
stored: the position is Kueue's at that moment. The visibility API is an aggregated API
served by the Kueue manager; when it does not answer (Kueue restarting, the APIService not
Available, no permission), the reading says so (``unavailable``, in words for the page) and
the positions fall back to TauGrid's own order: priority, then the time the run was queued.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Final
from urllib.parse import quote

import kube
from executors.kubernetes.render import RenderError, workload_name
from kube import KubeError
from runs.backends import QueueReading
from runs.models import Backend, Run, RunState
from workspaces.models import Workspace

logger = logging.getLogger(__name__)

VISIBILITY_API: Final = "/apis/visibility.kueue.x-k8s.io/v1beta2"
#: The most pending workloads read per LocalQueue (the API's own default page).
PENDING_LIMIT: Final = 1000
#: How long a page waits for the visibility API: a page must not hang on it.
VISIBILITY_TIMEOUT: Final = (3.0, 5.0)


def pending_workloads_path(namespace: str, local_queue: str) -> str:
    return (
        f"{VISIBILITY_API}/namespaces/{quote(namespace, safe='')}/localqueues/"
        f"{quote(local_queue, safe='')}/pendingworkloads"
    )


def _value(run: Run | Mapping[str, Any], name: str) -> Any:
    return run[name] if isinstance(run, Mapping) else getattr(run, name)


def _queued_on_kubernetes(runs: Iterable[Run | Mapping[str, Any]]) -> list[Any]:
    return [
        run
        for run in runs
        if _value(run, "state") == RunState.QUEUED and _value(run, "backend") == Backend.KUBERNETES
    ]


def _owner_names(item: Mapping[str, Any]) -> list[str]:
    references = (item.get("metadata") or {}).get("ownerReferences") or []
    return [str(reference.get("name", "")) for reference in references]


def read_queue(
    workspace: Workspace,
    runs: Iterable[Run | Mapping[str, Any]],
    *,
    client: kube.KubeClient | None = None,
) -> QueueReading:
    """Where each of ``runs`` (runs or rows with ``id``, ``name``, ``state``, ``backend``,
    ``attempt_count``) that is queued on Kubernetes stands in the workspace's LocalQueue:
    one call to the visibility API, none when no such run is given."""
    queued = _queued_on_kubernetes(runs)
    if not queued:
        return QueueReading()
    covered = {int(_value(run, "id")) for run in queued}
    by_workload: dict[str, int] = {}
    for run in queued:
        try:
            name = workload_name(str(_value(run, "name")), int(_value(run, "attempt_count")))
        except RenderError:
            continue
        by_workload[name] = int(_value(run, "id"))
    try:
        answer = (client or kube.client()).get_path(
            pending_workloads_path(workspace.namespace, workspace.local_queue),
            params={"limit": PENDING_LIMIT},
            timeout=VISIBILITY_TIMEOUT,
        )
    except KubeError as exc:
        logger.warning(
            "Kueue's visibility API did not answer for %s/%s: %s",
            workspace.namespace,
            workspace.local_queue,
            exc,
        )
        return QueueReading(
            positions=fallback_positions(workspace),
            covered=covered,
            unavailable=(
                f"Kueue's queue could not be read ({exc}); the positions shown are TauGrid's "
                "own order: priority, then the time each run was queued."
            ),
        )
    reading = QueueReading(covered=covered)
    for item in answer.get("items") or []:
        position = item.get("positionInLocalQueue")
        if not isinstance(position, int):
            continue
        for owner in _owner_names(item):
            run_id = by_workload.get(owner)
            if run_id is not None:
                reading.positions[run_id] = position + 1
    return reading


def fallback_positions(workspace: Workspace) -> dict[int, int]:
    """The workspace's queued Kubernetes runs in TauGrid's order (priority, then the time
    each was queued): one query."""
    ordered = (
        Run.objects.for_workspace(workspace)
        .filter(state=RunState.QUEUED, backend=Backend.KUBERNETES)
        .order_by("-priority_value", "queued_at", "id")
        .values_list("pk", flat=True)[:PENDING_LIMIT]
    )
    return {run_id: index for index, run_id in enumerate(ordered, start=1)}
