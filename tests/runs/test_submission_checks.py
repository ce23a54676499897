"""What submission refuses up front, so that no run is accepted only to wait forever or fail
at once: more than this machine could ever give (local backend), and a project zip without
the entry point. A zip of the project *folder* is unwrapped. The submit page's live check
says the same, through the same functions."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from executors.kubernetes import render
from runs import bundles
from runs.models import CodeBundle, Run, RunEvent, RunState
from runs.submission import ENDPOINT_IS_NOT_A_RUN, SubmissionRefused, check_bundle, check_spec
from tau.spec import load_spec, locate
from tau.spec.samples import SERVE_EXAMPLE
from tests.executors.local.agent_harness import local_quota
from tests.runs.factories import ROOT, TINY_SPEC, cluster_quota, zip_bytes, zip_directory

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/workspaces/alpha/runs/"
GPU_EXAMPLE = ROOT / "examples" / "gpu-quickstart"


@pytest.fixture(autouse=True)
def small_machine(settings: Any, tmp_path: Path) -> None:
    """A machine like a laptop: 2 CPUs, 4Gi, no GPU; bundles under this test's var/."""
    settings.TAU_BACKEND = "local"
    settings.TAU_LOCAL_CPUS = 2
    settings.TAU_LOCAL_MEMORY = "4Gi"
    settings.TAU_LOCAL_GPUS = 0
    settings.VAR_DIR = tmp_path


def post(world: Any, spec: bytes, bundle: bytes | None = None, who: str = "researcher") -> Any:
    payload: dict[str, Any] = {"spec": SimpleUploadedFile("tau.yaml", spec)}
    if bundle is not None:
        payload["bundle"] = SimpleUploadedFile("project.zip", bundle)
    return world.api_client_for(who).post(RUNS, payload, format="multipart")


def tiny(compute: str, entrypoint: str = "main.py") -> bytes:
    return (
        "schema_version: 1\nname: sized\nrun:\n"
        f"  entrypoint: {entrypoint}\n  workload_kind: job\ncompute:\n{compute}"
    ).encode()


MAIN = zip_bytes({"main.py": "print('hi')\n"})


def by_path(response: Any) -> dict[str, dict[str, Any]]:
    assert response.status_code == 400, response.content
    return {problem["path"]: problem for problem in response.json()["problems"]}


def stored_bundles(var_dir: Path) -> list[Path]:
    return sorted((var_dir / "bundles").rglob("*.zip")) if (var_dir / "bundles").exists() else []


# ---------------------------------------------------------------------------------------------
# More than this machine could ever give
# ---------------------------------------------------------------------------------------------


def test_a_gpu_run_on_a_machine_without_gpus_is_refused_at_compute_gpus(
    world: Any, tmp_path: Path
) -> None:
    spec = tiny("  gpus: 1\n  cpus: 1\n  memory: 1Gi\n")
    problems = by_path(post(world, spec, MAIN))
    gpus = problems["compute.gpus"]
    assert gpus["message"] == (
        "The run needs 1 GPU, but this machine has 0 GPUs (TAU_LOCAL_GPUS); runs that need "
        "GPUs must go to a cluster."
    )
    assert (gpus["line"], gpus["column"]) == (7, 3)  # the `gpus:` key in the file
    assert Run.objects.for_workspace(world.alpha).count() == 0
    assert stored_bundles(tmp_path) == []


def test_more_cpus_or_memory_than_the_machine_has_is_refused(world: Any) -> None:
    problems = by_path(post(world, tiny("  cpus: 3\n  memory: 1Gi\n"), MAIN))
    assert set(problems) == {"compute.cpus"}
    assert problems["compute.cpus"]["message"] == (
        "The run needs 3 CPUs at once, but this machine has 2 (TAU_LOCAL_CPUS); ask for at "
        "most 2 in total."
    )
    problems = by_path(post(world, tiny("  cpus: 1\n  memory: 6Gi\n"), MAIN))
    assert set(problems) == {"compute.memory"}
    assert "this machine has 4Gi (TAU_LOCAL_MEMORY)" in problems["compute.memory"]["message"]
    # Every worker's share counts: 3 workers of 1 CPU are 3 CPUs at once on one machine.
    problems = by_path(post(world, tiny("  cpus: 1\n  memory: 1Gi\n  workers: 3\n"), MAIN))
    assert "needs 3 CPUs at once" in problems["compute.cpus"]["message"]


def test_what_fits_the_machine_is_accepted_and_waits_for_quota_as_before(world: Any) -> None:
    """Demand the machine can meet but the workspace's quota cannot meet *now* still queues."""
    local_quota(world.alpha, cpu="2")
    spec = tiny("  cpus: 2\n  memory: 1Gi\n")
    first = post(world, spec, MAIN)
    second = post(world, spec, MAIN)
    assert (first.status_code, second.status_code) == (201, 201)
    assert Run.objects.for_workspace(world.alpha).filter(state=RunState.PENDING).count() == 2


def test_the_gpu_example_leads_with_the_machine_having_no_gpu(world: Any) -> None:
    response = post(world, (GPU_EXAMPLE / "tau.yaml").read_bytes(), zip_directory(GPU_EXAMPLE))
    assert response.status_code == 400
    problems = response.json()["problems"]
    # The first thing said is the real reason; quota and size problems follow.
    assert problems[0]["path"] == "compute.gpus"
    assert "this machine has 0 GPUs" in problems[0]["message"]
    assert [p["path"] for p in problems[1:]].count("compute.cpus") >= 1


def test_a_machine_with_gpus_takes_gpu_runs(world: Any, settings: Any) -> None:
    settings.TAU_LOCAL_GPUS = 2
    assert post(world, tiny("  gpus: 2\n  cpus: 1\n  memory: 1Gi\n"), MAIN).status_code == 201
    spec = tiny("  gpus: 3\n  cpus: 1\n  memory: 1Gi\n")
    problems = by_path(post(world, spec, MAIN))
    assert "this machine has 2 (TAU_LOCAL_GPUS)" in problems["compute.gpus"]["message"]


def test_the_rule_is_the_agent_s_rule(world: Any, settings: Any) -> None:
    """One wording for submission and for a queued run the machine shrank under."""
    from executors.local.agent.admission import machine_capacity, never_fits
    from runs.policy import requested_totals

    spec = load_spec(tiny("  cpus: 3\n  memory: 1Gi\n"))
    with pytest.raises(SubmissionRefused) as refused:
        check_spec(tiny("  cpus: 3\n  memory: 1Gi\n"), workspace=world.alpha)
    (problem,) = refused.value.problems
    assert problem.message == never_fits(requested_totals(spec), machine_capacity())["cpu"]


def test_on_kubernetes_the_local_machine_does_not_count(world: Any, settings: Any) -> None:
    settings.TAU_LOCAL_GPUS = 0
    cluster_quota(world.alpha)
    spec = tiny("  gpus: 1\n  cpus: 1\n  memory: 1Gi\n")
    placement = check_spec(spec, workspace=world.alpha, backend="kubernetes")
    assert placement.spec.compute.gpus == 1


# ---------------------------------------------------------------------------------------------
# The project zip and the entry point
# ---------------------------------------------------------------------------------------------


def folder_zip(folder: str, files: dict[str, str], *, macos: bool = False) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(zipfile.ZipInfo(f"{folder}/"), b"")
        for name, content in files.items():
            archive.writestr(f"{folder}/{name}", content)
            if macos:
                archive.writestr(f"__MACOSX/{folder}/._{name}", b"\x00\x05\x16\x07resource")
    return buffer.getvalue()


def unpacked(run: Run, tmp_path: Path) -> set[str]:
    assert run.bundle is not None
    target = tmp_path / f"unpacked-{run.pk}"
    bundles.unpack(run.bundle.sha256, target)
    return {str(path.relative_to(target)) for path in target.rglob("*") if path.is_file()}


@pytest.mark.parametrize("macos", [False, True], ids=["zip", "finder-zip"])
def test_a_zip_of_the_project_folder_is_unwrapped(world: Any, tmp_path: Path, macos: bool) -> None:
    upload = folder_zip(
        "my-project", {"main.py": "print('hi')\n", "lib/util.py": "X = 1\n"}, macos=macos
    )
    response = post(world, TINY_SPEC, upload)
    assert response.status_code == 201, response.json()
    run = Run.objects.for_workspace(world.alpha).get(name=response.json()["name"])
    # What runs is the folder's contents: main.py at the top, no folder, no Finder forks.
    assert unpacked(run, tmp_path) == {"main.py", "lib/util.py"}
    assert run.bundle is not None
    assert run.bundle.file_count == 2
    submitted = RunEvent.objects.for_workspace(world.alpha).get(run=run, seq=1)
    assert "my-project/" in submitted.message
    assert submitted.data["unwrapped_folder"] == "my-project"
    # The same upload again is the same stored bundle (unwrapping is deterministic).
    again = post(world, TINY_SPEC, upload)
    assert again.status_code == 201
    assert CodeBundle.objects.for_workspace(world.alpha).count() == 1
    assert len(stored_bundles(tmp_path)) == 1


def test_a_folder_the_entry_point_names_is_kept(world: Any, tmp_path: Path) -> None:
    upload = folder_zip("src", {"main.py": "print('hi')\n"})
    response = post(world, tiny("  cpus: 1\n  memory: 1Gi\n", "src/main.py"), upload)
    assert response.status_code == 201, response.json()
    run = Run.objects.for_workspace(world.alpha).get(name=response.json()["name"])
    assert unpacked(run, tmp_path) == {"src/main.py"}
    assert (
        "unwrapped_folder"
        not in RunEvent.objects.for_workspace(world.alpha).get(run=run, seq=1).data
    )


def test_an_entry_point_missing_from_the_zip_is_refused_with_where_it_is(
    world: Any, tmp_path: Path
) -> None:
    project = {"scripts/main.py": "print(1)\n", "README.md": "# mine\n"}
    problems = by_path(post(world, TINY_SPEC, zip_bytes(project)))
    entry = problems["run.entrypoint"]
    assert entry["message"] == "names main.py, which is not in the project zip."
    assert entry["hint"] == "the zip has scripts/main.py; set run.entrypoint to scripts/main.py"
    assert (entry["line"], entry["column"]) == (4, 3)
    problems = by_path(post(world, TINY_SPEC, zip_bytes({"a.py": "", "b.py": "", "README": ""})))
    assert problems["run.entrypoint"]["hint"] == "the zip holds README, a.py, b.py"
    assert Run.objects.for_workspace(world.alpha).count() == 0
    assert stored_bundles(tmp_path) == []
    assert list((tmp_path / "bundles").iterdir()) == []  # no staged upload left behind


def test_a_script_without_any_zip_is_refused_here(world: Any) -> None:
    problems = by_path(post(world, TINY_SPEC))
    assert problems["run.entrypoint"]["hint"] == "add the project zip, with main.py in it"
    assert "no project zip was given" in problems["run.entrypoint"]["message"]
    # A command line needs no zip: it runs what the machine has.
    command = tiny("  cpus: 1\n  memory: 1Gi\n", "python -c 'print(1)'")
    assert post(world, command).status_code == 201


def test_spec_and_bundle_problems_are_reported_together(world: Any) -> None:
    spec = TINY_SPEC.replace(b"cpus: 1", b"cpus: 9")
    problems = by_path(post(world, spec, b"not a zip at all"))
    assert set(problems) == {"compute.cpus", "bundle"}


def test_bundle_listing_finds_the_one_folder() -> None:
    listing = bundles.BundleListing.from_names(
        ["proj/", "proj/a.py", "proj/sub/b.py", "__MACOSX/proj/._a.py"]
    )
    assert listing.wrapper == "proj"
    assert listing.files == {"proj/a.py", "proj/sub/b.py"}
    assert bundles.BundleListing.from_names(["proj/a.py", "top.py"]).wrapper is None
    assert bundles.BundleListing.from_names(["a/x.py", "b/y.py"]).wrapper is None
    # Names the full check refuses are never part of a listing.
    odd = bundles.BundleListing.from_names(["../x.py", "/etc/passwd", "ok.py"])
    assert odd.files == {"ok.py"}


def test_check_bundle_without_a_listing_depends_on_the_backend(world: Any) -> None:
    spec = load_spec(TINY_SPEC)
    problems, unwrap = check_bundle(spec, None, source=TINY_SPEC, backend="local")
    assert [p.path for p in problems] == ["run.entrypoint"]
    assert unwrap is None
    # On a cluster the script may come in the image.
    assert check_bundle(spec, None, source=TINY_SPEC, backend="kubernetes") == ([], None)


def test_locate_points_at_keys_and_falls_back_to_the_block() -> None:
    source = b"schema_version: 1\nname: x\nrun:\n  entrypoint: a.py\n  args: [p, q]\n"
    source += b"compute:\n  cpus: 1\n"
    assert locate(source, "run.entrypoint") == (4, 3)
    assert locate(source, "run.args[1]") == (5, 13)
    assert locate(source, "compute.gpus") == (6, 1)  # not written: its block
    assert locate(source, "queue.priority") is None
    assert locate(b"{{{{ not yaml", "run") is None


# ---------------------------------------------------------------------------------------------
# The live check and the page (without JavaScript)
# ---------------------------------------------------------------------------------------------


def validate(world: Any, spec: bytes, **fields: str) -> str:
    client = world.client_for("researcher")
    response = client.post(
        reverse("run-validate", args=["alpha"]), {"spec_text": spec.decode(), **fields}
    )
    assert response.status_code == 200
    return str(response.content.decode())


def test_the_live_check_refuses_what_submission_refuses(world: Any) -> None:
    html = validate(
        world,
        tiny("  gpus: 1\n  cpus: 1\n  memory: 1Gi\n"),
        bundle_status="read",
        bundle_files="main.py",
    )
    assert "runs that need GPUs must go to a cluster" in html
    assert "Looks good" not in html
    assert "data-blocking" in html
    listing = "scripts/main.py\nREADME.md"
    html = validate(world, TINY_SPEC, bundle_status="read", bundle_files=listing)
    assert "not in the project zip" in html
    assert "scripts/main.py" in html
    html = validate(world, TINY_SPEC)  # no zip chosen yet
    assert "no project zip was given" in html


def test_the_live_check_previews_what_really_happens_here(world: Any) -> None:
    # Browsers send the listing's line breaks as CRLF.
    html = validate(
        world, TINY_SPEC, bundle_status="read", bundle_files="proj/\r\nproj/main.py\r\nproj/x.py"
    )
    assert "Looks good" in html
    assert "the folder is unwrapped" in html
    assert "proj/" in html
    assert "This machine&#x27;s Python" in html or "This machine's Python" in html
    assert "Image" not in html  # local runs use no image
    html = validate(world, TINY_SPEC, bundle_status="unread")
    assert "checked when you submit" in html


def test_a_refused_page_submission_keeps_the_text_and_asks_for_the_zip_again(
    world: Any,
) -> None:
    client = world.client_for("researcher")
    response = client.post(
        reverse("run-submit", args=["alpha"]),
        {
            "spec_text": TINY_SPEC.decode(),
            "bundle": SimpleUploadedFile("mine.zip", zip_bytes({"other.py": ""})),
        },
    )
    assert response.status_code == 400
    html = response.content.decode()
    assert "Choose the project zip again" in html
    assert "mine.zip" in html
    assert "name: tiny" in html  # the spec text is kept
    assert "Not submitted" in html


def test_an_htmx_submission_answers_with_problems_or_a_redirect(world: Any) -> None:
    client = world.client_for("researcher")
    url = reverse("run-submit", args=["alpha"])
    refused = client.post(url, {"spec_text": TINY_SPEC.decode()}, headers={"HX-Request": "true"})
    assert refused.status_code == 400
    assert "<html" not in refused.content.decode()  # only the check's fragment
    assert "no project zip was given" in refused.content.decode()
    accepted = client.post(
        url,
        {
            "spec_text": TINY_SPEC.decode(),
            "bundle": SimpleUploadedFile("p.zip", MAIN),
        },
        headers={"HX-Request": "true"},
    )
    assert accepted.status_code == 204
    run = Run.objects.for_workspace(world.alpha).get()
    assert accepted["HX-Redirect"] == f"/w/alpha/runs/{run.name}/"


# ---------------------------------------------------------------------------------------------
# What only a cluster gives: a data volume, and (for now) sweeps
# ---------------------------------------------------------------------------------------------


def test_a_data_volume_is_refused_here_with_a_hint(world: Any, tmp_path: Path) -> None:
    spec = tiny("  cpus: 1\n  memory: 1Gi\n") + b"storage:\n  data_pvc: datasets\n"
    problems = by_path(post(world, spec, MAIN))
    assert set(problems) == {"storage.data_pvc"}
    problem = problems["storage.data_pvc"]
    assert "the data volume datasets is a Kubernetes PersistentVolumeClaim" in problem["message"]
    assert "keep the data in the project folder" in problem["message"]
    assert (problem["line"], problem["column"]) == (10, 3)  # the `data_pvc:` key
    assert Run.objects.for_workspace(world.alpha).count() == 0
    assert stored_bundles(tmp_path) == []


def test_a_sweep_is_taken_here_and_on_kubernetes(world: Any) -> None:
    local_quota(world.alpha)
    spec = (
        b"schema_version: 1\nname: sweep\nrun: {entrypoint: main.py}\n"
        b"compute: {cpus: 1, memory: 1Gi}\n"
        b"execution: {launcher: ray-tune, metric: loss, configs: {lr: [0.1, 0.01]}}\n"
    )
    response = post(world, spec, MAIN)
    assert response.status_code == 201, response.content
    assert render.kubernetes_problems(load_spec(spec)) == []


def test_a_reference_direct_config_is_accepted_and_stored_in_normal_form(world: Any) -> None:
    local_quota(world.alpha)
    spec = (
        b"name: direct-job\nengine: job\nentrypoint: main.py\n"
        b"compute:\n  cpu_request: 250m\n  memory_request: 64Mi\n"
        b"experiment: {project: Tau Local, name: smoke, group: local}\n"
        b"policy: {namespace: ray}\n"
    )
    response = post(world, spec, MAIN)
    assert response.status_code == 201, response.content
    run = Run.objects.for_workspace(world.alpha).get()
    stored = run.spec
    assert stored["run"]["workload_kind"] == "job"
    assert (stored["compute"]["cpus"], stored["compute"]["memory"]) == ("250m", "64Mi")
    assert stored["resilience"]["max_retries"] == 0
    assert stored["experiment"]["name"] == "smoke"
    # Policy filled in what the file left to the workspace; the rest is the file's meaning.
    assert stored["experiment"] == {
        "project": "Tau Local",
        "group": "local",
        "tags": [],
        "name": "smoke",
    }


def test_a_problem_found_after_the_schema_points_where_a_direct_config_says_it(
    world: Any,
) -> None:
    """The machine's no-GPU refusal is about compute.gpus; a direct RayJob writes that as
    compute.gpus_per_worker, and the problem is put there, with its line."""
    spec = (
        b"name: direct-gpu\nengine: rayjob\nentrypoint: main.py\ncompute:\n"
        b"  workers: 2\n  gpus_per_worker: 1\n  cpu_request: 1\n  memory_request: 1Gi\n"
    )
    problems = by_path(post(world, spec, MAIN))
    assert "compute.gpus_per_worker" in problems, problems
    gpus = problems["compute.gpus_per_worker"]
    assert "this machine has 0 GPUs" in gpus["message"]
    assert (gpus["line"], gpus["column"]) == (6, 3)


def test_the_live_check_says_how_the_file_was_read_and_what_it_ignores(world: Any) -> None:
    local_quota(world.alpha)
    direct = (
        b"name: direct-cpu\nengine: rayjob\nentrypoint: main.py\n"
        b"compute:\n  workers: 3\n  gpus_per_worker: 0\n  cpu_request: 250m\n"
        b"  memory_request: 256Mi\nmetrics:\n  offload: {enabled: true}\n"
    )
    html = validate(world, direct, bundle_status="read", bundle_files="main.py")
    assert "Looks good" in html, html
    reading = html[html.index('id="spec-reading"') :]
    assert reading.startswith('id="spec-reading">direct run config: 1 head + 2 workers, 0 GPUs')
    warnings = html[html.index('id="spec-warnings"') :]
    warnings = warnings[: warnings.index("</ul>")]
    assert '<span class="mono">line 10</span> <span class="mono">metrics.offload</span>' in warnings
    assert "Azure Data Explorer" in warnings
    # A TauGrid file says so, and has nothing ignored.
    html = validate(world, TINY_SPEC, bundle_status="read", bundle_files="main.py")
    assert 'id="spec-reading">TauGrid tau.yaml v1: Job, 1 pod, 0 GPUs' in html
    assert 'id="spec-warnings"' not in html


# ---------------------------------------------------------------------------------------------
# Endpoints are not runs
# ---------------------------------------------------------------------------------------------

ENDPOINT_SPEC = SERVE_EXAMPLE.encode()


def test_an_endpoint_spec_is_refused_as_a_run_with_where_to_deploy_it(
    world: Any, tmp_path: Path
) -> None:
    local_quota(world.alpha)
    response = post(world, ENDPOINT_SPEC, zip_bytes({"app.py": "app = None\n"}))
    problems = by_path(response)
    assert set(problems) == {"run.workload_kind"}
    problem = problems["run.workload_kind"]
    assert problem["message"] == ENDPOINT_IS_NOT_A_RUN
    assert problem["message"] == (
        "this tau.yaml describes an endpoint; deploy it with `tau serve deploy`"
    )
    assert (problem["line"], problem["column"]) == (4, 3)  # the `workload_kind:` key
    assert Run.objects.for_workspace(world.alpha).count() == 0
    assert stored_bundles(tmp_path) == []


@pytest.mark.parametrize("backend", ["local", "kubernetes"])
def test_no_backend_takes_an_endpoint_as_a_run(world: Any, backend: str) -> None:
    cluster_quota(world.alpha)
    local_quota(world.alpha)
    with pytest.raises(SubmissionRefused) as refused:
        check_spec(ENDPOINT_SPEC, workspace=world.alpha, backend=backend)
    assert [(p.path, p.message) for p in refused.value.problems] == [
        ("run.workload_kind", ENDPOINT_IS_NOT_A_RUN)
    ]


def test_the_live_check_says_an_endpoint_is_deployed(world: Any) -> None:
    html = validate(world, ENDPOINT_SPEC, bundle_status="read", bundle_files="app.py")
    assert "this tau.yaml describes an endpoint" in html
    assert "tau serve deploy" in html
    assert "Looks good" not in html
