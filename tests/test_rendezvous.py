"""The rendezvous table every worker of a multi-worker run gets (``tau/rendezvous.py``), as the
local executor says it: :func:`tau.rendezvous.environment`. How a Kubernetes pod says it is
tested with the renderer (tests/executors/kubernetes/test_render.py)."""

from __future__ import annotations

import pytest

from tau import rendezvous


def test_the_table_names_each_variable_once_and_says_every_value() -> None:
    assert len(rendezvous.NAMES) == len(set(rendezvous.NAMES))
    assert {value for _name, value in rendezvous.RENDEZVOUS} == set(rendezvous.Value)
    assert rendezvous.NAMES == (
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "PET_NNODES",
        "PET_NODE_RANK",
        "PET_MASTER_ADDR",
        "PET_MASTER_PORT",
    )
    # torchrun's default, which every pod can listen on.
    assert rendezvous.DEFAULT_PORT == 29500


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_each_worker_gets_its_own_rank_and_the_same_rest(rank: int) -> None:
    environment = rendezvous.environment(
        workers=3, rank=rank, master_addr="127.0.0.1", master_port=41234
    )
    assert list(environment) == list(rendezvous.NAMES)
    assert environment == {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "41234",
        "WORLD_SIZE": "3",
        "RANK": str(rank),
        "LOCAL_RANK": "0",
        "PET_NNODES": "3",
        "PET_NODE_RANK": str(rank),
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": "41234",
    }


def test_names_the_spec_sets_itself_are_left_out() -> None:
    environment = rendezvous.environment(
        workers=2,
        rank=1,
        master_addr="127.0.0.1",
        master_port=41234,
        taken={"MASTER_PORT", "LOCAL_RANK", "NOT_IN_THE_TABLE"},
    )
    assert list(environment) == [
        "MASTER_ADDR",
        "WORLD_SIZE",
        "RANK",
        "PET_NNODES",
        "PET_NODE_RANK",
        "PET_MASTER_ADDR",
        "PET_MASTER_PORT",
    ]
    # Only the name itself: its torchrun twin keeps the table's value.
    assert environment["PET_MASTER_PORT"] == "41234"
    assert environment["RANK"] == environment["PET_NODE_RANK"] == "1"


def test_every_name_taken_leaves_nothing() -> None:
    assert (
        rendezvous.environment(
            workers=2, rank=0, master_addr="127.0.0.1", master_port=1, taken=rendezvous.NAMES
        )
        == {}
    )
