"""The runs app tells the workspace sync how many runs are live, so that archiving a
workspace keeps its Kueue queues until none is."""

from __future__ import annotations

from typing import Any

import pytest

from executors.kubernetes import kueue_cluster
from runs import state
from runs.models import RunState
from tests.runs.factories import make_run

pytestmark = pytest.mark.django_db


def test_live_runs_are_counted_for_the_workspace_sync(world: Any) -> None:
    assert kueue_cluster.live_runs(world.alpha) == 0
    waiting = state.transition(make_run(world), RunState.QUEUED)
    make_run(world)  # pending: handed over, not yet queued
    assert kueue_cluster.live_runs(world.alpha) == 2
    assert kueue_cluster.live_runs(world.beta) == 0
    state.transition(waiting, RunState.CANCELLED)
    assert kueue_cluster.live_runs(world.alpha) == 1


def test_where_a_cluster_placed_an_attempt_is_noted_once(world: Any) -> None:
    from runs import attempts
    from runs.models import RunAttempt

    run = make_run(world)
    attempt = RunAttempt.objects.for_workspace(world.alpha).get(run=run, number=1)
    assert attempts.note_admission(
        attempt_id=attempt.pk, cluster_queue="tau-alpha", flavors={"nvidia.com/gpu": "h100"}
    )
    assert not attempts.note_admission(
        attempt_id=attempt.pk, cluster_queue="tau-alpha", flavors={"nvidia.com/gpu": "h100"}
    )
    assert attempts.note_nodes(attempt_id=attempt.pk, node_names=["gpu-h100-1", "gpu-h100-0"])
    assert not attempts.note_nodes(attempt_id=attempt.pk, node_names=["gpu-h100-0"])
    assert attempts.note_nodes(attempt_id=attempt.pk, node_names=["gpu-h100-0", "cpu-0"])
    attempt.refresh_from_db()
    assert (attempt.cluster_queue, attempt.flavors, attempt.node_names) == (
        "tau-alpha",
        {"nvidia.com/gpu": "h100"},
        ["cpu-0", "gpu-h100-0", "gpu-h100-1"],
    )
