"""Fixtures for the browser tests of the portal's pages."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.executors.local.agent_harness import Agent, local_quota
from tests.runs.processes import Portal


@pytest.fixture
def machine(settings: Any, tmp_path: Path, world: Any, live_server: Any) -> Iterator[Agent]:
    """The live server, a Celery worker and the local agent share one var/ directory; runs
    report to the live server (the SDK's TAU_API_URL)."""
    var_dir = tmp_path / "var"
    var_dir.mkdir()
    settings.VAR_DIR = var_dir
    local_quota(world.alpha, cpu="4")
    agent = Agent(var_dir, {"TAU_API_URL": live_server.url}).start()
    worker = Portal(broker_url=settings.CELERY_BROKER_URL, var_dir=var_dir)
    worker.start(web=False, beat=True)
    try:
        yield agent
    finally:
        worker.stop()
        agent.stop()
