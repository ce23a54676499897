"""The submit page in a real browser: a run no machine here could ever start is refused as
you type, Submit waits while the check shows problems (and the problems sit above it on a
phone), a refused submission keeps the chosen files, and the zip of a project *folder* is
unwrapped and runs."""

from __future__ import annotations

import io
import re
import stat
import zipfile
from pathlib import Path
from typing import Any

import pytest

from runs.models import Run, RunState
from tests.executors.local.agent_harness import Agent, wait_until
from tests.pages.browser_support import check_page, log_in, watch_console
from tests.runs.factories import ROOT, TINY_SPEC

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

EXAMPLE = ROOT / "examples" / "cpu-quickstart"
SUBMIT = "/w/alpha/runs/new/"

SPEC = TINY_SPEC.decode()  # main.py, 1 CPU


def write_zip(path: Path, files: dict[str, str], *, symlink: str | None = None) -> Path:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in files.items():
            archive.writestr(name, content)
        if symlink is not None:
            link = zipfile.ZipInfo(symlink)
            link.create_system = 3
            link.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(link, "/etc/passwd")
    path.write_bytes(buffer.getvalue())
    return path


def submit_button(page: Any) -> Any:
    return page.get_by_role("button", name="Submit", exact=True)


@pytest.fixture
def submit_page(world: Any, live_server: Any, page: Any, settings: Any, tmp_path: Path) -> Any:
    settings.TAU_BACKEND = "local"
    settings.TAU_LOCAL_GPUS = 0
    settings.TAU_LOCAL_CPUS = 2
    settings.VAR_DIR = tmp_path
    log_in(page.context, live_server.url, world.users["researcher"])
    page.goto(f"{live_server.url}{SUBMIT}")
    return page


def test_a_gpu_run_is_refused_as_you_type_and_submit_waits(
    submit_page: Any, tmp_path: Path
) -> None:
    page = submit_page
    problems = watch_console(page)
    page.set_input_files("#bundle", str(write_zip(tmp_path / "p.zip", {"main.py": "print(1)"})))
    page.fill("#spec-text", SPEC.replace("  cpus: 1", "  gpus: 1\n  cpus: 1"))
    page.wait_for_selector("#validation .problems")
    check = page.inner_text("#validation")
    assert "compute.gpus" in check
    assert "this machine has 0 GPUs (TAU_LOCAL_GPUS); runs that need GPUs must go to a cluster" in (
        check
    )
    assert "Looks good" not in check
    assert submit_button(page).is_disabled()
    assert page.is_visible("#submit-blocked")
    check_page(page, "submit-refused")
    # On a phone the problems come before the button that cannot be pressed yet.
    page.set_viewport_size({"width": 390, "height": 900})
    problems_box = page.locator("#validation .problems").bounding_box()
    button_box = submit_button(page).bounding_box()
    assert problems_box["y"] + problems_box["height"] <= button_box["y"]
    page.set_viewport_size({"width": 1280, "height": 900})
    # Fixed: the check passes and Submit can be pressed again.
    page.fill("#spec-text", SPEC)
    page.wait_for_selector("#validation .ok-text")
    assert submit_button(page).is_enabled()
    assert not page.is_visible("#submit-blocked")
    assert problems == []


def test_a_refused_submission_keeps_the_chosen_files(
    submit_page: Any, world: Any, tmp_path: Path
) -> None:
    page = submit_page
    problems = watch_console(page)
    # A symbolic link is only seen by the server's full check, at submission.
    bad = write_zip(tmp_path / "linked.zip", {"main.py": "print(1)"}, symlink="data")
    page.set_input_files("#bundle", str(bad))
    page.fill("#spec-text", SPEC)
    page.wait_for_selector("#validation .ok-text")
    submit_button(page).click()
    page.wait_for_selector("#validation .problems")
    check = page.inner_text("#validation")
    assert "Not submitted" in check
    assert "symbolic link" in check
    assert page.url.endswith(SUBMIT)
    assert page.eval_on_selector("#bundle", "input => input.files[0].name") == "linked.zip"
    assert page.input_value("#spec-text") == SPEC
    assert Run.objects.for_workspace(world.alpha).count() == 0
    # Choosing a good zip checks again and lets the same text go through.
    good = write_zip(tmp_path / "good.zip", {"main.py": "print(1)"})
    page.set_input_files("#bundle", str(good))
    page.wait_for_selector("#validation .ok-text")
    assert submit_button(page).is_enabled()
    submit_button(page).click()
    page.wait_for_url(re.compile(r"/w/alpha/runs/tiny-[a-z0-9]{6}/$"))
    assert Run.objects.for_workspace(world.alpha).count() == 1
    assert problems == []


def test_an_entry_point_missing_from_the_zip_is_said_before_submitting(
    submit_page: Any, tmp_path: Path
) -> None:
    page = submit_page
    page.fill("#spec-text", SPEC)
    page.set_input_files(
        "#bundle", str(write_zip(tmp_path / "w.zip", {"src/main.py": "", "README.md": ""}))
    )
    # (A check of the text alone, without the zip, may come first: wait for this one.)
    page.locator("#validation").get_by_text("not in the project zip").wait_for()
    assert "set run.entrypoint to src/main.py" in page.inner_text("#validation")
    assert submit_button(page).is_disabled()


def test_a_zip_of_the_project_folder_is_unwrapped_and_runs(
    world: Any, live_server: Any, machine: Agent, page: Any, tmp_path: Path
) -> None:
    problems = watch_console(page)
    folder = {f"cpu-quickstart/{f.name}": f.read_text() for f in EXAMPLE.iterdir() if f.is_file()}
    archive = write_zip(tmp_path / "cpu-quickstart.zip", folder)
    log_in(page.context, live_server.url, world.users["researcher"])
    page.goto(f"{live_server.url}{SUBMIT}")
    text = (EXAMPLE / "tau.yaml").read_text().replace("[--steps, 1500]", "[--steps, 200]")
    page.set_input_files("#bundle", str(archive))
    page.fill("#spec-text", text)
    page.wait_for_selector("#validation .ok-text")
    preview = page.inner_text("#validation")
    assert "cpu-quickstart/" in preview
    assert "the folder is unwrapped" in preview
    # Local runs use this machine's Python, not the spec's image: the preview says so, and
    # that the image the spec names is not used here.
    assert "This machine's Python" in preview
    assert "not the image python:3.12-slim that tau.yaml names" in preview
    submit_button(page).click()
    page.wait_for_url(re.compile(r"/w/alpha/runs/cpu-quickstart-[a-z0-9]{6}/$"))
    run = Run.objects.for_workspace(world.alpha).get()
    wait_until(
        lambda: Run.objects.unscoped().get(pk=run.pk).state == RunState.SUCCEEDED,
        timeout=120,
        what="the unwrapped project to run to the end",
        agent=machine,
    )
    assert problems == []


def test_the_check_says_every_problem_at_once_and_what_is_ignored_here(
    submit_page: Any, world: Any, tmp_path: Path
) -> None:
    """A typo elsewhere no longer hides that the run could never start here (it was said
    only once the typo was fixed); a field the machine refuses is not refused again in the
    quota's words; and the environment says that the image tau.yaml names is not used on
    this machine."""
    from decimal import Decimal

    from workspaces.models import ResourceFlavor, WorkspaceQuota

    page = submit_page
    # A quota smaller than the machine (alpha is in a cohort: leave it for beta's rules).
    world.alpha.cohort = None
    world.alpha.save()
    local, _ = ResourceFlavor.objects.get_or_create(name="local")
    WorkspaceQuota.objects.create(
        workspace=world.alpha, flavor=local, resource="cpu", nominal=Decimal(1)
    )
    WorkspaceQuota.objects.create(
        workspace=world.alpha, flavor=local, resource="memory", nominal=Decimal(2**31)
    )
    typo = SPEC.replace("cpus: 1", "cpus: 3").replace("name: tiny", "name: Tiny Run")
    page.fill("#spec-text", typo)
    page.wait_for_selector("#validation .problems")
    problems = page.locator("#validation .problems li").all_inner_texts()
    assert any(problem.startswith("line 2") and "name" in problem for problem in problems)
    cpus = [problem for problem in problems if "compute.cpus" in problem]
    assert len(cpus) == 1, problems  # said once, in the machine's words
    assert "this machine has 2 (TAU_LOCAL_CPUS)" in cpus[0]

    page.fill("#spec-text", SPEC.replace("cpus: 1", "cpus: 3"))
    page.wait_for_function(
        "() => !document.querySelector('#validation').textContent.includes('line 2')"
    )
    problems = page.locator("#validation .problems li").all_inner_texts()
    assert [problem for problem in problems if "compute.cpus" in problem] == cpus, problems
    assert len(problems) == 1, problems

    page.set_input_files("#bundle", str(write_zip(tmp_path / "p.zip", {"main.py": "print(1)\n"})))
    page.fill("#spec-text", SPEC + "runtime:\n  image: python:3.12-slim\n")
    page.wait_for_selector("#validation .ok-text")
    environment = page.inner_text("#check-environment")
    assert "not the image python:3.12-slim" in environment, environment
    assert "runtime.image is ignored here" in environment, environment
    check_page(page, "submit-image-ignored")


def test_a_submission_past_the_limit_says_when_to_try_again(
    submit_page: Any, world: Any, live_server: Any, tmp_path: Path, settings: Any, monkeypatch: Any
) -> None:
    """Issue 30: submissions are limited per token (the pages count as one); the page says so
    where the check is (a 429 htmx swaps in), and keeps what was chosen."""
    from portal import rate_limits

    settings.TAU_SUBMISSIONS_PER_MINUTE = 1
    monkeypatch.setattr(rate_limits, "clock", lambda: 1_899_999_990.0)  # one window
    page = submit_page
    problems = watch_console(page)
    project = write_zip(tmp_path / "p.zip", {"main.py": "print(1)"})
    page.set_input_files("#bundle", str(project))
    page.fill("#spec-text", SPEC)
    page.wait_for_selector("#validation .ok-text")
    submit_button(page).click()
    page.wait_for_url(re.compile(r"/w/alpha/runs/tiny-[a-z0-9]{6}/$"))

    page.goto(f"{live_server.url}{SUBMIT}")
    page.set_input_files("#bundle", str(project))
    page.fill("#spec-text", SPEC)
    page.wait_for_selector("#validation .ok-text")
    submit_button(page).click()
    page.locator("#validation").get_by_text("More than 1 submissions a minute").wait_for()
    check = page.inner_text("#validation")
    assert "Not submitted" in check
    assert "this run was not submitted. Try again in 30 seconds." in check
    assert page.eval_on_selector("#bundle", "input => input.files[0].name") == "p.zip"
    assert Run.objects.for_workspace(world.alpha).count() == 1
    assert problems == []
