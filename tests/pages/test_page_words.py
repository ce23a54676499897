"""What the pages say, read from their HTML: times in words (never a raw timedelta such as
``0:01:55.434714``), and footnotes that read as sentences."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from runs.models import Run, RunState
from runs.wording import duration_words
from tests.runs.factories import TINY_SPEC, make_run

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("seconds", "words", "about"),
    [
        (0.3, "under 1 s", "under 1 s"),
        (12, "12 s", "12 s"),
        (59.6, "1 min", "1 min"),
        (115.434714, "1 min 55 s", "2 min"),
        (3599.7, "1 h", "1 h"),
        (7500, "2 h 5 min", "2 h"),
        (90061, "1 day 1 h", "1 day"),
        (200000, "2 days 8 h", "2 days"),
    ],
)
def test_durations_in_words(seconds: float, words: str, about: str) -> None:
    assert duration_words(timedelta(seconds=seconds)) == words
    assert duration_words(timedelta(seconds=seconds), parts=1) == about


def test_the_queue_says_when_a_run_may_start_in_words(world: Any) -> None:
    """Admissions every 1 min 55.434714 s: the queue says "starts in about 3 min 51 s" for
    the third in line, and its footnote says what a place in the queue adds, not
    "position N starts in roughly N x 2 min"."""
    now = timezone.now()
    for index in range(4):
        run = make_run(world)
        admitted = now - timedelta(seconds=115.434714 * (index + 1))
        Run.objects.for_workspace(world.alpha).filter(pk=run.pk).update(
            state=RunState.SUCCEEDED, queued_at=admitted - timedelta(seconds=5),
            admitted_at=admitted,
        )  # fmt: skip
    for position in (1, 2, 3):
        run = make_run(world)
        Run.objects.for_workspace(world.alpha).filter(pk=run.pk).update(
            state=RunState.QUEUED, queue_position=position
        )
    html = world.client_for("researcher").get("/w/alpha/queue/").content.decode()
    assert "starts in about 1 min 55 s" in html
    assert "starts in about 3 min 51 s" in html
    assert "0:01:55" not in html
    assert "0:03:50" not in html
    assert "N x" not in html
    assert (
        "a run was admitted about every 1 min 55 s (median), so each place ahead in the "
        "queue adds about 1 min 55 s." in html
    )
    # The submit page's check says the same for the run it would add (position 4).
    check = world.client_for("researcher").post(
        "/w/alpha/runs/validate/",
        {"spec_text": TINY_SPEC.decode(), "bundle_status": "read", "bundle_files": "main.py"},
    )
    text = check.content.decode()
    assert "about 5 min 46 s (position 4)" in text, text
    assert "0:05:46" not in text


def test_the_readme_names_the_button_the_workspace_page_shows(world: Any) -> None:
    """The quick start said *New run*; the button reads "Submit a run"."""
    import re

    from tests.runs.factories import ROOT

    # The README's quick start, and the test cluster's walk-through in the docs.
    readme = "\n".join(
        (ROOT / name).read_text(encoding="utf-8") for name in ("README.md", "docs/kubernetes.md")
    )
    named = re.findall(r"open the demo workspace, \*([^*]+)\*", readme)
    assert named, "the quick start's step is gone: update this test with it"
    html = world.client_for("researcher").get("/w/alpha/").content.decode()
    for button in named:
        assert f">{button}</a>" in html, button
