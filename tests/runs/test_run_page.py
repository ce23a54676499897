"""The run page as the server draws it: which attempt's log it shows, where "Raw" leads, and
the words it uses for what happened (never the codes). The browser side is in
tests/pages/test_browser_run_page.py."""

from __future__ import annotations

import re
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from runs.models import FailureClass, Run, RunState
from tests.runs.factories import make_run
from tests.runs.histories import storied_run
from workspaces.models import Membership, Role

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


def test_a_run_whose_first_attempt_waits_says_so(world: Any) -> None:
    run = make_run(world)  # handed over with its first attempt, which waits to be admitted
    html = world.client_for("viewer").get(f"/w/alpha/runs/{run.name}/").content.decode()
    assert "Waiting for the first attempt to start" in html
    attempts = seen(html.split('id="attempts-heading"')[1].split("</ol>")[0])
    assert "Attempt 1 Waiting" in attempts


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


def test_preempted_and_evicted_runs_wait_on_the_queue_pages_with_their_reason(
    world: Any,
) -> None:
    """Under Kueue these states last: such a run waits to be admitted again, and the queue
    pages list it with the waiting runs, saying why."""
    waiting = {}
    for state in (RunState.PREEMPTED, RunState.EVICTED):
        run = make_run(world, state=state)
        Run.objects.for_workspace(world.alpha).filter(pk=run.pk).update(
            state_reason=f"{state.label} by the cluster; waiting to be admitted again."
        )
        waiting[state] = run
    running = make_run(world, state=RunState.RUNNING)

    def section(html: str, start: str, end: str) -> str:
        return html.split(start)[1].split(end)[0]

    html = world.client_for("viewer").get("/w/alpha/queue/").content.decode()
    listed = section(html, 'id="pending-heading"', 'id="running-heading"')
    assert "Waiting (2)" in seen(listed)
    for state, run in waiting.items():
        assert run.name in listed
        assert f"{state.label} by the cluster; waiting to be admitted again." in listed
    assert running.name not in listed
    assert running.name in html.split('id="running-heading"')[1]

    html = world.client_for("platform_admin").get("/queue/").content.decode()
    listed = section(html, '<h3 class="small">Waiting</h3>', "</ol>")
    for state, run in waiting.items():
        assert run.name in listed
        assert f"{state.label} by the cluster" in listed
    assert running.name not in listed
    assert "2 waiting and 1 running" in seen(html)


def test_only_the_submitter_or_a_workspace_admin_may_act_on_a_run(
    world: Any, django_user_model: Any
) -> None:
    """One rule for the page's buttons, its form posts and the API's actions: another
    researcher of the workspace may read the run, not cancel or resume it."""
    colleague = django_user_model.objects.create_user(username="carla", password=None)
    Membership.objects.create(workspace=world.alpha, user=colleague, role=Role.RESEARCHER)
    run = make_run(world)  # rob's
    page = f"/w/alpha/runs/{run.name}/"
    api = f"/api/v1/workspaces/alpha/runs/{run.name}/"
    cases = [
        (colleague, False),
        (world.users["researcher"], True),
        (world.users["workspace_admin"], True),
    ]
    for user, allowed in cases:
        browser = Client()
        browser.force_login(user)
        html = browser.get(page).content.decode()
        assert ("Cancel run</button>" in html) is allowed, user
        api_client = APIClient()
        api_client.force_authenticate(user)
        if not allowed:
            assert browser.post(f"{page}cancel/").status_code == 403
            assert api_client.post(f"{api}cancel/").status_code == 403
            assert api_client.post(f"{api}resume/", {}, format="json").status_code == 403
    admin = APIClient()
    admin.force_authenticate(world.users["workspace_admin"])
    assert admin.post(f"{api}cancel/").status_code == 200
    run.refresh_from_db()
    assert run.state == RunState.CANCELLED
