"""What a workspace's quotas leave out of what its runs ask for on Kubernetes
(``workspaces.kueue_coverage``), said to the platform team where they set quotas: the admin's
workspace page (and a warning when a save leaves something out) and the staff API's answer.
The refusal at submission is in tests/runs/test_policy.py."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.urls import reverse

from executors.kubernetes import kueue_sync
from tests.runs.factories import cluster_quota
from tests.workspaces.test_admin_workspace_form import rendered_form
from tests.workspaces.test_platform_api import API, gamma, with_token
from workspaces.kueue_coverage import pod_set_gaps, quota_ceilings, quota_warnings
from workspaces.models import ResourceFlavor, WorkspaceQuota

pytestmark = pytest.mark.django_db

NO_MEMORY = (
    "No memory quota: every run asks for memory, and Kueue admits none that asks for a "
    "resource its ClusterQueue has no quota for, so beta's runs are refused at submission "
    "until it has a memory row."
)


@pytest.fixture
def on_kubernetes(settings: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The Kubernetes backend, its Kueue syncs recorded instead of sent to a broker."""
    settings.TAU_BACKEND = "kubernetes"
    published: list[int] = []
    monkeypatch.setattr(kueue_sync, "publish", published.append)
    return published


def row(workspace: Any, flavor: str, resource: str, nominal: str) -> None:
    found, _ = ResourceFlavor.objects.get_or_create(name=flavor)
    WorkspaceQuota.objects.update_or_create(
        workspace=workspace, flavor=found, resource=resource, defaults={"nominal": Decimal(nominal)}
    )


def test_what_the_quotas_leave_out(world: Any) -> None:
    # beta: 4 GPUs of h100 and nothing else (the world fixture).
    assert quota_warnings(world.beta) == [
        NO_MEMORY.replace("memory", "cpu"),
        NO_MEMORY,
    ]
    cluster_quota(world.beta)
    assert quota_warnings(world.beta) == []
    # A CPU flavor with cpu and memory, and the GPU flavor with cpu but no memory: one group
    # (they share cpu), and no flavor of it holds a GPU worker's GPUs, cpu and memory at once.
    WorkspaceQuota.objects.for_workspace(world.beta).filter(resource="memory").delete()
    row(world.beta, "cpu", "cpu", "32")
    row(world.beta, "cpu", "memory", str(64 * 2**30))
    assert quota_warnings(world.beta) == [
        "No GPU run can start on flavor h100: it has no memory quota, and Kueue places all the "
        "cpu, memory and nvidia.com/gpu a GPU worker asks for on one flavor. Add memory rows "
        "for h100."
    ]
    # The same rows, as a submission sees them: a CPU run fits, a GPU worker does not.
    ceilings = quota_ceilings(world.beta)
    assert pod_set_gaps({"cpu": Decimal(4), "memory": Decimal(2**30)}, ceilings) == []
    (gap,) = pod_set_gaps(
        {"nvidia.com/gpu": Decimal(1), "cpu": Decimal(4), "memory": Decimal(2**30)}, ceilings
    )
    assert (gap.flavor, gap.short, gap.alone) == ("h100", (("memory", Decimal(0)),), False)


def test_the_staff_api_answer_says_what_the_quotas_leave_out(
    world: Any, on_kubernetes: list[int]
) -> None:
    staff = with_token(world, "platform_admin")
    created = staff.post(f"{API}/workspaces/", gamma(), format="json")  # GPUs and memory only
    assert created.status_code == 201, created.content
    assert created.json()["quota_warnings"] == [
        "No cpu quota: every run asks for cpu, and Kueue admits none that asks for a resource "
        "its ClusterQueue has no quota for, so gamma's runs are refused at submission until it "
        "has a cpu row."
    ]
    quotas = [
        *gamma()["quotas"],
        {"flavor": "h100", "resource": "cpu", "nominal": "64"},
    ]
    changed = staff.patch(f"{API}/workspaces/gamma/", {"quotas": quotas}, format="json")
    assert changed.status_code == 200, changed.content
    assert changed.json()["quota_warnings"] == []


def test_on_the_local_backend_a_missing_row_is_no_warning(world: Any) -> None:
    staff = with_token(world, "platform_admin")
    created = staff.post(f"{API}/workspaces/", gamma(), format="json")
    assert created.status_code == 201, created.content
    assert created.json()["quota_warnings"] == []  # the machine limits what has no row


def test_the_admin_workspace_page_warns(world: Any, on_kubernetes: list[int]) -> None:
    client = world.client_for("platform_admin")
    url = reverse("admin:workspaces_workspace_change", args=[world.beta.pk])
    page = client.get(url).content.decode()
    assert "Quotas for runs" in page
    assert NO_MEMORY.replace("'", "&#x27;") in page

    # Saving the page as it is (quotas still without cpu and memory) says so at once.
    saved = client.post(url, rendered_form(page), follow=True)
    assert saved.status_code == 200
    said = [str(message) for message in saved.context["messages"]]
    assert f"beta: {NO_MEMORY}" in said

    cluster_quota(world.beta)
    page = client.get(url).content.decode()
    assert "They cover what runs ask for" in page
