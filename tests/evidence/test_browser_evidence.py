"""The run page's evidence section in a real browser, with a real Celery worker sealing and
checking: "Sealing" turns into "Verified" without a reload, the download verifies offline,
and a log changed on disk afterwards is named when someone asks for the check again;
checked with axe-core at both widths."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from evidence import keys, verification
from evidence.models import SealRequest
from runs import lifecycle
from runs.models import RunState
from runs.state import transition
from tau.evidence.keys import load_trusted_keys
from tau.evidence.verify import verify_file
from tests.evidence.helpers import records_of, seal_all
from tests.evidence.test_records import finish
from tests.pages.browser_support import check_page, log_in, watch_console
from tests.runs.factories import make_run
from tests.runs.processes import Portal

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LOG = b"step 1: loss 0.70\nstep 2: loss 0.41\n"


def test_the_evidence_section_follows_sealing_and_checking(
    world: Any, live_server: Any, page: Any, settings: Any, tmp_path: Path
) -> None:
    var_dir = tmp_path / "var"
    var_dir.mkdir()
    settings.VAR_DIR = var_dir
    # The worker generates the signing key under the shared var/; this process reads it there.
    settings.TAU_EVIDENCE_SIGNING_KEY = None
    settings.TAU_EVIDENCE_GENERATED_KEY_PATH = var_dir / "evidence_signing_key.pem"
    settings.TAU_EVIDENCE_PUBLIC_KEYS_FILE = ""
    log = var_dir / "attempt-1.log"
    log.write_bytes(LOG)
    # The run ends; its seal is asked for, and no worker is running yet.
    run = finish(make_run(world), RunState.SUCCEEDED, log)
    problems = watch_console(page)
    log_in(page.context, live_server.url, world.users["researcher"])
    page.goto(f"{live_server.url}/w/alpha/runs/{run.name}/")
    section = page.locator("#evidence")
    assert "Sealing" in section.inner_text()
    assert section.locator("text=Download evidence").count() == 0
    page.evaluate("window.__sameDocument = true")

    worker = Portal(broker_url=settings.CELERY_BROKER_URL, var_dir=var_dir)
    worker.start(web=False, beat=False)
    try:
        # The worker seals, then checks; the section follows without a reload.
        page.wait_for_selector("#evidence .evidence-verified", timeout=60_000)
        assert page.evaluate("window.__sameDocument === true"), "the page reloaded"
        text = section.inner_text()
        assert "Verified" in text
        assert "Sealing" not in text
        check_page(page, "run-evidence")

        with page.expect_download() as download_info:
            section.get_by_role("link", name=f"Download evidence of {run.name}").click()
        exported = Path(download_info.value.path())
        trusted = load_trusted_keys(json.dumps(keys.keyring()).encode())
        report = verify_file(exported, trusted)
        assert report.ok, report.problems
        assert report.trusted is True

        # A byte of the log changes on disk; asked to check again, the page names it.
        log.write_bytes(LOG.replace(b"0.41", b"0.40"))
        section.get_by_role("button", name=f"Check again the evidence of {run.name}").click()
        page.wait_for_selector("#evidence .evidence-problems", timeout=60_000)
        found = page.inner_text("#evidence .evidence-problems")
        assert "Does not verify" in found
        assert "attempts/1/log.txt: SHA-256 does not match" in found
        check_page(page, "run-evidence-problems")
    finally:
        worker.stop()
    assert problems == []


def test_every_record_of_a_resumed_run_is_offered_with_its_own_download(
    world: Any, live_server: Any, page: Any, settings: Any, tmp_path: Path
) -> None:
    """Issue 30: only the newest record of a resumed run could be downloaded, under a name
    whose suffix looked like a counter. The page lists each ending, each record downloads
    under the name of the attempt its ending came after, and each verifies as itself; a
    record that could not be sealed says so, and why."""
    var_dir = tmp_path / "var"
    var_dir.mkdir()
    settings.VAR_DIR = var_dir
    settings.TAU_EVIDENCE_SIGNING_KEY = None
    settings.TAU_EVIDENCE_GENERATED_KEY_PATH = var_dir / "evidence_signing_key.pem"
    settings.TAU_EVIDENCE_PUBLIC_KEYS_FILE = ""
    log = var_dir / "attempt-1.log"
    log.write_bytes(LOG)
    run = finish(make_run(world), RunState.FAILED, log)
    seal_all(run)
    resumed = lifecycle.resume_run(run=run, user=world.users["researcher"])
    transition(resumed, RunState.CANCELLED)
    seal_all(run)
    for record in records_of(run):  # checked, as the worker would after sealing
        assert verification.verify(record.pk) == []
    trusted = load_trusted_keys(json.dumps(keys.keyring()).encode())

    problems = watch_console(page)
    log_in(page.context, live_server.url, world.users["researcher"])
    page.goto(f"{live_server.url}/w/alpha/runs/{run.name}/")
    section = page.locator("#evidence")
    assert "cancelled after attempt 2" in section.inner_text()
    earlier = section.locator(".evidence-earlier li")
    assert earlier.count() == 1
    assert "Ended failed after attempt 1" in earlier.first.inner_text()
    downloads = {
        f"Download evidence of {run.name}": (f"{run.name}-attempt-2.evidence.tar", 2, "cancelled"),
        "Download the evidence of attempt 1": (f"{run.name}-attempt-1.evidence.tar", 1, "failed"),
    }
    for link, (name, attempts, state) in downloads.items():
        with page.expect_download() as download_info:
            section.get_by_role("link", name=link).click()
        download = download_info.value
        assert download.suggested_filename == name
        report = verify_file(Path(download.path()), trusted)
        assert report.ok, report.problems
        assert (report.run["attempts"], report.run["state"]) == (attempts, state)
    check_page(page, "run-evidence-endings")

    # A run whose evidence could not be sealed: said, with the reason, and not polled.
    broken = finish(make_run(world), RunState.FAILED, log)
    SealRequest.objects.unscoped().filter(run=broken).update(
        given_up_at=timezone.now(),
        tries=8,
        last_error="ValueError: 9007199254740993 cannot be held exactly by an IEEE 754 double",
    )
    page.goto(f"{live_server.url}/w/alpha/runs/{broken.name}/")
    alert = page.locator("#evidence [role=alert]")
    assert "could not be sealed" in alert.inner_text()
    assert "cannot be held exactly" in alert.inner_text()
    assert page.locator("#evidence[data-poll-url]").count() == 0
    check_page(page, "run-evidence-not-sealed")
    assert problems == []
