"""Models from runs (issue 33): a succeeded run's kept artifacts under a path become a
version with the run's final metrics and lineage; ``best`` by a metric; a version downloads
as one tar whose files are its manifest's."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path
from typing import Any

import pytest

from catalog.ingest import asset_named, ingest_folder
from catalog.models import AssetVersion, RunInput
from runs.artifacts import store_artifact
from runs.models import MetricPoint, RunState
from tests.datasets.test_catalog import folder
from tests.runs.factories import TINY_SPEC, make_run

pytestmark = pytest.mark.django_db

API = "/api/v1/workspaces/alpha"
MODEL = f"{API}/models/tiny"
WITH_ARTIFACTS = TINY_SPEC + b"outputs:\n  artifacts: [model/**, notes.txt]\n"


@pytest.fixture(autouse=True)
def store(settings: Any, tmp_path: Path) -> None:
    settings.TAU_STORAGE_URL = f"file://{tmp_path / 'store'}"


def trained(world: Any, val_loss: float, *, state: RunState = RunState.SUCCEEDED) -> Any:
    run = make_run(world, spec=WITH_ARTIFACTS, state=state)
    for name, data in (
        ("model/weights.bin", bytes(range(32)) + str(val_loss).encode()),
        ("model/config/params.json", b'{"hidden": 8}'),
        ("notes.txt", b"not part of the model"),
    ):
        store_artifact(run=run, attempt=1, name=name, source=io.BytesIO(data))
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, attempt=1, key="val_loss", step=step, value=value)
        for step, value in ((10, 0.9), (20, val_loss))
    )
    return run


def register(client: Any, run: Any, path: str = "model/") -> Any:
    return client.post(
        f"{MODEL}/versions/", {"source": "run", "run": run.name, "path": path}, "application/json"
    )


def test_a_succeeded_runs_artifacts_become_a_version_with_its_metrics_and_lineage(
    world: Any, tmp_path: Path
) -> None:
    client = world.client_for("researcher")
    client.post(f"{API}/models/", {"name": "tiny"}, "application/json")
    run = trained(world, 0.25)
    raw = ingest_folder(
        asset_named(world.alpha, "dataset", "wiki"),
        folder(tmp_path / "wiki", {"a.txt": b"a\n"}),
        source="upload",
    )
    RunInput.objects.create(run=run, version=raw, asked="latest", path="wiki")
    made = register(client, run)
    assert made.status_code == 201, made.json()
    body = made.json()
    assert (body["ref"], body["state"], body["source"]) == ("tiny@1", "ready", "run")
    assert (body["produced_by"], body["derived_from"]) == (run.name, ["wiki@1"])
    assert body["source_detail"] == f"{run.name}: model"
    assert body["metrics"] == {"val_loss": 0.25}
    files = client.get(f"{MODEL}/versions/1/files/").json()["results"]
    assert [row["path"] for row in files] == ["config/params.json", "weights.bin"]
    one = register(client, run, "notes.txt").json()  # a single file is kept by its name
    assert one["files_count"] == 1
    assert client.get(f"{MODEL}/versions/2/files/").json()["results"][0]["path"] == "notes.txt"


def test_registering_is_refused_for_a_run_that_did_not_succeed_or_kept_nothing_there(
    world: Any,
) -> None:
    client = world.client_for("researcher")
    client.post(f"{API}/models/", {"name": "tiny"}, "application/json")
    failed = trained(world, 0.5, state=RunState.FAILED)
    refused = register(client, failed)
    assert refused.status_code == 400
    assert "is failed: register a version from a run that succeeded" in refused.json()["detail"]
    good = trained(world, 0.5)
    nothing = register(client, good, "checkpoints/")
    assert nothing.status_code == 400
    assert "kept no artifact at checkpoints or under checkpoints/" in nothing.json()["detail"]
    unknown = client.post(
        f"{MODEL}/versions/", {"source": "run", "run": "nope", "path": "model"}, "application/json"
    )
    assert unknown.json()["run"] == ["This workspace has no run 'nope'."]
    traversal = register(client, good, "../model")
    assert traversal.status_code == 400
    assert not AssetVersion.objects.for_workspace(world.alpha).exists()
    # Another workspace's run does not exist here.
    theirs = make_run(world, spec=WITH_ARTIFACTS, state=RunState.SUCCEEDED)
    type(theirs).objects.unscoped().filter(pk=theirs.pk).update(workspace=world.beta)
    assert register(client, theirs).json()["run"] == [f"This workspace has no run {theirs.name!r}."]


def test_best_picks_by_a_metric_either_way(world: Any) -> None:
    client = world.client_for("researcher")
    client.post(f"{API}/models/", {"name": "tiny"}, "application/json")
    for loss in (0.4, 0.2, 0.3):
        assert register(client, trained(world, loss)).status_code == 201
    viewer = world.client_for("viewer")
    lowest = viewer.get(f"{MODEL}/best/", {"metric": "val_loss", "mode": "min"}).json()
    assert (lowest["ref"], lowest["metrics"]) == ("tiny@2", {"val_loss": 0.2})
    assert viewer.get(f"{MODEL}/best/", {"metric": "val_loss", "mode": "max"}).json()["ref"] == (
        "tiny@1"
    )
    assert viewer.get(f"{MODEL}/best/", {"metric": "val_loss"}).json()["ref"] == "tiny@2"
    missing = viewer.get(f"{MODEL}/best/", {"metric": "accuracy"})
    assert missing.status_code == 404
    assert "recorded 'accuracy'" in missing.json()["detail"]
    assert viewer.get(f"{MODEL}/best/", {"metric": "val_loss", "mode": "up"}).status_code == 400
    assert viewer.get(f"{MODEL}/best/").status_code == 400


def test_a_version_downloads_as_a_tar_of_exactly_its_files(world: Any) -> None:
    client = world.client_for("researcher")
    client.post(f"{API}/models/", {"name": "tiny"}, "application/json")
    register(client, trained(world, 0.1))
    response = world.client_for("viewer").get(f"{MODEL}/versions/latest/download/")
    assert response.status_code == 200
    body = b"".join(response.streaming_content)
    assert int(response["Content-Length"]) == len(body)
    assert response["Content-Type"] == "application/x-tar"
    assert 'filename="tiny-1.tar"' in response["Content-Disposition"]
    version = AssetVersion.objects.for_workspace(world.alpha).get()
    assert response["X-Manifest-Digest"] == version.manifest_digest
    with tarfile.open(fileobj=io.BytesIO(body)) as archive:
        found = {
            member.name: hashlib.sha256(archive.extractfile(member).read()).hexdigest()  # type: ignore[union-attr]
            for member in archive.getmembers()
        }
    assert found == dict(version.files.values_list("path", "sha256"))
    again = world.client_for("viewer").get(f"{MODEL}/versions/1/download/")
    assert b"".join(again.streaming_content) == body  # the same bytes every time
    assert world.client_for("outsider").get(f"{MODEL}/versions/1/download/").status_code == 404
