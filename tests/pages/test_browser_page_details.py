"""Details a newcomer met on the portal's pages, in a real browser at 1280 px and 390 px:
fields that look like fields, a runs table that fits a phone, times that keep counting,
messages that go once their news is old, a log box that says why it is empty, a top bar on
one line for platform staff, badges that keep their shape."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from runs import state
from runs.models import Run, RunState
from tests.pages.browser_support import check_page, log_in, watch_console
from tests.runs.factories import make_run

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

FIELD_LOOK = """sel => { const s = getComputedStyle(document.querySelector(sel));
    return [s.borderTopWidth, s.borderTopColor, s.borderTopLeftRadius, s.paddingLeft,
            s.fontSize, s.fontFamily]; }"""


def test_every_field_looks_like_the_others(world: Any, live_server: Any, page: Any) -> None:
    """The runs filter's search box and the token's expiry (a number) had the browser's own
    small, square look beside the styled fields."""
    make_run(world)
    log_in(page.context, live_server.url, world.users["researcher"])
    page.goto(f"{live_server.url}/w/alpha/runs/")
    styled = page.evaluate(FIELD_LOOK, "#f-submitter")
    assert page.evaluate(FIELD_LOOK, "#f-q") == styled
    page.goto(f"{live_server.url}/tokens/")
    assert page.evaluate(FIELD_LOOK, "#id_expires_in_days") == styled
    assert page.evaluate(FIELD_LOOK, "#id_name") == styled


CELLS_OUTSIDE = """() => {
    const wrap = document.querySelector('table.runs').closest('.table-wrap');
    const right = wrap.getBoundingClientRect().right;
    const outside = Array.from(document.querySelectorAll('table.runs tbody td'))
        .filter(td => td.getBoundingClientRect().right > right + 1)
        .map(td => td.dataset.label || td.textContent.trim());
    return {outside: outside, scrolls: wrap.scrollWidth > wrap.clientWidth + 1};
}"""


def test_the_runs_table_fits_a_phone(world: Any, live_server: Any, page: Any) -> None:
    """At 390 px the runs table was cut after "Submitted by": each run is now a block with
    every field named, and nothing lies beside the screen."""
    for _ in range(3):
        make_run(world)
    log_in(page.context, live_server.url, world.users["researcher"])
    page.goto(f"{live_server.url}/w/alpha/runs/")
    page.set_viewport_size({"width": 390, "height": 900})
    assert page.evaluate(CELLS_OUTSIDE) == {"outside": [], "scrolls": False}
    first = page.locator("table.runs tbody tr").first
    labels = first.evaluate(
        """tr => Array.from(tr.querySelectorAll('td')).map(td =>
            getComputedStyle(td, '::before').content).filter(c => c !== 'none')"""
    )
    assert labels == [
        f'"{label}: "' for label in ("State", "Experiment", "Submitted by", "Submitted", "Attempts")
    ]
    # Choosing runs to compare still works from the phone layout.
    assert first.locator("input[type=checkbox]").is_visible()
    page.set_viewport_size({"width": 1280, "height": 900})
    assert page.evaluate(CELLS_OUTSIDE) == {"outside": [], "scrolls": False}
    assert page.locator("table.runs thead").is_visible()
    check_page(page, "runs-stacked")


def test_relative_times_keep_counting(world: Any, live_server: Any, page: Any) -> None:
    """ "30 seconds ago" froze: the live list answers 304 while nothing changes."""
    run = make_run(world)
    created = timezone.now() - timedelta(seconds=30)
    Run.objects.for_workspace(world.alpha).filter(pk=run.pk).update(created_at=created)
    page.clock.install(time=timezone.now())
    log_in(page.context, live_server.url, world.users["researcher"])
    page.goto(f"{live_server.url}/w/alpha/runs/")
    when = page.locator(f'table.runs tr:has(a:text("{run.name}")) time')
    assert when.inner_text().endswith("seconds ago")
    page.clock.fast_forward("02:00")
    page.wait_for_function(
        "el => el.textContent === '2 minutes ago'", arg=when.element_handle(), timeout=10_000
    )
    page.clock.fast_forward("02:00:00")
    page.wait_for_function(
        "el => el.textContent === '2 hours ago'", arg=when.element_handle(), timeout=10_000
    )


def test_messages_go_when_their_news_is_old(world: Any, live_server: Any, page: Any) -> None:
    """ "Cancelling tiny-x." stayed on the page after the run was cancelled. A run that was
    only waiting is cancelled at once, and the message says so; a message about an action
    goes when the page shows what happened since (a live change), or after a while; an error
    stays until dismissed."""
    waiting = make_run(world)
    running = make_run(world)
    Run.objects.for_workspace(world.alpha).filter(pk=running.pk).update(state=RunState.RUNNING)
    page.on("dialog", lambda dialog: dialog.accept())
    page.clock.install(time=timezone.now())
    log_in(page.context, live_server.url, world.users["researcher"])

    page.goto(f"{live_server.url}/w/alpha/runs/{waiting.name}/")
    page.get_by_role("button", name="Cancel run").click()
    page.wait_for_selector(".message-success")
    assert page.inner_text(".message-success").startswith(f"Cancelled {waiting.name}.")
    page.clock.fast_forward(13_000)
    page.wait_for_selector(".messages", state="detached", timeout=10_000)

    # A running run is being stopped: "Cancelling"; when the page shows it cancelled (a live
    # change, long before the message's time is up), the message goes.
    page.goto(f"{live_server.url}/w/alpha/runs/{running.name}/")
    page.get_by_role("button", name="Cancel run").click()
    page.wait_for_selector(".message-success")
    assert page.inner_text(".message-success").startswith(f"Cancelling {running.name}")
    state.transition(Run.objects.for_workspace(world.alpha).get(pk=running.pk), RunState.CANCELLED)
    waited = 0
    while page.locator(".run-state .state").inner_text() != "Cancelled":
        assert waited < 10_000, "the page never showed the run cancelled"
        page.clock.run_for(2_100)  # the run page polls every 2 s
        waited += 2_100
        page.wait_for_timeout(300)  # (the fetch itself takes real time)
    # Read for a moment, then gone, long before the 12 s any message stays at most.
    page.clock.run_for(4_000)
    assert waited + 4_000 < 12_000
    page.wait_for_selector(".messages", state="detached", timeout=5_000)

    # An error stays until dismissed.
    page.goto(f"{live_server.url}/w/alpha/runs/?after=not-a-cursor")
    page.wait_for_selector(".message-error")
    page.clock.fast_forward(60_000)
    assert page.locator(".message-error").is_visible()
    page.get_by_role("button", name="Dismiss this message").click()
    assert page.locator(".message-error").count() == 0


def test_a_waiting_run_has_no_empty_black_log_box(world: Any, live_server: Any, page: Any) -> None:
    run = make_run(world)  # waiting for an agent that is not there
    problems = watch_console(page)
    log_in(page.context, live_server.url, world.users["researcher"])
    page.goto(f"{live_server.url}/w/alpha/runs/{run.name}/")
    # After the log's first read (which used to empty the box).
    page.wait_for_function(
        "() => document.getElementById('log').textContent.includes('appears here')"
    )
    log = page.evaluate(
        """() => { const el = document.getElementById('log'), s = getComputedStyle(el);
        return {text: el.textContent, background: s.backgroundColor,
                height: el.getBoundingClientRect().height}; }"""
    )
    assert log["text"].strip(), log
    assert log["background"] != "rgb(15, 20, 25)", log  # not the terminal's black
    assert log["height"] < 120, log
    check_page(page, "run-waiting-log")
    assert problems == []


def test_staff_navigation_fits_one_line_and_says_usage_once(
    world: Any, live_server: Any, page: Any
) -> None:
    log_in(page.context, live_server.url, world.users["platform_admin"])
    page.goto(f"{live_server.url}/w/alpha/runs/")
    nav = page.locator("nav.topnav")
    visible_usage = nav.get_by_role("link", name="Usage", exact=True)
    assert visible_usage.count() == 1
    tops = page.evaluate(
        """() => Array.from(document.querySelectorAll('.topbar > *, nav.topnav > *'))
        .filter(el => el.offsetParent !== null)
        .map(el => { const r = el.getBoundingClientRect();
                     return Math.round(r.top + r.height / 2); })"""
    )
    assert max(tops) - min(tops) <= 4, tops  # one row at 1280 px
    # The platform's pages are one menu away.
    page.locator(".platform-menu summary").click()
    menu = page.locator(".platform-menu .menu-list")
    links = ("All queues", "GPU fleet", "Usage of all workspaces", "Audit log", "Platform admin")
    for name in links:
        assert menu.get_by_role("link", name=name).is_visible()
    page.keyboard.press("Escape")
    assert not menu.is_visible()
    check_page(page, "staff-navigation")
    page.set_viewport_size({"width": 390, "height": 900})
    page.locator(".platform-menu summary").click()
    box = menu.bounding_box()
    assert box is not None
    assert box["x"] >= 0, box
    assert box["x"] + box["width"] <= 390, box


def test_role_badges_keep_their_shape_beside_long_names(
    world: Any, live_server: Any, page: Any, django_user_model: Any
) -> None:
    vera = world.users["viewer"]
    vera.first_name, vera.last_name = "Veronika Alexandra", "Montgomery-Fitzwilliam Jr."
    vera.save()
    log_in(page.context, live_server.url, vera)
    page.set_viewport_size({"width": 390, "height": 900})
    for path in ("/w/alpha/", "/profile/"):
        page.goto(f"{live_server.url}{path}")
        heights = page.eval_on_selector_all(
            ".plain-list .badge", "els => els.map(e => e.getBoundingClientRect().height)"
        )
        assert heights, path
        assert max(heights) < 30, (path, heights)
