"""A local run reading a dataset version registered in place (issue 33, catalog.in_place):
the agent stages its files from the workspace's folder of prefixes, each checked against the
manifest as it is copied into this machine's cache, never from the store (which holds
nothing of it); a file changed after registration fails the attempt as ``infrastructure``,
naming the version and the file, and the workspace's own files are never changed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from catalog import prefixes
from catalog.ingest import asset_named, set_alias
from runs.models import FailureClass, RunState
from tests.executors.local.agent_harness import (
    attempts,
    local_quota,
    spec,
    submit,
    wait_for_state,
)

pytestmark = pytest.mark.django_db(transaction=True)

READER = """\
import os
import pathlib

data = pathlib.Path(os.environ["TAU_DATA_DIR"]) / "corpus"
for path in sorted(data.rglob("*.txt")):
    print("read", path.relative_to(data), path.read_text().strip())
"""

USES = """\
inputs:
  datasets:
    - {name: wiki, version: train, path: corpus}
resilience: {max_retries: 0}
"""


def test_a_local_run_reads_a_version_in_place_and_a_file_changed_since_fails_it(
    world: Any, var_dir: Path, start_agent: Any
) -> None:
    local_quota(world.alpha)
    raw = var_dir / "prefixes" / "alpha" / "wiki" / "raw"  # TAU_DATA_PREFIX_DIR's default
    (raw / "part").mkdir(parents=True)
    (raw / "part" / "a.txt").write_text("The Quick Brown Fox\n")
    (raw / "b.txt").write_text("Jumps Over\n")
    version = prefixes.start(asset_named(world.alpha, "dataset", "wiki"), "wiki/raw")
    prefixes.read(version, "wiki/raw")
    version.refresh_from_db()
    assert (version.state, version.in_place, version.prefix) == ("ready", True, "wiki/raw")
    set_alias(version, "train")

    agent = start_agent()
    run = submit(world, spec("read-in-place", extra=USES), {"main.py": READER})
    wait_for_state(run, {RunState.SUCCEEDED, RunState.FAILED}, timeout=120, agent=agent)
    (attempt,) = attempts(run)
    log = Path(attempt.log_path).read_text()
    assert run.state == RunState.SUCCEEDED, (run.state_reason, log[-3000:])
    assert "read b.txt Jumps Over" in log
    assert "read part/a.txt The Quick Brown Fox" in log
    assert "[taugrid] staged wiki@1 at $TAU_DATA_DIR/corpus: 2 files, 31 bytes" in log
    storage = var_dir / "storage"
    assert not storage.exists() or not [p for p in storage.rglob("*") if p.is_file()]
    assert (raw / "b.txt").stat().st_mode & 0o200  # the workspace's file, as it was

    (raw / "part" / "a.txt").write_text("The Quick Brown Cat\n")  # the same size
    again = submit(world, spec("read-in-place", extra=USES), {"main.py": READER})
    wait_for_state(again, {RunState.SUCCEEDED, RunState.FAILED}, timeout=120, agent=agent)
    assert again.state == RunState.FAILED
    (failed,) = attempts(again)
    assert failed.failure_class == FailureClass.INFRASTRUCTURE
    assert "wiki@1: part/a.txt: changed since it was registered (SHA-256 " in (
        failed.failure_message
    )
    assert "The Quick Brown Cat" not in Path(failed.log_path).read_text()
