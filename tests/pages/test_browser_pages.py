"""The researcher portal in a real browser, against a live server, a real Celery worker and
the real local agent: submit from the browser and watch the run live; cancel; resume from a
checkpoint; what viewers and outsiders get; every page checked with axe-core at 1280 px and
390 px, with screenshots kept as test artifacts."""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runs.models import Checkpoint, Run, RunState
from tests.executors.local.agent_harness import Agent, spec, submit, wait_until
from tests.pages.browser_support import check_page, log_in, watch_console
from tests.runs.factories import ROOT

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

EXAMPLE = ROOT / "examples" / "cpu-quickstart"


def matches(pattern: str) -> Callable[[str], bool]:
    return lambda url: re.search(pattern, url) is not None


def example_zip(tmp_path: Path) -> Path:
    path = tmp_path / "cpu-quickstart.zip"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for file in sorted(EXAMPLE.iterdir()):
            archive.write(file, file.name)
    path.write_bytes(buffer.getvalue())
    return path


def state_badge(page: Any) -> str:
    return str(page.inner_text(".run-state .state")).strip()


def chart_points(page: Any) -> int:
    return int(
        page.evaluate(
            "() => { const c = document.querySelector('#metrics .chart');"
            " return c && c.data ? c.data[0].x.length : 0; }"
        )
    )


def test_researcher_submits_and_watches_a_run_live(
    world: Any, live_server: Any, machine: Agent, page: Any, tmp_path: Path
) -> None:
    problems = watch_console(page)
    log_in(page.context, live_server.url, world.users["researcher"])
    page.goto(f"{live_server.url}/w/alpha/runs/new/")
    # A longer training than the example's default, so the page has time to show it live.
    text = (EXAMPLE / "tau.yaml").read_text().replace("[--steps, 1500]", "[--steps, 6000]")
    page.fill("#spec-text", "name: Broken Name\n")
    page.wait_for_selector("#validation .problems")
    assert "name" in page.inner_text("#validation")
    page.fill("#spec-text", text)
    # The example's train.py comes in the project zip: until it is chosen, the check says so.
    page.locator("#validation").get_by_text("no project zip was given").wait_for()
    page.set_input_files("#bundle", str(example_zip(tmp_path)))
    page.wait_for_selector("#validation .ok-text")
    assert "Looks good" in page.inner_text("#validation")
    check_page(page, "submit")
    page.get_by_role("button", name="Submit", exact=True).click()
    page.wait_for_url(matches(r"/w/alpha/runs/cpu-quickstart-[a-z0-9]{6}/$"))
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads

    wait_until(lambda: state_badge(page) == "Running", timeout=60, what="running", agent=machine)
    page.wait_for_function(
        "() => document.getElementById('log').textContent.includes('step')", timeout=30_000
    )
    page.wait_for_selector("#metrics .chart", timeout=30_000)
    first = chart_points(page)
    wait_until(
        lambda: chart_points(page) > first, timeout=40, what="the chart growing", agent=machine
    )
    check_page(page, "run-running")
    wait_until(
        lambda: state_badge(page) == "Succeeded", timeout=120, what="succeeded", agent=machine
    )
    assert page.evaluate("window.__sameDocument === true"), "the page reloaded"
    page.wait_for_function(
        "() => document.getElementById('log-follow').textContent === 'Finished'", timeout=20_000
    )
    assert "val_accuracy" in page.inner_text("#log") or "accuracy" in page.inner_text("#log")
    # Finished: nothing polls any more once its evidence is sealed and checked (the
    # evidence card follows that, from the worker, for a moment after the run ended).
    page.wait_for_function(
        "() => document.querySelectorAll('[data-poll-url]').length === 0", timeout=60_000
    )
    check_page(page, "run-succeeded")
    assert problems == []


def test_cancel_from_the_run_page(world: Any, live_server: Any, machine: Agent, page: Any) -> None:
    run = submit(
        world,
        spec("sleeper"),
        {"main.py": "import time\nprint('sleeping', flush=True)\ntime.sleep(600)\n"},
    )
    wait_until(
        lambda: Run.objects.unscoped().get(pk=run.pk).state == RunState.RUNNING,
        timeout=60,
        what="running",
        agent=machine,
    )
    log_in(page.context, live_server.url, world.users["researcher"])
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(f"{live_server.url}/w/alpha/runs/{run.name}/")
    page.get_by_role("button", name="Cancel run").click()
    wait_until(
        lambda: state_badge(page) == "Cancelled", timeout=60, what="cancelled", agent=machine
    )
    assert Run.objects.unscoped().get(pk=run.pk).state == RunState.CANCELLED


def test_resume_a_failed_run_from_a_checkpoint(
    world: Any, live_server: Any, machine: Agent, page: Any
) -> None:
    failing = (EXAMPLE / "tau.yaml").read_bytes() + b"\nresilience:\n  max_retries: 0\n"
    failing = failing.replace(b"runtime:\n", b"runtime:\n  env:\n    EXAMPLE_FAIL_AT_STEP: '700'\n")
    run = submit(world, failing, {f.name: f.read_text() for f in EXAMPLE.iterdir() if f.is_file()})
    wait_until(
        lambda: Run.objects.unscoped().get(pk=run.pk).state == RunState.FAILED,
        timeout=120,
        what="failed",
        agent=machine,
    )
    checkpoint = Checkpoint.objects.unscoped().filter(run=run).order_by("-step").first()
    assert checkpoint is not None
    log_in(page.context, live_server.url, world.users["researcher"])
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(f"{live_server.url}/w/alpha/runs/{run.name}/")
    assert "Exited with an error" in page.inner_text("#run-live")
    check_page(page, "run-failed")
    page.locator(f"form:has(input[name=checkpoint][value='{checkpoint.pk}']) button").click()
    wait_until(
        lambda: state_badge(page) == "Succeeded",
        timeout=120,
        what="resumed run succeeding",
        agent=machine,
    )
    page.wait_for_function(
        "(step) => document.getElementById('log')"
        ".textContent.includes('resumed from step ' + step)",
        arg=checkpoint.step,
        timeout=20_000,
    )


def test_viewers_see_no_actions_and_outsiders_nothing(
    world: Any, live_server: Any, page: Any
) -> None:
    run = submit(world, spec("quiet"), {"main.py": "print('hi')\n"})
    log_in(page.context, live_server.url, world.users["viewer"])
    page.goto(f"{live_server.url}/w/alpha/runs/{run.name}/")
    assert page.get_by_role("button", name="Cancel run").count() == 0
    assert page.get_by_role("link", name="Submit a run").count() == 0
    # A forged cancel, with a valid CSRF token (from the page's own logout form), is refused
    # for the viewer's role, not for CSRF.
    status, body = page.evaluate(
        """async (url) => {
            const token = document.querySelector('input[name=csrfmiddlewaretoken]').value;
            const r = await fetch(url, {method: 'POST', headers: {'X-CSRFToken': token}});
            return [r.status, await r.text()]; }""",
        f"/w/alpha/runs/{run.name}/cancel/",
    )
    assert status == 403
    assert "researcher role" in body
    assert Run.objects.unscoped().get(pk=run.pk).state == RunState.QUEUED
    context = page.context.browser.new_context()
    outsider = context.new_page()
    log_in(context, live_server.url, world.users["outsider"])
    response = outsider.goto(f"{live_server.url}/w/alpha/runs/{run.name}/")
    assert response is not None
    assert response.status == 404
    context.close()


def test_every_page_passes_axe_at_both_widths(world: Any, live_server: Any, page: Any) -> None:
    problems = watch_console(page)
    run = submit(world, spec("sample"), {"main.py": "print('hi')\n"})
    admin = world.users["workspace_admin"]
    log_in(page.context, live_server.url, admin)
    pages = {
        "home": "/",
        "workspace": "/w/alpha/",
        "runs": "/w/alpha/runs/",
        "run-queued": f"/w/alpha/runs/{run.name}/",
        "queue": "/w/alpha/queue/",
        "tokens": "/tokens/",
        "profile": "/profile/",
        "workspace-audit": "/w/alpha/audit/",
        "not-found": "/w/nowhere/",
    }
    for name, path in pages.items():
        page.goto(f"{live_server.url}{path}")
        check_page(page, name)
    # The platform team's pages, and a refusal.
    page.context.clear_cookies()
    log_in(page.context, live_server.url, world.users["platform_admin"])
    for name, path in {"platform-queue": "/queue/", "platform-audit": "/audit/"}.items():
        page.goto(f"{live_server.url}{path}")
        check_page(page, name)
    page.context.clear_cookies()
    log_in(page.context, live_server.url, world.users["viewer"])
    response = page.goto(f"{live_server.url}/w/alpha/runs/new/")
    assert response is not None
    assert response.status == 403
    check_page(page, "forbidden")
    page.context.clear_cookies()
    page.goto(f"{live_server.url}/login/")
    check_page(page, "login")
    assert problems == []
