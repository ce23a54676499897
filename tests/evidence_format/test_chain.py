"""The event chain: the same hash the portal has always stored, and every kind of break named."""

from __future__ import annotations

import hashlib
import json

from tau.evidence.chain import CONTENT_FIELDS, GENESIS_HASH, check_chain, event_hash, event_line
from tests.evidence_format.record import sample_parts


def test_the_hash_is_sha256_of_prev_hash_newline_and_sorted_compact_json() -> None:
    content = {"seq": 1, "run": 7, "data": {"b": 1.0, "a": "é"}, "message": ""}
    # Written out by hand, not through json.dumps, so a change of serialisation fails here.
    expected_text = '{"data":{"a":"\\u00e9","b":1.0},"message":"","run":7,"seq":1}'
    expected = hashlib.sha256(f"{GENESIS_HASH}\n{expected_text}".encode()).hexdigest()
    assert event_hash(GENESIS_HASH, content) == expected


def test_a_whole_chain_has_no_problems_and_lines_keep_their_numbers() -> None:
    events = sample_parts().events
    assert check_chain(events) == []
    # A float that happens to be whole stays a float through events.jsonl, so its hash holds.
    read_back = [json.loads(event_line(event)) for event in events]
    assert read_back[2]["data"]["loss"] == 1.0
    assert isinstance(read_back[2]["data"]["loss"], float)
    assert check_chain(read_back) == []
    assert set(CONTENT_FIELDS) | {"prev_hash", "hash"} == set(read_back[0])


def test_breaks_are_named_by_seq() -> None:
    events = sample_parts().events
    assert check_chain(events[1:])[:2] == [
        "event seq 2: expected seq 1 at line 1",
        "event seq 2: prev_hash is not the hash of the event before it",
    ]
    edited = [dict(event) for event in events]
    edited[4]["new_state"] = "failed"
    assert check_chain(edited) == ["event seq 5: hash does not match its content"]
    incomplete = [dict(event) for event in events]
    del incomplete[0]["data"]
    assert check_chain(incomplete)[0] == "event #1: missing data"
