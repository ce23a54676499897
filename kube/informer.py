"""Informers: list, then watch, one kind of object, forever, in a thread of their own, and
hand everything read to a sink (client-go's informer, without its cache: the caller keeps
what it needs).

Each watch resumes from the last ``resourceVersion`` it saw (bookmarks keep it fresh); a
``410 Gone`` means list again; a connection lost or an API server that does not answer
(restarting) means wait (doubling, up to :data:`MAX_BACKOFF_SECONDS`) and list again; every
``resync_seconds`` the watch is replaced by a full list anyway. A kind that cannot be watched
(its CRD is not installed, or an ``optional`` kind RBAC refuses) is reported as an empty list
and tried again after :data:`UNAVAILABLE_RETRY_SECONDS`. Informers touch no database.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from kube.api import Body, KubeClient, Watch
from kube.errors import Forbidden, Gone, KubeError, Unauthorized, UnknownKind

logger = logging.getLogger(__name__)

#: The longest wait between two tries of a list or watch that failed.
MAX_BACKOFF_SECONDS: Final = 10.0
#: How long a watch runs before it is replaced (the server ends it; a resync may come first).
WATCH_SECONDS: Final = 300
#: How long a kind that cannot be watched (a CRD not installed, an optional kind RBAC
#: refuses) waits before it is tried again.
UNAVAILABLE_RETRY_SECONDS: Final = 60.0


@dataclass(frozen=True)
class WatchedKind:
    api_version: str
    kind: str
    label_selector: str | None = None
    field_selector: str | None = None
    #: The watcher works without it (an installation whose RBAC predates it): a refusal
    #: (403) counts as "none of them", logged, and is tried again later.
    optional: bool = False


@dataclass(frozen=True)
class Listed:
    """A full list of one kind: the cache replaces what it held of that kind."""

    generation: int
    kind: str
    items: list[Body]


@dataclass(frozen=True)
class Changed:
    generation: int
    kind: str
    type: str  # ADDED, MODIFIED, DELETED
    object: Body


Message = Listed | Changed


class Informer:
    """List, then watch, one kind, forever (until ``stop``). Runs in a thread of its own;
    everything it reads goes to ``sink`` (module docstring)."""

    def __init__(
        self,
        client: KubeClient,
        watched: WatchedKind,
        sink: Callable[[Message], None],
        *,
        generation: int,
        stop: threading.Event,
        resync_seconds: float,
        watch_seconds: int = WATCH_SECONDS,
    ) -> None:
        self.client = client
        self.watched = watched
        self.sink = sink
        self.generation = generation
        self.stop = stop
        self.resync_seconds = resync_seconds
        self.watch_seconds = watch_seconds
        self.lists = 0  # how many full lists it made
        self.watches = 0  # how many watches it started (a clean end resumes from the version)
        self._watch: Watch | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self.run, name=f"informer-{self.watched.kind}", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """End the current watch at once (``stop`` must be set first)."""
        current = self._watch
        if current is not None:
            current.close()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        backoff = 0.0
        kind = self.watched.kind
        while not self.stop.is_set():
            if backoff:
                self.stop.wait(backoff)
                if self.stop.is_set():
                    return
            try:
                version = self._list()
                backoff = 0.0
                self._watch_until_resync(version)
            except Gone as error:
                logger.info("the watch of %s expired (%s); listing again", kind, error)
            except KubeError as error:
                if self._unavailable(error):
                    # RayJob without KubeRay: nothing of that kind can exist; Nodes the
                    # watcher may not read: as if there were none. Look again later.
                    logger.warning("%s cannot be watched: %s", kind, error)
                    self.sink(Listed(self.generation, kind, []))
                    backoff = UNAVAILABLE_RETRY_SECONDS
                    continue
                backoff = min(MAX_BACKOFF_SECONDS, max(0.5, backoff * 2))
                logger.warning(
                    "watching %s failed (%s); listing again in %.1f s", kind, error, backoff
                )
            except Exception:
                backoff = MAX_BACKOFF_SECONDS
                logger.exception("the %s informer failed; listing again in %.0f s", kind, backoff)

    def _unavailable(self, error: KubeError) -> bool:
        if isinstance(error, UnknownKind):
            return True
        refused = isinstance(error, Forbidden) and not isinstance(error, Unauthorized)
        return refused and self.watched.optional

    def _list(self) -> str:
        watched = self.watched
        listing = self.client.list_with_version(
            watched.api_version,
            watched.kind,
            label_selector=watched.label_selector,
            field_selector=watched.field_selector,
        )
        self.lists += 1
        self.sink(Listed(self.generation, watched.kind, listing.items))
        return listing.resource_version

    def _watch_until_resync(self, version: str) -> None:
        watched = self.watched
        resync_at = time.monotonic() + self.resync_seconds
        while not self.stop.is_set():
            left = resync_at - time.monotonic()
            if left <= 0:
                return  # a full list: the periodic resync
            self.watches += 1
            self._watch = self.client.watch(
                watched.api_version,
                watched.kind,
                resource_version=version,
                label_selector=watched.label_selector,
                field_selector=watched.field_selector,
                timeout_seconds=max(1, min(self.watch_seconds, int(left) + 1)),
            )
            try:
                for event in self._watch:
                    if self.stop.is_set():
                        return
                    version = event.resource_version or version
                    if event.type == "BOOKMARK":
                        continue
                    self.sink(Changed(self.generation, watched.kind, event.type, event.object))
            finally:
                self._watch.close()
                self._watch = None
