"""Artifacts (``runs.artifacts``): names and patterns, the content-addressed store and its
limits, collection from a local attempt's output folder (no links followed, regular files
only), the run token's upload, and the members' list and download, against PostgreSQL."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from executors.local.agent.artifact_collection import collect_artifacts
from runs import artifacts
from runs.models import Artifact, EventKind, Run, RunEvent
from tests.runs.factories import TINY_SPEC, make_run
from tests.runs.test_api import bearer, run_token

pytestmark = pytest.mark.django_db

ARTIFACT_SPEC = TINY_SPEC + b"outputs:\n  artifacts: [model/**, '*.json']\n"


def run_with_artifacts(world: Any, name: str = "tiny") -> Run:
    return make_run(world, spec=ARTIFACT_SPEC.replace(b"name: tiny", f"name: {name}".encode()))


def kept(run: Run) -> dict[str, str]:
    return {
        a.path: artifacts.open_artifact(a).read().decode()
        for a in Artifact.objects.for_workspace(run.workspace_id).filter(run=run)
    }


def refusals(run: Run) -> list[str]:
    return list(
        RunEvent.objects.for_workspace(run.workspace_id)
        .filter(run=run, kind=EventKind.ARTIFACT_REFUSED)
        .values_list("message", flat=True)
    )


@pytest.mark.parametrize(
    ("name", "normal"),
    [("model/w.pt", "model/w.pt"), ("./model//w.pt", "model/w.pt"), ("a/./b", "a/b")],
)
def test_names_are_normalised(name: str, normal: str) -> None:
    assert artifacts.normalise_path(name) == normal


@pytest.mark.parametrize("name", ["", "/etc/passwd", "a/../../b", "..", "a\\b", "a\x00b", "./"])
def test_names_outside_the_folder_are_refused(name: str) -> None:
    with pytest.raises(artifacts.ArtifactRefused):
        artifacts.normalise_path(name)


@pytest.mark.parametrize(
    ("path", "matches"),
    [
        ("model/w.pt", True),
        ("model/a/b/c.bin", True),
        ("metrics.json", True),
        ("eval/metrics.json", False),  # * stays within one component
        ("model", False),
        ("other/w.pt", False),
    ],
)
def test_patterns(path: str, matches: bool) -> None:
    assert artifacts.matches_declared(path, ["model/**", "*.json"]) is matches


def test_stored_once_per_content_and_replaced_by_a_later_attempt(
    world: Any, settings: Any, tmp_path: Path
) -> None:
    settings.VAR_DIR = tmp_path
    run = run_with_artifacts(world)
    first = artifacts.store_artifact(
        run=run, attempt=1, name="model/w.pt", source=io.BytesIO(b"one")
    )
    assert (first.size, first.sha256) == (3, hashlib.sha256(b"one").hexdigest())
    stored = artifacts.content_path(first.sha256)
    assert stored.is_relative_to(tmp_path / "artifacts")
    assert stored.read_bytes() == b"one"
    artifacts.store_artifact(run=run, attempt=1, name="r.json", source=io.BytesIO(b"one"))
    again = artifacts.store_artifact(
        run=run, attempt=2, name="./model/w.pt", source=io.BytesIO(b"two")
    )
    assert (again.pk, again.attempt) == (first.pk, 2)
    assert kept(run) == {"model/w.pt": "two", "r.json": "one"}


def test_an_undeclared_name_is_refused_and_nothing_kept(
    world: Any, settings: Any, tmp_path: Path
) -> None:
    settings.VAR_DIR = tmp_path
    run = run_with_artifacts(world)
    with pytest.raises(artifacts.ArtifactRefused, match="matches none"):
        artifacts.store_artifact(run=run, attempt=1, name="notes.txt", source=io.BytesIO(b"x"))
    assert kept(run) == {}


def test_limits_per_run_and_per_workspace(world: Any, settings: Any, tmp_path: Path) -> None:
    settings.VAR_DIR = tmp_path
    settings.TAU_ARTIFACT_MAX_BYTES_PER_RUN = 10
    settings.TAU_ARTIFACT_MAX_BYTES_PER_WORKSPACE = 15
    run = run_with_artifacts(world)
    artifacts.store_artifact(run=run, attempt=1, name="a.json", source=io.BytesIO(b"x" * 6))
    with pytest.raises(artifacts.ArtifactRefused) as refused:
        artifacts.store_artifact(run=run, attempt=1, name="b.json", source=io.BytesIO(b"y" * 5))
    assert refused.value.too_large
    # Saving the same path again counts with its new size only.
    artifacts.store_artifact(run=run, attempt=1, name="a.json", source=io.BytesIO(b"z" * 10))
    assert kept(run) == {"a.json": "z" * 10}
    assert refusals(run) == [
        "Artifact 'b.json' was not kept: it is larger than the 4 bytes left of the artifact "
        "limits (10 bytes per run, 15 bytes per workspace)."
    ]
    other = run_with_artifacts(world, "other")
    with pytest.raises(artifacts.ArtifactRefused):  # the workspace has 10 of 15 left… 5
        artifacts.store_artifact(run=other, attempt=1, name="c.json", source=io.BytesIO(b"c" * 6))
    artifacts.store_artifact(run=other, attempt=1, name="c.json", source=io.BytesIO(b"c" * 5))
    assert kept(other) == {"c.json": "ccccc"}
    assert len(list((tmp_path / "artifacts").glob("upload-*"))) == 0  # nothing half-written


def test_collection_from_the_output_folder_follows_no_link(
    world: Any, settings: Any, tmp_path: Path
) -> None:
    settings.VAR_DIR = tmp_path / "var"
    run = run_with_artifacts(world)
    output = tmp_path / "output"
    (output / "model" / "deep").mkdir(parents=True)
    (output / "model" / "w.pt").write_text("weights")
    (output / "model" / "deep" / "x.bin").write_text("deep")
    (output / "result.json").write_text("{}")
    (output / "notes.txt").write_text("not declared")
    secret = tmp_path / "secret.json"
    secret.write_text("host file")
    (output / "link.json").symlink_to(secret)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "stolen.pt").write_text("host file")
    (output / "model" / "linked").symlink_to(outside)
    os.mkfifo(output / "model" / "pipe")
    collected = collect_artifacts(run=run, attempt=1, output=output)
    assert kept(run) == {
        "model/deep/x.bin": "deep",
        "model/w.pt": "weights",
        "result.json": "{}",
    }
    assert collected.refused == []


def test_collection_over_the_limit_keeps_going_and_says_so(
    world: Any, settings: Any, tmp_path: Path
) -> None:
    settings.VAR_DIR = tmp_path / "var"
    settings.TAU_ARTIFACT_MAX_BYTES_PER_RUN = 4
    run = run_with_artifacts(world)
    output = tmp_path / "output"
    output.mkdir()
    (output / "big.json").write_text("x" * 5)
    (output / "small.json").write_text("ok")
    collected = collect_artifacts(run=run, attempt=1, output=output)
    assert kept(run) == {"small.json": "ok"}
    assert [path for path, _ in collected.refused] == ["big.json"]
    assert len(refusals(run)) == 1


# --- the API ----------------------------------------------------------------------------


def upload(client: Any, run: Run, path: str, body: bytes) -> Any:
    return client.post(
        f"/api/v1/workspaces/alpha/runs/{run.name}/report/artifacts/?{urlencode({'path': path})}",
        body,
        content_type="application/octet-stream",
    )


#: Names that would read as something they are not (issue 30): the rule every name follows
#: (``tau.printable``), shared with metric names.
HIDDEN = [
    "model/x\u202egnp.exe",  # right-to-left override: shown as "model/xexe.png"
    "model/\u2067w\u2069.pt",  # right-to-left isolate (Cf)
    "model/w\u200d.pt",  # zero-width joiner (Cf)
    "model/w\u2028.pt",  # line separator (Zl)
    "model/w\x07.pt",  # a control character (Cc)
]


@pytest.mark.parametrize("name", HIDDEN)
def test_names_with_invisible_or_control_characters_are_refused(
    world: Any, settings: Any, tmp_path: Path, name: str
) -> None:
    settings.VAR_DIR = tmp_path
    run = run_with_artifacts(world)
    refused = upload(bearer(run_token(world, run)), run, name, b"weights")
    assert refused.status_code == 400, refused.content
    [said] = refused.json()["path"]
    assert said.startswith("An artifact's name must be printable text; U+")
    assert said.endswith("is an invisible or control character.")
    assert kept(run) == {}


def test_collection_keeps_no_file_named_with_an_invisible_character(
    world: Any, settings: Any, tmp_path: Path
) -> None:
    settings.VAR_DIR = tmp_path / "var"
    run = run_with_artifacts(world)
    output = tmp_path / "output"
    (output / "model").mkdir(parents=True)
    (output / "model" / "x\u202egnp.exe").write_text("not what it looks like")
    (output / "model" / "w.pt").write_text("weights")
    collected = collect_artifacts(run=run, attempt=1, output=output)
    assert kept(run) == {"model/w.pt": "weights"}
    assert [why for _, why in collected.refused if "U+202E" in why], collected.refused


def test_names_in_any_script_are_fine(world: Any, settings: Any, tmp_path: Path) -> None:
    settings.VAR_DIR = tmp_path
    run = run_with_artifacts(world)
    client = bearer(run_token(world, run))
    for name in ("model/Gewichte (ü).pt", "model/权重.pt", "model/📦 w.pt"):
        assert upload(client, run, name, b"w").status_code == 201, name


def test_a_workload_uploads_with_its_run_token(world: Any, settings: Any, tmp_path: Path) -> None:
    settings.VAR_DIR = tmp_path
    run = run_with_artifacts(world)
    client = bearer(run_token(world, run))
    answer = upload(client, run, "model/w.pt", b"weights")
    assert answer.status_code == 201, answer.content
    assert answer.json()["sha256"] == hashlib.sha256(b"weights").hexdigest()
    assert answer.json()["download"] == (
        f"/api/v1/workspaces/alpha/runs/{run.name}/artifacts/model/w.pt"
    )
    refused = upload(client, run, "notes.txt", b"x")
    assert refused.status_code == 400
    assert "matches none" in refused.json()["path"][0]
    escaping = upload(client, run, "../../etc/passwd.json", b"x")
    assert escaping.status_code == 400
    settings.TAU_ARTIFACT_MAX_BYTES_PER_RUN = 10
    too_big = upload(client, run, "model/big.pt", b"x" * 11)
    assert too_big.status_code == 413
    assert "not kept" in too_big.json()["detail"]
    assert kept(run) == {"model/w.pt": "weights"}
    assert len(refusals(run)) == 1
    # Its token reaches its own run only.
    other = run_with_artifacts(world, "other")
    assert upload(client, other, "model/w.pt", b"x").status_code == 404
    # A person cannot upload as the workload.
    people = world.api_client_for("researcher")
    assert upload(people, run, "model/w.pt", b"x").status_code == 403


def test_members_list_and_download_outsiders_get_404(
    world: Any, settings: Any, tmp_path: Path
) -> None:
    settings.VAR_DIR = tmp_path
    run = run_with_artifacts(world)
    artifacts.store_artifact(run=run, attempt=1, name="model/w.pt", source=io.BytesIO(b"w"))
    base = f"/api/v1/workspaces/alpha/runs/{run.name}/artifacts/"
    viewer = world.api_client_for("viewer")
    listed = viewer.get(base)
    assert listed.status_code == 200
    assert [(a["path"], a["size"], a["attempt"]) for a in listed.json()] == [("model/w.pt", 1, 1)]
    download = viewer.get(listed.json()[0]["download"])
    assert download.status_code == 200
    assert b"".join(download.streaming_content) == b"w"
    assert download["Content-Type"] == "application/octet-stream"
    assert download["X-Content-SHA256"] == hashlib.sha256(b"w").hexdigest()
    assert 'attachment; filename="w.pt"' in download["Content-Disposition"]
    assert viewer.get(base + "model/other.pt").status_code == 404
    # A client that accepts only bytes gets them, and a refusal as the API's JSON.
    octets = viewer.get(base + "model/w.pt", HTTP_ACCEPT="application/octet-stream")
    assert octets.status_code == 200
    assert b"".join(octets.streaming_content) == b"w"
    missing = viewer.get(base + "model/other.pt", HTTP_ACCEPT="application/octet-stream")
    assert missing.status_code == 404
    assert "no such artifact" in missing.json()["detail"]
    outsider = world.api_client_for("outsider")
    assert outsider.get(base).status_code == 404
    assert outsider.get(base + "model/w.pt").status_code == 404
    assert bearer(run_token(world, run)).get(base).status_code == 403


def test_the_list_costs_a_fixed_number_of_queries(
    world: Any, settings: Any, tmp_path: Path
) -> None:
    settings.VAR_DIR = tmp_path
    run = run_with_artifacts(world)
    viewer = world.api_client_for("viewer")
    base = f"/api/v1/workspaces/alpha/runs/{run.name}/artifacts/"
    artifacts.store_artifact(run=run, attempt=1, name="a.json", source=io.BytesIO(b"a"))
    with CaptureQueriesContext(connection) as few:
        assert viewer.get(base).status_code == 200
    for index in range(20):
        artifacts.store_artifact(
            run=run, attempt=1, name=f"model/{index}.pt", source=io.BytesIO(b"%d" % index)
        )
    with CaptureQueriesContext(connection) as many:
        assert len(viewer.get(base).json()) == 21
    assert len(few) == len(many) == 3, [q["sql"] for q in many.captured_queries]


def test_the_run_page_lists_them_with_their_downloads(
    world: Any, settings: Any, tmp_path: Path
) -> None:
    settings.VAR_DIR = tmp_path
    run = run_with_artifacts(world)
    page = world.client_for("viewer").get(f"/w/alpha/runs/{run.name}/")
    assert "None kept yet" in page.content.decode()
    artifacts.store_artifact(run=run, attempt=1, name="model/<w>.pt", source=io.BytesIO(b"w"))
    html = world.client_for("viewer").get(f"/w/alpha/runs/{run.name}/").content.decode()
    assert "model/&lt;w&gt;.pt" in html
    assert f'href="/api/v1/workspaces/alpha/runs/{run.name}/artifacts/model/%3Cw%3E.pt"' in html
