"""The run page as the server draws it: which attempt's log it shows, where "Raw" leads, and
the words it uses for what happened (never the codes). The browser side is in
tests/pages/test_browser_run_page.py."""

from __future__ import annotations

import re
from html import unescape
from pathlib import Path
from typing import Any

import pytest

from runs.models import FailureClass, Run, RunState
from tests.runs.factories import make_run
from tests.runs.histories import storied_run

pytestmark = pytest.mark.django_db

CODES = [
    *(failure.value for failure in FailureClass if "_" in failure.value),
    "manual_resume",
    "cancel-requested",
]


def visible_text(html: str) -> str:
    """Roughly what a person reads (or hears): no tags, scripts or attribute values."""
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S)
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


def seen(html: str) -> str:
    """What the eye reads: without the words only screen readers get."""
    return visible_text(re.sub(r'<span class="visually-hidden">[^<]*</span>', "", html))


def test_the_run_page_speaks_in_words(world: Any, settings: Any, tmp_path: Path) -> None:
    settings.VAR_DIR = tmp_path
    run = storied_run(world, tmp_path)
    html = world.client_for("viewer").get(f"/w/alpha/runs/{run.name}/").content.decode()
    text = visible_text(html)
    for code in CODES:
        assert code not in text, f"{code!r} shows on the page"
    assert "after manual" not in text
    reason = re.search(r'<span class="state-reason">([^<]*)</span>', html)
    assert reason is not None
    assert reason.group(1) == "Cancelled by rob."  # current, not "stopping it"
    assert not re.search(r"\bcancelled → cancelled\b", text, flags=re.I)
    # The current reason, the timeline and the attempts, in words.
    assert "Cancelled Cancelled by rob." in text  # the badge, then the reason
    assert "This machine" in text
    timeline = seen(html.split('id="timeline-heading"')[1].split("</ol>")[0])
    assert "Cancelled Cancelled by rob." in timeline  # said once, then the message
    assert "→ Cancelled" not in timeline
    assert "Cancel requested Cancel requested by rob; stopping its processes." in timeline
    assert "Resumed → Queued Resumed by rob" in timeline
    assert "Starting again → Queued Attempt 1 failed" in timeline
    assert "→ Running Running." not in timeline  # a plain change is the state alone
    assert "Running Running." in timeline
    assert "Submitted Submitted by rob" in timeline
    attempts = seen(html.split('id="attempts-heading"')[1].split("</ol>")[0])
    assert "Attempt 3 Cancelled log Resumed on request" in attempts
    assert "Attempt 2 Failed log Retry after the program exited with an error" in attempts
    # The first attempt wrote nothing: its hint does not send the reader to its log.
    assert (
        "It exited with code 1 before writing anything to its log; run the entrypoint on "
        "your machine to see why."
    ) in text
    assert "It exited with code 2; the end of its log usually says why." in text


def test_the_log_shows_the_newest_attempt_or_the_one_asked_for(
    world: Any, settings: Any, tmp_path: Path
) -> None:
    settings.VAR_DIR = tmp_path
    run = storied_run(world, tmp_path)
    client = world.client_for("viewer")
    logs = f"/api/v1/workspaces/alpha/runs/{run.name}/logs/"

    newest = client.get(f"/w/alpha/runs/{run.name}/").content.decode()
    options = re.findall(r'<option value="(\d)"( selected)?>([^<]+)</option>', newest)
    assert options == [
        ("3", " selected", "Attempt 3 (newest)"),
        ("2", "", "Attempt 2"),
        ("1", "", "Attempt 1"),
    ]
    assert f'id="log-download" href="{logs}?format=text&amp;attempt=3"' in newest
    assert "data-attempt=" not in newest  # the newest is followed
    assert 'aria-label="Log of attempt 3"' in newest

    older = client.get(f"/w/alpha/runs/{run.name}/", {"attempt": 1}).content.decode()
    assert '<option value="1" selected>Attempt 1</option>' in older
    assert f'id="log-download" href="{logs}?format=text&amp;attempt=1"' in older
    assert 'data-attempt="1"' in older
    # The link leads to that attempt's whole log, as text.
    raw = client.get(logs, {"format": "text", "attempt": 1})
    assert raw["Content-Type"] == "text/plain; charset=utf-8"
    assert b"".join(raw.streaming_content) == b""
    raw = client.get(logs, {"format": "text", "attempt": 2})
    assert b"".join(raw.streaming_content) == b"second attempt\nTraceback: boom\n"

    # A number the run does not have shows the newest.
    unknown = client.get(f"/w/alpha/runs/{run.name}/", {"attempt": 7}).content.decode()
    assert f"{logs}?format=text&amp;attempt=3" in unknown


def test_a_run_without_attempts_waits_with_no_picker(world: Any) -> None:
    run = make_run(world)
    html = world.client_for("viewer").get(f"/w/alpha/runs/{run.name}/").content.decode()
    assert 'id="log-attempt-form" hidden' in html
    assert "Waiting for the first attempt to start" in html


@pytest.mark.parametrize("state", list(RunState), ids=str)
def test_lists_and_queues_show_state_words(world: Any, state: RunState) -> None:
    run = make_run(world, state=state)
    Run.objects.for_workspace(world.alpha).filter(pk=run.pk).update(
        failure_class=FailureClass.OOM_KILLED
    )
    pages = {
        "runs": world.client_for("viewer").get("/w/alpha/runs/"),
        "queue": world.client_for("viewer").get("/w/alpha/queue/"),
        "platform": world.client_for("platform_admin").get("/queue/"),
        "run": world.client_for("viewer").get(f"/w/alpha/runs/{run.name}/"),
    }
    for name, response in pages.items():
        assert response.status_code == 200, name
        html = response.content.decode()
        badges = re.findall(r'<span class="state state-[a-z_-]+">([^<]*)</span>', html)
        for badge in badges:
            assert badge[:1].isupper(), f"{name}: badge {badge!r}"
            assert "_" not in badge
        assert "oom_killed" not in visible_text(html)
