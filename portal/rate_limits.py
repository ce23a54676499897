"""Counts in the shared cache, the one primitive every rate limit of the portal is built on:
failed token checks and password logins (``identity``), run reports and submissions
(``runs``).

Counts live in Django's cache (Redis when there is one, shared by every process), so a limit
holds across web workers. Incrementing is atomic in Redis; a count that expired between its
creation and its increment starts again.
"""

from __future__ import annotations

import logging
import math
import time

from django.core.cache import cache

logger = logging.getLogger(__name__)


def add_to_count(key: str, timeout: int, delta: int = 1) -> int:
    """Add ``delta`` to the count at ``key`` (created with ``timeout`` seconds to live); the
    new count. Taking back what was never counted (or has expired) leaves nothing below 0.
    Raises what the cache raises: callers decide what an unavailable cache means."""
    if delta > 0:
        cache.add(key, 0, timeout=timeout)
    try:
        return int(cache.incr(key, delta))
    except ValueError:  # gone: expired since add, or nothing left to take back
        if delta > 0:
            cache.set(key, delta, timeout=timeout)
        return max(delta, 0)


def clock() -> float:
    """Seconds since the epoch: which window an event falls in (tests hold it still)."""
    return time.time()


def window_wait(name: str, limit: int, window: int) -> int | None:
    """Count one event against ``limit`` per fixed ``window`` of seconds for ``name``; None
    when it is within the limit, else the seconds until the next window (for
    ``Retry-After``). An event refused still counts: hammering does not shorten the wait.

    When the cache is down the event is let through (with a warning): a limit on how often
    something may be done must not stop it being done at all."""
    now = clock()
    key = f"ratelimit:{name}:{int(now // window)}"
    try:
        count = add_to_count(key, window + 5)
    except Exception:
        logger.warning("rate-limit cache unavailable; not limiting %s", name, exc_info=True)
        return None
    if count <= limit:
        return None
    return max(1, math.ceil(window - now % window))
