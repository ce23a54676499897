"""``make run``'s web server and the database: it answers each request in a thread of its
own (``web.http_server``), so it holds a pool of connections (``TAU_DB_POOL_SIZE``, set by
``runportal.web_environment``) instead of opening one for each request or keeping one per
thread (``portal.env.parse_database_url``)."""

from __future__ import annotations

import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.db import connection

from tests.runs.processes import portal_processes
from web.management.commands.runportal import WEB_POOL_SIZE

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

#: Requests that read the database (``/readyz`` asks it), some at once.
REQUESTS = 120


def sessions_opened() -> int:
    """Connections ever opened to this test database (PostgreSQL counts them)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        (count,) = cursor.fetchone()
    return int(count)


def ready(base: str) -> int:
    with urllib.request.urlopen(f"{base}/readyz", timeout=30) as response:
        return int(response.status)


def test_the_web_server_answers_from_a_pool_of_connections(tmp_path: Path) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("a pool is PostgreSQL's (make test runs the suite on it)")
    for portal in portal_processes(tmp_path, "filesystem://"):
        portal.start(worker=False, beat=False)
        before = sessions_opened()

        with ThreadPoolExecutor(max_workers=8) as pool:
            assert set(pool.map(ready, [portal.url] * REQUESTS)) == {200}
        time.sleep(2)  # a backend that has ended is counted once its exit is reported
        opened = sessions_opened() - before
        # One per request without the pool (and one per thread with kept connections).
        assert opened <= int(WEB_POOL_SIZE), portal.log("web")[-2000:]
