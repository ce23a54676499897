"""The run page in a real browser: switching between attempts' logs, following the newest
while the run is live, the Raw link downloading the chosen attempt's log as text, and words
for people instead of codes; checked with axe-core at both widths."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from executors.kubernetes.backend import KeptLogs
from runs import attempts, state
from runs.models import Backend, Run, RunState
from tests.pages.browser_support import check_page, log_in, watch_console
from tests.runs.factories import cluster_quota, make_run
from tests.runs.histories import RETRYING, storied_run, write_log

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LEAKS = ("manual_resume", "user_error", "cancel-requested")


def log_text(page: Any) -> str:
    return str(page.eval_on_selector("#log", "el => el.textContent"))


def wait_for_log(page: Any, text: str) -> None:
    page.wait_for_function(
        "(text) => document.getElementById('log').textContent.includes(text)", arg=text
    )


def options(page: Any) -> list[str]:
    return [
        str(o).strip()
        for o in page.eval_on_selector_all(
            "#log-attempt option", "els => els.map(e => e.textContent)"
        )
    ]


def test_reading_each_attempt_and_downloading_its_log(
    world: Any, live_server: Any, page: Any, settings: Any, tmp_path: Path
) -> None:
    settings.VAR_DIR = tmp_path / "var"
    (tmp_path / "var").mkdir()
    run = storied_run(world, tmp_path)
    problems = watch_console(page)
    log_in(page.context, live_server.url, world.users["researcher"])
    page.goto(f"{live_server.url}/w/alpha/runs/{run.name}/")

    wait_for_log(page, "third attempt, resumed")
    assert options(page) == ["Attempt 3 (newest)", "Attempt 2", "Attempt 1"]
    assert page.input_value("#log-attempt") == "3"
    assert page.get_attribute("#log-download", "href").endswith("?format=text&attempt=3")
    # The run is over: nothing to follow.
    page.wait_for_function("() => document.getElementById('log-follow').disabled")

    page.select_option("#log-attempt", "2")
    wait_for_log(page, "Traceback: boom")
    assert "third attempt" not in log_text(page)
    assert page.get_attribute("#log", "aria-label") == "Log of attempt 2"
    assert page.url.endswith("?attempt=2")
    href = page.get_attribute("#log-download", "href")
    assert href.endswith("?format=text&attempt=2")

    # "Raw" downloads that attempt's whole log as text.
    with page.expect_download() as download_info:
        page.click("#log-download")
    download = download_info.value
    assert download.suggested_filename == f"{run.name}-attempt-2.log"
    assert Path(download.path()).read_text() == "second attempt\nTraceback: boom\n"
    raw = page.context.request.get(f"{live_server.url}{href}")
    assert raw.headers["content-type"] == "text/plain; charset=utf-8"

    # Attempt 1 wrote nothing, and its hint does not send the reader to an empty log.
    page.select_option("#log-attempt", "1")
    page.wait_for_function("() => document.getElementById('log').textContent === ''")
    assert "before writing anything to its log" in page.inner_text(".attempts")

    # The attempts list's "log" link switches back, in place.
    page.evaluate("window.__sameDocument = true")
    page.get_by_role("link", name="log of attempt 3").click()
    wait_for_log(page, "third attempt, resumed")
    assert page.input_value("#log-attempt") == "3"
    assert page.url.endswith(f"/runs/{run.name}/")
    assert page.evaluate("window.__sameDocument === true"), "the page reloaded"

    # Words, not codes.
    shown = page.inner_text("#run-live")
    for code in LEAKS:
        assert code not in shown
    assert not re.search(r"cancelled\s*→\s*cancelled", shown, flags=re.IGNORECASE)
    assert page.inner_text(".state-reason") == "Cancelled by rob."
    assert "Resumed on request" in shown
    check_page(page, "run-attempts")

    # Opened at an older attempt (a link, or without JavaScript), it shows that one.
    page.goto(f"{live_server.url}/w/alpha/runs/{run.name}/?attempt=2")
    wait_for_log(page, "Traceback: boom")
    assert page.input_value("#log-attempt") == "2"
    assert problems == []


def test_following_the_newest_attempt_while_reading_an_older_one(
    world: Any, live_server: Any, page: Any, settings: Any, tmp_path: Path
) -> None:
    settings.VAR_DIR = tmp_path / "var"
    (tmp_path / "var").mkdir()
    spec = RETRYING.replace(b"max_retries: 1", b"max_retries: 3")
    run = state.transition(make_run(world, spec=spec), RunState.QUEUED)
    first = attempts.admit_attempt(run=run)
    write_log(first, tmp_path, "first attempt\n")
    attempts.attempt_running(attempt=first)
    run = attempts.finish_attempt(
        attempt=first,
        outcome=attempts.AttemptOutcome(succeeded=False, exit_code=1, failure_class="user_error"),
    )
    second = attempts.admit_attempt(run=run)
    write_log(second, tmp_path, "second attempt: step 1\n")
    attempts.attempt_running(attempt=second)
    second_log = Path(second.log_path)

    problems = watch_console(page)
    log_in(page.context, live_server.url, world.users["researcher"])
    page.goto(f"{live_server.url}/w/alpha/runs/{run.name}/")
    wait_for_log(page, "second attempt: step 1")
    assert options(page) == ["Attempt 2 (newest)", "Attempt 1"]
    assert page.inner_text("#log-follow") == "Following"
    with second_log.open("a") as handle:
        handle.write("second attempt: step 2\n")
    wait_for_log(page, "second attempt: step 2")

    # An older attempt is read once, complete; the newest goes on meanwhile.
    page.select_option("#log-attempt", "1")
    wait_for_log(page, "first attempt")
    assert page.is_disabled("#log-follow")
    with second_log.open("a") as handle:
        handle.write("second attempt: step 3\n")
    page.wait_for_timeout(3000)  # longer than a poll: nothing of the newest comes in
    assert log_text(page) == "first attempt\n"

    # Back to the newest: it is followed again, with what it wrote meanwhile.
    page.select_option("#log-attempt", "2")
    wait_for_log(page, "second attempt: step 3")
    assert page.inner_text("#log-follow") == "Following"
    with second_log.open("a") as handle:
        handle.write("second attempt: step 4\n")
    wait_for_log(page, "second attempt: step 4")

    # A new attempt begins: it joins the picker and its log is followed.
    run = attempts.finish_attempt(
        attempt=second,
        outcome=attempts.AttemptOutcome(succeeded=False, exit_code=1, failure_class="user_error"),
    )
    third = attempts.admit_attempt(run=run)
    write_log(third, tmp_path, "third attempt: hello\n")
    attempts.attempt_running(attempt=third)
    wait_for_log(page, "third attempt: hello")
    assert "second attempt" not in log_text(page)
    assert options(page) == ["Attempt 3 (newest)", "Attempt 2", "Attempt 1"]
    assert page.get_attribute("#log-download", "href").endswith("?format=text&attempt=3")
    check_page(page, "run-live-attempts")
    assert problems == []


def test_a_cluster_run_s_log_is_read_pod_by_pod(
    world: Any, live_server: Any, page: Any, settings: Any, tmp_path: Path
) -> None:
    """A Job of two workers on Kubernetes, ended, its pods' logs kept by the watcher as the
    backend keeps them (executors.kubernetes.backend.KeptLogs): worker 0 is shown, and a picker
    offers worker 1. (The keeping itself, from real pods, is tested on the test cluster.)"""
    settings.VAR_DIR = tmp_path / "var"
    settings.TAU_BACKEND = "kubernetes"
    cluster_quota(world.alpha)  # Kubernetes refuses a run whose resources have no quota
    run = state.transition(make_run(world, spec=RETRYING), RunState.QUEUED)
    Run.objects.unscoped().filter(pk=run.pk).update(backend=Backend.KUBERNETES)
    attempt = attempts.admit_attempt(run=fresh_run(run))
    attempts.attempt_running(attempt=attempt)
    attempts.finish_attempt(attempt=attempt, outcome=attempts.AttemptOutcome(succeeded=True))
    pods = [f"{run.name}-a1-0-x1", f"{run.name}-a1-1-y2"]
    kept = tmp_path / "var" / "kube-logs" / str(run.pk) / "attempt-1.log"
    folder = KeptLogs.folder_of(kept)
    folder.mkdir(parents=True)
    (folder / "index.json").write_text(json.dumps({"pods": pods, "not_kept": 0}))
    (folder / f"{pods[1]}.log").write_text("rank 1: ready\n")
    kept.write_text("rank 0: step 100 loss=0.2\n")
    attempts.note_log_kept(attempt_id=attempt.pk, path=str(kept), size=kept.stat().st_size)

    problems = watch_console(page)
    log_in(page.context, live_server.url, world.users["researcher"])
    page.goto(f"{live_server.url}/w/alpha/runs/{run.name}/")
    wait_for_log(page, "rank 0: step 100")
    assert page.is_visible("#log-pod")
    choices = page.eval_on_selector_all("#log-pod option", "els => els.map(e => e.textContent)")
    assert choices == [f"{pods[0]} (default)", pods[1]]

    page.select_option("#log-pod", pods[1])
    wait_for_log(page, "rank 1: ready")
    assert "rank 0" not in log_text(page)
    assert page.get_attribute("#log", "aria-label") == f"Log of attempt 1, pod {pods[1]}"
    href = page.get_attribute("#log-download", "href")
    assert href.endswith(f"?format=text&attempt=1&pod={pods[1]}")
    with page.expect_download() as download_info:
        page.click("#log-download")
    assert Path(download_info.value.path()).read_text() == "rank 1: ready\n"

    page.select_option("#log-pod", pods[0])
    wait_for_log(page, "rank 0: step 100")
    assert "rank 1" not in log_text(page)
    check_page(page, "run-cluster-pods")
    assert problems == []


def fresh_run(run: Run) -> Run:
    return Run.objects.unscoped().get(pk=run.pk)
