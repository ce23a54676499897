"""The Kubernetes watcher's heartbeat: when the active watcher last had the whole cluster
listed and had reconciled what it read, for the processes that cannot ask it (``/metrics``
in the web process says how far behind it is, ``web.portal_metrics``).

The watcher is a process of its own (``manage.py run_kube_watcher``), so its state must be
written somewhere every process reads. The Lease it holds is no measure: a thread of its own
renews it, and renews it as well while the main loop is stuck on a slow database, behind a
flood of changes, or waiting for a kind it cannot list. The main loop writes this instead,
into the cache every process shares (Redis in production, files under ``var/`` on one
machine), after each step it completed with every watched kind listed: a watcher that
stops, hangs, lost its Lease to nobody, or cannot list the cluster stops writing it, and the
heartbeat's age grows. It is written with no expiry, so an old heartbeat stays readable as
old rather than vanishing, and at most once every :data:`WRITE_EVERY_SECONDS`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.core.cache import cache

logger = logging.getLogger(__name__)

#: Where the heartbeat is kept in the shared cache.
HEARTBEAT_KEY = "runs:kube-watcher-heartbeat"
#: The most often it is written: a step ends every half second when nothing happens.
WRITE_EVERY_SECONDS = 2.0


@dataclass(frozen=True)
class Heartbeat:
    """One heartbeat: when (Unix time), which replica, how many changes it had read from
    the cluster and not yet taken in (``backlog``) when it wrote it, and how many attempts'
    objects it found in the cluster that the database does not know (``unknown``: after a
    database restore; ``executors.kubernetes.watcher.KubeWatcher.report_unknown``)."""

    at: float
    identity: str
    backlog: int
    unknown: int = 0


class HeartbeatWriter:
    """The active watcher's side: :meth:`beat` after every step."""

    def __init__(
        self,
        identity: str,
        *,
        every: float = WRITE_EVERY_SECONDS,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.identity = identity
        self.every = every
        self.clock = clock
        self.monotonic = monotonic
        self._written_at: float | None = None
        self._failing = False

    def beat(self, *, listed: bool, backlog: int, unknown: int = 0) -> bool:
        """Write the heartbeat if the watcher has every kind listed (``listed``) and the last
        one is old enough. True if it was written. The cache being down is logged once per
        outage and never stops the watcher."""
        if not listed:
            return False
        now = self.monotonic()
        if self._written_at is not None and now - self._written_at < self.every:
            return False
        value = {
            "at": self.clock(),
            "identity": self.identity,
            "backlog": int(backlog),
            "unknown": int(unknown),
        }
        try:
            cache.set(HEARTBEAT_KEY, value, timeout=None)
        except Exception as error:  # a heartbeat is not worth stopping the watcher for
            if not self._failing:
                logger.warning("cannot write the watcher's heartbeat to the cache: %s", error)
            self._failing = True
            return False
        if self._failing:
            logger.info("the watcher's heartbeat is written to the cache again")
        self._failing = False
        self._written_at = now
        return True


class HeartbeatUnreadable(RuntimeError):
    """The shared cache did not answer: whether the watcher is behind is not known."""


def last_heartbeat() -> Heartbeat | None:
    """The newest heartbeat, or None if no watcher ever wrote one (or the cache was emptied
    since). Raises :class:`HeartbeatUnreadable` when the cache cannot be read."""
    try:
        value = cache.get(HEARTBEAT_KEY)
    except Exception as error:
        raise HeartbeatUnreadable(f"the cache did not answer: {error}") from error
    if not isinstance(value, dict):
        return None
    try:
        return Heartbeat(
            at=float(value["at"]),
            identity=str(value["identity"]),
            backlog=int(value["backlog"]),
            unknown=int(value.get("unknown", 0)),
        )
    except (KeyError, TypeError, ValueError):
        logger.warning("the watcher's heartbeat in the cache is malformed: %r", value)
        return None
