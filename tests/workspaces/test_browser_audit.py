"""The audit log in a real browser, on a platform where runs ran: run tokens (issued and
revoked with every attempt) and everyday sign-ins no longer drown the changes. The default
view leaves them out and says how many, one click from each; filters by kind and by who
(a user, or "system"); a token its owner named like a run token is not hidden by its name.
The admin's list does the same by default. Both pages pass axe at both widths."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from identity.models import ApiToken
from identity.tokens import issue_token, revoke_token
from portal import audit
from tests.pages.browser_support import check_page, log_in, watch_console
from workspaces.models import WorkspaceQuota

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def busy_platform(world: Any) -> None:
    """30 attempts' run tokens, 20 sign-ins and sign-outs, one failed sign-in, one change of
    a quota, and a person's token named like a run token."""
    rob = world.users["researcher"]
    for attempt in range(1, 16):
        for run in ("train-a1b2c3", "eval-d4e5f6"):
            issued = issue_token(
                user=rob,
                name=f"run {run} attempt {attempt}",
                kind=ApiToken.Kind.RUN,
                workspace=world.alpha,
                expires_in_days=2,
                details={"run": run, "attempt": attempt},
            )
            revoke_token(token=issued.token)
    for _ in range(10):
        with audit.acting_as(rob, source="web"):
            audit.record(action="login.success", object_type="auth.user", object_repr="rob")
            audit.record(action="logout", object_type="auth.user", object_repr="rob")
    audit.record(
        action="login.failed", object_type="auth.user", object_repr="password login as 'root'"
    )
    with audit.acting_as(world.users["platform_admin"], source="admin"):
        quota = WorkspaceQuota.objects.for_workspace(world.alpha).get()
        quota.nominal = Decimal(16)
        quota.save()
    issue_token(
        user=rob,
        name="run sneaky attempt 1",
        workspace=world.alpha,
        expires_in_days=2,
    )


def rows(page: Any) -> list[str]:
    return [row.strip() for row in page.locator("table.audit tbody tr").all_inner_texts()]


def test_run_tokens_and_sign_ins_are_summarised_and_one_click_away(
    world: Any, live_server: Any, page: Any
) -> None:
    busy_platform(world)
    problems = watch_console(page)
    log_in(page.context, live_server.url, world.users["platform_admin"])
    page.goto(f"{live_server.url}/audit/")
    shown = rows(page)
    text = "\n".join(shown)
    assert "workspaces.workspacequota" in text  # the change
    assert "login.failed" in text  # a refused sign-in is never routine
    assert "run sneaky attempt 1" in text  # a name does not make a run token
    assert not any("run train-a1b2c3" in row for row in shown)
    assert not any("login.success" in row or "logout" in row for row in shown)
    summary = page.inner_text("#audit-left-out")
    assert "60 run-token entries" in summary  # 30 attempts: issued and revoked
    assert "21 sign-ins and sign-outs" in summary  # and the admin's own, to read this
    check_page(page, "audit-default")

    page.click("#audit-left-out a:has-text('run-token entries')")
    page.wait_for_url("**kind=run-tokens**")
    assert page.input_value("#id_kind") == "run-tokens"
    shown = rows(page)
    assert len(shown) == 50  # a page of them
    assert all("run " in row and "attempt" in row for row in shown), shown
    assert not any("sneaky" in row for row in shown)

    page.select_option("#id_kind", "sign-ins")
    page.fill("#id_actor", "system")
    page.click("button:has-text('Filter')")
    page.wait_for_url("**actor=system**")
    [only] = rows(page)
    assert "system" in only
    assert "login.failed" in only
    assert problems == []


def test_the_admin_list_leaves_routine_entries_out_by_default(
    world: Any, live_server: Any, page: Any
) -> None:
    busy_platform(world)
    log_in(page.context, live_server.url, world.users["platform_admin"])
    page.goto(f"{live_server.url}/admin/portal/auditevent/")
    listed = page.locator("#result_list tbody").inner_text()
    assert "run train-a1b2c3" not in listed
    assert "login.success" not in listed
    assert "workspaces.workspacequota" in listed
    page.click("#changelist-filter a:has-text('Run tokens (one per attempt)')")
    page.wait_for_url("**kind=run-tokens**")
    assert "run train-a1b2c3" in page.locator("#result_list tbody").inner_text()
    assert "sneaky" not in page.locator("#result_list tbody").inner_text()
