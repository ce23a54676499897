"""Fixtures of the local executor's tests that run a real agent (``test_agent*.py`` here), and
``var_dir`` for any test that stores code bundles (tests/runs/test_submission_checks.py): a
plugin of tests/conftest.py, so that both see the one definition."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runs import delivery
from tests.executors.local.agent_harness import Agent


@pytest.fixture
def var_dir(tmp_path: Path, settings: Any) -> Path:
    """The agent's TAU_VAR_DIR, and this process's too (code bundles are stored there)."""
    directory = tmp_path / "var"
    directory.mkdir()
    settings.VAR_DIR = directory
    return directory


@pytest.fixture
def agents(var_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Agent]]:
    """Agents started by a test; every one is stopped before the database is emptied."""
    # Deliveries are made by the test itself (delivery.deliver), not by a Celery worker.
    monkeypatch.setattr(delivery, "publish", lambda delivery_id: None)
    started: list[Agent] = []
    yield started
    for agent in started:
        if agent.process is not None and agent.process.poll() is None:
            agent.stop()


@pytest.fixture
def start_agent(agents: list[Agent], var_dir: Path) -> Any:
    def start(**extra_env: str) -> Agent:
        agent = Agent(var_dir, extra_env).start()
        agents.append(agent)
        return agent

    return start
