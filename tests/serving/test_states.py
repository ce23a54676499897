"""The endpoint state machine: the transition table is enforced (every pair tried), every
change is an event, and the events form a hash chain that finds any tampering."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest

from serving.events import verify_event_chain
from serving.models import TRANSITIONS, Endpoint, EndpointEvent, EndpointState
from serving.state import IllegalTransition, transition
from tau.evidence.chain import GENESIS_HASH
from tests.serving.factories import make_endpoint

pytestmark = pytest.mark.django_db

PAIRS = [(old, new) for old in EndpointState for new in EndpointState]


def events_of(endpoint: Endpoint) -> list[EndpointEvent]:
    return list(
        EndpointEvent.objects.for_workspace(endpoint.workspace_id)
        .filter(endpoint=endpoint)
        .order_by("seq")
    )


def test_the_states_are_the_contract() -> None:
    assert [state.value for state in EndpointState] == [
        "deploying",
        "ready",
        "updating",
        "unhealthy",
        "stopped",
        "failed",
    ]
    assert set(TRANSITIONS) == set(EndpointState)


@pytest.mark.parametrize(("old", "new"), PAIRS, ids=[f"{o}->{n}" for o, n in PAIRS])
def test_transition_table(world: Any, old: EndpointState, new: EndpointState) -> None:
    endpoint = make_endpoint(world, state=old)
    before = len(events_of(endpoint))
    if new in TRANSITIONS[old]:
        moved = transition(endpoint, new, reason="test")
        assert moved.state == new
        assert moved.state_reason == "test"
        events = events_of(endpoint)
        assert len(events) == before + 1
        assert (events[-1].old_state, events[-1].new_state) == (old, new)
    else:
        with pytest.raises(IllegalTransition):
            transition(endpoint, new, reason="test")
        endpoint.refresh_from_db()
        assert endpoint.state == old
        assert len(events_of(endpoint)) == before


def test_no_state_follows_itself() -> None:
    """Staying in a state is no transition: an observation that repeats it writes no event."""
    assert all(state not in TRANSITIONS[state] for state in EndpointState)


def test_a_life_leaves_a_verifiable_chain(world: Any) -> None:
    endpoint = make_endpoint(world)
    for state in (
        EndpointState.READY,
        EndpointState.UNHEALTHY,
        EndpointState.READY,
        EndpointState.STOPPED,
    ):
        endpoint = transition(endpoint, state, reason=f"to {state}")
    events = events_of(endpoint)
    assert [event.seq for event in events] == [1, 2, 3, 4, 5]
    assert events[0].kind == "deployed"
    assert events[0].prev_hash == GENESIS_HASH
    assert all(later.prev_hash == earlier.hash for earlier, later in pairwise(events))
    assert verify_event_chain(endpoint)


@pytest.mark.parametrize("field", ["message", "new_state", "data", "kind"])
def test_tampering_breaks_the_chain(world: Any, field: str) -> None:
    endpoint = make_endpoint(world)
    endpoint = transition(endpoint, EndpointState.READY, reason="ready")
    transition(endpoint, EndpointState.STOPPED, reason="stopped")
    value = {
        "message": "nothing to see",
        "new_state": "failed",
        "data": {"forged": True},
        "kind": "updated",
    }[field]
    EndpointEvent.objects.for_workspace(world.alpha).filter(endpoint=endpoint, seq=2).update(
        **{field: value}
    )
    assert not verify_event_chain(endpoint)


def test_a_deleted_event_breaks_the_chain(world: Any) -> None:
    endpoint = make_endpoint(world)
    endpoint = transition(endpoint, EndpointState.READY, reason="ready")
    transition(endpoint, EndpointState.STOPPED, reason="stopped")
    EndpointEvent.objects.for_workspace(world.alpha).filter(endpoint=endpoint, seq=2).delete()
    assert not verify_event_chain(endpoint)


def test_each_endpoint_has_a_chain_of_its_own(world: Any) -> None:
    """Two endpoints' first events are not the same event: the content names its endpoint."""
    first = make_endpoint(world, name="one")
    second = make_endpoint(world, name="two")
    assert events_of(first)[0].hash != events_of(second)[0].hash
    assert verify_event_chain(first)
    assert verify_event_chain(second)
