"""The runs app tells the workspace sync how many runs are live, so that archiving a
workspace keeps its Kueue queues until none is."""

from __future__ import annotations

from typing import Any

import pytest

from runs import state
from runs.models import RunState
from tests.runs.factories import make_run
from workspaces import kueue_cluster

pytestmark = pytest.mark.django_db


def test_live_runs_are_counted_for_the_workspace_sync(world: Any) -> None:
    assert kueue_cluster.live_runs(world.alpha) == 0
    waiting = state.transition(make_run(world), RunState.QUEUED)
    make_run(world)  # pending: handed over, not yet queued
    assert kueue_cluster.live_runs(world.alpha) == 2
    assert kueue_cluster.live_runs(world.beta) == 0
    state.transition(waiting, RunState.CANCELLED)
    assert kueue_cluster.live_runs(world.alpha) == 1
