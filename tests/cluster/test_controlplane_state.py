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


def test_only_what_names_the_state_folder_is_the_control_planes() -> None:
    """A local run's sandbox names ``~/.cache/taugrid/run-venvs/…`` (its environment): not the
    control plane's ``~/.cache/taugrid/run``, which `down` stops everything naming."""
    controlplane = load_controlplane()
    state = Path("/root/.cache/taugrid/run")
    assert controlplane.names_folder(
        "kine --endpoint=sqlite:///root/.cache/taugrid/run/kine.db", state
    )
    assert controlplane.names_folder("ray start --temp-dir /root/.cache/taugrid/run", state)
    assert controlplane.names_folder("x --dir=/root/.cache/taugrid/run:y", state)
    assert not controlplane.names_folder(
        "bwrap --ro-bind /root/.cache/taugrid/run-venvs/0c15 /root/.cache/taugrid/run-venvs/0c15",
        state,
    )
    assert not controlplane.names_folder("x /root/.cache/taugrid/run.old/y", state)
