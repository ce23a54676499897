"""The platform admin in a real browser at 1280 px: the workspace form fits the window and
has no "Created at" before there is anything; priorities are chosen from the priority
classes, node labels and tolerations are edited as rows, with errors that name the row and
say what to fix, and stored as the JSON they always were; the workspace list's Kueue column,
the audit log's and the deliveries' last columns are on the screen."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from notifications.models import NotificationDelivery, Webhook
from portal import audit
from tests.pages.browser_support import log_in, watch_console
from workspaces.models import KueueSync, PriorityClass, ResourceFlavor, Workspace

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

FITS = """() => ({
    page: document.documentElement.scrollWidth - window.innerWidth,
    results: Array.from(document.querySelectorAll('.results')).map(
        r => r.scrollWidth - r.clientWidth),
    columns: Array.from(document.querySelectorAll('#result_list thead th')).filter(
        th => th.getBoundingClientRect().right > window.innerWidth + 1).map(
        th => th.textContent.trim()),
})"""


def fits(page: Any) -> None:
    measured = page.evaluate(FITS)
    assert measured["page"] <= 1, measured
    assert all(extra <= 1 for extra in measured["results"]), measured
    assert measured["columns"] == [], measured


@pytest.fixture
def admin_page(world: Any, live_server: Any, page: Any) -> Any:
    log_in(page.context, live_server.url, world.users["platform_admin"])
    page.set_viewport_size({"width": 1280, "height": 900})
    return page


def test_the_workspace_form_fits_and_asks_only_what_matters(
    world: Any, live_server: Any, admin_page: Any
) -> None:
    page = admin_page
    problems = watch_console(page)
    PriorityClass.objects.create(name="high", value=5000)
    PriorityClass.objects.create(name="low", value=10)
    page.goto(f"{live_server.url}/admin/workspaces/workspace/add/")
    fits(page)
    text = page.inner_text("#content")
    assert "Created at" not in text
    assert page.inner_text(".field-member_since p, td.field-member_since").strip() == "—"
    # Priorities: the classes there are, by value, as choices.
    choices = page.locator("#id_allowed_priorities input[type=checkbox]")
    assert [c.strip() for c in page.locator("#id_allowed_priorities").inner_text().split("\n")] == [
        "low (10)",
        "normal (1000)",
        "high (5000)",
    ]
    assert page.locator("textarea[name=allowed_priorities]").count() == 0
    page.fill("#id_slug", "gamma")
    page.fill("#id_name", "Gamma")
    page.check("#id_allowed_priorities input[value=high]")
    page.check("#id_allowed_priorities input[value=low]")
    page.select_option("#id_memberships-0-role", "admin")
    page.evaluate(
        "id => { const s = document.getElementById('id_memberships-0-user');"
        " s.add(new Option('rob', id, true, true)); }",
        str(world.users["researcher"].pk),
    )
    page.click("input[name=_save]")
    page.wait_for_selector(".messagelist .success")
    gamma = Workspace.unscoped_objects.get(slug="gamma")
    assert gamma.allowed_priorities == ["low", "high"]  # JSON, as before, by class value
    assert choices.count() == 0  # (on the list page now)

    # The change form keeps the workspace's own order, and shows a name that is no class any
    # more (so that it is seen, and unchosen: a workspace may allow only real classes).
    Workspace.unscoped_objects.filter(pk=gamma.pk).update(allowed_priorities=["high", "gone"])
    page.goto(f"{live_server.url}/admin/workspaces/workspace/{gamma.pk}/change/")
    fits(page)
    assert page.is_checked("#id_allowed_priorities input[value=gone]")
    assert "gone (no such priority class)" in page.inner_text("#id_allowed_priorities")
    assert "Created at" in page.inner_text("#content")  # an existing workspace has a history
    page.check("#id_allowed_priorities input[value=normal]")
    page.click("input[name=_save]")
    page.wait_for_selector(".errornote")
    assert "No priority class called 'gone'" in page.inner_text(".field-allowed_priorities")
    page.uncheck("#id_allowed_priorities input[value=gone]")
    page.click("input[name=_save]")
    page.wait_for_selector(".messagelist .success")
    gamma.refresh_from_db()
    assert gamma.allowed_priorities == ["high", "normal"]
    assert problems == []


def test_labels_and_tolerations_are_rows_with_errors_that_say_what_to_fix(
    world: Any, live_server: Any, admin_page: Any
) -> None:
    page = admin_page
    flavor = world.gpu_flavor
    url = f"{live_server.url}/admin/workspaces/resourceflavor/{flavor.pk}/change/"
    page.goto(url)
    fits(page)
    assert page.locator("textarea[name=node_labels], textarea[name=tolerations]").count() == 0
    assert page.input_value("input[name=node_labels-key-0]") == "nvidia.com/gpu.product"
    assert page.input_value("input[name=node_labels-value-0]") == "NVIDIA-H100-80GB-HBM3"
    page.fill("input[name=node_labels-key-1]", "pool")
    page.fill("input[name=node_labels-value-1]", "h100 nodes")  # a space: not a label value
    page.fill("input[name=node_labels-value-2]", "orphan")  # a value without a key
    page.fill("input[name=tolerations-key-0]", "nvidia.com/gpu")
    page.select_option("select[name=tolerations-operator-0]", "Exists")
    page.fill("input[name=tolerations-value-0]", "present")
    page.select_option("select[name=tolerations-effect-0]", "NoSchedule")
    page.click("input[name=_save]")
    page.wait_for_selector(".errornote")
    errors = page.locator(".errorlist").all_inner_texts()
    said = "\n".join(errors)
    assert "Row 2: the value 'h100 nodes' must be" in said, said
    assert "Row 3: give the label key for the value 'orphan'." in said, said
    assert "Row 1: Exists takes no value; clear it or choose Equal." in said, said
    flavor.refresh_from_db()
    assert flavor.node_labels == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert flavor.tolerations == []
    # What was typed is still there to fix.
    assert page.input_value("input[name=node_labels-value-1]") == "h100 nodes"
    page.fill("input[name=node_labels-value-1]", "h100")
    page.fill("input[name=node_labels-value-2]", "")
    page.fill("input[name=tolerations-value-0]", "")
    page.click("input[name=_save]")
    page.wait_for_url("**/admin/workspaces/resourceflavor/")
    flavor.refresh_from_db()
    assert flavor.node_labels == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "pool": "h100"}
    assert flavor.tolerations == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    # Emptying a row removes the label (rows by key: pool is the second).
    page.goto(url)
    assert page.input_value("input[name=node_labels-key-1]") == "pool"
    page.fill("input[name=node_labels-key-1]", "")
    page.fill("input[name=node_labels-value-1]", "")
    page.click("input[name=_save]")
    page.wait_for_url("**/admin/workspaces/resourceflavor/")
    assert ResourceFlavor.objects.get(pk=flavor.pk).node_labels == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"
    }


def test_the_lists_last_columns_are_on_the_screen(
    world: Any, live_server: Any, admin_page: Any, settings: Any
) -> None:
    page = admin_page
    settings.TAU_BACKEND = "kubernetes"  # the workspace list's Kueue column
    long_error = (
        'admission webhook "vclusterqueue.kb.io" denied the request: spec.resourceGroups[0]'
        '.flavors[0].resources[1].nominalQuota: Invalid value: "-1": must be greater than or '
        "equal to 0 (and the cohort research-with-a-long-name does not exist yet)"
    )
    for workspace in (world.alpha, world.beta):
        KueueSync.objects.create(
            scope=KueueSync.Scope.WORKSPACE,
            workspace_slug=workspace.slug,
            state=KueueSync.State.FAILED,
            last_error=long_error,
        )
    page.goto(f"{live_server.url}/admin/workspaces/workspace/")
    assert page.locator("#result_list th.column-kueue_state").count() == 1
    fits(page)

    with audit.acting_as(world.users["platform_admin"], source="admin"):
        for index in range(5):
            audit.record(
                action="webhook.created",
                workspace=world.alpha,
                object_type="notifications.webhook",
                object_repr=f"https://hooks.example.org/{'x' * 120}/{index}",
            )
    page.goto(f"{live_server.url}/admin/portal/auditevent/")
    fits(page)

    webhook = Webhook.objects.create(
        workspace=world.alpha, url=f"https://hooks.example.org/{'y' * 150}", secret="s"
    )
    for index in range(3):
        NotificationDelivery.objects.create(
            workspace=world.alpha,
            channel=NotificationDelivery.Channel.WEBHOOK,
            webhook=webhook,
            event="run.failed",
            key=f"run-{index}",
            tries=3,
            last_status_code=502,
            last_error="The receiver answered 502 Bad Gateway: " + "upstream timed out " * 8,
            last_tried_at=timezone.now(),
            next_try_at=timezone.now() + timedelta(minutes=5),
        )
    page.goto(f"{live_server.url}/admin/notifications/notificationdelivery/")
    fits(page)
