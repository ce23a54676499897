"""Runs that read datasets and write datasets and models on the local executor (issue 33): the
versions pinned at submission are staged read-only under TAU_DATA_DIR, the output folders
become versions with their lineage, and the run's history (sealed in its evidence) names the
digests both ways. A missing dataset refuses the submission; a corrupted stored file fails the
attempt naming it; a promised output that is not written fails the run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from catalog import storage
from catalog.ingest import asset_named, ingest_folder, set_alias
from catalog.models import AssetVersion, RunInput
from runs.events import verify_event_chain
from runs.models import EventKind, FailureClass, MetricPoint, RunEvent, RunState
from runs.submission import SubmissionRefused
from tests.evidence.helpers import manifest_of, seal_all
from tests.executors.local.agent_harness import (
    attempts,
    local_quota,
    spec,
    submit,
    wait_for_state,
)
from tests.runs.factories import zip_directory

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
API = "/api/v1/workspaces/alpha"

READER = """\
import os
import pathlib

data = pathlib.Path(os.environ["TAU_DATA_DIR"]) / "corpus"
out = pathlib.Path(os.environ["TAU_OUTPUT_DIR"])
texts = [path.read_text() for path in sorted(data.rglob("*.txt"))]
print("read", len(texts), "files from", data)
try:
    (data / "new.txt").write_text("x")
    print("the data could be written")
except OSError as exc:
    print("the data is read-only:", type(exc).__name__)
clean = out / "clean"
clean.mkdir()
(clean / "all.txt").write_text("".join(text.lower() for text in texts))
if os.environ.get("MAKE_MODEL", "1") == "1":
    model = out / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(bytes(range(16)))
"""

USES = """\
inputs:
  datasets:
    - {name: wiki, version: train, path: corpus}
outputs:
  dataset: {name: wiki-clean, path: clean}
  model: {name: tiny, path: model}
"""


def raw_wiki(world: Any, tmp_path: Path) -> AssetVersion:
    folder = tmp_path / "raw"
    (folder / "part").mkdir(parents=True)
    (folder / "part" / "a.txt").write_text("The Quick Brown Fox\n")
    (folder / "b.txt").write_text("Jumps Over\n")
    version = ingest_folder(asset_named(world.alpha, "dataset", "wiki"), folder, source="upload")
    set_alias(version, "train")
    return version


def test_a_run_reads_its_pinned_dataset_and_its_outputs_become_versions_with_lineage(
    world: Any, var_dir: Path, tmp_path: Path, start_agent: Any
) -> None:
    local_quota(world.alpha)
    raw = raw_wiki(world, tmp_path)
    run = submit(world, spec("clean-wiki", extra=USES), {"main.py": READER})
    # Pinned at submission: moving the alias afterwards changes nothing for this run.
    (tmp_path / "raw" / "c.txt").write_text("later\n")
    later = ingest_folder(raw.asset, tmp_path / "raw", source="upload")
    set_alias(later, "train")
    (pinned,) = RunInput.objects.for_workspace(world.alpha).filter(run=run)
    assert (pinned.version_id, pinned.asked, pinned.path) == (raw.pk, "train", "corpus")

    agent = start_agent()
    wait_for_state(run, {RunState.SUCCEEDED, RunState.FAILED}, timeout=120, agent=agent)
    (attempt,) = attempts(run)
    log = Path(attempt.log_path).read_text()
    assert run.state == RunState.SUCCEEDED, (run.state_reason, log[-3000:])
    assert "read 2 files from" in log
    assert "the data is read-only: " in log
    assert "[taugrid] staged wiki@1 at $TAU_DATA_DIR/corpus: 2 files, 31 bytes" in log

    clean = AssetVersion.objects.for_workspace(world.alpha).get(asset__name="wiki-clean")
    model = AssetVersion.objects.for_workspace(world.alpha).get(asset__name="tiny")
    for made in (clean, model):
        assert (made.state, made.source, made.produced_by_id) == ("ready", "run", run.pk)
        assert list(made.derived_from.all()) == [raw]
    assert clean.files_count == 1
    assert clean.bytes == len("the quick brown fox\njumps over\n")
    assert model.asset.kind == "model"
    assert f"kept model tiny@1: 1 files, 16 bytes, {model.manifest_digest}" in log

    # Both ways in the run's history, which its evidence seals.
    events = {
        event.kind: event for event in RunEvent.objects.for_workspace(world.alpha).filter(run=run)
    }
    assert events[EventKind.SUBMITTED].data["datasets"] == [
        {
            "ref": "wiki@1",
            "asked": "wiki@train",
            "manifest_digest": raw.manifest_digest,
            "path": "corpus",
        }
    ]
    # What staging took, for the run page (a cluster's stager reports the same).
    staged = events[EventKind.DATA_STAGED].data
    assert (staged["attempt"], staged["files"], staged["bytes"]) == (1, 2, 31)
    assert staged["seconds"] >= 0
    kept = events[EventKind.OUTPUTS_KEPT].data["versions"]
    assert [(v["kind"], v["ref"], v["manifest_digest"]) for v in kept] == [
        ("dataset", "wiki-clean@1", clean.manifest_digest),
        ("model", "tiny@1", model.manifest_digest),
    ]
    assert all(v["derived_from"] == ["wiki@1"] for v in kept)
    assert verify_event_chain(run)
    # The staged files are the store's blobs, read-only.
    staged = Path(attempt.log_path).parent / "data" / "corpus" / "b.txt"
    assert (
        staged.stat().st_ino
        == storage.blob_path(world.alpha.pk, raw_sha(raw, "b.txt")).stat().st_ino
    )
    assert staged.stat().st_mode & 0o222 == 0


def raw_sha(version: AssetVersion, path: str) -> str:
    return str(version.files.get(path=path).sha256)


def test_a_run_naming_a_missing_dataset_or_version_is_refused_at_that_key(
    world: Any, tmp_path: Path
) -> None:
    local_quota(world.alpha)
    raw_wiki(world, tmp_path)
    cases = {
        "inputs:\n  datasets:\n    - {name: nothing}\n": (
            "inputs.datasets[0].name",
            "this workspace has no dataset named 'nothing'",
        ),
        "inputs:\n  datasets:\n    - {name: wiki}\n    - {name: wiki, version: '7', path: w7}\n": (
            "inputs.datasets[1].version",
            "wiki has no version '7'.",
        ),
        "inputs:\n  datasets:\n    - {name: wiki, version: eval}\n": (
            "inputs.datasets[0].version",
            "wiki has no alias 'eval'.",
        ),
    }
    for extra, (path, message) in cases.items():
        with pytest.raises(SubmissionRefused) as refused:
            submit(world, spec("reads", extra=extra), {"main.py": "print(1)\n"})
        assert [(p.path, p.message.split(" (")[0]) for p in refused.value.problems] == [
            (path, message.split(" (")[0])
        ], extra
    assert not RunInput.objects.for_workspace(world.alpha).exists()


def test_a_changed_stored_file_fails_the_attempt_naming_it(
    world: Any, var_dir: Path, tmp_path: Path, start_agent: Any
) -> None:
    local_quota(world.alpha)
    raw = raw_wiki(world, tmp_path)
    once = USES + "resilience: {max_retries: 0}\n"  # an infrastructure failure is retried
    run = submit(world, spec("clean-wiki", extra=once), {"main.py": READER})
    blob = storage.blob_path(world.alpha.pk, raw_sha(raw, "part/a.txt"))
    blob.chmod(0o644)
    blob.write_text("The Quick Brown Cat\n")
    agent = start_agent()
    wait_for_state(run, {RunState.SUCCEEDED, RunState.FAILED}, timeout=120, agent=agent)
    assert run.state == RunState.FAILED
    (attempt,) = attempts(run)
    assert attempt.failure_class == FailureClass.INFRASTRUCTURE
    assert (
        "wiki@1: part/a.txt: the stored copy differs from the manifest" in attempt.failure_message
    )
    assert not AssetVersion.objects.for_workspace(world.alpha).filter(asset__name="tiny").exists()


def test_a_promised_output_that_is_not_written_fails_the_run(
    world: Any, var_dir: Path, tmp_path: Path, start_agent: Any
) -> None:
    local_quota(world.alpha)
    raw_wiki(world, tmp_path)
    extra = USES + textwrap.dedent(
        """\
        runtime:
          env: {MAKE_MODEL: "0"}
        """
    )
    run = submit(world, spec("clean-wiki", extra=extra), {"main.py": READER})
    agent = start_agent()
    wait_for_state(run, {RunState.SUCCEEDED, RunState.FAILED}, timeout=120, agent=agent)
    assert run.state == RunState.FAILED
    (attempt,) = attempts(run)
    assert attempt.failure_class == FailureClass.USER_ERROR
    assert attempt.failure_message == (
        "outputs.model: the run wrote no folder model under TAU_OUTPUT_DIR, so no version of "
        "the model tiny was made."
    )


def test_data_prep_then_training_make_one_lineage_from_raw_data_to_a_model(
    world: Any, var_dir: Path, tmp_path: Path, start_agent: Any, live_server: Any
) -> None:
    """examples/data-prep reads a raw version and makes a derived one; examples/train-on-data
    trains on that and makes a model version: raw → run → tokenized → run → model, on the
    versions' pages of the API and in each run's sealed evidence."""
    local_quota(world.alpha)
    raw_folder = tmp_path / "reviews-raw"
    subprocess.run(
        [sys.executable, str(EXAMPLES / "data-prep" / "make_raw.py"), str(raw_folder)], check=True
    )
    raw = ingest_folder(
        asset_named(world.alpha, "dataset", "reviews-raw"), raw_folder, source="upload"
    )
    agent = start_agent(TAU_API_URL=live_server.url)  # the examples' metrics are sent there
    runs = {}
    for example in ("data-prep", "train-on-data"):
        folder = EXAMPLES / example
        run = submit(world, (folder / "tau.yaml").read_bytes(), bundle=zip_directory(folder))
        wait_for_state(run, {RunState.SUCCEEDED, RunState.FAILED}, timeout=120, agent=agent)
        assert run.state == RunState.SUCCEEDED, (run.state_reason, log_of(run)[-3000:])
        runs[example] = run
    assert "kept 600, dropped 40 duplicates and 3 too short" in log_of(runs["data-prep"])
    accuracy = (
        MetricPoint.objects.for_workspace(world.alpha)
        .filter(run=runs["train-on-data"], key="val_accuracy")
        .order_by("-step")
        .values_list("value", flat=True)
        .first()
    )
    assert accuracy is not None
    assert accuracy > 0.9

    api = world.client_for("viewer")
    tokenized = api.get(f"{API}/datasets/reviews-tokenized/versions/1/").json()
    model = api.get(f"{API}/models/reviews-classifier/versions/1/").json()
    assert (tokenized["state"], tokenized["derived_from"], tokenized["produced_by"]) == (
        "ready",
        ["reviews-raw@1"],
        runs["data-prep"].name,
    )
    assert (model["state"], model["derived_from"], model["produced_by"]) == (
        "ready",
        ["reviews-tokenized@1"],
        runs["train-on-data"].name,
    )
    files = {
        row["path"]
        for row in api.get(f"{API}/models/reviews-classifier/versions/1/files/").json()["results"]
    }
    assert files == {"model.json", "vocab.txt"}

    for example, read, made in (
        (
            "data-prep",
            ("reviews-raw@1", raw.manifest_digest),
            ("dataset", "reviews-tokenized@1", tokenized["manifest_digest"]),
        ),
        (
            "train-on-data",
            ("reviews-tokenized@1", tokenized["manifest_digest"]),
            ("model", "reviews-classifier@1", model["manifest_digest"]),
        ),
    ):
        (record,) = seal_all(runs[example])
        data = manifest_of(record)["data"]
        assert [(item["ref"], item["manifest_digest"]) for item in data["read"]] == [read]
        assert [
            (item["kind"], item["ref"], item["manifest_digest"]) for item in data["produced"]
        ] == [made]


def log_of(run: Any) -> str:
    return "".join(Path(attempt.log_path).read_text() for attempt in attempts(run))
