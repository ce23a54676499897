"""The GPU fleet and a workspace's GPU page in words and at both widths: on a machine without
GPUs the fleet says why once, starting with a capital, with no warning box repeating the card
under it; at 390 px every node's fields are shown, named, in a block of their own (the table
showed two columns and tall empty rows); a workspace without GPU quota says its GPU runs are
refused at submission, which is what the submit check does."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.cache import cache

from gpus.models import NodeSource
from runs import submission
from tests.gpus.test_pages import broken_node, node, synced
from tests.pages.browser_support import check_page, log_in, watch_console
from tests.runs.factories import TINY_FILES, zip_bytes

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

NO_DRIVER = "no NVIDIA driver on this machine (NVML: NVML Shared Library Not Found)"


@pytest.fixture(autouse=True)
def fresh_cache() -> Any:
    cache.clear()  # the fleet page is shared through the cache
    yield
    cache.clear()


def test_a_machine_without_gpus_says_why_once(world: Any, live_server: Any, page: Any) -> None:
    synced(NodeSource.LOCAL, error=NO_DRIVER)
    problems = watch_console(page)
    log_in(page.context, live_server.url, world.users["platform_admin"])
    page.goto(f"{live_server.url}/gpus/")
    main = page.inner_text("main")
    assert main.count("NVML Shared Library Not Found") == 1, main
    assert "No NVIDIA driver on this machine (NVML: NVML Shared Library Not Found)." in main
    assert "no NVIDIA driver" not in main  # never starts lower-case
    assert page.locator(".warning-box").count() == 0
    assert page.locator("h2", has_text="This machine has no NVIDIA GPU").count() == 1
    check_page(page, "fleet-no-gpu")
    assert problems == []


ROWS = """() => Array.from(document.querySelectorAll('table.fleet-table tbody tr')).map(tr => {
    const wrap = tr.closest('.table-wrap').getBoundingClientRect();
    const cells = Array.from(tr.children);
    return {
        outside: cells.filter(c => c.getBoundingClientRect().right > wrap.right + 1).length,
        labels: cells.map(c => getComputedStyle(c, '::before').content)
            .filter(c => c !== 'none' && c !== 'normal'),
        empty: cells.filter(c => c.getBoundingClientRect().height > 80
            && !c.textContent.trim()).length,
    };
})"""


def test_the_fleet_on_a_phone_shows_every_field_of_a_node(
    world: Any, live_server: Any, page: Any, settings: Any
) -> None:
    settings.TAU_BACKEND = "kubernetes"
    synced()
    for index in range(3):
        node(f"gpu-h100-{index + 10}", gpus_in_use=index)
    broken_node()
    log_in(page.context, live_server.url, world.users["platform_admin"])
    page.goto(f"{live_server.url}/gpus/")
    page.set_viewport_size({"width": 390, "height": 900})
    rows = page.evaluate(ROWS)
    assert len(rows) == 4
    for row in rows:
        assert row["outside"] == 0, rows
        assert row["empty"] == 0, rows
        assert row["labels"] == [
            f'"{label}: "'
            for label in (
                "Health",
                "GPUs in use",
                "Utilisation",
                "Memory",
                "Hottest",
                "Power",
                "Taints",
                "Runs",
            )
        ], rows
    wraps = page.eval_on_selector_all(
        ".fleet-table",
        "els => els.map(e => e.closest('.table-wrap')).map(w => w.scrollWidth - w.clientWidth)",
    )
    assert max(wraps) <= 1, wraps
    check_page(page, "fleet-nodes")


def test_a_workspace_without_gpu_quota_says_gpu_runs_are_refused(
    world: Any, live_server: Any, page: Any
) -> None:
    world.alpha.quotas.all().delete()
    gpu_spec = b"""schema_version: 1
name: needs-gpu
run:
  entrypoint: main.py
compute:
  gpus: 1
"""
    with pytest.raises(submission.SubmissionRefused) as refused:
        submission.submit(
            workspace=world.alpha,
            user=world.users["researcher"],
            spec_source=gpu_spec,
            bundle=io.BytesIO(zip_bytes(TINY_FILES)),
        )
    assert any(problem.path == "compute.gpus" for problem in refused.value.problems)
    log_in(page.context, live_server.url, world.users["researcher"])
    page.goto(f"{live_server.url}/w/alpha/gpus/")
    said = page.inner_text("#no-gpu-quota")
    assert "refused when it is submitted" in said
    assert "wait" not in said
    check_page(page, "workspace-gpus-no-quota")
