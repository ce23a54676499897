"""Every evidence record of a resumed run can be listed and downloaded (issue 30: only the
newest could, under a name whose suffix looked like a counter): the API lists each ending with
its own download, each file is named after the attempt its ending came after, and each one
verifies as what it sealed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse

from evidence import selectors
from runs import lifecycle
from runs.models import Run, RunState
from runs.state import transition
from tau.evidence.verify import verify_file
from tests.evidence.helpers import export_url, records_of, seal_all
from tests.evidence.test_records import finish
from tests.runs.factories import make_run

pytestmark = pytest.mark.django_db


def resumed_three_times(world: Any, tmp_path: Path) -> Run:
    """A run that failed, then was resumed and cancelled twice: three endings, all sealed."""
    log = tmp_path / "first.log"
    log.write_bytes(b"first attempt\n")
    run = finish(make_run(world), RunState.FAILED, log)
    seal_all(run)
    for _ in range(2):
        resumed = lifecycle.resume_run(run=run, user=world.users["researcher"])
        transition(resumed, RunState.CANCELLED)
        seal_all(run)
    run.refresh_from_db()
    return run


def _saved(response: Any, target: Path) -> Path:
    assert response.status_code == 200, response.content
    target.write_bytes(b"".join(response.streaming_content))
    return target


def test_the_api_lists_every_record_of_a_resumed_run_each_with_its_download(
    world: Any, var_dir: Path, tmp_path: Path
) -> None:
    run = resumed_three_times(world, tmp_path)
    records = records_of(run)
    assert [record.attempt_count for record in records] == [1, 2, 3]
    client = world.api_client_for("viewer")
    listed = client.get(reverse("api:run-evidence-records", args=["alpha", run.name]))
    assert listed.status_code == 200
    endings = listed.json()
    assert [(e["attempts"], e["state"], e["status"]) for e in endings] == [
        (3, "cancelled", "sealed"),
        (2, "cancelled", "sealed"),
        (1, "failed", "sealed"),
    ]
    for ending in endings:
        assert ending["file_name"] == f"{run.name}-attempt-{ending['attempts']}.evidence.tar"
        assert ending["ending_event"] in {record.terminal_seq for record in records}
        response = client.get(ending["download"])
        disposition = response["Content-Disposition"]
        assert disposition == f'attachment; filename="{ending["file_name"]}"'
        report = verify_file(_saved(response, tmp_path / ending["file_name"]))
        assert report.ok, report.problems
        # Each file is the record of its own ending: its attempts and its terminal state.
        assert (report.run["attempts"], report.run["state"]) == (
            ending["attempts"],
            ending["state"],
        )
    # The run's own route gives the present (newest) ending, under the same name as listed.
    newest = client.get(export_url(run))
    assert newest["Content-Disposition"] == f'attachment; filename="{endings[0]["file_name"]}"'
    # An ending that does not exist, or is not sealed, is a plain 404.
    missing = client.get(reverse("api:run-evidence-record", args=["alpha", run.name, 10**6]))
    assert missing.status_code == 404
    assert "lists its records" in missing.json()["detail"]


def test_the_run_page_offers_every_earlier_record_and_a_resumed_run_keeps_them_while_it_runs(
    world: Any, var_dir: Path, tmp_path: Path
) -> None:
    run = resumed_three_times(world, tmp_path)
    client = world.client_for("viewer")
    page = client.get(f"/w/alpha/runs/{run.name}/").content.decode()
    section = page.split('id="evidence"')[1].split("</section>")[0]
    assert f"{run.name}-attempt-3.evidence.tar" in section  # the present ending's
    hrefs = re.findall(r'href="([^"]*/evidence/records/\d+/)"', section)
    assert len(hrefs) == 2  # the two earlier ones, each its own download
    for href, attempts in zip(hrefs, (2, 1), strict=True):
        assert f'download="{run.name}-attempt-{attempts}.evidence.tar"' in section
        assert client.get(href).status_code == 200
    assert "Ended failed after attempt 1" in section

    # Resumed again and running: nothing is being sealed, and every earlier record stays.
    lifecycle.resume_run(run=run, user=world.users["researcher"])
    run.refresh_from_db()
    evidence = selectors.run_evidence(run)
    assert evidence is not None
    assert (evidence.newest, len(evidence.earlier)) == (None, 3)
    section = client.get(f"/w/alpha/runs/{run.name}/").content.decode()
    section = section.split('id="evidence"')[1].split("</section>")[0]
    assert "going again" in section
    assert "data-poll-url" not in section.split(">")[0]
    assert len(re.findall(r"/evidence/records/\d+/", section)) == 3
