"""Typed readers for settings that come from the environment.

Every setting TauGrid reads from the environment goes through these helpers, so that
a wrong value fails at start-up with a message naming the variable, and so that secrets
can be given either inline (``NAME``) or as a path to a file (``NAME_FILE``, the way
container orchestrators mount secrets).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit


class ImproperlyConfiguredEnv(Exception):
    """A variable is missing or malformed; the message says which and what to do."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return default if value is None else value


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfiguredEnv(f"{name} must be true or false, got {raw!r}")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfiguredEnv(f"{name} must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfiguredEnv(f"{name} must be at least {minimum}, got {value}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_secret(name: str) -> str | None:
    """Read ``NAME`` or, when ``NAME_FILE`` is set, the first line of that file.

    Setting both is an error: it is never clear which one the operator meant.
    """
    inline = os.environ.get(name)
    file_name = os.environ.get(f"{name}_FILE")
    if inline and file_name:
        raise ImproperlyConfiguredEnv(f"set either {name} or {name}_FILE, not both")
    if file_name:
        try:
            content = Path(file_name).read_text(encoding="utf-8")
        except OSError as exc:
            raise ImproperlyConfiguredEnv(
                f"{name}_FILE points at {file_name!r}, which cannot be read: {exc.strerror}"
            ) from None
        value = content.strip()
        if not value:
            raise ImproperlyConfiguredEnv(f"{name}_FILE points at an empty file: {file_name!r}")
        return value
    return inline or None


@dataclass(frozen=True)
class DatabaseConfig:
    """What Django needs to open a database, parsed from a ``DATABASE_URL``."""

    settings: dict[str, object]
    vendor: str


def parse_database_url(url: str, *, conn_max_age: int = 0, pool_size: int = 0) -> DatabaseConfig:
    """Turn ``postgres://user:pass@host:5432/name?sslmode=require`` or
    ``sqlite:///absolute/path.sqlite3`` into a Django ``DATABASES`` entry.

    ``pool_size`` > 0 (PostgreSQL only): a pool of up to that many connections per process
    (psycopg's, as Django 5.1+ runs it) instead of one connection kept ``conn_max_age``
    seconds. For a server that answers each request in a thread of its own (``make run``'s
    uvicorn, ``web.http_server``): a kept connection is its thread's, so each new thread
    opened one more (seventeen after 300 requests, measured), and without keeping them every
    request paid for a new one (a backend and SCRAM: 10-20 ms of a 25 ms API answer)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in {"postgres", "postgresql", "pgsql"}:
        name = unquote(parts.path.lstrip("/"))
        if not name:
            raise ImproperlyConfiguredEnv("DATABASE_URL must name a database, e.g. .../taugrid")
        options: dict[str, object] = dict(parse_qsl(parts.query))
        if pool_size > 0:
            options["pool"] = {"min_size": 1, "max_size": pool_size, "timeout": 30}
            conn_max_age = 0  # Django refuses both: the pool keeps the connections
        return DatabaseConfig(
            vendor="postgresql",
            settings={
                "ENGINE": "django.db.backends.postgresql",
                "NAME": name,
                "USER": unquote(parts.username or ""),
                "PASSWORD": unquote(parts.password or ""),
                "HOST": unquote(parts.hostname or ""),
                "PORT": str(parts.port or ""),
                "CONN_MAX_AGE": conn_max_age,
                "CONN_HEALTH_CHECKS": conn_max_age > 0,
                "OPTIONS": options,
            },
        )
    if scheme == "sqlite":
        # As SQLAlchemy spells it: sqlite:///relative/path or sqlite:////absolute/path.
        if parts.netloc:
            raise ImproperlyConfiguredEnv("sqlite URLs look like sqlite:////absolute/path.sqlite3")
        path = unquote(parts.path)[1:]
        if not path:
            raise ImproperlyConfiguredEnv("DATABASE_URL sqlite:// needs a file path")
        return DatabaseConfig(
            vendor="sqlite",
            settings={
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": path,
                "OPTIONS": {
                    "timeout": 20,
                    "transaction_mode": "IMMEDIATE",
                    # WAL lets the web server, worker and agent read while one of them writes.
                    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                },
            },
        )
    raise ImproperlyConfiguredEnv(
        f"DATABASE_URL scheme {scheme!r} is not supported; use postgres:// or sqlite:///"
    )
