"""The control plane's record (``state.json``) is replaced whole: deploy/cluster/ray_submitter.py
reads it while `up` is still recording nodes and ports, and once read it empty between a
truncate and a write ("no control plane recorded", a failed `up --ray` under load)."""

from __future__ import annotations

import threading
from pathlib import Path

from tests.cluster.plugin import load_controlplane


def test_a_reader_never_sees_the_record_half_written(tmp_path: Path) -> None:
    controlplane = load_controlplane()
    record = {"ports": {"apiserver": 6443}, "nodes": [f"node-{n}" for n in range(200)]}
    controlplane.write_state(tmp_path, record)
    stop = threading.Event()

    def keep_writing() -> None:
        count = 0
        while not stop.is_set():
            count += 1
            controlplane.write_state(tmp_path, {**record, "ready_at": str(count)})

    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        seen = [controlplane.load_state(tmp_path) for _ in range(3000)]
    finally:
        stop.set()
        writer.join()
    assert all(state is not None and state["nodes"] == record["nodes"] for state in seen)
    assert [path.name for path in tmp_path.iterdir()] == ["state.json"]  # no staging left
