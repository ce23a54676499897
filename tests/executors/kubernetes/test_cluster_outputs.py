"""A cluster run's ``outputs.dataset`` / ``outputs.model`` (issue 33): refused at submission
unless the workspace's storage claim holds TAU_OUTPUT_DIR and the portal mounts it
(``TAU_DATA_PREFIX_DIR/<workspace>/``); read there by the watcher when the attempt succeeds,
once; a promised folder that is missing turns the success into a failure that names it.
(The success end to end, on the test cluster: test_kube_end_to_end.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from catalog.models import AssetVersion
from executors.kubernetes.backend import outputs_problems
from executors.kubernetes.watcher import AttemptKey, KubeWatcher
from runs.models import FailureClass
from runs.observations import Observation, ObservedState
from tau.spec import load_spec
from tests.runs.factories import TINY_SPEC, make_run
from workspaces.models import Workspace

MAKES = (
    TINY_SPEC + b"outputs:\n  dataset: {name: clean, path: clean}\n  model: {name: m, path: m}\n"
)


def test_outputs_need_the_workspaces_claim_mounted_in_the_portal(
    settings: Any, tmp_path: Path
) -> None:
    settings.TAU_DATA_PREFIX_DIR = str(tmp_path)
    spec = load_spec(MAKES)
    bare = Workspace(slug="alpha", storage_claim="")
    said = outputs_problems(spec, bare)
    assert [path for path, _ in said] == ["outputs.dataset", "outputs.model"]
    assert "alpha has no storage claim" in said[0][1]
    claimed = Workspace(slug="alpha", storage_claim="alpha-data")
    unmounted = outputs_problems(spec, claimed)
    assert len(unmounted) == 2
    for _, message in unmounted:
        assert f"not mounted in the portal at {tmp_path / 'alpha'}" in message
    (tmp_path / "alpha").mkdir()
    assert outputs_problems(spec, claimed) == []
    assert outputs_problems(load_spec(TINY_SPEC), bare) == []  # nothing promised


@pytest.mark.django_db
def test_a_success_whose_promised_folder_is_missing_becomes_a_failure_naming_it(
    world: Any, settings: Any, tmp_path: Path
) -> None:
    settings.TAU_DATA_PREFIX_DIR = str(tmp_path / "prefixes")
    settings.TAU_STORAGE_URL = f"file://{tmp_path / 'store'}"
    run = make_run(world, spec=MAKES)
    written = tmp_path / "prefixes" / "alpha" / "runs" / run.name / "outputs" / "attempt-1"
    (written / "clean").mkdir(parents=True)
    (written / "clean" / "a.txt").write_text("clean\n")  # the model's folder is missing
    watcher = KubeWatcher(client=None, resync_seconds=300)  # type: ignore[arg-type]
    key = AttemptKey(run.pk, 1)
    succeeded = Observation(state=ObservedState.SUCCEEDED, exit_code=0, ran=True)

    verdict = watcher._with_outputs_kept(key, run, succeeded)

    assert (verdict.state, verdict.failure_class) == (
        ObservedState.FAILED,
        FailureClass.USER_ERROR,
    )
    assert "outputs.model: the run wrote no folder m under TAU_OUTPUT_DIR" in verdict.reason
    assert not AssetVersion.objects.for_workspace(world.alpha).exists()  # nothing half kept
    # Decided once: the next look at the same objects gets the same answer, nothing redone.
    (written / "m").mkdir()
    assert watcher._with_outputs_kept(key, run, succeeded) is verdict
    assert not AssetVersion.objects.for_workspace(world.alpha).exists()


@pytest.mark.django_db
def test_a_success_keeps_its_outputs_once(world: Any, settings: Any, tmp_path: Path) -> None:
    settings.TAU_DATA_PREFIX_DIR = str(tmp_path / "prefixes")
    settings.TAU_STORAGE_URL = f"file://{tmp_path / 'store'}"
    run = make_run(world, spec=MAKES)
    written = tmp_path / "prefixes" / "alpha" / "runs" / run.name / "outputs" / "attempt-1"
    for folder in ("clean", "m"):
        (written / folder).mkdir(parents=True)
        (written / folder / "x.bin").write_bytes(folder.encode())
    succeeded = Observation(state=ObservedState.SUCCEEDED, exit_code=0, ran=True)
    watcher = KubeWatcher(client=None, resync_seconds=300)  # type: ignore[arg-type]
    assert watcher._with_outputs_kept(AttemptKey(run.pk, 1), run, succeeded) is succeeded
    made = AssetVersion.objects.for_workspace(world.alpha).order_by("asset__name")
    assert [(v.ref, v.state, v.produced_by_id) for v in made] == [
        ("clean@1", "ready", run.pk),
        ("m@1", "ready", run.pk),
    ]
    # Another watcher (a restart) finds them kept: none made twice.
    again = KubeWatcher(client=None, resync_seconds=300)  # type: ignore[arg-type]
    assert again._with_outputs_kept(AttemptKey(run.pk, 1), run, succeeded) is succeeded
    assert made.count() == 2
