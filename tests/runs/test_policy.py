"""Workspace policy at submission: defaults filled from the workspace, limits refused with
the path in tau.yaml they are about, and never a silently changed spec.

The ``world`` fixture: alpha (cohort ``research``, priorities ``["normal"]``, 8 GPUs of
``h100``, unlimited borrowing) and beta (no cohort, no priorities, 4 GPUs of ``h100``); here
both also get 64 CPUs and 256Gi of memory on ``h100`` (``cluster_quota``), without which
Kueue would admit none of their runs.
"""

from __future__ import annotations

import copy
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from executors.kubernetes import render
from runs.policy import PolicyRefused, apply_policy, quota_ceilings, run_totals
from runs.submission import SubmissionRefused, check_spec
from tau.quantity import parse_quantity
from tau.spec import Spec, load_spec
from tests.runs.factories import cluster_quota
from workspaces.models import ResourceFlavor, WorkspaceQuota

pytestmark = pytest.mark.django_db

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GPU = "nvidia.com/gpu"

BASE: dict[str, Any] = {
    "schema_version": 1,
    "name": "policy-test",
    "run": {"entrypoint": "train.py", "workload_kind": "job"},
    "compute": {"cpus": 1, "memory": "1Gi"},
}


@pytest.fixture(autouse=True)
def cpus_and_memory(world: Any) -> None:
    cluster_quota(world.alpha)
    cluster_quota(world.beta)


def spec_of(**blocks: dict[str, Any]) -> Spec:
    """A valid spec: BASE with the given blocks merged in (``compute={"gpus": 2}``)."""
    data = copy.deepcopy(BASE)
    for block, fields in blocks.items():
        data.setdefault(block, {}).update(fields)
    return load_spec(yaml.safe_dump(data))


def refusal(spec: Spec, workspace: Any, backend: str = "kubernetes") -> dict[str, str]:
    with pytest.raises(PolicyRefused) as refused:
        apply_policy(spec, workspace, backend=backend)
    problems: dict[str, str] = {}
    for problem in refused.value.problems:  # several problems on one path: one per line
        problems[problem.path] = "\n".join(
            filter(None, [problems.get(problem.path), problem.message])
        )
    return problems


def quota(workspace: Any, resource: str, nominal: str, **extra: Any) -> WorkspaceQuota:
    flavor_name = extra.pop("flavor", "h100")
    flavor, _ = ResourceFlavor.objects.get_or_create(name=flavor_name)
    row, _ = WorkspaceQuota.objects.update_or_create(
        workspace=workspace,
        flavor=flavor,
        resource=resource,
        defaults={"nominal": parse_quantity(nominal), **extra},
    )
    return row


# ---------------------------------------------------------------------------------------------
# Priority and queue
# ---------------------------------------------------------------------------------------------


def test_a_priority_the_workspace_does_not_allow_is_refused(world: Any) -> None:
    problems = refusal(spec_of(queue={"priority": "urgent"}), world.alpha)
    assert problems == {
        "queue.priority": "'urgent' is not allowed in alpha; allowed: normal.",
    }
    problems = refusal(spec_of(queue={"priority": "normal"}), world.beta)
    assert "allowed: none (leave queue.priority out)" in problems["queue.priority"]


def test_an_allowed_priority_is_kept_and_ranked(world: Any) -> None:
    world.alpha.allowed_priorities = ["low", "normal", "high"]
    world.alpha.save()
    placement = apply_policy(spec_of(queue={"priority": "high"}), world.alpha, backend="local")
    assert (placement.priority, placement.priority_value) == ("high", 2)
    assert placement.spec.queue.priority == "high"


def test_another_queue_than_the_workspace_s_is_refused(world: Any) -> None:
    problems = refusal(spec_of(queue={"name": "someone-elses"}), world.alpha)
    assert problems == {
        "queue.name": "alpha has one queue, 'alpha'; leave queue.name out or use it.",
    }
    placement = apply_policy(spec_of(queue={"name": "alpha"}), world.alpha, backend="local")
    assert placement.spec.queue.name == "alpha"


# ---------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------


def test_an_image_from_a_registry_off_the_allow_list_is_refused(world: Any, settings: Any) -> None:
    settings.TAU_IMAGE_REGISTRIES = ["registry.example.org", "docker.io"]
    problems = refusal(spec_of(runtime={"image": "ghcr.io/acme/train:1"}), world.alpha)
    assert problems == {
        "runtime.image": "images from ghcr.io are not allowed here; "
        "use one of: registry.example.org, docker.io.",
    }
    for allowed in ("registry.example.org/team/train:2", "python:3.12-slim", "acme/train:1"):
        placement = apply_policy(spec_of(runtime={"image": allowed}), world.alpha, backend="local")
        assert placement.spec.runtime.image == allowed
    # The workspace's default image is held to the same list.
    world.alpha.default_image = "quay.io/acme/base:1"
    world.alpha.save()
    assert "quay.io" in refusal(spec_of(), world.alpha)["runtime.image"]


def test_any_registry_when_no_list_is_configured(world: Any, settings: Any) -> None:
    settings.TAU_IMAGE_REGISTRIES = []
    image = "ghcr.io/acme/train:1"
    assert apply_policy(spec_of(runtime={"image": image}), world.alpha, backend="local")


# ---------------------------------------------------------------------------------------------
# GPUs and quota
# ---------------------------------------------------------------------------------------------


def test_more_gpus_per_worker_than_any_node_has_is_refused(world: Any, settings: Any) -> None:
    settings.TAU_MAX_GPUS_PER_NODE = 4
    problems = refusal(spec_of(compute={"gpus": 8}), world.alpha)
    assert problems["compute.gpus"] == (
        "8 GPUs per worker, but no node here has more than 4; "
        "use more workers with fewer GPUs each."
    )
    assert apply_policy(spec_of(compute={"gpus": 4, "workers": 2}), world.alpha, backend="local")


def test_more_than_the_nominal_quota_outside_a_cohort_is_refused(world: Any) -> None:
    assert apply_policy(spec_of(compute={"gpus": 4}), world.beta, backend="kubernetes")
    problems = refusal(spec_of(compute={"gpus": 1, "workers": 5}), world.beta)
    assert problems == {
        "compute.gpus": "the run needs 5 nvidia.com/gpu at once (5 worker(s)), but beta can "
        "get at most 4; it would never start.",
    }
    # A borrowing limit means nothing without a cohort.
    quota(world.beta, GPU, "4", borrowing_limit=Decimal(4))
    assert "at most 4;" in refusal(spec_of(compute={"gpus": 5}), world.beta)["compute.gpus"]


def test_in_a_cohort_nominal_plus_borrowing_limit_is_the_ceiling(world: Any) -> None:
    quota(world.alpha, GPU, "8", borrowing_limit=Decimal(4))
    assert apply_policy(spec_of(compute={"gpus": 6, "workers": 2}), world.alpha, backend="local")
    problems = refusal(spec_of(compute={"gpus": 1, "workers": 13}), world.alpha)
    assert "alpha can get at most 12" in problems["compute.gpus"]


def test_unlimited_borrowing_in_a_cohort_has_no_ceiling(world: Any) -> None:
    assert quota_ceilings(world.alpha)[GPU] == {"h100": None}
    placement = apply_policy(
        spec_of(compute={"gpus": 8, "workers": 16}), world.alpha, backend="local"
    )
    assert placement.spec.compute.workers == 16


def test_cpu_and_memory_quotas_count_too(world: Any) -> None:
    quota(world.beta, "cpu", "8")
    quota(world.beta, "memory", "16Gi")
    problems = refusal(spec_of(compute={"cpus": 4, "memory": "12Gi", "workers": 3}), world.beta)
    assert set(problems) == {"compute.cpus", "compute.memory"}
    assert "needs 12 cpu" in problems["compute.cpus"]
    assert "needs 36Gi memory" in problems["compute.memory"]
    assert "at most 16Gi" in problems["compute.memory"]


def test_gpus_without_any_gpu_quota_are_refused(world: Any) -> None:
    WorkspaceQuota.objects.for_workspace(world.beta).filter(resource=GPU).delete()
    assert refusal(spec_of(compute={"gpus": 1}), world.beta) == {
        "compute.gpus": "beta has no GPU quota."
    }


def test_on_kubernetes_a_resource_without_any_quota_is_refused_at_submission(world: Any) -> None:
    """Kueue admits nothing that asks for a resource its ClusterQueue has no quota for (it says
    "resource memory unavailable in ClusterQueue", and the run waits forever): refused at once,
    in words. Locally a resource without a row is limited by the machine alone."""
    WorkspaceQuota.objects.for_workspace(world.beta).filter(resource="memory").delete()
    problems = refusal(spec_of(), world.beta)
    assert problems == {
        "compute.memory": "the run asks for memory, but beta has no memory quota, and Kueue "
        "admits no run that asks for a resource its ClusterQueue has no quota for; it would "
        "never start. Ask the platform team for a memory quota.",
    }
    # A RayJob's head and submitter ask for memory too: still said once.
    rayjob = spec_of(run={"workload_kind": "rayjob"}, runtime={"image": "ray:2"})
    assert list(refusal(rayjob, world.beta)) == ["compute.memory"]
    assert apply_policy(spec_of(), world.beta, backend="local")

    WorkspaceQuota.objects.for_workspace(world.beta).delete()
    assert set(refusal(spec_of(compute={"gpus": 1}), world.beta)) == {
        "compute.gpus",
        "compute.cpus",
        "compute.memory",
    }
    assert apply_policy(spec_of(compute={"cpus": 64}), world.beta, backend="local")


def test_on_kubernetes_a_pod_set_must_find_all_it_asks_for_on_one_flavor(world: Any) -> None:
    """Kueue assigns every resource of one resource group to a pod set on the same flavor: a
    GPU flavor without memory quota, grouped with a CPU flavor (they share cpu), can never take
    a GPU worker, though every amount exists somewhere."""
    WorkspaceQuota.objects.for_workspace(world.beta).filter(resource="memory").delete()
    quota(world.beta, "cpu", "16", flavor="cpu")
    quota(world.beta, "memory", "64Gi", flavor="cpu")
    gpu_run = spec_of(compute={"gpus": 1})
    assert refusal(gpu_run, world.beta) == {
        "compute.memory": "the 1 worker(s) need 1 cpu, 1Gi memory and 1 nvidia.com/gpu on one "
        "flavor, but no flavor of beta has them all (the closest, h100, has no memory quota); "
        "it would never start (Kueue places all the cpu, memory and nvidia.com/gpu a pod set "
        "asks for on one flavor).",
    }
    # A CPU run lands on the CPU flavor; a RayJob's head of 8Gi too, and its GPU worker not.
    assert apply_policy(spec_of(), world.beta, backend="kubernetes")
    rayjob = spec_of(
        run={"workload_kind": "rayjob"}, compute={"gpus": 1}, runtime={"image": "ray:2"}
    )
    assert list(refusal(rayjob, world.beta)) == ["compute.memory"]
    # With compute.gpu_type only that flavor is tried for the GPUs, though the CPU flavor
    # has the memory.
    quota(world.beta, "memory", "64Gi", flavor="h100")
    quota(world.beta, "memory", "200Gi", flavor="cpu")
    assert apply_policy(gpu_run, world.beta, backend="kubernetes")
    pinned = refusal(
        spec_of(compute={"gpus": 1, "memory": "100Gi", "gpu_type": "h100"}), world.beta
    )
    assert pinned == {
        "compute.memory": "the 1 worker(s) need 1 cpu, 100Gi memory and 1 nvidia.com/gpu on one "
        "flavor, but beta's flavor h100 has at most 64Gi memory; it would never start (Kueue "
        "places all the cpu, memory and nvidia.com/gpu a pod set asks for on one flavor).",
    }


def test_one_worker_group_must_fit_on_one_flavor(world: Any) -> None:
    quota(world.beta, GPU, "4", flavor="a100")  # beta: 4 on h100 and 4 on a100
    assert quota_ceilings(world.beta)[GPU] == {"a100": Decimal(4), "h100": Decimal(4)}
    # 8 GPUs in total exist, but Kueue places all workers of a pod set on one flavor.
    problems = refusal(spec_of(compute={"gpus": 4, "workers": 2}), world.beta)
    assert problems == {
        "compute.gpus": "the 2 worker(s) need 8 nvidia.com/gpu on one flavor, but the most "
        "beta can get on any single flavor is 4; it would never start.",
    }
    assert apply_policy(spec_of(compute={"gpus": 4}), world.beta, backend="kubernetes")


def test_gpu_type_must_be_a_flavor_the_workspace_has_quota_on(world: Any) -> None:
    quota(world.beta, GPU, "2", flavor="a100")
    assert refusal(spec_of(compute={"gpus": 1, "gpu_type": "b200"}), world.beta) == {
        "compute.gpu_type": "beta has no GPU quota on 'b200'; its GPU flavors: a100, h100.",
    }
    # Only the named flavor's quota counts: 3 fit on h100 (4) but not on a100 (2).
    problems = refusal(spec_of(compute={"gpus": 3, "gpu_type": "a100"}), world.beta)
    assert "at most 2;" in problems["compute.gpus"]
    placement = apply_policy(
        spec_of(compute={"gpus": 3, "gpu_type": "h100"}), world.beta, backend="kubernetes"
    )
    assert placement.spec.compute.gpu_type == "h100"


def test_a_rayjob_on_kubernetes_also_needs_room_for_its_head_and_submitter(world: Any) -> None:
    quota(world.beta, "cpu", "17")
    spec = spec_of(
        run={"workload_kind": "rayjob"}, compute={"cpus": 16}, runtime={"image": "ray:2"}
    )
    assert run_totals(spec, "kubernetes")["cpu"] == Decimal("18.5")  # 16 + head 2 + submitter 0.5
    assert run_totals(spec, "kubernetes")["memory"] == Decimal(2**30) + Decimal(9 * 2**30)
    assert run_totals(spec, "local")["cpu"] == Decimal(16)
    problems = refusal(spec, world.beta, backend="kubernetes")
    assert "needs 18500m cpu at once" in problems["compute.cpus"]
    # Locally there is no Ray head pod: the workers' 16 CPUs fit.
    assert apply_policy(spec, world.beta, backend="local")
    # The head is what executors.kubernetes.render renders.
    assert render.HEAD_RESOURCES["cpu"] == "2"


def test_an_endpoint_on_kubernetes_counts_every_replica_and_its_ray_head(world: Any) -> None:
    """A RayService's Ray cluster is admitted whole: one worker per replica (the most
    replicas autoscaling may reach) and the head, as executors.kubernetes.render_endpoint
    renders them."""
    spec = load_spec(
        b"""schema_version: 1
name: chat
run: {workload_kind: rayservice}
serve:
  import_path: app:app
  autoscaling: {min_replicas: 1, max_replicas: 3}
compute: {gpus: 1, cpus: 8, memory: 32Gi}
runtime: {image: ray:2}
"""
    )
    totals = run_totals(spec, "kubernetes")
    assert totals["nvidia.com/gpu"] == Decimal(3)
    assert totals["cpu"] == Decimal(3 * 8 + 2)  # three replicas and the head
    assert totals["memory"] == Decimal(3 * 32 * 2**30 + 8 * 2**30)


# ---------------------------------------------------------------------------------------------
# Backend limits
# ---------------------------------------------------------------------------------------------


def test_secrets_need_the_kubernetes_backend(world: Any) -> None:
    spec = spec_of(runtime={"secrets": [{"env": "WANDB_API_KEY", "secret": "wandb", "key": "k"}]})
    assert set(refusal(spec, world.alpha, backend="local")) == {"runtime.secrets"}
    assert apply_policy(spec, world.alpha, backend="kubernetes")


def test_what_kubernetes_cannot_carry_exactly_is_refused_there(world: Any, settings: Any) -> None:
    """The Kubernetes backend refuses it at submission (its ``submission_problems``), once:
    the policy has nothing to add, and on this machine the run is taken."""
    settings.TAU_BACKEND = "kubernetes"
    data = copy.deepcopy(BASE)
    data["run"].update(workload_kind="rayjob", args=["a\tb"])
    data["runtime"] = {"image": "ray:2.46.0"}
    source = yaml.safe_dump(data).encode()
    with pytest.raises(SubmissionRefused) as refused:
        check_spec(source, workspace=world.alpha, backend="kubernetes")
    assert [problem.path for problem in refused.value.problems] == ["run.args[0]"]
    assert "TAB" in refused.value.problems[0].message
    assert apply_policy(load_spec(source), world.alpha, backend="kubernetes")
    assert check_spec(source, workspace=world.alpha, backend="local")


def test_every_problem_is_reported_at_once(world: Any, settings: Any) -> None:
    settings.TAU_IMAGE_REGISTRIES = ["registry.example.org"]
    settings.TAU_MAX_GPUS_PER_NODE = 4
    spec = spec_of(
        compute={"gpus": 8},
        runtime={"image": "ghcr.io/x/y:1"},
        queue={"priority": "urgent", "name": "other"},
    )
    assert set(refusal(spec, world.beta)) == {
        "queue.priority",
        "queue.name",
        "runtime.image",
        "compute.gpus",
    }


# ---------------------------------------------------------------------------------------------
# Defaults, and never a silently changed spec
# ---------------------------------------------------------------------------------------------


def test_defaults_come_from_the_workspace(world: Any, settings: Any) -> None:
    world.alpha.default_image = "registry.example.org/base:3"
    world.alpha.default_priority = "normal"
    world.alpha.save()
    placement = apply_policy(spec_of(), world.alpha, backend="local")
    assert placement.spec.runtime.image == "registry.example.org/base:3"
    assert placement.spec.queue.priority == "normal"
    assert placement.spec.queue.name == "alpha"
    assert (placement.priority, placement.priority_value) == ("normal", 0)

    settings.TAU_DEFAULT_IMAGE = "python:3.12-slim"
    bare = apply_policy(spec_of(), world.beta, backend="local")
    assert bare.spec.runtime.image == "python:3.12-slim"  # neither spec nor workspace names one
    assert bare.spec.queue.priority is None
    assert bare.priority == ""
    assert bare.spec.queue.name == "beta"


def _set_leaves(data: Any, path: str = "") -> dict[str, Any]:
    """Every non-null leaf of a spec's normal form, by path."""
    if isinstance(data, dict):
        return {
            k: v
            for key, value in data.items()
            for k, v in _set_leaves(value, f"{path}.{key}").items()
        }
    return {} if data is None else {path: data}


@pytest.mark.parametrize(
    "path",
    sorted([*EXAMPLES.glob("*/tau.yaml"), *EXAMPLES.glob("*/tau.gpu.yaml")]),
    ids=lambda p: p.parent.name if p.name == "tau.yaml" else f"{p.parent.name}-gpu",
)
def test_no_value_the_spec_sets_is_ever_replaced(world: Any, path: Path) -> None:
    world.alpha.default_image = "registry.example.org/base:3"
    world.alpha.default_priority = "normal"
    world.alpha.save()
    quota(world.alpha, GPU, "64")
    spec = load_spec(path.read_bytes())
    placed = apply_policy(spec, world.alpha, backend="kubernetes").spec
    before, after = _set_leaves(spec.to_dict()), _set_leaves(placed.to_dict())
    assert {key: after[key] for key in before} == before
    filled = set(after) - set(before)
    assert filled <= {".runtime.image", ".queue.priority", ".queue.name"}


def test_a_spec_over_a_limit_is_refused_not_trimmed(world: Any, settings: Any) -> None:
    settings.TAU_MAX_GPUS_PER_NODE = 2
    spec = spec_of(compute={"gpus": 3})
    with pytest.raises(PolicyRefused):
        apply_policy(spec, world.alpha, backend="kubernetes")
    assert spec.compute.gpus == 3  # the input is a frozen value; nothing was clamped


@pytest.mark.parametrize(
    ("name", "gpus"),
    [
        ("multi-node-torchrun", 16),
        ("qlora", 1),
        ("gpu-quickstart", 1),
        # The GPU forms of the CPU examples (examples/<name>/tau.gpu.yaml).
        ("ddp-gpu", 16),
        ("fsdp-gpu", 16),
        ("lora-gpu", 1),
        ("ray-tune-gpu", 2),
        ("ray-train-gpu", 8),
        ("deepspeed-gpu", 16),
    ],
)
def test_a_gpu_example_is_accepted_within_a_gpu_quota_and_refused_over_it(
    world: Any, name: str, gpus: int
) -> None:
    """Issue 32: the GPU forms of the examples, as written, on the Kubernetes backend: a
    workspace whose GPU quota covers the run takes it; one GPU less, and the run is refused
    at once, with how many it needs and how many the workspace can get."""
    example, gpu_form = name.removesuffix("-gpu"), name.endswith("-gpu")
    spec = load_spec(
        (EXAMPLES / example / ("tau.gpu.yaml" if gpu_form else "tau.yaml")).read_bytes()
    )
    quota(world.beta, "cpu", "1000")
    quota(world.beta, "memory", "8Ti")
    quota(world.beta, GPU, str(gpus))
    placement = apply_policy(spec, world.beta, backend="kubernetes")
    assert placement.spec.compute.gpus * placement.spec.compute.workers == gpus
    quota(world.beta, GPU, str(gpus - 1))
    problems = refusal(spec, world.beta)
    assert list(problems) == ["compute.gpus"], problems
    assert f"the run needs {gpus} nvidia.com/gpu at once" in problems["compute.gpus"]
    assert f"but beta can get at most {gpus - 1}; it would never start." in problems["compute.gpus"]
