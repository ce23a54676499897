"""Leader election with a ``coordination.k8s.io/v1`` Lease: one replica of a process acts,
the others stand by and take over when the holder stops renewing (client-go's
leaderelection, with a faster take-over when the holder's last renewal is already old).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from kube.api import Body, KubeClient
from kube.errors import Conflict, KubeError, NotFound

logger = logging.getLogger(__name__)

COORDINATION: Final = "coordination.k8s.io/v1"
#: How far another replica's clock may be ahead of the holder's before it could take the Lease
#: while the holder still acts (:class:`LeaderElection`).
LEASE_SKEW_SECONDS: Final = 2.0


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _micro_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def default_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class LeaderElection:
    """Hold a Lease. :meth:`try_acquire_or_renew` is one round;
    :meth:`run` repeats it in a thread of its own; :attr:`leading` is read by the loop.

    When a standby may take the Lease: at once when nobody holds it (a holder that stopped
    gracefully gives it up, :meth:`release`); otherwise once it has lapsed, by either of two
    clocks, whichever says so first:

    * its own (client-go's rule): the Lease seen unchanged for a whole lease. Immune to clock
      skew, but a replica that first sees the Lease long after the holder died (it started
      late, or the API server was frozen) waits a whole lease more for nothing;
    * the holder's ``renewTime`` plus the lease plus :data:`LEASE_SKEW_SECONDS`, against this
      machine's wall clock: a Lease last renewed long ago is taken as soon as it is seen.
      The holder stops acting two thirds of a lease after its last renewal, so a clock ahead
      by up to a third of a lease plus the allowance still never lets two replicas act at once
      (and a moment of both acting changes nothing twice: every step is guarded by the
      database). A ``renewTime`` in the future (a clock far behind) is not believed.

    Every call has a short timeout (:attr:`retry_period`): an API server that stopped
    answering must not hold a round for the client's usual 30 s, or a holder would renew (and
    a standby take over) only long after the server came back. A standby's next round is due
    when the Lease lapses, not a retry period later."""

    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str,
        lease_seconds: int,
        name: str,
        namespace_labels: Mapping[str, str] | None = None,
        identity: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name
        self.namespace_labels = dict(namespace_labels or {})
        self.identity = identity or default_identity()
        self.lease_seconds = lease_seconds
        self.renew_deadline = lease_seconds * 2 / 3
        self.retry_period = max(0.5, lease_seconds / 5)
        self.timeout = (min(2.0, self.retry_period), self.retry_period)
        self.clock = clock
        self.wall_clock = wall_clock
        self._leading_until = 0.0
        self._observed: tuple[str, str, str] | None = None
        self._observed_at = 0.0
        self._was_leading = False
        #: Another replica held the Lease at the last round that could read it.
        self.held_elsewhere = False
        #: When (this object's clock) the Lease held by another lapses: the next round is due.
        self._lapses_at: float | None = None

    @property
    def leading(self) -> bool:
        return self.clock() < self._leading_until

    def try_acquire_or_renew(self) -> bool:
        now = self.clock()
        self._lapses_at = None
        try:
            lease = self.client.get(
                COORDINATION, "Lease", self.name, self.namespace, timeout=self.timeout
            )
        except NotFound:
            return self._create(now)
        except KubeError as error:
            logger.warning("cannot read the Lease %s/%s: %s", self.namespace, self.name, error)
            return False
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        version = str(_metadata(lease).get("resourceVersion") or "")
        record = (holder, str(spec.get("renewTime") or ""), version)
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(spec.get("leaseDurationSeconds") or self.lease_seconds)
        if holder and holder != self.identity:
            lapses_at = self._lapses(spec, duration, now)
            if now < lapses_at:
                self._leading_until = 0.0
                self.held_elsewhere = True
                self._lapses_at = lapses_at
                return False
        moment = _micro_time(self.wall_clock())
        ours = holder == self.identity
        # Not acting until now although the Lease names this replica: an earlier write of ours
        # landed but its answer was lost (a timeout under load), or this replica stopped
        # renewing in time. Either way it starts acting now, and says so like any take-over.
        resumed = ours and not self.leading
        body = {
            "apiVersion": COORDINATION,
            "kind": "Lease",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "resourceVersion": version,
            },
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.lease_seconds,
                "acquireTime": spec.get("acquireTime") if ours else moment,
                "renewTime": moment,
                "leaseTransitions": int(spec.get("leaseTransitions") or 0) + (0 if ours else 1),
            },
        }
        try:
            stored = self.client.update(body, timeout=self.timeout)
        except Conflict:
            return False  # someone else wrote it first: look again next round
        except KubeError as error:
            logger.warning("cannot renew the Lease %s/%s: %s", self.namespace, self.name, error)
            return False
        self._held(stored, now)
        if not ours or resumed:
            if resumed:
                why = "it named this replica already: an earlier write of ours went unanswered"
            elif holder:
                why = f"from {holder}, whose lease ran out"
            else:
                why = "it was free"
            logger.info("took the Lease %s/%s (%s)", self.namespace, self.name, why)
        return True

    def _lapses(self, spec: Mapping[str, Any], duration: float, now: float) -> float:
        """When (this object's clock) another holder's Lease lapses: a whole lease after this
        replica saw it change, or sooner by the holder's ``renewTime`` (class docstring)."""
        by_own_clock = self._observed_at + duration
        renewed = _parse_time(spec.get("renewTime"))
        if renewed is None:
            return by_own_clock
        age = (self.wall_clock() - renewed).total_seconds()
        if age < -LEASE_SKEW_SECONDS:
            return by_own_clock  # renewed in our future: that clock cannot be trusted
        return min(by_own_clock, now + duration + LEASE_SKEW_SECONDS - age)

    def next_round_in(self) -> float:
        """Seconds until the next round: a retry period, or less when the Lease another
        replica holds lapses sooner."""
        if self._lapses_at is None:
            return self.retry_period
        return min(self.retry_period, max(0.05, self._lapses_at - self.clock()))

    def _create(self, now: float) -> bool:
        moment = _micro_time(self.wall_clock())
        lease = {
            "apiVersion": COORDINATION,
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.lease_seconds,
                "acquireTime": moment,
                "renewTime": moment,
                "leaseTransitions": 0,
            },
        }
        try:
            try:
                stored = self.client.create(lease, timeout=self.timeout)
            except NotFound:
                # Its namespace is missing (a cluster where the portal does not run in a pod:
                # `make run` against the test cluster): made once, plain, for the Lease.
                self._create_namespace()
                stored = self.client.create(lease, timeout=self.timeout)
        except Conflict:
            return False
        except KubeError as error:
            logger.warning("cannot create the Lease %s/%s: %s", self.namespace, self.name, error)
            return False
        logger.info("created the Lease %s/%s", self.namespace, self.name)
        self._held(stored, now)
        return True

    def _create_namespace(self) -> None:
        try:
            self.client.create(
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {
                        "name": self.namespace,
                        "labels": self.namespace_labels,
                    },
                },
                timeout=self.timeout,
            )
        except Conflict:
            return
        logger.info("created the namespace %s for the Lease %s", self.namespace, self.name)

    def _held(self, stored: Body, now: float) -> None:
        spec = stored.get("spec") or {}
        self._observed = (
            self.identity,
            str(spec.get("renewTime") or ""),
            str(_metadata(stored).get("resourceVersion") or ""),
        )
        self._observed_at = now
        self._leading_until = now + self.renew_deadline
        self.held_elsewhere = False

    def release(self) -> None:
        """Give the Lease up (a graceful stop): a standby takes over at its next round."""
        if not self.leading:
            return
        self._leading_until = 0.0
        try:
            lease = self.client.get(
                COORDINATION, "Lease", self.name, self.namespace, timeout=self.timeout
            )
            spec = dict(lease.get("spec") or {})
            if spec.get("holderIdentity") != self.identity:
                return
            spec.pop("holderIdentity", None)
            spec["leaseDurationSeconds"] = 1
            spec["renewTime"] = _micro_time(self.wall_clock())
            self.client.update({**lease, "spec": spec}, timeout=self.timeout)
            logger.info("gave up the Lease %s/%s", self.namespace, self.name)
        except KubeError as error:
            logger.warning("could not give up the Lease (it lapses by itself): %s", error)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.try_acquire_or_renew()
            # Whether it acts, not whether this round's call was answered: one unanswered
            # renewal within the renew deadline loses nothing.
            leading = self.leading
            if leading != self._was_leading:
                self._was_leading = leading
                if not leading:
                    logger.warning("lost the Lease %s/%s", self.namespace, self.name)
            stop.wait(self.next_round_in())
