"""The Kubernetes watcher's heartbeat (executors/kubernetes/heartbeat.py): written only with the
cluster listed, at most every WRITE_EVERY_SECONDS, never stopping the watcher when the cache is
down, read back as written; and, on the test cluster, the real ``serve`` loop writing it while it
leads and no more once it stopped, as /metrics shows.

The shared cache is the suite's real Redis; a cache that does not answer is a Redis address
nothing listens on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import cache
from django.db import connection
from django.test import Client, override_settings
from prometheus_client.parser import text_string_to_metric_families

import kube as adapter
from executors.kubernetes.heartbeat import (
    HEARTBEAT_KEY,
    WRITE_EVERY_SECONDS,
    Heartbeat,
    HeartbeatUnreadable,
    HeartbeatWriter,
    last_heartbeat,
)
from executors.kubernetes.watcher import serve
from tests.cluster.plugin import Kube, KubeCluster, wait_until
from tests.runs.processes import free_port


@pytest.fixture(autouse=True)
def no_heartbeat() -> Iterator[None]:
    cache.delete(HEARTBEAT_KEY)
    yield
    cache.delete(HEARTBEAT_KEY)


class Clocks:
    def __init__(self) -> None:
        self.wall = 1_700_000_000.0
        self.monotonic = 100.0

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.monotonic += seconds


def writer(clocks: Clocks) -> HeartbeatWriter:
    return HeartbeatWriter(
        "watcher-a", clock=lambda: clocks.wall, monotonic=lambda: clocks.monotonic
    )


def test_it_is_written_with_the_cluster_listed_and_at_most_every_few_seconds() -> None:
    clocks = Clocks()
    heartbeat = writer(clocks)
    assert not heartbeat.beat(listed=False, backlog=0)  # still listing: not following yet
    assert last_heartbeat() is None
    assert heartbeat.beat(listed=True, backlog=3)
    assert last_heartbeat() == Heartbeat(at=1_700_000_000.0, identity="watcher-a", backlog=3)
    clocks.advance(WRITE_EVERY_SECONDS / 2)
    assert not heartbeat.beat(listed=True, backlog=9)
    assert last_heartbeat() == Heartbeat(at=1_700_000_000.0, identity="watcher-a", backlog=3)
    clocks.advance(WRITE_EVERY_SECONDS / 2)
    assert heartbeat.beat(listed=True, backlog=0)
    assert last_heartbeat() == Heartbeat(
        at=1_700_000_000.0 + WRITE_EVERY_SECONDS, identity="watcher-a", backlog=0
    )
    # No expiry: a watcher that stopped long ago is still readable, as old (-1: Redis keeps
    # the key for good).
    key = cache.make_and_validate_key(HEARTBEAT_KEY)
    redis = cache._cache.get_client(key)  # type: ignore[attr-defined]
    assert redis.ttl(key) == -1


def test_a_malformed_heartbeat_reads_as_none() -> None:
    cache.set(HEARTBEAT_KEY, {"at": "yesterday", "identity": "x", "backlog": 0})
    assert last_heartbeat() is None
    cache.set(HEARTBEAT_KEY, "not a heartbeat")
    assert last_heartbeat() is None


def down_cache() -> dict[str, Any]:
    return {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{free_port()}/0",
            "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
        }
    }


def test_a_cache_that_does_not_answer_never_stops_the_watcher(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clocks = Clocks()
    heartbeat = writer(clocks)
    with override_settings(CACHES=down_cache()), caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert not heartbeat.beat(listed=True, backlog=0)
            clocks.advance(WRITE_EVERY_SECONDS)
        with pytest.raises(HeartbeatUnreadable):
            last_heartbeat()
    warnings = [r for r in caplog.records if "cannot write the watcher's heartbeat" in r.message]
    assert len(warnings) == 1, "one warning per outage, not one per step"
    # Back: written at once, and said so.
    with caplog.at_level(logging.INFO):
        assert heartbeat.beat(listed=True, backlog=1)
    assert "written to the cache again" in caplog.text
    assert last_heartbeat() is not None


def newer_than(moment: float) -> Heartbeat | None:
    """The heartbeat, once one newer than ``moment`` was written (for ``wait_until``)."""
    beat = last_heartbeat()
    return beat if beat is not None and beat.at > moment else None


@pytest.mark.cluster
@pytest.mark.django_db(transaction=True)
def test_the_active_watcher_beats_while_it_follows_the_cluster_and_stops_when_it_stops(
    kube_cluster: KubeCluster, kube: Kube, settings: Any
) -> None:
    settings.TAU_BACKEND = "kubernetes"
    settings.TAU_KUBE_WATCHER_LEASE_NAMESPACE = kube.namespace("heartbeat")
    settings.TAU_KUBE_WATCHER_LEASE_SECONDS = 3
    client = adapter.KubeClient(adapter.new_api_client(kube_cluster.kubeconfig))
    stop = threading.Event()

    def watch() -> None:
        try:
            serve(client=client, identity="heartbeat-test", stop=stop)
        finally:
            connection.close()

    thread = threading.Thread(target=watch, name="watcher", daemon=True)
    thread.start()
    try:
        first = wait_until("the watcher's first heartbeat", lambda: newer_than(0.0), 60)
        assert first.identity == "heartbeat-test"
        assert abs(first.at - time.time()) < 10
        wait_until("a second heartbeat", lambda: newer_than(first.at), WRITE_EVERY_SECONDS * 5)
        response = Client(HTTP_AUTHORIZATION=f"Bearer {settings.TAU_METRICS_TOKEN}").get("/metrics")
        assert response.status_code == 200
        samples = {
            sample.name: sample.value
            for family in text_string_to_metric_families(response.content.decode())
            for sample in family.samples
        }
        lag = time.time() - samples["taugrid_kube_watcher_heartbeat_timestamp_seconds"]
        assert 0 <= lag < WRITE_EVERY_SECONDS + 5
        assert samples["taugrid_kube_watcher_backlog"] >= 0
    finally:
        stop.set()
        thread.join(timeout=60)
        client.close()
    assert not thread.is_alive()
    stopped = last_heartbeat()
    time.sleep(WRITE_EVERY_SECONDS + 1)
    assert last_heartbeat() == stopped, "a stopped watcher writes no more: its lag grows"
