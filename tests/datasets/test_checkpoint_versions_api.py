"""Models from checkpoints (issue 34): ``POST …/models/{name}/versions/`` with ``{"source":
"checkpoint", "run": RUN, "step": N}`` makes a run's complete checkpoint (a folder or a file in
its checkpoint folder on this machine) the model's next version, produced by the run and
derived from what it read, whatever state the run ended in, the model made if it is new; every
refusal is a 400 that says why and makes nothing (no empty model either), and a cluster run's
checkpoints are refused, saying what to do instead."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from catalog.ingest import asset_named, ingest_folder
from catalog.models import Asset, AssetVersion, RunInput
from executors.local import backend as local_backend
from runs.models import Checkpoint, MetricPoint, Run, RunState
from tests.datasets.test_catalog import folder
from tests.runs.factories import make_run

pytestmark = pytest.mark.django_db

API = "/api/v1/workspaces/alpha"
MODEL = f"{API}/models/tiny"


@pytest.fixture(autouse=True)
def places(settings: Any, tmp_path: Path) -> None:
    settings.TAU_STORAGE_URL = f"file://{tmp_path / 'store'}"
    settings.VAR_DIR = tmp_path / "var"


def checkpoint(run: Run, step: int, files: dict[str, bytes], *, complete: bool = True) -> Path:
    """A checkpoint folder ``step-N`` in the run's checkpoint folder, recorded as the agent
    records one (its absolute path)."""
    where = local_backend.checkpoint_dir(run) / f"step-{step}"
    for name, data in files.items():
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        (where / name).write_bytes(data)
    Checkpoint.objects.create(run=run, attempt=1, step=step, path=str(where), complete=complete)
    return where


def register(client: Any, run: Run, step: int | None = None, model: str = MODEL) -> Any:
    body: dict[str, Any] = {"source": "checkpoint", "run": run.name}
    if step is not None:
        body["step"] = step
    return client.post(f"{model}/versions/", body, "application/json")


def versions(world: Any) -> Any:
    return AssetVersion.objects.for_workspace(world.alpha)


def test_a_runs_newest_complete_checkpoint_becomes_a_version_with_its_lineage(
    world: Any, tmp_path: Path
) -> None:
    client = world.client_for("researcher")
    client.post(f"{API}/models/", {"name": "tiny"}, "application/json")
    # A fine-tune that was cancelled: its checkpoints are checkpoints still.
    run = make_run(world, state=RunState.CANCELLED)
    raw = ingest_folder(
        asset_named(world.alpha, "dataset", "wiki"),
        folder(tmp_path / "wiki", {"a.txt": b"a\n"}),
        source="upload",
    )
    RunInput.objects.create(run=run, version=raw, asked="latest", path="wiki")
    MetricPoint.objects.create(run=run, attempt=1, key="val_loss", step=30, value=0.4)
    checkpoint(run, 10, {"weights.bin": b"early"})
    checkpoint(run, 20, {"weights.bin": b"later", "config/params.json": b"{}"})
    checkpoint(run, 30, {"weights.bin": b"half"}, complete=False)

    made = register(client, run)
    assert made.status_code == 201, made.json()
    body = made.json()
    assert (body["ref"], body["state"], body["source"]) == ("tiny@1", "ready", "run")
    assert body["source_detail"] == f"{run.name}: checkpoint step 20"
    assert (body["produced_by"], body["derived_from"]) == (run.name, ["wiki@1"])
    assert body["metrics"] == {"val_loss": 0.4}
    files = client.get(f"{MODEL}/versions/1/files/").json()["results"]
    assert [row["path"] for row in files] == ["config/params.json", "weights.bin"]
    download = client.get(f"{MODEL}/versions/1/download/")
    assert b"later" in b"".join(download.streaming_content)

    # An older step, named; and a checkpoint that is one file, kept by its name.
    early = register(client, run, 10).json()
    assert (early["ref"], early["source_detail"]) == ("tiny@2", f"{run.name}: checkpoint step 10")
    single = local_backend.checkpoint_dir(run) / "model-40.pt"
    single.write_bytes(b"one file")
    Checkpoint.objects.create(run=run, attempt=2, step=40, path=str(single))
    one = register(client, run).json()
    assert (one["ref"], one["files_count"]) == ("tiny@3", 1)
    assert client.get(f"{MODEL}/versions/3/files/").json()["results"][0]["path"] == "model-40.pt"

    # A model that is new is made for it (as `tau data model register` makes one).
    fresh = register(client, run, 20, model=f"{API}/models/reviews")
    assert fresh.status_code == 201, fresh.json()
    assert fresh.json()["ref"] == "reviews@1"
    assert (
        Asset.objects.for_workspace(world.alpha).get(name="reviews").created_by
        == (world.users["researcher"])
    )


def test_each_refusal_says_why_and_makes_nothing(world: Any, settings: Any) -> None:
    client = world.client_for("researcher")
    client.post(f"{API}/models/", {"name": "tiny"}, "application/json")
    run = make_run(world, state=RunState.FAILED)

    def refused(step: int | None = None, on: Run = run) -> str:
        answer = register(client, on, step)
        assert answer.status_code == 400, answer.json()
        assert not versions(world).exists()
        return str(answer.json()["detail"])

    assert refused() == f"{run.name} wrote no checkpoint."
    checkpoint(run, 5, {"weights.bin": b"half"}, complete=False)
    assert refused() == f"{run.name} wrote no complete checkpoint (only unfinished ones)."
    assert refused(5) == (
        f"{run.name}'s checkpoint at step 5 is incomplete (the workload reported it "
        "unfinished): name a complete one."
    )
    gone = checkpoint(run, 10, {"weights.bin": b"kept"})
    checkpoint(run, 20, {"weights.bin": b"kept"})
    assert refused(7) == (
        f"{run.name} has no checkpoint at step 7; its complete checkpoints' steps: 20, 10."
    )
    for name in os.listdir(gone):
        os.remove(gone / name)
    gone.rmdir()
    assert refused(10).startswith(f"{run.name}'s checkpoint at step 10 is gone from this machine")

    # A link in the checkpoint folder is never followed, to a file or a folder.
    outside = local_backend.checkpoint_dir(run).parent / "elsewhere"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"not the run's")
    linked = local_backend.checkpoint_dir(run) / "step-30"
    linked.symlink_to(outside)
    Checkpoint.objects.create(run=run, attempt=1, step=30, path=str(linked))
    assert "symbolic link" in refused(30)
    inside = checkpoint(run, 40, {"weights.bin": b"w"})
    (inside / "extra").symlink_to(outside / "secret.txt")
    assert "extra is a symlink" in refused(40)
    # A recorded path outside the run's checkpoint folder (written before paths were checked).
    Checkpoint.objects.create(run=run, attempt=1, step=50, path=str(outside))
    assert "inside the run's checkpoint folder" in refused(50)

    # The catalog's limits hold for checkpoints too.
    checkpoint(run, 60, {"weights.bin": b"x" * 64})
    settings.TAU_DATA_MAX_FILE_BYTES = 10
    assert "one file may have at most 10" in refused(60)
    settings.TAU_DATA_MAX_FILE_BYTES = 1000

    # Bad requests, and a run of another workspace, which does not exist here.
    wrong = client.post(
        f"{MODEL}/versions/",
        {"source": "checkpoint", "run": run.name, "step": "latest"},
        "application/json",
    )
    assert wrong.status_code == 400
    assert "whole number" in wrong.json()["step"][0]
    nameless = client.post(f"{MODEL}/versions/", {"source": "checkpoint"}, "application/json")
    assert nameless.json()["run"] == ["Name the run (its full name)."]
    theirs = make_run(world, state=RunState.SUCCEEDED)
    checkpoint(theirs, 10, {"weights.bin": b"theirs"})
    Run.objects.unscoped().filter(pk=theirs.pk).update(workspace=world.beta)
    answer = register(client, theirs)
    assert answer.status_code == 400
    assert answer.json()["run"] == [f"This workspace has no run {theirs.name!r}."]
    # A model that is not there yet is not made for a refused checkpoint.
    assert register(client, run, 10, model=f"{API}/models/nope").status_code == 400
    assert not versions(world).exists()
    assert list(Asset.objects.for_workspace(world.alpha).values_list("name", flat=True)) == ["tiny"]
    # A viewer may not register.
    assert register(world.client_for("viewer"), run, 60).status_code == 403


def test_a_kubernetes_runs_checkpoint_is_refused_saying_what_to_do_instead(
    world: Any, settings: Any
) -> None:
    client = world.client_for("researcher")
    client.post(f"{API}/models/", {"name": "tiny"}, "application/json")
    run = make_run(world, state=RunState.SUCCEEDED)
    settings.TAU_BACKEND = "kubernetes"
    Run.objects.for_workspace(world.alpha).filter(pk=run.pk).update(backend="kubernetes")
    Checkpoint.objects.create(run=run, attempt=1, step=10, path="/tau/checkpoints/step-10")
    answer = register(client, run)
    assert answer.status_code == 400
    assert answer.json()["detail"] == (
        f"{run.name} ran on Kubernetes: its checkpoints are on the workspace's volume, which "
        "the portal cannot read them from. Declare outputs.model in its tau.yaml (the run's "
        "model is then registered when it succeeds), or keep the checkpoint with "
        "outputs.artifacts and register it with `tau data model register NAME --run "
        f"{run.name} --path PATH`."
    )
    assert not versions(world).exists()
