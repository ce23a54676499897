"""Batch inference (issue 34): a run reads a model version (``inputs.models``) beside a dataset
version, pinned at submission and recorded like a dataset; examples/batch-inference runs for
real on the local executor (Ray Data ``map_batches`` on the attempt's own Ray cluster, with
``ray[data]`` installed from the wheels make test downloads) and its predictions become a
dataset version derived from exactly the dataset version and the model version it read."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from catalog.ingest import asset_named, ingest_folder, set_alias
from catalog.models import AssetVersion, RunInput
from executors.local.agent import processes
from runs.events import verify_event_chain
from runs.models import EventKind, MetricPoint, RunEvent, RunState
from runs.submission import SubmissionRefused
from tests.evidence.helpers import manifest_of, seal_all
from tests.executors.local.agent_harness import (
    attempts,
    how_it_ended,
    local_quota,
    spec,
    submit,
    wait_for_state,
)
from tests.executors.local.test_agent_examples import EXAMPLES, torch_agent
from tests.executors.local.test_agent_workers import FIRST_INSTALL_SECONDS
from tests.runs.factories import zip_directory

pytestmark = pytest.mark.django_db(transaction=True)

API = "/api/v1/workspaces/alpha"

#: A classifier as examples/train-on-data writes one: a weight per vocabulary word, a bias.
VOCABULARY = ["great", "awful", "quiet"]
WEIGHTS = [2.0, -3.0, 1.0]
BIAS = -0.5
#: The reviews: labelled lines as examples/data-prep's raw data has, and lines of text alone.
REVIEWS = {
    "part-0.tsv": "1\tA GREAT kettle, really great!\n0\tAwful. Just awful\n",
    "more/part-1.txt": "quiet and great\nnothing to say here\n",
}


def classifier(world: Any, tmp_path: Path) -> AssetVersion:
    folder = tmp_path / "classifier"
    folder.mkdir()
    (folder / "model.json").write_text(json.dumps({"weights": WEIGHTS, "bias": BIAS}))
    (folder / "vocab.txt").write_text("".join(f"{word}\n" for word in VOCABULARY))
    version = ingest_folder(
        asset_named(world.alpha, "model", "reviews-classifier"), folder, source="upload"
    )
    set_alias(version, "production")
    return version


def reviews(world: Any, tmp_path: Path) -> AssetVersion:
    folder = tmp_path / "reviews"
    for name, text in REVIEWS.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return ingest_folder(
        asset_named(world.alpha, "dataset", "reviews-raw"), folder, source="upload"
    )


def expected(text: str, words: list[str]) -> tuple[float, int, int]:
    """What the classifier answers for ``text`` whose known words are ``words``."""
    z = BIAS + sum(WEIGHTS[VOCABULARY.index(word)] for word in words)
    positive = round(1.0 / (1.0 + math.exp(-z)), 6)
    return positive, int(positive >= 0.5), len(words)


# ------------------------------------------------------------------------------ submission


def test_a_model_version_is_pinned_at_submission_as_a_run_input(world: Any, tmp_path: Path) -> None:
    local_quota(world.alpha)
    data, model = reviews(world, tmp_path), classifier(world, tmp_path)
    uses = (
        "inputs:\n"
        "  datasets: [{name: reviews-raw, path: reviews}]\n"
        "  models: [{name: reviews-classifier, version: production, path: model}]\n"
    )
    run = submit(world, spec("reads-a-model", extra=uses), {"main.py": "print(1)\n"})
    # Pinned: the alias moving afterwards changes nothing for this run.
    later = ingest_folder(model.asset, tmp_path / "classifier", source="upload")
    set_alias(later, "production")
    pinned = RunInput.objects.for_workspace(world.alpha).filter(run=run).order_by("path")
    assert [(item.version_id, item.asked, item.path) for item in pinned] == [
        (model.pk, "production", "model"),
        (data.pk, "latest", "reviews"),
    ]
    submitted = RunEvent.objects.for_workspace(world.alpha).get(run=run, kind=EventKind.SUBMITTED)
    assert submitted.data["datasets"] == [
        {
            "ref": "reviews-raw@1",
            "asked": "reviews-raw@latest",
            "manifest_digest": data.manifest_digest,
            "path": "reviews",
        }
    ]
    assert submitted.data["models"] == [
        {
            "ref": "reviews-classifier@1",
            "asked": "reviews-classifier@production",
            "manifest_digest": model.manifest_digest,
            "path": "model",
        }
    ]


def test_a_missing_model_or_version_is_refused_at_its_key(world: Any, tmp_path: Path) -> None:
    local_quota(world.alpha)
    reviews(world, tmp_path)
    classifier(world, tmp_path)
    cases = {
        # A dataset of that name is not a model.
        "inputs:\n  models: [{name: reviews-raw}]\n": (
            "inputs.models[0].name",
            "this workspace has no model named 'reviews-raw' (`tau data model list` shows its "
            "models).",
        ),
        "inputs:\n  datasets: [{name: reviews-raw}]\n  models: [{name: reviews-classifier, "
        "version: '4'}]\n": ("inputs.models[0].version", "reviews-classifier has no version '4'."),
        "inputs:\n  models: [{name: reviews-classifier, path: a}, {name: reviews-classifier, "
        "version: staging, path: b}]\n": (
            "inputs.models[1].version",
            "reviews-classifier has no alias 'staging'.",
        ),
    }
    for extra, problem in cases.items():
        with pytest.raises(SubmissionRefused) as refused:
            submit(world, spec("reads", extra=extra), {"main.py": "print(1)\n"})
        assert [(p.path, p.message) for p in refused.value.problems] == [problem], extra
    assert not RunInput.objects.for_workspace(world.alpha).exists()


# ------------------------------------------------------------------------ the example, for real


@pytest.mark.slow
def test_the_batch_inference_example_writes_predictions_derived_from_the_data_and_the_model(
    world: Any, tmp_path: Path, start_agent: Any, live_server: Any
) -> None:
    """examples/batch-inference as written: its Ray cluster classifies the reviews with Ray
    Data, and the predictions become reviews-predictions@1, produced by the run and derived
    from exactly reviews-raw@1 and reviews-classifier@1."""
    local_quota(world.alpha)
    data, model = reviews(world, tmp_path), classifier(world, tmp_path)
    example = EXAMPLES / "batch-inference"
    run = submit(world, (example / "tau.yaml").read_bytes(), bundle=zip_directory(example))
    agent = torch_agent(start_agent, TAU_API_URL=live_server.url)  # the SDK reports there
    wait_for_state(
        run, {RunState.SUCCEEDED, RunState.FAILED}, timeout=FIRST_INSTALL_SECONDS, agent=agent
    )
    assert run.state == RunState.SUCCEEDED, how_it_ended(run, agent)
    (attempt,) = attempts(run)
    log = Path(attempt.log_path).read_text()
    assert "[ray-cluster] 2 worker nodes" in log
    assert (
        "[taugrid] staged reviews-classifier@1 at $TAU_DATA_DIR/model, reviews-raw@1 at "
        "$TAU_DATA_DIR/reviews: 4 files"
    ) in log
    assert "loaded the classifier (3 words) on node " in log
    assert "predicted 4 rows of 2 files" in log

    made = AssetVersion.objects.for_workspace(world.alpha).get(asset__name="reviews-predictions")
    assert (made.ref, made.state, made.produced_by_id) == ("reviews-predictions@1", "ready", run.pk)
    assert made.asset.kind == "dataset"
    assert set(made.derived_from.all()) == {data, model}
    api = world.client_for("viewer")
    shown = api.get(f"{API}/datasets/reviews-predictions/versions/1/").json()
    assert sorted(shown["derived_from"]) == ["reviews-classifier@1", "reviews-raw@1"]
    assert shown["produced_by"] == run.name

    output = Path(attempt.log_path).parent / "output" / "predictions"
    rows = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
    assert [(row["file"], row["text"], row["label"]) for row in rows] == [
        ("more/part-1.txt", "quiet and great", None),
        ("more/part-1.txt", "nothing to say here", None),
        ("part-0.tsv", "A GREAT kettle, really great!", 1),
        ("part-0.tsv", "Awful. Just awful", 0),
    ]
    answers = [(row["positive"], row["predicted"], row["words"]) for row in rows]
    assert answers == [
        expected("quiet and great", ["quiet", "great"]),
        expected("nothing to say here", []),
        expected("A GREAT kettle, really great!", ["great"]),
        expected("Awful. Just awful", ["awful"]),
    ]
    assert [answer[1] for answer in answers] == [1, 0, 1, 0]
    assert json.loads((output / "summary.json").read_text()) == {
        "rows": 4,
        "positive": 2,
        "positive_share": 0.5,
        "labelled": 2,
        "agreed": 2,
        "files": 2,
    }
    assert set(made.files.values_list("path", flat=True)) == {
        "predictions.jsonl",
        "summary.json",
    }
    metrics = dict(
        MetricPoint.objects.for_workspace(world.alpha)
        .filter(run=run, step=0)
        .values_list("key", "value")
    )
    assert metrics == {"rows": 4.0, "positive_share": 0.5, "agreement": 1.0}

    kept = RunEvent.objects.for_workspace(world.alpha).get(run=run, kind=EventKind.OUTPUTS_KEPT)
    (version,) = kept.data["versions"]
    assert (version["ref"], sorted(version["derived_from"])) == (
        "reviews-predictions@1",
        ["reviews-classifier@1", "reviews-raw@1"],
    )
    assert verify_event_chain(run)
    (record,) = seal_all(run)
    sealed = manifest_of(record)["data"]
    assert sorted(item["ref"] for item in sealed["read"]) == [
        "reviews-classifier@1",
        "reviews-raw@1",
    ]
    assert [item["ref"] for item in sealed["produced"]] == ["reviews-predictions@1"]
    markers = {"TAU_RUN_ID": str(run.pk), "TAU_RUN_NAME": run.name}
    assert processes.marked_processes(markers) == []  # no Ray process outlives the attempt
