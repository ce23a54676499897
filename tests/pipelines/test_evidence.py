"""A pipeline's record (issue 35): one file with its signed manifest, pipeline.yaml, its
hash-chained history and every stage's own sealed record; every stage's inputs and outputs
named by digest; checked offline, every stage's record in full, and any change found."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from catalog.ingest import asset_named, ingest_folder
from evidence import sealing
from evidence.models import SealRequest
from pipelines.models import Pipeline
from runs.models import Run, RunState
from tau.evidence.keys import load_trusted_keys
from tau.evidence.pipeline_record import verify_pipeline_file
from tau.evidence.verify import verify_and_report, verify_file
from tests.evidence.helpers import TEST_SIGNING_KEY
from tests.pipelines.factories import PIPELINE, make_pipeline, pipeline_zip, stage_spec
from tests.pipelines.test_orchestration import end, report, run_of

pytestmark = pytest.mark.django_db

TWO_STAGES = """\
schema_version: 1
name: small
stages:
  prepare: {config: prepare/tau.yaml}
  train: {config: train/tau.yaml, needs: [prepare]}
"""


@pytest.fixture(autouse=True)
def _signing_key(settings: Any) -> None:
    settings.TAU_EVIDENCE_SIGNING_KEY = TEST_SIGNING_KEY


def seal_all() -> None:
    for request in SealRequest.objects.unscoped().filter(sealed_at__isnull=True):
        assert sealing.seal(request.pk)


def evidence_url(pipeline: Pipeline) -> str:
    return f"/api/v1/workspaces/alpha/pipelines/{pipeline.name}/evidence/"


def download(world: Any, pipeline: Pipeline, tmp_path: Path) -> Path:
    response = world.api_client_for("viewer").get(evidence_url(pipeline))
    assert response.status_code == 200, response.content[:500]
    assert response["Content-Disposition"] == f'attachment; filename="{pipeline.name}.pipeline.tar"'
    path = tmp_path / f"{pipeline.name}.pipeline.tar"
    path.write_bytes(b"".join(response.streaming_content))
    assert int(response["Content-Length"]) == path.stat().st_size
    return path


def finished(world: Any, tmp_path: Path) -> Pipeline:
    """A two-stage pipeline that read a dataset version and made a model version."""
    files = tmp_path / "wiki"
    files.mkdir()
    (files / "part-0.txt").write_text("the corpus\n")
    ingest_folder(asset_named(world.alpha, "dataset", "wiki"), files, source="prefix")
    reads = stage_spec("prepare") + "inputs:\n  datasets:\n    - {name: wiki, version: latest}\n"
    data = pipeline_zip(TWO_STAGES, **{"prepare/tau.yaml": reads})
    pipeline = make_pipeline(world, data)
    end(pipeline, "prepare")
    train = run_of(pipeline, "train")
    report(train, "val_loss", 0.25)
    end(pipeline, "train")
    pipeline.refresh_from_db()
    assert pipeline.state == "succeeded"
    return pipeline


def test_the_record_verifies_offline_and_names_inputs_and_outputs(
    world: Any, tmp_path: Path, settings: Any, capsys: Any
) -> None:
    pipeline = finished(world, tmp_path)
    # Each stage's run record must be sealed first: until then the record is not ready.
    refused = world.api_client_for("viewer").get(evidence_url(pipeline))
    assert refused.status_code == 409
    assert "still being sealed" in refused.json()["detail"]
    seal_all()
    path = download(world, pipeline, tmp_path)

    checked = verify_pipeline_file(path, check_run=verify_file)
    assert checked.problems == []
    assert checked.records == 2
    assert checked.events >= 6
    with tarfile.open(path) as tar:
        names = tar.getnames()
        manifest = json.loads(tar.extractfile("pipeline.json").read())  # type: ignore[union-attr]
    assert names[:4] == ["pipeline.json", "pipeline.sig", "pipeline.yaml", "history.jsonl"]
    assert sorted(names[4:]) == sorted(
        f"stages/{stage['name']}/{stage['run']['name']}-attempt-1.evidence.tar"
        for stage in manifest["stages"]
    )
    prepare, train = manifest["stages"]
    (read,) = prepare["inputs"]
    assert read["ref"] == "wiki@1"
    assert read["manifest_digest"].startswith("sha256:")
    assert train["metrics"] == {"val_loss": 0.25}
    assert train["run"]["spec_hash"] == run_of(pipeline, "train").spec_hash
    assert ["dataset:wiki@1", f"run:{prepare['run']['name']}"] in manifest["lineage"]["edges"]

    # The command line says the same (exit 0), and checks the signer against a keyring.
    keyring = tmp_path / "keys.json"
    keyring.write_text(
        json.dumps(world.api_client_for("viewer").get("/api/v1/evidence/keys/").json())
    )
    assert verify_and_report(str(path), str(keyring), as_json=True) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["ok"] is True
    assert said["signer"]["trusted"] is True
    assert said["counts"] == {"events": checked.events, "stages": 2, "records": 2}
    assert load_trusted_keys(keyring.read_bytes())


def rewritten(path: Path, member: str, change: Any) -> Path:
    """A copy of the tar at ``path`` with ``member``'s bytes changed by ``change``."""
    out = path.with_name(f"changed-{member.replace('/', '-')}")
    with tarfile.open(path) as source, tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as copy:
        for info in source.getmembers():
            data = source.extractfile(info).read()  # type: ignore[union-attr]
            if info.name == member:
                data = change(data)
                info.size = len(data)
            copy.addfile(info, io.BytesIO(data))
    return out


def flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


def test_any_change_is_found(world: Any, tmp_path: Path) -> None:
    pipeline = finished(world, tmp_path)
    seal_all()
    path = download(world, pipeline, tmp_path)
    with tarfile.open(path) as tar:
        stage_records = [name for name in tar.getnames() if name.startswith("stages/")]
    cases = {
        # An event's message edited: the member's digest and the chain both say so.
        "history.jsonl": lambda data: data.replace(b"Submitted by", b"Submitted bx", 1),
        # The manifest edited: its signature no longer matches.
        "pipeline.json": lambda data: data.replace(b'"succeeded"', b'"succeedee"', 1),
        # A byte deep in a stage's own record.
        stage_records[0]: lambda data: flip(data, 3000),
    }
    for member, change in cases.items():
        found = verify_pipeline_file(
            rewritten(path, member, change), check_run=verify_file
        ).problems
        assert found, member
        assert any(
            member.split("/")[-1] in problem or "signature" in problem for problem in found
        ), (
            member,
            found,
        )


def test_a_running_pipeline_has_no_record_yet_and_another_workspace_none_at_all(
    world: Any,
) -> None:
    pipeline = make_pipeline(world, pipeline_zip(PIPELINE))
    refused = world.api_client_for("viewer").get(evidence_url(pipeline))
    assert refused.status_code == 409
    assert "still running" in refused.json()["detail"]
    assert world.api_client_for("outsider").get(evidence_url(pipeline)).status_code == 404


def test_a_stage_that_failed_and_one_never_started_are_in_the_record(
    world: Any, tmp_path: Path
) -> None:
    pipeline = make_pipeline(world, pipeline_zip(TWO_STAGES))
    end(pipeline, "prepare", RunState.FAILED)
    seal_all()
    path = download(world, pipeline, tmp_path)
    report_ = verify_pipeline_file(path, check_run=verify_file)
    assert report_.problems == []
    with tarfile.open(path) as tar:
        manifest = json.loads(tar.extractfile("pipeline.json").read())  # type: ignore[union-attr]
    prepare, train = manifest["stages"]
    assert (prepare["state"], prepare["run"]["state"]) == ("failed", "failed")
    assert train["run"] is None
    assert train["reason"] == "not started: prepare failed"
    assert manifest["pipeline"]["state"] == "failed"
    assert Run.objects.unscoped().count() == 1


def test_a_model_a_stage_made_is_in_the_lineage(world: Any, tmp_path: Path) -> None:
    pipeline = finished(world, tmp_path)
    train = run_of(pipeline, "train")
    output = tmp_path / "out"
    output.mkdir()
    (output / "weights.bin").write_bytes(b"\x00" * 16)
    version = ingest_folder(asset_named(world.alpha, "model", "tiny"), output, source="prefix")
    version.produced_by = train
    version.save(update_fields=["produced_by"])
    seal_all()
    path = download(world, pipeline, tmp_path)
    assert verify_pipeline_file(path, check_run=verify_file).problems == []
    with tarfile.open(path) as tar:
        manifest = json.loads(tar.extractfile("pipeline.json").read())  # type: ignore[union-attr]
    assert manifest["stages"][1]["outputs"] == [
        {"kind": "model", "ref": "tiny@1", "manifest_digest": version.manifest_digest}
    ]
    assert [f"run:{train.name}", "model:tiny@1"] in manifest["lineage"]["edges"]
