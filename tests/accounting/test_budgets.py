"""GPU-hour budgets: what a run may cost in the preview and the API's answer, the three
policies past the hard limit, and the 80% / 100% warnings, each sent once."""

from __future__ import annotations

import io
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils import timezone

from accounting import budget_alerts
from accounting.models import BudgetAlert
from portal.notices import Notice, notice
from runs import submission
from runs.accounting import Period
from runs.models import Run, RunEvent
from tests.accounting.helpers import CPU_SPEC, GPU_SPEC, attempt_at, gpu_run
from tests.runs.factories import TINY_FILES, zip_bytes
from workspaces.models import OverBudget, PriorityClass, ResourceFlavor, WorkspaceBudget

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _gpus_here(settings: Any) -> None:
    settings.TAU_LOCAL_GPUS = 64
    settings.TAU_LOCAL_CPUS = 64
    settings.TAU_LOCAL_MEMORY = "512Gi"


#: 64 GPUs: the hours the tests use fit in the last minutes (of this month).
BIG_SPEC = GPU_SPEC.replace(
    b"gpus: 2\n  workers: 2\n  cpus: 4\n  memory: 16Gi",
    b"gpus: 8\n  workers: 8\n  cpus: 1\n  memory: 1Gi",
)
assert BIG_SPEC != GPU_SPEC


def used(world: Any, gpu_hours: float) -> None:
    """This month, ``gpu_hours`` used by a finished 64-GPU run of alpha's."""
    run = gpu_run(world, spec=BIG_SPEC)
    end = timezone.now() - timedelta(seconds=10)
    start = end - timedelta(hours=gpu_hours / 64)
    month_start = Period.containing(timezone.now()).start
    assert start >= month_start, "the hours must be this month's: not in its first minutes"
    attempt_at(run, 1, start, end)


def budget(world: Any, hours: str, **extra: Any) -> WorkspaceBudget:
    return WorkspaceBudget.objects.create(workspace=world.alpha, gpu_hours=Decimal(hours), **extra)


def submit(world: Any, spec: bytes = GPU_SPEC) -> Run:
    return submission.submit(
        workspace=world.alpha,
        user=world.users["researcher"],
        spec_source=spec,
        bundle=io.BytesIO(zip_bytes(TINY_FILES)),
    )


def test_the_preview_says_what_a_run_may_cost_and_what_is_left(world: Any) -> None:
    budget(world, "400")
    used(world, 2)  # 2 GPU-hours in 30 minutes
    client = world.client_for("researcher")
    html = client.post(
        reverse("run-validate", args=["alpha"]),
        {"spec_text": GPU_SPEC.decode(), "bundle_status": "read", "bundle_files": "main.py"},
    ).content.decode()
    # 4 GPUs x max_runtime 2h = 8 GPU-hours; 400 - 2 = 398 left.
    assert "Up to 8 GPU-hours if it runs to its max_runtime; 398 of 400 left this month" in html


def test_the_api_answer_says_what_the_run_may_cost(world: Any) -> None:
    budget(world, "400")
    response = world.api_client_for("researcher").post(
        "/api/v1/workspaces/alpha/runs/",
        {
            "spec": SimpleUploadedFile("tau.yaml", GPU_SPEC),
            "bundle": SimpleUploadedFile("p.zip", zip_bytes(TINY_FILES)),
        },
        format="multipart",
    )
    assert response.status_code == 201, response.content
    cost = response.json()["cost"]
    assert cost["gpus"] == 4
    assert cost["max_gpu_hours"] == 8.0
    assert cost["budgets"] == [
        {
            "flavor": "all flavors",
            "used_gpu_hours": 0.0,
            "gpu_hours": 400.0,
            "hard_limit_gpu_hours": 400.0,
            "left_gpu_hours": 400.0,
            "over_limit": "refuse",
        }
    ]
    assert cost["summary"].startswith("Up to 8 GPU-hours")
    # The submitted event keeps it, for the run's record.
    run = Run.objects.for_workspace(world.alpha).get(name=response.json()["name"])
    first = RunEvent.objects.for_workspace(world.alpha).get(run=run, seq=1)
    assert first.data["cost"]["max_gpu_hours"] == 8.0


def test_without_max_runtime_the_cost_has_no_upper_bound(world: Any) -> None:
    spec = GPU_SPEC.replace(b"  max_runtime: 2h\n", b"")
    run = submit(world, spec)
    assert run.submitted_cost is not None
    assert run.submitted_cost["max_gpu_hours"] is None
    assert "4 GPU-hours for each hour it runs" in run.submitted_cost["summary"]


def test_past_the_hard_limit_refuse_names_the_budget_at_compute_gpus(world: Any) -> None:
    budget(world, "1", over_limit=OverBudget.REFUSE)
    used(world, 1.5)
    before = Run.objects.for_workspace(world.alpha).count()
    with pytest.raises(submission.SubmissionRefused) as refused:
        submit(world)
    [problem] = refused.value.problems
    assert problem.path == "compute.gpus"
    assert "past its hard limit of 1" in problem.message
    assert "all flavors" in problem.message
    assert "Ask the platform team to raise the GPU-hour budget" in problem.message
    assert problem.line is not None  # pointed at its line in tau.yaml
    assert Run.objects.for_workspace(world.alpha).count() == before  # nothing written
    # A run without GPUs is not held back by a GPU-hour budget.
    assert submit(world, CPU_SPEC).submitted_cost == {
        "gpus": 0,
        "max_gpu_hours": None,
        "summary": "It uses no GPUs, so no GPU-hour budget.",
        "budgets": [],
    }


def test_the_api_refusal_is_a_problem_at_compute_gpus(world: Any) -> None:
    budget(world, "1")
    used(world, 1.5)
    response = world.api_client_for("researcher").post(
        "/api/v1/workspaces/alpha/runs/",
        {
            "spec": SimpleUploadedFile("tau.yaml", GPU_SPEC),
            "bundle": SimpleUploadedFile("p.zip", zip_bytes(TINY_FILES)),
        },
        format="multipart",
    )
    assert response.status_code == 400
    [problem] = response.json()["problems"]
    assert problem["path"] == "compute.gpus"
    assert "GPU-hour budget" in problem["message"]


def test_below_the_hard_limit_nothing_is_refused(world: Any) -> None:
    budget(world, "1", hard_limit_gpu_hours=Decimal("2"))
    used(world, 1.5)  # past the soft limit, below the hard one
    run = submit(world)
    assert run.submitted_cost is not None
    assert run.submitted_cost["budgets"][0]["left_gpu_hours"] == 0.0


def test_past_the_hard_limit_lowest_priority(world: Any) -> None:
    PriorityClass.objects.create(name="low", value=10)
    PriorityClass.objects.create(name="high", value=5000)
    world.alpha.allowed_priorities = ["normal", "low", "high"]
    world.alpha.default_priority = "high"
    world.alpha.save()
    budget(world, "1", over_limit=OverBudget.LOWEST_PRIORITY)
    used(world, 1.5)
    run = submit(world)
    assert run.priority == "low"  # the allowed class of least value, not the list's first
    assert run.spec["queue"]["priority"] == "low"
    assert run.submitted_cost is not None
    assert "submitted at the lowest priority, low" in run.submitted_cost["summary"]


def test_past_the_hard_limit_allow(world: Any) -> None:
    budget(world, "1", over_limit=OverBudget.ALLOW)
    used(world, 1.5)
    run = submit(world)
    assert run.priority == ""  # alpha's default: unchanged
    assert run.submitted_cost is not None
    assert "it is still allowed" in run.submitted_cost["summary"]


def test_a_flavor_budget_counts_that_flavor_only(world: Any, settings: Any) -> None:
    """A budget on h100 holds back a run that asks for h100, not one on another flavor."""
    a100 = ResourceFlavor.objects.create(name="a100", gpu_model="NVIDIA-A100")
    from workspaces.models import WorkspaceQuota

    WorkspaceQuota.objects.create(
        workspace=world.alpha, flavor=a100, resource="nvidia.com/gpu", nominal=Decimal(8)
    )
    budget(world, "1", flavor=world.gpu_flavor)
    settings.TAU_LOCAL_FLAVOR = "h100"  # local runs count as that flavor here
    used(world, 1.5)
    with pytest.raises(submission.SubmissionRefused, match="h100"):
        submit(world, GPU_SPEC.replace(b"  memory: 16Gi\n", b"  memory: 16Gi\n  gpu_type: h100\n"))
    run = submit(
        world, GPU_SPEC.replace(b"  memory: 16Gi\n", b"  memory: 16Gi\n  gpu_type: a100\n")
    )
    assert run.submitted_cost is not None
    assert run.submitted_cost["budgets"] == []


def test_a_running_run_is_never_stopped_by_a_budget(world: Any) -> None:
    budget(world, "1")
    run = gpu_run(world)
    start = timezone.now() - timedelta(minutes=45)  # 4 GPUs x 45 min = 3 GPU-hours so far
    attempt_at(run, 1, start, None)
    Run.objects.for_workspace(world.alpha).filter(pk=run.pk).update(state="running")
    budget_alerts.check_budgets()
    run.refresh_from_db()
    assert run.state == "running"
    assert run.cancel_requested_at is None


def test_thresholds_notify_once_each(world: Any) -> None:
    heard: list[Notice] = []

    def listen(sender: Any, notice: Notice, **kwargs: Any) -> None:
        heard.append(notice)

    notice.connect(listen, dispatch_uid="test-listen")
    try:
        watched = budget(world, "10")
        used(world, 7)  # 70%: nothing yet
        assert budget_alerts.check_budgets() == []
        used(world, 1.5)  # 85%
        assert [s.threshold_percent for s in budget_alerts.check_budgets()] == [80]
        assert budget_alerts.check_budgets() == []  # once
        used(world, 2)  # 105%
        assert [s.threshold_percent for s in budget_alerts.check_budgets()] == [100]
        assert budget_alerts.check_budgets() == []
    finally:
        notice.disconnect(dispatch_uid="test-listen")
    assert [n.event for n in heard] == ["budget.threshold", "budget.threshold"]
    assert [n.data["threshold_percent"] for n in heard] == [80, 100]
    assert heard[0].workspace_id == world.alpha.pk
    assert heard[0].data["used_gpu_hours"] == pytest.approx(8.5)
    assert "80% of its GPU-hour budget" in heard[0].title
    assert heard[1].key == f"budget:{watched.pk}:{Period.containing(timezone.now()).key}:100"
    assert BudgetAlert.objects.unscoped().filter(budget=watched).count() == 2


def test_passing_both_thresholds_at_once_sends_both(world: Any) -> None:
    budget(world, "1")
    used(world, 2)
    assert [s.threshold_percent for s in budget_alerts.check_budgets()] == [80, 100]


def test_budget_validation(world: Any) -> None:
    from django.core.exceptions import ValidationError

    wrong = WorkspaceBudget(
        workspace=world.alpha, gpu_hours=Decimal("10"), hard_limit_gpu_hours=Decimal("5")
    )
    with pytest.raises(ValidationError, match="cannot be below the soft limit"):
        wrong.full_clean()
    budget(world, "10")
    twice = WorkspaceBudget(workspace=world.alpha, gpu_hours=Decimal("20"))
    with pytest.raises(ValidationError, match="already has a budget for all flavors"):
        twice.full_clean()


def test_staff_set_a_budget_on_the_workspace_admin_page_and_it_is_audited(world: Any) -> None:
    from django.test import Client

    from portal.models import AuditEvent
    from tests.workspaces.test_admin_workspace_form import rendered_form

    staff: Client = world.client_for("platform_admin")
    url = reverse("admin:workspaces_workspace_change", args=[world.alpha.pk])
    form = rendered_form(staff.get(url).content.decode())
    form.update(
        {
            "budgets-TOTAL_FORMS": "1",
            "budgets-0-flavor": str(world.gpu_flavor.pk),
            "budgets-0-gpu_hours": "400",
            "budgets-0-hard_limit_gpu_hours": "300",  # below the soft limit: refused
            "budgets-0-over_limit": "lowest_priority",
        }
    )
    refused = staff.post(url, form)
    assert refused.status_code == 200
    assert "cannot be below the soft limit" in refused.content.decode()
    assert not WorkspaceBudget.objects.for_workspace(world.alpha).exists()

    form["budgets-0-hard_limit_gpu_hours"] = "450"
    assert staff.post(url, form).status_code == 302
    saved = WorkspaceBudget.objects.for_workspace(world.alpha).get()
    assert (saved.gpu_hours, saved.hard_limit, saved.over_limit) == (
        Decimal("400"),
        Decimal("450"),
        "lowest_priority",
    )
    event = AuditEvent.objects.unscoped().filter(object_type__icontains="budget").get()
    assert event.workspace_id == world.alpha.pk
    assert event.actor_id == world.users["platform_admin"].pk
