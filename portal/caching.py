"""Answers computed at most once per period for every process, in Django's cache: what a
page or the API asks of a slow source (Prometheus, say) is asked once for everyone, and each
viewer after that reads the answer as it was."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TypeVar

from django.core.cache import cache

T = TypeVar("T")


def hashed_key(prefix: str, *parts: object) -> str:
    """``prefix:`` and a digest of ``parts``: one key per configuration and subject (another
    server or other names, another key), of a length every cache takes."""
    scope = "|".join(str(part) for part in parts)
    return f"{prefix}:" + hashlib.sha256(scope.encode()).hexdigest()[:40]


def through_cache(key: str, kind: type[T], compute: Callable[[], T], *, seconds: int) -> T:
    """The ``kind`` answer kept under ``key``, else ``compute()``'s, kept ``seconds`` (never
    kept where ``seconds`` is 0). Anything else under the key (an older shape of the answer,
    left by a process of an earlier release) counts as nothing."""
    found = cache.get(key)
    if isinstance(found, kind):
        return found
    answer = compute()
    if seconds > 0:
        cache.set(key, answer, timeout=seconds)
    return answer
