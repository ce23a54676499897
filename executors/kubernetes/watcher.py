"""The Kubernetes watcher: follows every run's objects on the cluster to the end, and tells the
run services what happened (``manage.py run_kube_watcher``; ``make run`` starts it when
``TAU_BACKEND=kubernetes``). The Kubernetes backend's counterpart of the local agent.

A loop over small steps, each tested on its own:

1. **Informers** (:class:`kube.informer.Informer`, one thread per kind) list, then watch,
   Workloads (``kueue.x-k8s.io/v1beta2``), Jobs, RayJobs (``ray.io/v1``) and Pods with
   TauGrid's labels, warning Events, ClusterQueues and LocalQueues, in all namespaces, and
   Nodes (for the XID errors node-problem-detector reports on them). Each watch resumes from
   the last ``resourceVersion`` it saw; a ``410 Gone`` means list again; a lost connection
   means wait (doubling, up to ``kube.informer.MAX_BACKOFF_SECONDS``) and list again; every
   ``TAU_KUBE_WATCHER_RESYNC_SECONDS`` the watch is replaced by a full list anyway. Informers
   touch no database: they put what they read on one queue.
2. **The cache** (:class:`ClusterCache`, the main thread's only) keeps the objects and indexes
   them by attempt (the labels ``taugrid.io/run-id`` + ``taugrid.io/attempt``, never names:
   names change with the attempt number), a Workload by its job's uid (Kueue's
   ``kueue.x-k8s.io/job-uid`` label: Kueue copies no other label), an Event by the object it
   is about, a pod by the node it is bound to. Of a Node it keeps only what an observation
   reads (``executors.kubernetes.status.node_facts``: its name and XID conditions), so the fleet's
   heartbeats change nothing and cost no memory. Each change marks the attempts it concerns
   *dirty*: a Node's XID conditions changing, the attempts with pods on it that this watcher
   has not seen end.
3. **Reconcile** one dirty attempt: read its run, gather its objects from the cache (only from
   the run's workspace namespace: an object elsewhere with a run's labels is not believed),
   ask :func:`executors.kubernetes.status.observe` what they mean, and apply it with the core's
   decision table, :func:`runs.observations.apply_observation`, as the local executor does.
4. **Apply** through the run services only (``admit_attempt``,
   ``attempt_running``, ``finish_attempt`` — whose retry policy hands a new attempt to the
   backend through the outbox — ``note_reason``, ``note_admission``, ``note_nodes``, and the
   run tokens revoked when an attempt ends). Every step is guarded by the state the database
   holds, under the run's lock, so seeing the same status twice, or two watchers acting for a
   moment, changes nothing the second time: no event is recorded twice. The attempt's Job or
   RayJob is deleted when TauGrid ended an attempt Kubernetes had not (preempted and
   suspended by Kueue, which would admit it again; stuck on an image).
5. **Sweep**, once every informer has listed and then at each resync: every live Kubernetes
   run's current attempt is reconciled whatever the watches said, which catches what happened
   while no watcher ran: objects deleted behind TauGrid's back, a cancel whose pods are gone.
6. **One active replica** (:class:`kube.leader.LeaderElection`): a
   ``coordination.k8s.io/v1`` Lease named ``taugrid-kube-watcher`` in
   ``TAU_KUBE_WATCHER_LEASE_NAMESPACE``, created if missing (and its namespace with it, where
   the portal does not run in one: ``make run``), renewed every fifth of
   ``TAU_KUBE_WATCHER_LEASE_SECONDS``. The holder acts only while its last renewal is younger
   than two thirds of the lease; a standby takes the Lease as soon as it lapses — a whole
   lease after it saw it change, or sooner when the holder's ``renewTime`` is a lease old by
   this machine's clock (within a skew allowance), so a replica that starts after the holder
   died does not wait another lease — and only then starts its informers. A replica that
   stops gracefully gives the Lease up at once, and a standby takes it at its next round. A
   holder that could not renew in time (the API server did not answer) stops acting but keeps
   its informers until another replica holds the Lease: renewed, it acts again at once on
   what it read meanwhile, with a sweep.

7. **Endpoints**: every ``ENDPOINT_FOLLOW_SECONDS`` the active watcher reads each live
   endpoint's RayService (and, until it serves, the Kueue Workload of its Ray cluster) and
   reports its state through ``serving.services.observe`` (``executors.kubernetes.endpoints``).

What the watcher decides about an attempt, and why, is in ``executors.kubernetes.status``;
about an endpoint, in ``executors.kubernetes.endpoint_status``.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType
from typing import Any, Final

from django.conf import settings
from django.db import DatabaseError, close_old_connections
from django.utils import timezone

import kube
from catalog.runs import OutputsNotKept, cluster_outputs, keep_outputs
from executors.kubernetes import kueue_sync, labels
from executors.kubernetes.backend import KubernetesBackend, no_pod_left
from executors.kubernetes.endpoints import follow as follow_endpoints
from executors.kubernetes.heartbeat import HeartbeatWriter
from executors.kubernetes.rbac import LEADER_LEASE
from executors.kubernetes.status import AttemptObjects, node_facts, observe
from kube import KubeClient, KubeError
from kube.informer import Informer, Listed, Message, WatchedKind
from kube.leader import LeaderElection
from runs import run_tokens
from runs.attempts import note_log_kept, note_log_missing
from runs.models import (
    LIVE_STATES,
    Backend,
    Delivery,
    EventKind,
    FailureClass,
    Run,
    RunAttempt,
    RunEvent,
)
from runs.observations import Applied, Observation, ObservedState, apply_observation
from tau.spec import spec_from_dict

logger = logging.getLogger(__name__)

Body = dict[str, Any]

KUEUE: Final = "kueue.x-k8s.io/v1beta2"
#: TauGrid's objects: its own label, and the run id present.
TAUGRID_SELECTOR: Final = f"{labels.MANAGED_BY}={labels.MANAGED_BY_TAUGRID},{labels.RUN_ID}"
#: A Job or RayJob TauGrid created and the cache does not hold is "deleted" only once its
#: creation is this old: a watch event can lag the backend's write by a moment.
ABSENCE_GRACE: Final = timedelta(seconds=30)
#: A reconcile that could not be completed (a run still pending, a database error) is tried
#: again after this long.
RETRY_SECONDS: Final = 2.0
#: An admitted attempt whose pods have not started is looked at again this often, whether or
#: not anything changes: what it says depends on how long they have waited (a pod the
#: scheduler cannot place, an image that cannot be pulled; ``executors.kubernetes.status``).
RECHECK_SECONDS: Final = 10.0
#: A waiting run's reason quotes its queue's numbers ("the workspace uses 8 of its 8"), which
#: move with every admission: a change of a ClusterQueue or LocalQueue marks its waiting runs
#: for a refresh of lower rank than any run's own change, due once the queue has had
#: QUEUE_SETTLE_SECONDS to settle (a run finishing and the next admitted read 8, 3, 8 within
#: a second), at most QUEUE_REFRESH_BATCH per step, between which new changes are taken in.
#: With a thousand waiting runs an admission is not held up behind a thousand rewritten
#: reasons, and however often the queue moves meanwhile, a marked run is refreshed once.
QUEUE_SETTLE_SECONDS: Final = 2.0
#: How often the active watcher reads the live endpoints' RayServices (executors.kubernetes
#: .endpoints.follow): their states reach the portal within this.
ENDPOINT_FOLLOW_SECONDS: Final = 2.0
QUEUE_REFRESH_BATCH: Final = 50
#: The most warning Events kept (the oldest are dropped first).
MAX_EVENTS: Final = 10_000

JOB: Final = WatchedKind("batch/v1", "Job", label_selector=TAUGRID_SELECTOR)
RAYJOB: Final = WatchedKind("ray.io/v1", "RayJob", label_selector=TAUGRID_SELECTOR)
POD: Final = WatchedKind("v1", "Pod", label_selector=TAUGRID_SELECTOR)
WORKLOAD: Final = WatchedKind(KUEUE, "Workload", label_selector=labels.KUEUE_JOB_UID)
EVENT: Final = WatchedKind("v1", "Event", field_selector="type=Warning")
CLUSTER_QUEUE: Final = WatchedKind(KUEUE, "ClusterQueue")
LOCAL_QUEUE: Final = WatchedKind(KUEUE, "LocalQueue")
#: Without Nodes, a run that fails under an XID error reads as the program's failure.
NODE: Final = WatchedKind("v1", "Node", optional=True)
WATCHED: Final = (WORKLOAD, JOB, RAYJOB, POD, EVENT, CLUSTER_QUEUE, LOCAL_QUEUE, NODE)
WORKLOAD_OBJECT_KINDS: Final = frozenset({JOB.kind, RAYJOB.kind})


@dataclass(frozen=True, order=True)
class AttemptKey:
    run_id: int
    attempt: int


def attempt_key(obj: Mapping[str, Any]) -> AttemptKey | None:
    """The attempt an object of TauGrid's belongs to, from its labels."""
    found = (obj.get("metadata") or {}).get("labels") or {}
    try:
        return AttemptKey(int(found[labels.RUN_ID]), int(found[labels.ATTEMPT]))
    except (KeyError, TypeError, ValueError):
        return None


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _uid(obj: Mapping[str, Any]) -> str:
    meta = _meta(obj)
    return str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")


def _name_of(kind: str, obj: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = _meta(obj)
    return (str(meta.get("namespace") or ""), kind, str(meta.get("name") or ""))


def _what_reasons_quote(queue: Mapping[str, Any]) -> tuple[Any, ...]:
    """What of a ClusterQueue or LocalQueue a waiting run's reason depends on
    (``executors.kubernetes.status.waiting_reason``): the quotas, the cohort, the reservations, and
    which ClusterQueue a LocalQueue feeds. Kueue rewrites a queue's status at every admission and
    finish; most of it (workload counts, conditions) changes no run's reason."""
    spec = queue.get("spec") or {}
    status = queue.get("status") or {}
    return (
        spec.get("clusterQueue"),
        spec.get("resourceGroups"),
        spec.get("cohortName") or spec.get("cohort"),
        status.get("flavorsReservation"),
    )


def _node_name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def _owned_by_rayjob(obj: Mapping[str, Any]) -> bool:
    return any(ref.get("kind") == "RayJob" for ref in _meta(obj).get("ownerReferences") or [])


# --- informers ---------------------------------------------------------------------------------


# --- the cache --------------------------------------------------------------------------------


class ClusterCache:
    """The objects the informers read, indexed for :meth:`objects_for` (main thread only)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Body]] = {w.kind: {} for w in WATCHED}
        self.members: dict[AttemptKey, set[tuple[str, str]]] = {}
        self.workload_by_job_uid: dict[str, str] = {}
        self.events: OrderedDict[str, Body] = OrderedDict()
        self.events_about: dict[tuple[str, str, str], set[str]] = {}
        #: (namespace, kind, name) → uid, for what an Event is about.
        self.named: dict[tuple[str, str, str], str] = {}
        self.listed: set[str] = set()
        #: Attempts whose Job or RayJob this process has seen (so its absence is a deletion).
        self.seen: set[AttemptKey] = set()
        #: Node name → the uids of the pods bound to it.
        self.pods_on_node: dict[str, set[str]] = {}

    # -- updates, each returning the attempts it concerns --

    def replace(self, kind: str, items: Iterable[Body]) -> set[AttemptKey]:
        fresh = {_uid(item): item for item in items}
        dirty: set[AttemptKey] = set()
        for uid, old in list(self.objects[kind].items()):
            if uid not in fresh:
                dirty |= self._remove(kind, old)
        for uid, item in fresh.items():
            known = self.objects[kind].get(uid)
            if known is None or _meta(known).get("resourceVersion") != _meta(item).get(
                "resourceVersion"
            ):
                dirty |= self._put(kind, item)
        self.listed.add(kind)
        return dirty

    def change(self, kind: str, change_type: str, obj: Body) -> set[AttemptKey]:
        if change_type == "DELETED":
            old = self.objects[kind].get(_uid(obj), obj)
            return self._remove(kind, old)
        return self._put(kind, obj)

    def _put(self, kind: str, obj: Body) -> set[AttemptKey]:
        uid = _uid(obj)
        before = self.objects[kind].get(uid)
        if kind == NODE.kind:
            return self._put_node(uid, before, obj)
        self.objects[kind][uid] = obj
        if (
            kind in {CLUSTER_QUEUE.kind, LOCAL_QUEUE.kind}
            and before is not None
            and _what_reasons_quote(before) == _what_reasons_quote(obj)
        ):
            return set()  # counts of pending and admitted workloads moved: no reason changes
        if kind == EVENT.kind:
            return self._put_event(uid, obj)
        self.named[_name_of(kind, obj)] = uid
        if kind == WORKLOAD.kind:
            job_uid = str((_meta(obj).get("labels") or {}).get(labels.KUEUE_JOB_UID) or "")
            if job_uid:
                self.workload_by_job_uid[job_uid] = uid
            return self._keys_of_job_uid(job_uid)
        if kind in {CLUSTER_QUEUE.kind, LOCAL_QUEUE.kind}:
            return self._waiting_keys(kind, obj)
        key = attempt_key(obj)
        if key is None:
            return set()
        self.members.setdefault(key, set()).add((kind, uid))
        if kind in WORKLOAD_OBJECT_KINDS and not _owned_by_rayjob(obj):
            self.seen.add(key)
        if kind == POD.kind:
            self._bind(uid, before, obj)
        return {key}

    def _put_node(self, uid: str, before: Body | None, node: Body) -> set[AttemptKey]:
        facts = node_facts(node)
        self.objects[NODE.kind][uid] = facts
        name = str(facts["metadata"]["name"])
        self.named[("", NODE.kind, name)] = uid
        if before is not None and before["status"] == facts["status"]:
            return set()  # a heartbeat, a label, a new allocation: nothing observe reads
        return self.keys_on_node(name)

    def _bind(self, uid: str, before: Body | None, pod: Body) -> None:
        """Index the pod by its node (``spec.nodeName`` is set once, by the binding)."""
        old, new = _node_name(before or {}), _node_name(pod)
        if old and old != new:
            self._unbind(uid, old)
        if new:
            self.pods_on_node.setdefault(new, set()).add(uid)

    def _unbind(self, uid: str, node: str) -> None:
        bound = self.pods_on_node.get(node)
        if bound is not None:
            bound.discard(uid)
            if not bound:
                del self.pods_on_node[node]

    def keys_on_node(self, name: str) -> set[AttemptKey]:
        """The attempts with a pod bound to the node ``name``."""
        keys: set[AttemptKey] = set()
        for uid in self.pods_on_node.get(name, ()):
            key = attempt_key(self.objects[POD.kind].get(uid) or {})
            if key is not None:
                keys.add(key)
        return keys

    def _remove(self, kind: str, obj: Body) -> set[AttemptKey]:
        uid = _uid(obj)
        stored = self.objects[kind].pop(uid, None) or obj
        if kind == EVENT.kind:
            return self._drop_event(uid, stored)
        if self.named.get(_name_of(kind, stored)) == uid:
            del self.named[_name_of(kind, stored)]
        if kind == WORKLOAD.kind:
            job_uid = str((_meta(stored).get("labels") or {}).get(labels.KUEUE_JOB_UID) or "")
            if self.workload_by_job_uid.get(job_uid) == uid:
                del self.workload_by_job_uid[job_uid]
            return self._keys_of_job_uid(job_uid)
        if kind in {CLUSTER_QUEUE.kind, LOCAL_QUEUE.kind}:
            return self._waiting_keys(kind, stored)
        if kind == NODE.kind:
            return self.keys_on_node(str(_meta(stored).get("name") or ""))
        if kind == POD.kind and _node_name(stored):
            self._unbind(uid, _node_name(stored))
        key = attempt_key(stored)
        if key is None:
            return set()
        members = self.members.get(key)
        if members is not None:
            members.discard((kind, uid))
            if not members:
                del self.members[key]
        return {key}

    def _put_event(self, uid: str, event: Body) -> set[AttemptKey]:
        about = self._about(event)
        self.events[uid] = event
        self.events.move_to_end(uid)
        self.events_about.setdefault(about, set()).add(uid)
        while len(self.events) > MAX_EVENTS:
            oldest, dropped = self.events.popitem(last=False)
            self.objects[EVENT.kind].pop(oldest, None)
            self.events_about.get(self._about(dropped), set()).discard(oldest)
        return self._keys_named(about)

    def _drop_event(self, uid: str, event: Body) -> set[AttemptKey]:
        self.events.pop(uid, None)
        about = self._about(event)
        self.events_about.get(about, set()).discard(uid)
        return self._keys_named(about)

    @staticmethod
    def _about(event: Mapping[str, Any]) -> tuple[str, str, str]:
        involved = event.get("involvedObject") or {}
        return (
            str(involved.get("namespace") or _meta(event).get("namespace") or ""),
            str(involved.get("kind") or ""),
            str(involved.get("name") or ""),
        )

    def _keys_named(self, about: tuple[str, str, str]) -> set[AttemptKey]:
        kind = about[1]
        obj = self.objects.get(kind, {}).get(self.named.get(about, ""))
        if obj is None:
            return set()
        if kind == WORKLOAD.kind:
            job_uid = str((_meta(obj).get("labels") or {}).get(labels.KUEUE_JOB_UID) or "")
            return self._keys_of_job_uid(job_uid)
        key = attempt_key(obj)
        return {key} if key is not None else set()

    def _keys_of_job_uid(self, job_uid: str) -> set[AttemptKey]:
        for kind in WORKLOAD_OBJECT_KINDS:
            job = self.objects[kind].get(job_uid)
            if job is not None:
                key = attempt_key(job)
                return {key} if key is not None else set()
        return set()

    def _waiting_keys(self, queue_kind: str, queue: Body) -> set[AttemptKey]:
        """Attempts waiting in ``queue`` (a ClusterQueue, or a LocalQueue) whose Kueue
        Workload is not admitted: their waiting reason quotes the queue's numbers."""
        queue_meta = _meta(queue)
        if queue_kind == LOCAL_QUEUE.kind:
            wanted = {(queue_meta.get("namespace"), queue_meta.get("name"))}
        else:
            wanted = {
                (_meta(local).get("namespace"), _meta(local).get("name"))
                for local in self.objects[LOCAL_QUEUE.kind].values()
                if (local.get("spec") or {}).get("clusterQueue") == queue_meta.get("name")
            }
        keys: set[AttemptKey] = set()
        for key, members in self.members.items():
            for kind, uid in members:
                if kind not in WORKLOAD_OBJECT_KINDS:
                    continue
                obj = self.objects[kind].get(uid)
                if obj is None:
                    continue
                meta = _meta(obj)
                local = (
                    meta.get("namespace"),
                    (meta.get("labels") or {}).get(labels.KUEUE_QUEUE_NAME),
                )
                if local not in wanted:
                    continue
                workload = self.objects[WORKLOAD.kind].get(self.workload_by_job_uid.get(uid, ""))
                if workload is None or not (workload.get("status") or {}).get("admission"):
                    keys.add(key)
        return keys

    # -- reads --

    def ready(self) -> bool:
        return all(w.kind in self.listed for w in WATCHED)

    def keys(self) -> set[AttemptKey]:
        return set(self.members)

    def describe(self, key: AttemptKey) -> str:
        """The attempt's objects for a person: its Job or RayJob, else its pods, by
        ``kind namespace/name``."""
        found = [
            self.objects[kind][uid] | {"kind": kind}
            for kind, uid in sorted(self.members.get(key, set()))
            if uid in self.objects[kind]
        ]
        main = [o for o in found if o["kind"] in WORKLOAD_OBJECT_KINDS and not _owned_by_rayjob(o)]
        shown = main or found
        names = [f"{o['kind']} {_meta(o).get('namespace')}/{_meta(o).get('name')}" for o in shown]
        return ", ".join(names) or f"the objects of run {key.run_id} attempt {key.attempt}"

    def objects_for(self, key: AttemptKey, *, namespace: str, created: bool) -> AttemptObjects:
        """The attempt's objects in ``namespace`` (objects elsewhere are not believed)."""
        found: dict[str, list[Body]] = {}
        for kind, uid in sorted(self.members.get(key, set())):
            obj = self.objects[kind].get(uid)
            if obj is not None and _meta(obj).get("namespace") == namespace:
                found.setdefault(kind, []).append(obj)
        # The RayJob if there is one (its submitter Job is one of its parts), else the Job.
        candidates = [
            obj
            for kind in (RAYJOB.kind, JOB.kind)
            for obj in found.get(kind, [])
            if not _owned_by_rayjob(obj)
        ]
        workload_object = candidates[0] if candidates else None
        kueue_workload = None
        if workload_object is not None:
            workload_uid = self.workload_by_job_uid.get(_uid(workload_object))
            if workload_uid is not None:
                kueue_workload = self.objects[WORKLOAD.kind].get(workload_uid)
        pods = found.get(POD.kind, [])
        return AttemptObjects(
            workload_object=workload_object,
            kueue_workload=kueue_workload,
            pods=tuple(pods),
            events=tuple(self._events_about(namespace, workload_object, kueue_workload, pods)),
            cluster_queue=self._cluster_queue(workload_object, kueue_workload),
            created=created,
            nodes=tuple(self._nodes_under(pods)),
        )

    def _nodes_under(self, pods: list[Body]) -> list[Body]:
        """What the cache keeps of the Nodes the pods are bound to, by name."""
        found: list[Body] = []
        for name in sorted({_node_name(pod) for pod in pods} - {""}):
            node = self.objects[NODE.kind].get(self.named.get(("", NODE.kind, name), ""))
            if node is not None:
                found.append(node)
        return found

    def _events_about(
        self,
        namespace: str,
        workload_object: Body | None,
        kueue_workload: Body | None,
        pods: list[Body],
    ) -> list[Body]:
        wanted = [(POD.kind, str(_meta(p).get("name"))) for p in pods]
        if workload_object is not None:
            wanted.append((str(workload_object.get("kind")), str(_meta(workload_object)["name"])))
        if kueue_workload is not None:
            wanted.append((WORKLOAD.kind, str(_meta(kueue_workload).get("name"))))
        found: list[Body] = []
        for kind, name in wanted:
            for uid in sorted(self.events_about.get((namespace, kind, name), set())):
                event = self.events.get(uid)
                if event is not None:
                    found.append(event)
        return found

    def _cluster_queue(
        self, workload_object: Body | None, kueue_workload: Body | None
    ) -> Body | None:
        admission = ((kueue_workload or {}).get("status") or {}).get("admission") or {}
        name = admission.get("clusterQueue")
        if not name and workload_object is not None:
            meta = _meta(workload_object)
            queue_name = (meta.get("labels") or {}).get(labels.KUEUE_QUEUE_NAME)
            for local in self.objects[LOCAL_QUEUE.kind].values():
                local_meta = _meta(local)
                if (
                    local_meta.get("namespace") == meta.get("namespace")
                    and local_meta.get("name") == queue_name
                ):
                    name = (local.get("spec") or {}).get("clusterQueue")
        if not name:
            return None
        for cluster_queue in self.objects[CLUSTER_QUEUE.kind].values():
            if _meta(cluster_queue).get("name") == name:
                return cluster_queue
        return None


# --- applying an observation -------------------------------------------------------------------


# --- the watcher --------------------------------------------------------------------------------


class KubeWatcher:
    """Informers, the cache, reconciling and sweeping (module docstring, steps 1 to 5). The
    caller drives it: :meth:`start`, then :meth:`step` in a loop while it leads, :meth:`stop`."""

    def __init__(
        self,
        client: KubeClient,
        *,
        resync_seconds: float,
        acting: Callable[[], bool] = lambda: True,
    ) -> None:
        self.client = client
        self.resync_seconds = resync_seconds
        self.acting = acting
        self.messages: queue.Queue[Message] = queue.Queue()
        self.cache = ClusterCache()
        self.generation = 0
        self.informers: list[Informer] = []
        self._stop_informers = threading.Event()
        self.dirty: set[AttemptKey] = set()
        #: Waiting runs whose queue changed, and when their refresh is due (QUEUE_SETTLE_SECONDS).
        self.refresh: dict[AttemptKey, float] = {}
        self.retry_at: dict[AttemptKey, float] = {}
        self.applied: dict[AttemptKey, Observation] = {}
        #: Succeeded attempts whose outputs were read: None when kept (or none declared), the
        #: failed observation that replaces the success when they could not be.
        self.outputs_verdicts: dict[AttemptKey, Observation | None] = {}
        self.namespaces: dict[int, str | None] = {}
        self.swept_at: float | None = None
        self.started_at = 0.0
        #: Attempts whose objects carry TauGrid's labels but that the database does not know
        #: (a run deleted, or a database restored from a backup older than the cluster), each
        #: with the objects named; found at each sweep (:meth:`report_unknown`).
        self.unknown: dict[AttemptKey, str] = {}

    @property
    def running(self) -> bool:
        return bool(self.informers)

    def start(self) -> None:
        """Start fresh informers (an empty cache: each lists first)."""
        self.stop()
        self.generation += 1
        self.cache = ClusterCache()
        self.dirty.clear()
        self.refresh.clear()
        self.retry_at.clear()
        self.applied.clear()
        self.namespaces.clear()
        self.swept_at = None
        self.started_at = time.monotonic()
        self._stop_informers = threading.Event()
        self.informers = [
            Informer(
                self.client,
                watched,
                self.messages.put,
                generation=self.generation,
                stop=self._stop_informers,
                resync_seconds=self.resync_seconds,
            )
            for watched in WATCHED
        ]
        for informer in self.informers:
            informer.start()

    def sweep_soon(self) -> None:
        """Sweep at the next step (every live run's current attempt reconciled): after a time
        in which it did not act, whatever the watches said meanwhile."""
        self.swept_at = None

    def stop(self) -> None:
        if not self.informers:
            return
        self._stop_informers.set()
        for informer in self.informers:
            informer.close()
        for informer in self.informers:
            informer.join(timeout=5)
        self.informers = []

    # -- one step --

    def step(self, timeout: float = 0.5) -> int:
        """Take in what the informers read (waiting up to ``timeout`` for the first of it,
        less while queue refreshes are due), then reconcile every attempt it concerns, and a
        batch of the refreshes; sweep when due. How many were reconciled."""
        if self.refresh:
            timeout = min(timeout, max(0.0, min(self.refresh.values()) - time.monotonic()))
        self._take_messages(timeout)
        if not self.cache.ready():
            return 0
        now = time.monotonic()
        if self.swept_at is None or now - self.swept_at >= self.resync_seconds:
            self.sweep()
        due = {key for key, at in self.retry_at.items() if at <= now}
        for key in due:
            del self.retry_at[key]
        todo = sorted(self.dirty | due)
        self.dirty.clear()
        for key in todo:
            self.refresh.pop(key, None)  # reconciled now, with their queue's numbers
        refreshing = sorted(key for key, at in self.refresh.items() if at <= now)
        refreshing = refreshing[:QUEUE_REFRESH_BATCH]
        for key in refreshing:
            del self.refresh[key]
        done = 0
        for index, key in enumerate([*todo, *refreshing]):
            if not self.acting():
                # Not ours to act on any more.
                self.dirty.update(todo[index:])
                for key in refreshing[max(0, index - len(todo)) :]:
                    self.refresh[key] = now
                break
            self.reconcile(key)
            done += 1
        return done

    def _take_messages(self, timeout: float) -> None:
        try:
            message = self.messages.get(timeout=timeout)
        except queue.Empty:
            return
        taken = 0
        while True:
            self._take(message)
            taken += 1
            if taken >= 5000:
                return
            try:
                message = self.messages.get_nowait()
            except queue.Empty:
                return

    def _take(self, message: Message) -> None:
        if message.generation != self.generation:
            return  # from informers of an earlier leadership
        if isinstance(message, Listed):
            keys = self.cache.replace(message.kind, message.items)
        else:
            keys = self.cache.change(message.kind, message.type, message.object)
        if message.kind in {CLUSTER_QUEUE.kind, LOCAL_QUEUE.kind}:
            due = time.monotonic() + QUEUE_SETTLE_SECONDS
            for key in keys - self.dirty:
                self.refresh.setdefault(key, due)
        elif message.kind == NODE.kind:
            # A node's XIDs decide only how a failure reads: the attempts this watcher has
            # seen end are done with (a finished pod stays bound to its node for long).
            self.dirty |= {key for key in keys if not self._seen_ended(key)}
        else:
            self.dirty |= keys

    def _seen_ended(self, key: AttemptKey) -> bool:
        applied = self.applied.get(key)
        return applied is not None and applied.ended

    def sweep(self) -> None:
        """Reconcile every live Kubernetes run's current attempt, and every attempt that has
        objects, whatever the watches said (module docstring, step 5)."""
        live = Run.objects.unscoped().filter(backend=Backend.KUBERNETES, state__in=LIVE_STATES)
        for run_id, number in list(live.values_list("pk", "attempt_count")):
            if number:
                self.dirty.add(AttemptKey(run_id, number))
        self.swept_at = time.monotonic()  # only once read: a database error means "again"
        self.dirty |= self.cache.keys()
        self.applied.clear()
        self.namespaces.clear()
        self.report_unknown()

    def report_unknown(self) -> None:
        """Log, once each, the attempts that have objects in the cluster (labelled by TauGrid)
        but no run or attempt in the database: after a database restore, the objects of runs
        submitted since the backup. TauGrid leaves them alone (it cannot know whose they
        are); the warning names them so that a person can look and delete them. Runs the
        database knows whose objects are gone are the other half: their attempts fail as
        ``infrastructure`` ("deleted outside TauGrid …") when reconciled."""
        keys = self.cache.keys()
        attempts = dict(
            Run.objects.unscoped()
            .filter(pk__in={key.run_id for key in keys}, backend=Backend.KUBERNETES)
            .values_list("pk", "attempt_count")
        )
        unknown = {
            key
            for key in keys
            if key.run_id not in attempts or key.attempt > (attempts[key.run_id] or 0)
        }
        for key in sorted(unknown - set(self.unknown)):
            named = self.cache.describe(key)
            self.unknown[key] = named
            what = (
                "no run"
                if key.run_id not in attempts
                else f"a run with {attempts[key.run_id]} attempt(s) only"
            )
            logger.warning(
                "%s carries TauGrid's labels for run %s attempt %s, but the database has %s "
                "(was it restored from an older backup?). TauGrid leaves it alone: check "
                "whose it is, and delete it if nothing needs it.",
                named,
                key.run_id,
                key.attempt,
                what,
            )
        for key in set(self.unknown) - unknown:
            del self.unknown[key]

    # -- one attempt --

    def reconcile(self, key: AttemptKey) -> Applied | None:
        """Reconcile one attempt; None when there was nothing to do. Failures are logged and
        the attempt is tried again later: one bad attempt never stops the others."""
        try:
            return self._reconcile(key)
        except DatabaseError:
            logger.warning(
                "database error reconciling run %s attempt %s",
                key.run_id,
                key.attempt,
                exc_info=True,
            )
            close_old_connections()
        except KubeError as error:
            logger.warning("run %s attempt %s: Kubernetes said %s", key.run_id, key.attempt, error)
        except Exception:
            logger.exception("could not reconcile run %s attempt %s", key.run_id, key.attempt)
        self.applied.pop(key, None)
        self.retry_at[key] = time.monotonic() + RETRY_SECONDS * 5
        return None

    def _namespace(self, run_id: int) -> str | None:
        """The run's workspace namespace; None for a run that is not one of this
        installation's Kubernetes runs (remembered until the next sweep)."""
        if run_id not in self.namespaces:
            self.namespaces[run_id] = (
                Run.objects.unscoped()
                .filter(pk=run_id, backend=Backend.KUBERNETES)
                .values_list("workspace__namespace", flat=True)
                .first()
            )
        return self.namespaces[run_id]

    def _reconcile(self, key: AttemptKey) -> Applied | None:
        # Nothing but the cache until the observation differs from the last one applied: a
        # ClusterQueue's status moves with every admission, and reaches every waiting run.
        namespace = self._namespace(key.run_id)
        if namespace is None:
            return None
        created = self._created(key)
        objects = self.cache.objects_for(key, namespace=namespace, created=created)
        now = timezone.now()
        observation = observe(
            objects, now=now, xid_settle=timedelta(seconds=settings.TAU_XID_SETTLE_SECONDS)
        )
        if observation.settles_at is not None:
            # A GPU program's failure its node's XID condition may still explain: read it
            # again when the hold is over (or sooner, if the Node changes meanwhile).
            wait = (observation.settles_at - now).total_seconds()
            self.retry_at[key] = time.monotonic() + max(0.0, wait)
            return None
        if self.applied.get(key) == observation:
            self._recheck_if_waiting_for_a_node(key, observation)
            return None  # nothing new since the last time
        run = Run.objects.unscoped().filter(pk=key.run_id).first()
        if run is None:
            self.namespaces[key.run_id] = None  # deleted meanwhile
            return None
        object_remains = objects.workload_object is not None
        if observation.state == ObservedState.SUCCEEDED:
            observation = self._with_outputs_kept(key, run, observation)
        applied = apply_observation(
            run_id=key.run_id,
            attempt_number=key.attempt,
            observation=observation,
            processes_remain=bool(objects.pods),
            object_remains=object_remains,
        )
        if applied.actions:
            logger.info(
                "run %s (%s) attempt %d: %s — %s",
                run.name,
                run.pk,
                key.attempt,
                ", ".join(applied.actions),
                observation.reason or observation.state,
            )
        if applied.ended_attempt is not None:
            self._revoke_token(key)
            self._keep_log(key)
        if applied.delete_object and objects.workload_object is not None:
            self._delete(objects.workload_object, run.name)
        if applied.retry:
            self.retry_at[key] = time.monotonic() + RETRY_SECONDS
            self.applied.pop(key, None)
        else:
            self.applied[key] = observation
            self._recheck_if_waiting_for_a_node(key, observation)
        return applied

    def _recheck_if_waiting_for_a_node(self, key: AttemptKey, observation: Observation) -> None:
        """Look again later (RECHECK_SECONDS), even when nothing changed this time: the
        scheduler may say nothing new for minutes while the wait itself becomes the reason."""
        if observation.state == ObservedState.ADMITTED and not observation.ran:
            self.retry_at.setdefault(key, time.monotonic() + RECHECK_SECONDS)

    def _created(self, key: AttemptKey) -> bool:
        """Whether the attempt's Job or RayJob was made: seen by this process, or its submit
        delivered long enough ago (:data:`ABSENCE_GRACE`) that the informers, which have all
        listed, would hold it if it still existed."""
        if key in self.cache.seen:
            return True
        return (
            Delivery.objects.unscoped()
            .filter(
                run_id=key.run_id,
                attempt__number=key.attempt,
                action=Delivery.Action.SUBMIT,
                delivered_at__lt=timezone.now() - ABSENCE_GRACE,
            )
            .exists()
        )

    def _with_outputs_kept(
        self, key: AttemptKey, run: Run, observation: Observation
    ) -> Observation:
        """A succeeded attempt's ``outputs.dataset`` / ``outputs.model``, read from its
        TAU_OUTPUT_DIR on the workspace's storage claim as the portal mounts it
        (``catalog.runs.cluster_outputs``), become versions before the success is recorded;
        one that cannot fails the attempt instead (the run promised it), saying which. Once
        per attempt: what was decided is kept for the observations that follow."""
        if key in self.outputs_verdicts:
            return self.outputs_verdicts[key] or observation
        verdict: Observation | None = None
        try:
            spec = spec_from_dict(run.spec)
            declared = spec.outputs.dataset is not None or spec.outputs.model is not None
            if (
                declared
                and not RunEvent.objects.unscoped()
                .filter(run_id=run.pk, kind=EventKind.OUTPUTS_KEPT)
                .exists()
            ):
                made = keep_outputs(run, spec, cluster_outputs(run, key.attempt))
                logger.info(
                    "run %s attempt %d: kept %s",
                    run.name,
                    key.attempt,
                    ", ".join(version.ref for version in made),
                )
        except OutputsNotKept as exc:
            verdict = dataclasses.replace(
                observation,
                state=ObservedState.FAILED,
                failure_class=FailureClass.USER_ERROR,
                reason=str(exc),
            )
        self.outputs_verdicts[key] = verdict
        return verdict or observation

    def _keep_log(self, key: AttemptKey) -> None:
        """The ended attempt's log, kept by the portal before Kubernetes deletes its pods; or,
        when no pod remains to read it from, why there is none (so that its evidence is
        sealed at once, saying so, instead of waiting for a log that cannot come)."""
        attempt = (
            RunAttempt.objects.unscoped()
            .select_related("run", "run__workspace")
            .filter(run_id=key.run_id, number=key.attempt)
            .first()
        )
        if attempt is None or attempt.log_path:
            return
        try:
            kept = KubernetesBackend().archive_log(attempt.run, attempt)
            if kept is not None:
                note_log_kept(attempt_id=attempt.pk, path=str(kept[0]), size=kept[1])
            else:
                note_log_missing(attempt_id=attempt.pk, why=no_pod_left(attempt))
        except (OSError, KubeError, DatabaseError) as exc:
            logger.warning(
                "could not keep the log of run %s attempt %d: %s", key.run_id, key.attempt, exc
            )

    def _revoke_token(self, key: AttemptKey) -> None:
        attempt = (
            RunAttempt.objects.unscoped().filter(run_id=key.run_id, number=key.attempt).first()
        )
        if attempt is None:
            return
        try:
            run_tokens.revoke_run_tokens(run_id=key.run_id, attempt=attempt)
        except DatabaseError:
            # The next sweep of a finished run does not retry this; the token expires.
            logger.warning("could not revoke the run token of run %s", key.run_id)

    def _delete(self, obj: Mapping[str, Any], run_name: str) -> None:
        meta = _meta(obj)
        logger.info(
            "deleting %s %s/%s of run %s: TauGrid ended that attempt",
            obj.get("kind"),
            meta.get("namespace"),
            meta.get("name"),
            run_name,
        )
        self.client.delete(
            str(obj.get("apiVersion")),
            str(obj.get("kind")),
            str(meta.get("name")),
            str(meta.get("namespace")),
            propagation="Background",
            missing_ok=True,
        )


# --- leader election ---------------------------------------------------------------------------


# --- the process ---------------------------------------------------------------------------------


def _sync_missing_workspaces(client: KubeClient) -> None:
    """Workspaces this cluster has no queues for (made while the portal ran the local backend,
    or before it was pointed here) are synced now, not at the next drift check. Asked of the
    cluster this watcher follows (``client``); whatever goes wrong is logged and left to the
    drift check: it must never stop the watcher."""
    try:
        kueue_sync.sync_missing(
            reason="the watcher started: not on this cluster yet", client=client
        )
    except Exception:
        logger.warning("workspaces not synced at start", exc_info=True)


def serve(
    *,
    client: KubeClient | None = None,
    identity: str | None = None,
    stop: threading.Event | None = None,
) -> None:
    """The long-running process: elect, watch, reconcile, until SIGTERM/SIGINT (or ``stop``)."""
    client = client or kube.client()
    stop = stop or threading.Event()
    election = LeaderElection(
        client,
        namespace=settings.TAU_KUBE_WATCHER_LEASE_NAMESPACE,
        lease_seconds=settings.TAU_KUBE_WATCHER_LEASE_SECONDS,
        name=LEADER_LEASE,
        namespace_labels={labels.MANAGED_BY: labels.MANAGED_BY_TAUGRID},
        identity=identity,
    )
    watcher = KubeWatcher(
        client,
        resync_seconds=settings.TAU_KUBE_WATCHER_RESYNC_SECONDS,
        acting=lambda: election.leading,
    )
    heartbeat = HeartbeatWriter(election.identity)

    def handle(signum: int, frame: FrameType | None) -> None:
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)
    elector = threading.Thread(target=election.run, args=(stop,), name="lease", daemon=True)
    elector.start()
    logger.info(
        "Kubernetes watcher %s started; one replica acts at a time (Lease %s/%s)",
        election.identity,
        election.namespace,
        election.name,
    )
    acting = False
    endpoints_due = 0.0
    try:
        while not stop.is_set():
            if not election.leading:
                if acting:
                    acting = False
                    logger.warning(
                        "not the active watcher any more: acting on nothing until it holds the "
                        "Lease again"
                    )
                if watcher.running and election.held_elsewhere:
                    # Another replica acts now. Until then the informers go on (the Lease
                    # could not be renewed, say while the API server did not answer): if it
                    # is renewed, the watcher acts at once on what it has read meanwhile,
                    # instead of listing everything again.
                    logger.warning("another replica holds the Lease: stopped watching")
                    watcher.stop()
                stop.wait(0.2)
                continue
            if not watcher.running:
                logger.info("the active watcher: listing and watching the cluster")
                watcher.start()
                _sync_missing_workspaces(watcher.client)
            elif not acting:
                logger.info("the active watcher again: reconciling every live run")
                watcher.sweep_soon()
            acting = True
            try:
                watcher.step(timeout=0.5)
                if time.monotonic() >= endpoints_due:
                    endpoints_due = time.monotonic() + ENDPOINT_FOLLOW_SECONDS
                    follow_endpoints(watcher.client)
                # How far behind it is, for /metrics (executors.kubernetes.heartbeat).
                backlog = watcher.messages.qsize() + len(watcher.dirty)
                heartbeat.beat(
                    listed=watcher.cache.ready(), backlog=backlog, unknown=len(watcher.unknown)
                )
            except DatabaseError:
                logger.warning("database error; trying again", exc_info=True)
                close_old_connections()
                stop.wait(RETRY_SECONDS)
    finally:
        stop.set()
        watcher.stop()
        elector.join(timeout=30)  # no renewal may follow the release
        election.release()
        logger.info("Kubernetes watcher %s stopped", election.identity)
