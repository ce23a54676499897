"""Rendering runs into Kubernetes objects: golden files for every example, and the rules one
by one (names, Kueue labels, resources, environment, bundle fetch, dependents).

``UPDATE_GOLDEN=1 pytest tests/executors/kubernetes/test_render.py`` rewrites
tests/executors/kubernetes/golden/ from the current renderer (review the diff); in CI that
variable makes the test fail.
"""

from __future__ import annotations

import base64
import dataclasses
import difflib
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from executors.kubernetes import labels, render
from executors.kubernetes.render import (
    Flavor,
    Owner,
    RenderError,
    kubernetes_problems,
    render_job,
    render_rayjob,
    render_workload,
    run_token_secret_name,
    workload_name,
)
from runs import workload_sdk
from tau import rendezvous
from tau.k8s_names import dns1035_label_problem
from tau.spec import MAX_NAME_LENGTH, RAYJOB_NAME_MAX_LENGTH, RUN_NAME_SUFFIX_MAX_LENGTH, spec_hash
from tau.spec.model import EnvVar
from tests.cluster.kueue_objects import H100_LABELS

from .render_cases import (
    BUNDLE_SHA256,
    GOLDEN,
    GPU_FORM,
    OWNER_UID,
    TOKEN,
    Case,
    cases,
    dump,
    example_spec,
    gpu_forms,
    load,
    render_case,
    target_for,
    with_changes,
)

CASES = cases()


def containers_of(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod_spec.get("initContainers", []), *pod_spec["containers"]]


def pod_specs(workload: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(component, pod spec) of every pod template in a RayJob or Job."""
    if workload["kind"] == "RayJob":
        cluster = workload["spec"]["rayClusterSpec"]
        yield "head", cluster["headGroupSpec"]["template"]["spec"]
        for group in cluster["workerGroupSpecs"]:
            yield "worker", group["template"]["spec"]
        yield "submitter", workload["spec"]["submitterPodTemplate"]["spec"]
    else:
        yield "worker", workload["spec"]["template"]["spec"]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    names = [variable["name"] for variable in container.get("env", [])]
    assert len(names) == len(set(names)), f"duplicate env names in {container['name']}: {names}"
    return {variable["name"]: variable for variable in container.get("env", [])}


def user_containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    """The containers that run the researcher's code (not the submitter, not the fetcher)."""
    return [
        pod["containers"][0]
        for component, pod in pod_specs(workload)
        if component in {"head", "worker"}
    ]


# ---------------------------------------------------------------------------------------------
# Golden files
# ---------------------------------------------------------------------------------------------


def test_every_example_has_a_case() -> None:
    names = {case.name for case in CASES}
    assert {"cpu-quickstart", "gpu-quickstart", "multi-node-torchrun"} <= names
    assert "resume-from-checkpoint" in names
    # Every GPU form (tau.gpu.yaml) too, as <example>-gpu.
    assert {"ddp", "fsdp", "lora", "ray-tune"} <= set(gpu_forms())
    assert {f"{name}-gpu" for name in gpu_forms()} <= names


#: What golden files hold in place of the packed workload SDK, which changes with tau/sdk.py
#: (its delivery has tests of its own: test_the_workload_sdk_rides_with_the_bundle).
SDK_PLACEHOLDER = "<runs.workload_sdk.packed()>"


def without_sdk(value: Any) -> Any:
    """``value`` with every occurrence of the packed SDK replaced by ``SDK_PLACEHOLDER``."""
    if isinstance(value, dict):
        return {key: without_sdk(item) for key, item in value.items()}
    if isinstance(value, list):
        return [without_sdk(item) for item in value]
    return SDK_PLACEHOLDER if value == workload_sdk.packed() else value


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_rendered_objects_match_the_golden_file(case: Case) -> None:
    path = GOLDEN / f"{case.name}.yaml"
    rendered = without_sdk(render_case(case.spec, case.target))
    if os.environ.get("UPDATE_GOLDEN"):
        if os.environ.get("CI"):
            pytest.fail("UPDATE_GOLDEN is set in CI: golden files are only rewritten by hand")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dump(rendered), encoding="utf-8")
        pytest.skip(f"rewrote {path.name}; review the diff")
    assert path.exists(), f"{path} is missing: run with UPDATE_GOLDEN=1 to create it"
    expected = path.read_text(encoding="utf-8")
    if load(expected) != rendered:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                dump(rendered).splitlines(keepends=True),
                fromfile=f"golden/{path.name}",
                tofile="rendered",
            )
        )
        pytest.fail(f"rendered objects differ from {path.name}:\n{diff}", pytrace=False)


def test_no_golden_file_is_stale() -> None:
    assert {path.stem for path in GOLDEN.glob("*.yaml")} == {case.name for case in CASES}


def test_rendering_is_deterministic() -> None:
    for case in CASES:
        assert dump(render_case(case.spec, case.target)) == dump(
            render_case(case.spec, case.target)
        )


# ---------------------------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------------------------


def test_the_47_character_rule() -> None:
    longest = "a" + "b" * (RAYJOB_NAME_MAX_LENGTH - 2) + "c"
    assert len(longest) == 47
    assert len(workload_name(longest, 1)) == 47
    with pytest.raises(RenderError, match="at most 47 characters"):
        workload_name(longest + "d", 1)
    for bad in ("1-starts-with-a-digit", "Upper-case", "ends-with-", "has_underscore", "a.b"):
        with pytest.raises(RenderError, match="cannot name a workload"):
            workload_name(bad, 1)
    for bad_attempt in (0, -1, 10**9 + 1):
        with pytest.raises(RenderError, match="attempt"):
            workload_name("train-k3x9q2", bad_attempt)


def test_every_run_name_the_platform_makes_fits_with_any_attempt() -> None:
    from runs.lifecycle import new_run_name

    assert MAX_NAME_LENGTH + 1 + RUN_NAME_SUFFIX_MAX_LENGTH == RAYJOB_NAME_MAX_LENGTH
    longest_spec_name = "a" * MAX_NAME_LENGTH
    for _ in range(20):
        name = new_run_name(longest_spec_name)
        names = {workload_name(name, attempt) for attempt in (1, 2, 9, 10, 99, 10**6, 10**9)}
        assert len(names) == 7
        for found in names:
            assert dns1035_label_problem(found, max_length=RAYJOB_NAME_MAX_LENGTH) is None
            assert len(run_token_secret_name(name, 1)) <= 63


def test_each_attempt_has_its_own_workload_name() -> None:
    spec = example_spec("gpu-quickstart")
    first = render_workload(spec, target_for(spec))
    retry = render_workload(spec, target_for(spec, attempt=2, retry_reason="preempted"))
    assert first["metadata"]["name"] == "aks-gpu-quickstart-k3x9q2-a1"
    assert retry["metadata"]["name"] == "aks-gpu-quickstart-k3x9q2-a2"
    assert retry["metadata"]["labels"][labels.RUN] == "aks-gpu-quickstart-k3x9q2"
    assert retry["metadata"]["labels"][labels.ATTEMPT] == "2"


def test_a_long_run_name_is_shortened_with_its_hash_and_stays_unique() -> None:
    one, two = "a" * 38 + "-k3x9q2", "a" * 38 + "-k3x9q3"
    assert workload_name(one, 1) != workload_name(two, 1)
    assert workload_name(one, 1).endswith("-a1")
    assert workload_name(one, 12).endswith("-a12")
    assert workload_name(one, 1) == workload_name(one, 1)
    # Short names stay readable.
    assert workload_name("train-k3x9q2", 3) == "train-k3x9q2-a3"


def test_a_run_name_over_47_characters_is_refused() -> None:
    spec = example_spec("gpu-quickstart")
    with pytest.raises(RenderError, match="at most 47"):
        render_workload(spec, target_for(spec, run_name="x" * 48, token_secret="t"))


def test_bad_inputs_are_refused_with_the_reason() -> None:
    spec = example_spec("gpu-quickstart")
    bad_inputs: list[tuple[dict[str, Any], str]] = [
        ({"namespace": "Not_A_Namespace"}, "namespace"),
        ({"portal_url": "taugrid.example.org"}, "portal URL"),
        ({"bundle_sha256": "abc"}, "bundle digest"),
        ({"attempt": 0}, "start at 1"),
        ({"flavor": Flavor("h100", H100_LABELS)}, "no compute.gpu_type"),
    ]
    for changes, message in bad_inputs:
        with pytest.raises(RenderError, match=message):
            render_workload(spec, target_for(spec, **changes))
    unplaced = with_changes(spec, runtime={"image": None})
    with pytest.raises(RenderError, match=r"runtime.image is unset"):
        render_workload(unplaced, target_for(unplaced))
    typed = with_changes(spec, compute={"gpu_type": "h100"})
    with pytest.raises(RenderError, match="flavor 'h100' is needed"):
        render_workload(typed, target_for(typed))
    with pytest.raises(RenderError, match="not 'job'"):
        render_job(spec, target_for(spec))
    cpu = example_spec("cpu-quickstart")
    with pytest.raises(RenderError, match="not 'rayjob'"):
        render_rayjob(cpu, target_for(cpu))


# ---------------------------------------------------------------------------------------------
# Kueue, deadlines, suspend
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_kueue_labels_are_present_exactly_when_they_apply(case: Case) -> None:
    workload = render_case(case.spec, case.target)[0]
    object_labels = workload["metadata"]["labels"]
    assert object_labels[labels.KUEUE_QUEUE_NAME] == case.target.local_queue
    if case.spec.queue.priority is None:
        assert labels.KUEUE_PRIORITY_CLASS not in object_labels
    else:
        assert object_labels[labels.KUEUE_PRIORITY_CLASS] == case.spec.queue.priority
    max_runtime = case.spec.run.max_runtime
    if max_runtime is None:
        assert labels.KUEUE_MAX_EXEC_TIME_SECONDS not in object_labels
        assert "activeDeadlineSeconds" not in workload["spec"]
    else:
        # The object's own deadline first (a clean failure); Kueue's as the backstop.
        assert workload["spec"]["activeDeadlineSeconds"] == max_runtime
        assert object_labels[labels.KUEUE_MAX_EXEC_TIME_SECONDS] == str(
            max_runtime + render.MAX_EXEC_TIME_GRACE_SECONDS
        )
    # Kueue's labels go on the workload only, never on its pods.
    for template_labels in _template_labels(workload):
        assert not any(key.startswith("kueue.x-k8s.io/") for key in template_labels)


def _template_labels(workload: dict[str, Any]) -> Iterator[dict[str, str]]:
    if workload["kind"] == "RayJob":
        cluster = workload["spec"]["rayClusterSpec"]
        yield cluster["headGroupSpec"]["template"]["metadata"]["labels"]
        for group in cluster["workerGroupSpecs"]:
            yield group["template"]["metadata"]["labels"]
        yield workload["spec"]["submitterPodTemplate"]["metadata"]["labels"]
    else:
        yield workload["spec"]["template"]["metadata"]["labels"]


def test_priority_label_follows_the_spec() -> None:
    spec = with_changes(example_spec("cpu-quickstart"), queue={"priority": "high"})
    job = render_workload(spec, target_for(spec))
    assert job["metadata"]["labels"][labels.KUEUE_PRIORITY_CLASS] == "high"
    too_long = with_changes(spec, queue={"priority": "p" * 64})
    with pytest.raises(RenderError, match="priority"):
        render_workload(too_long, target_for(too_long))


def _walk(value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield key, item
            yield from _walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_suspend_is_left_to_kueue(case: Case) -> None:
    assert all(key != "suspend" for key, _ in _walk(render_case(case.spec, case.target)))


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_taugrid_labels_and_annotations(case: Case) -> None:
    workload = render_case(case.spec, case.target)[0]
    metadata = workload["metadata"]
    assert metadata["labels"][labels.RUN] == case.target.run_name
    assert metadata["labels"][labels.RUN_ID] == "42"
    assert metadata["labels"][labels.WORKSPACE] == "alpha"
    assert metadata["labels"][labels.ATTEMPT] == str(case.target.attempt)
    assert metadata["labels"][labels.MANAGED_BY] == labels.MANAGED_BY_TAUGRID
    assert metadata["annotations"][labels.SPEC_HASH] == spec_hash(case.spec)
    if case.target.bundle_sha256 is None:
        assert labels.BUNDLE_SHA256 not in metadata["annotations"]
    else:
        assert metadata["annotations"][labels.BUNDLE_SHA256] == case.target.bundle_sha256
    for template_labels in _template_labels(workload):
        assert template_labels[labels.RUN] == case.target.run_name
        assert template_labels[labels.COMPONENT] in {"head", "worker", "submitter"}


def test_every_key_is_spelt_in_the_labels_module() -> None:
    keys = set()
    for case in CASES:
        for obj in render_case(case.spec, case.target):
            keys |= set(obj["metadata"].get("labels", {}))
            keys |= set(obj["metadata"].get("annotations", {}))
            if obj["kind"] in {"RayJob", "Job"}:
                for template_labels in _template_labels(obj):
                    keys |= set(template_labels)
    spelt = {
        value
        for name, value in vars(labels).items()
        if name.isupper() and isinstance(value, str) and "/" in value
    }
    assert keys <= spelt, keys - spelt


# ---------------------------------------------------------------------------------------------
# Resources
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_requests_equal_limits_unless_the_spec_says_otherwise(case: Case) -> None:
    workload = render_case(case.spec, case.target)[0]
    compute = case.spec.compute
    for component, pod in pod_specs(workload):
        for container in containers_of(pod):
            resources = container["resources"]
            if component == "worker" and container is pod["containers"][0]:
                limits = {"cpu": compute.cpu_limit, "memory": compute.memory_limit}
            elif component == "head" and container is pod["containers"][0]:
                head = compute.ray_head
                limits = {"cpu": head.cpu_limit, "memory": head.memory_limit}
            else:
                assert resources["requests"] == resources["limits"], container["name"]
                continue
            gpus = resources["requests"].get("nvidia.com/gpu")
            if gpus is not None:
                limits["nvidia.com/gpu"] = gpus  # never overcommitted
            assert resources["limits"] == limits, container["name"]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_workers_get_compute_and_gpus_only_there(case: Case) -> None:
    workload = render_case(case.spec, case.target)[0]
    compute = case.spec.compute
    expected = {"cpu": compute.cpus, "memory": compute.memory}
    if compute.gpus:
        expected["nvidia.com/gpu"] = str(compute.gpus)
    for component, pod in pod_specs(workload):
        requests = pod["containers"][0]["resources"]["requests"]
        if component == "worker":
            assert requests == expected
        else:
            assert "nvidia.com/gpu" not in requests
    if workload["kind"] == "RayJob":
        group = workload["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
        assert group["replicas"] == group["minReplicas"] == group["maxReplicas"]
        assert group["replicas"] == compute.workers
        head = workload["spec"]["rayClusterSpec"]["headGroupSpec"]
        sized = compute.ray_head
        assert head["template"]["spec"]["containers"][0]["resources"]["requests"] == {
            "cpu": sized.cpus,
            "memory": sized.memory,
        }
        if compute.head is None:
            assert render.head_requests(case.spec) == dict(render.HEAD_RESOURCES)
        assert head["rayStartParams"] == {"num-cpus": "0"}
    else:
        assert workload["spec"]["completions"] == workload["spec"]["parallelism"]
        assert workload["spec"]["parallelism"] == compute.workers


def test_a_cpu_only_worker_asks_for_no_gpu() -> None:
    spec = with_changes(example_spec("gpu-quickstart"), compute={"gpus": 0})
    worker = render_workload(spec, target_for(spec))["spec"]["rayClusterSpec"]
    limits = worker["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]
    assert "nvidia.com/gpu" not in limits["limits"]


def test_a_named_flavor_selects_its_nodes_for_the_gpu_pods_only() -> None:
    case = next(case for case in CASES if case.name == "gpu-quickstart-retry-on-h100")
    workload = render_case(case.spec, case.target)[0]
    for component, pod in pod_specs(workload):
        if component == "worker":
            assert pod["nodeSelector"] == H100_LABELS
        else:
            assert "nodeSelector" not in pod
        assert "tolerations" not in pod  # Kueue injects the flavor's tolerations
    plain = render_case(*_case("gpu-quickstart"))[0]
    assert all("nodeSelector" not in pod for _, pod in pod_specs(plain))


def _case(name: str) -> tuple[Any, Any]:
    case = next(case for case in CASES if case.name == name)
    return case.spec, case.target


# ---------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_every_container_gets_the_platform_environment(case: Case) -> None:
    workload = render_case(case.spec, case.target)[0]
    target = case.target
    for _, pod in pod_specs(workload):
        for container in containers_of(pod):
            env = env_of(container)
            expected = set(render.PLATFORM_ENV)
            if target.resume_from is None:
                expected.discard("TAU_RESUME_FROM")
            assert expected <= set(env), (container["name"], expected - set(env))
            assert env["TAU_RUN_ID"]["value"] == "42"
            assert env["TAU_RUN_NAME"]["value"] == target.run_name
            assert env["TAU_WORKSPACE"]["value"] == "alpha"
            assert env["TAU_ATTEMPT"]["value"] == str(target.attempt)
            assert env["TAU_OUTPUT_DIR"]["value"] == "/tau/outputs"
            assert env["TAU_CHECKPOINT_DIR"]["value"] == "/tau/checkpoints"
            assert env["TAU_RETRY_REASON"].get("value", "") == target.retry_reason
            assert env["TAU_API_URL"]["value"] == "https://taugrid.example.org"
            assert env["TAU_RUN_TOKEN"] == {
                "name": "TAU_RUN_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": target.token_secret, "key": "token"}},
            }
            if target.resume_from is not None:
                assert env["TAU_RESUME_FROM"]["value"] == target.resume_from


def test_the_spec_environment_and_secrets_reach_the_user_containers() -> None:
    spec = with_changes(
        example_spec("gpu-quickstart"),
        runtime={
            "env": (
                render_env("NCCL_DEBUG", "WARN"),
                render_env("PRICE", "$(HOME) costs $5"),
            ),
            "secrets": (render_secret("WANDB_API_KEY", "wandb", "api-key"),),
        },
    )
    workload = render_workload(spec, target_for(spec))
    for container in [*user_containers(workload), _submitter(workload)]:
        env = env_of(container)
        assert env["NCCL_DEBUG"]["value"] == "WARN"
        # The kubelet expands $(NAME) and turns $$ into $: doubled, the value stays literal.
        assert env["PRICE"]["value"] == "$$(HOME) costs $$5"
        assert env["WANDB_API_KEY"]["valueFrom"] == {
            "secretKeyRef": {"name": "wandb", "key": "api-key"}
        }
    runtime_env = yaml.safe_load(workload["spec"]["runtimeEnvYAML"])
    assert "env_vars" not in runtime_env  # container env is exact; see the module docstring
    assert runtime_env == {
        "pip": ["torch>=2.4.0"],
        "working_dir": "/tau/code",
        "py_modules": ["/tau/sdk/tau"],
    }


def render_env(name: str, value: str) -> Any:
    from tau.spec import EnvVar

    return EnvVar(name, value)


def render_secret(env: str, secret: str, key: str) -> Any:
    from tau.spec import SecretRef

    return SecretRef(env=env, secret=secret, key=key)


def _submitter(workload: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = workload["spec"]["submitterPodTemplate"]["spec"]["containers"][0]
    return container


def test_a_multi_worker_job_gets_rendezvous_settings_and_a_headless_service() -> None:
    spec, target = _case("multi-node-torchrun")
    job, secret, service = render_case(spec, target)
    name = target.workload_name
    pod = job["spec"]["template"]["spec"]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2
    assert pod["subdomain"] == service["metadata"]["name"] == name
    # Its environment: test_every_pod_of_a_multi_worker_job_gets_the_rendezvous_table.
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    template_labels = job["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= template_labels.items()
    assert secret["kind"] == "Secret"


@pytest.mark.parametrize("workers", [2, 5])
def test_every_pod_of_a_multi_worker_job_gets_the_rendezvous_table(workers: int) -> None:
    """Exactly the names of tau/rendezvous.py, in its order, each said the way a pod can: the
    same table the local executor's workers get."""
    spec = with_changes(example_spec("multi-node-torchrun"), compute={"workers": workers})
    target = target_for(spec)
    job, _secret, service = render_case(spec, target)
    name = target.workload_name
    completion_index = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    index = {"fieldRef": {"fieldPath": completion_index}}
    master, port = f"{name}-0.{name}", str(rendezvous.DEFAULT_PORT)
    expected: list[dict[str, Any]] = [
        {"name": "MASTER_ADDR", "value": master},
        {"name": "MASTER_PORT", "value": port},
        {"name": "WORLD_SIZE", "value": str(workers)},
        {"name": "RANK", "valueFrom": index},
        {"name": "LOCAL_RANK", "value": "0"},
        {"name": "PET_NNODES", "value": str(workers)},
        {"name": "PET_NODE_RANK", "valueFrom": index},
        {"name": "PET_MASTER_ADDR", "value": master},
        {"name": "PET_MASTER_PORT", "value": port},
    ]
    assert [variable["name"] for variable in expected] == list(rendezvous.NAMES)
    # torchrun's default port, and the one the headless Service names.
    assert rendezvous.DEFAULT_PORT == 29500
    assert service["spec"]["ports"][0]["port"] == rendezvous.DEFAULT_PORT
    pods = list(pod_specs(job))
    assert [component for component, _pod in pods] == ["worker"]
    for _component, pod in pods:
        for container in pod.get("initContainers", []):
            assert not set(env_of(container)) & set(rendezvous.NAMES), container["name"]
        for container in pod["containers"]:
            env_of(container)  # no name twice
            table = [
                variable for variable in container["env"] if variable["name"] in rendezvous.NAMES
            ]
            assert table == expected, container["name"]


@pytest.mark.parametrize("taken", rendezvous.NAMES)
def test_the_spec_wins_over_a_rendezvous_default(taken: str) -> None:
    spec = with_changes(
        example_spec("multi-node-torchrun"), runtime={"env": (render_env(taken, "1234"),)}
    )
    container = render_workload(spec, target_for(spec))["spec"]["template"]["spec"]["containers"][0]
    env = env_of(container)  # set once: the spec's, not the table's as well
    assert env[taken] == {"name": taken, "value": "1234"}
    # The rest of the table is still there, in its order.
    names = [variable["name"] for variable in container["env"]]
    others = [name for name in rendezvous.NAMES if name != taken]
    assert [name for name in names if name in others] == others
    if taken == "MASTER_PORT":
        assert env["PET_MASTER_PORT"]["value"] == str(rendezvous.DEFAULT_PORT)


def test_a_secret_wins_over_a_rendezvous_default() -> None:
    spec = with_changes(
        example_spec("multi-node-torchrun"),
        runtime={"secrets": (render_secret("MASTER_ADDR", "rendezvous", "address"),)},
    )
    env = env_of(
        render_workload(spec, target_for(spec))["spec"]["template"]["spec"]["containers"][0]
    )
    assert env["MASTER_ADDR"] == {
        "name": "MASTER_ADDR",
        "valueFrom": {"secretKeyRef": {"name": "rendezvous", "key": "address"}},
    }


def test_single_worker_jobs_are_plain() -> None:
    spec, target = _case("cpu-quickstart")
    job, _secret = render_case(spec, target)
    assert "completionMode" not in job["spec"]
    assert job["spec"]["backoffLimit"] == 0
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert "subdomain" not in pod
    assert not set(env_of(pod["containers"][0])) & set(rendezvous.NAMES)


# ---------------------------------------------------------------------------------------------
# Shared memory and NCCL
# ---------------------------------------------------------------------------------------------


def _memory_limit(component: str, spec: Any) -> str:
    sized = spec.compute.ray_head if component == "head" else spec.compute
    limit: str = sized.memory_limit
    return limit


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_dev_shm_is_memory_backed_and_as_large_as_the_container_s_memory_limit(
    case: Case,
) -> None:
    workload = render_case(case.spec, case.target)[0]
    checked = 0
    for component, pod in pod_specs(workload):
        (main,) = pod["containers"]
        shm = [mount for mount in main.get("volumeMounts", []) if mount["mountPath"] == "/dev/shm"]
        if component == "submitter":
            assert shm == [], component  # KubeRay's submitter runs no user code
            continue
        (mount,) = shm
        (volume,) = [volume for volume in pod["volumes"] if volume["name"] == mount["name"]]
        limit = _memory_limit(component, case.spec)
        assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": limit}, component
        assert main["resources"]["limits"]["memory"] == limit, component
        checked += 1
    assert checked == (2 if workload["kind"] == "RayJob" else 1)


def test_dev_shm_follows_a_memory_limit_above_the_request() -> None:
    """The limit, not the request: pages in /dev/shm are charged up to the cgroup's limit."""
    spec, target = _case("reference-kind-ray")  # requests 256Mi / 512Mi, limits 768Mi / 6Gi
    cluster = render_workload(spec, target)["spec"]["rayClusterSpec"]
    head = cluster["headGroupSpec"]["template"]["spec"]
    worker = cluster["workerGroupSpecs"][0]["template"]["spec"]
    shm = {volume["name"]: volume for volume in head["volumes"]}["tau-shm"]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "6Gi"}
    shm = {volume["name"]: volume for volume in worker["volumes"]}["tau-shm"]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "768Mi"}
    job_spec = with_changes(
        example_spec("ddp", GPU_FORM),
        compute={"limits": dataclasses.replace(spec.compute.limits, memory="600Gi")},
    )
    pod = render_workload(job_spec, target_for(job_spec, flavor=Flavor("h100", H100_LABELS)))
    volumes = {volume["name"]: volume for volume in pod["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tau-shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "600Gi"}


def test_nccl_may_run_where_gpus_talk_to_each_other() -> None:
    def shaped(workers: int, gpus: int, *, sweep: bool = False) -> Any:
        base = example_spec("ray-tune") if sweep else example_spec("multi-node-torchrun")
        return with_changes(base, compute={"workers": workers, "gpus": gpus})

    assert render.nccl_may_run(shaped(2, 8))  # torchrun's processes on two nodes
    assert render.nccl_may_run(shaped(1, 8))  # eight processes in one pod
    assert render.nccl_may_run(shaped(2, 1))  # two GPU workers training together
    assert not render.nccl_may_run(shaped(1, 1))  # one GPU: nobody to talk to
    assert not render.nccl_may_run(shaped(2, 0))  # CPUs: gloo
    # A sweep's trials train alone, one worker's GPUs each.
    assert not render.nccl_may_run(shaped(2, 1, sweep=True))
    assert render.nccl_may_run(shaped(1, 2, sweep=True))


def _has_nccl_debug(workload: dict[str, Any]) -> dict[str, dict[str, Any] | None]:
    return {
        component: env_of(pod["containers"][0]).get("NCCL_DEBUG")
        for component, pod in pod_specs(workload)
    }


def test_the_multi_gpu_forms_get_nccl_warnings_and_no_other_case_does() -> None:
    with_nccl = {
        case.name
        for case in CASES
        if any(_has_nccl_debug(render_case(case.spec, case.target)[0]).values())
    }
    # multi-node-torchrun sets NCCL_DEBUG in its runtime.env itself; 1-GPU runs, CPU runs and
    # the sweep of 1-GPU trials get nothing.
    assert with_nccl == {
        *("ddp-gpu", "fsdp-gpu", "deepspeed-gpu", "multi-node-torchrun", "ray-train-gpu")
    }
    for name in ("ddp-gpu", "fsdp-gpu"):
        spec, target = _case(name)
        container = render_workload(spec, target)["spec"]["template"]["spec"]["containers"][0]
        names = [variable["name"] for variable in container["env"]]
        assert env_of(container)["NCCL_DEBUG"] == {"name": "NCCL_DEBUG", "value": "WARN"}
        # After the platform's rendezvous table, before the spec's own variables.
        assert names.index("PET_MASTER_PORT") < names.index("NCCL_DEBUG")
        assert names.index("NCCL_DEBUG") < names.index("OMP_NUM_THREADS")
        assert [name for name, _ in render.NCCL_ENV] == ["NCCL_DEBUG"]
        # Never in the fetcher, which runs no user code.
        (fetcher,) = render_workload(spec, target)["spec"]["template"]["spec"]["initContainers"]
        assert "NCCL_DEBUG" not in env_of(fetcher)


def test_only_the_gpu_workers_of_a_rayjob_get_nccl_settings() -> None:
    spec = with_changes(example_spec("gpu-quickstart"), compute={"workers": 2})
    found = _has_nccl_debug(render_workload(spec, target_for(spec)))
    assert found == {
        "head": None,
        "worker": {"name": "NCCL_DEBUG", "value": "WARN"},
        "submitter": None,
    }


def test_the_spec_wins_over_an_nccl_default() -> None:
    spec = with_changes(
        example_spec("ddp", GPU_FORM), runtime={"env": (render_env("NCCL_DEBUG", "INFO"),)}
    )
    target = target_for(spec, flavor=Flavor("h100", H100_LABELS))
    container = render_workload(spec, target)["spec"]["template"]["spec"]["containers"][0]
    assert env_of(container)["NCCL_DEBUG"] == {"name": "NCCL_DEBUG", "value": "INFO"}
    secret = with_changes(
        example_spec("ddp", GPU_FORM),
        runtime={"secrets": (render_secret("NCCL_DEBUG", "nccl", "level"),)},
    )
    container = render_workload(secret, target)["spec"]["template"]["spec"]["containers"][0]
    assert env_of(container)["NCCL_DEBUG"] == {
        "name": "NCCL_DEBUG",
        "valueFrom": {"secretKeyRef": {"name": "nccl", "key": "level"}},
    }


def test_the_gpu_forms_ask_for_whole_gpus_on_their_flavor_and_leave_tolerations_to_kueue() -> None:
    """What a real GPU pool needs of the pods: requests equal to limits for nvidia.com/gpu, the
    named flavor's node labels as the node selector; the flavor's tolerations are put on the
    pods by Kueue on admission (test_render_cluster.py checks them on the admitted pods)."""
    for name in gpu_forms():
        spec, target = _case(f"{name}-gpu")
        assert spec.compute.gpus >= 1, name
        for component, pod in pod_specs(render_case(spec, target)[0]):
            resources = pod["containers"][0]["resources"]
            gpus = resources["requests"].get("nvidia.com/gpu")
            assert gpus == resources["limits"].get("nvidia.com/gpu"), (name, component)
            assert (gpus == str(spec.compute.gpus)) == (component == "worker"), (name, component)
            assert "tolerations" not in pod, (name, component)
            if component == "worker" and spec.compute.gpu_type is not None:
                assert pod["nodeSelector"] == H100_LABELS, name
            else:
                assert "nodeSelector" not in pod, (name, component)


# ---------------------------------------------------------------------------------------------
# Entry points (the shell round trip itself is in test_render_entrypoint.py)
# ---------------------------------------------------------------------------------------------


def test_job_commands_are_the_exact_argument_vector() -> None:
    spec = with_changes(
        example_spec("cpu-quickstart"),
        run={"args": ("--name", "my run", 'say "hi"', "it's", "$(HOME)", "a\tb\nc")},
    )
    container = render_workload(spec, target_for(spec))["spec"]["template"]["spec"]
    command = container["containers"][0]["command"]
    assert command == [
        "python",
        "train.py",
        "--name",
        "my run",
        'say "hi"',
        "it's",
        "$$(HOME)",
        "a\tb\nc",
    ]


def test_plain_ray_entry_points_stay_readable() -> None:
    assert render.ray_entrypoint(["python", "train.py", "--steps", "1500"]) == (
        "python train.py --steps 1500"
    )
    spec, target = _case("gpu-quickstart")
    assert render_workload(spec, target)["spec"]["entrypoint"] == "python train.py"


def test_what_a_rayjob_cannot_carry_is_reported_before_rendering() -> None:
    spec = with_changes(
        example_spec("gpu-quickstart"),
        run={"args": ("a\tb",)},
        runtime={"pip": ("torch>=2.4.0", "pkg @ https://example.org/$x.whl")},
    )
    assert [path for path, _ in kubernetes_problems(spec)] == ["run.args[0]", "runtime.pip[1]"]
    with pytest.raises(RenderError, match="TAB"):
        render_workload(spec, target_for(spec))
    job = with_changes(spec, run={"workload_kind": "job"})
    assert kubernetes_problems(job) == []


# ---------------------------------------------------------------------------------------------
# Bundle fetch, storage, dependents
# ---------------------------------------------------------------------------------------------


def test_the_bundle_is_fetched_verified_and_shared() -> None:
    spec, target = _case("gpu-quickstart")
    rayjob = render_workload(spec, target)
    submitter = rayjob["spec"]["submitterPodTemplate"]["spec"]
    (fetcher,) = submitter["initContainers"]
    assert fetcher["command"][:4] == ["python3", "-I", "-c", render.FETCH_SCRIPT]
    assert fetcher["command"][4:] == [
        "https://taugrid.example.org/api/v1/workspaces/alpha/runs/aks-gpu-quickstart-k3x9q2/bundle/",
        BUNDLE_SHA256,
        "/tau/fetch",
        str(render.MAX_BUNDLE_BYTES),
        workload_sdk.packed(),
    ]
    assert fetcher["securityContext"]["runAsNonRoot"] is True
    assert fetcher["securityContext"]["readOnlyRootFilesystem"] is True
    assert submitter["containers"][0]["volumeMounts"] == [
        {"name": "tau-code", "mountPath": "/tau/code", "subPath": "code", "readOnly": True},
        {"name": "tau-code", "mountPath": "/tau/sdk", "subPath": "sdk", "readOnly": True},
    ]
    submit_env = env_of(submitter["containers"][0])
    assert submit_env["RAY_RUNTIME_ENV_IGNORE_GITIGNORE"]["value"] == "1"
    # Head and workers get the code through Ray's working_dir, not a volume of their own.
    for container in user_containers(rayjob):
        assert all(mount["name"] != "tau-code" for mount in container["volumeMounts"])

    spec, target = _case("resume-from-checkpoint")
    job = render_workload(spec, target)["spec"]["template"]["spec"]
    assert [init["name"] for init in job["initContainers"]] == ["tau-fetch-bundle"]
    workload = job["containers"][0]
    assert workload["workingDir"] == "/tau/code"
    mounts = {mount["mountPath"]: mount for mount in workload["volumeMounts"]}
    # resilience.checkpoint_dir is relative to the project directory, and persistent.
    assert mounts["/tau/code/checkpoints"]["subPath"] == mounts["/tau/checkpoints"]["subPath"]
    assert mounts["/tau/outputs"]["subPath"].endswith("/outputs/attempt-1")


def test_the_workload_sdk_rides_with_the_bundle() -> None:
    """The fetcher writes the SDK; a Job's container finds it first on PYTHONPATH (after it,
    the spec's own PYTHONPATH); a RayJob ships it to its driver and workers as py_modules."""
    packed = workload_sdk.packed()
    assert "$" not in packed  # the kubelet expands $(…) in args
    assert set(packed) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=")
    # A few KiB in each pod spec, not more (17 KiB since the SDK checks steps and sweeps
    # place a trial's returned row, 25 KiB with the endpoints' Serve builder, 33 KiB with its
    # local runner's status, metrics and loopback hook; an object may hold 1.5 MiB, and a
    # RayService carries it twice).
    assert len(packed) < 40 * 1024

    spec, target = _case("resume-from-checkpoint")
    pod = render_workload(spec, target)["spec"]["template"]["spec"]
    (workload,) = pod["containers"]
    assert env_of(workload)["PYTHONPATH"] == {"name": "PYTHONPATH", "value": "/tau/sdk"}
    mounts = {mount["mountPath"]: mount for mount in workload["volumeMounts"]}
    assert mounts["/tau/sdk"] == {
        "name": "tau-code",
        "mountPath": "/tau/sdk",
        "subPath": "sdk",
        "readOnly": True,
    }
    assert pod["initContainers"][0]["command"][-1] == packed

    own = with_changes(spec, runtime={"env": (EnvVar("PYTHONPATH", "/opt/lib:$HOME/lib"),)})
    workload = render_workload(own, target_for(own))["spec"]["template"]["spec"]["containers"][0]
    variables = [variable for variable in workload["env"] if variable["name"] == "PYTHONPATH"]
    assert variables == [{"name": "PYTHONPATH", "value": "/tau/sdk:/opt/lib:$$HOME/lib"}]

    gpu = example_spec("gpu-quickstart")
    rayjob = render_workload(gpu, target_for(gpu))
    runtime_env = yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])
    assert runtime_env["py_modules"] == ["/tau/sdk/tau"]
    assert runtime_env["working_dir"] == "/tau/code"


def test_without_a_bundle_there_is_no_fetcher() -> None:
    spec, target = _case("cpu-quickstart-no-bundle")
    pod = render_workload(spec, target)["spec"]["template"]["spec"]
    assert "initContainers" not in pod
    assert "workingDir" not in pod["containers"][0]
    gpu = example_spec("gpu-quickstart")
    rayjob = render_workload(gpu, target_for(gpu, bundle_sha256=None))
    assert "initContainers" not in rayjob["spec"]["submitterPodTemplate"]["spec"]
    assert yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"]) == {"pip": ["torch>=2.4.0"]}


def test_the_fetch_script_is_safe_from_the_kubelet_and_matches_the_upload_limit() -> None:
    from runs import bundles

    assert "$" not in render.FETCH_SCRIPT
    assert render.MAX_BUNDLE_BYTES == bundles.MAX_BUNDLE_BYTES
    compile(render.FETCH_SCRIPT, "<fetch>", "exec")


def test_the_run_secret_is_owned_by_the_workload() -> None:
    spec, target = _case("gpu-quickstart")
    secret = render_case(spec, target)[1]
    assert secret["metadata"]["name"] == "aks-gpu-quickstart-k3x9q2-a1-run-token"
    assert secret["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "ray.io/v1",
            "kind": "RayJob",
            "name": "aks-gpu-quickstart-k3x9q2-a1",
            "uid": OWNER_UID,
            "blockOwnerDeletion": True,
        }
    ]
    assert base64.b64decode(secret["data"]["token"]).decode() == TOKEN
    assert secret["immutable"] is True
    created = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "x", "uid": "u-1", "namespace": "n"},
    }
    assert Owner.of(created) == Owner("ray.io/v1", "RayJob", "x", "u-1")
    with pytest.raises(RenderError, match="token"):
        render.render_run_secret(spec, target, token="", owner=Owner.of(created))


def test_rendering_imports_neither_django_nor_kubernetes() -> None:
    code = (
        "import sys, executors.kubernetes.render\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'django', 'kubernetes'})\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_the_data_volume_is_mounted_at_data_in_every_pod(case: Case) -> None:
    workload = render_case(case.spec, case.target)[0]
    storage = case.spec.storage
    for component, pod in pod_specs(workload):
        claims = [
            volume["persistentVolumeClaim"]
            for volume in pod.get("volumes", [])
            if volume["name"] == "tau-dataset"
        ]
        main = pod["containers"][0]
        mounts = [m for m in main.get("volumeMounts", []) if m["mountPath"] == "/data"]
        env = {variable["name"]: variable.get("value") for variable in main.get("env", [])}
        if component == "submitter":
            # KubeRay's submitter only submits the job: it never mounts the data.
            assert (claims, mounts) == ([], []), component
            continue
        staged = case.target.staged_data is not None
        if storage.data_pvc is None:
            assert (claims, mounts) == ([], []), component
            # TAU_DATA_DIR names the staged datasets where there are some (test_staging_…).
            assert env.get("TAU_DATA_DIR") == ("/tau/data" if staged else None), component
            continue
        expected_claim: dict[str, object] = {"claimName": storage.data_pvc}
        expected_mount: dict[str, object] = {"name": "tau-dataset", "mountPath": "/data"}
        if storage.read_only:
            expected_claim["readOnly"] = expected_mount["readOnly"] = True
        assert claims == [expected_claim], component
        assert mounts == [expected_mount], component
        assert env["TAU_DATA_DIR"] == ("/tau/data" if staged else "/data"), component


@pytest.mark.parametrize("kind", ["job", "rayjob"])
def test_staging_puts_the_pinned_datasets_read_only_at_tau_data_before_the_program(
    kind: str,
) -> None:
    """A run that reads datasets: every pod that runs its code (a Job's pods; a RayJob's head,
    where the driver runs, and each worker) stages them first, into a volume sized from the
    manifest, mounted read-only where TAU_DATA_DIR says; a data PVC stays at /data."""
    spec = with_changes(
        example_spec("train-on-data"),
        run={"workload_kind": kind},
        storage={"data_pvc": "shared"},
    )
    target = target_for(spec, staged_data=(1000, 5 * 2**30))
    workload = render_workload(spec, target)
    size = str(5 * 2**30 + 1000 * render.STAGE_BYTES_PER_FILE + render.STAGE_SLACK_BYTES)
    staged_pods = 0
    for component, pod in pod_specs(workload):
        stagers = [c for c in pod.get("initContainers", []) if c["name"] == "tau-stage-data"]
        if component == "submitter":
            assert stagers == []
            continue
        staged_pods += 1
        (stager,) = stagers
        # After the bundle fetcher (when the pod has one): nothing runs before both.
        assert pod["initContainers"][-1] is stager
        assert stager["command"][:4] == ["python3", "-I", "-c", render.STAGE_SCRIPT]
        base = "https://taugrid.example.org/api/v1/workspaces/alpha/runs/train-on-data-k3x9q2/"
        assert stager["command"][4:] == [
            f"{base}data/",
            "/tau/data",
            str(5 * 2**30),
            f"{base}report/data-staged/",
        ]
        assert env_of(stager)["TAU_RUN_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "token"
        assert stager["terminationMessagePolicy"] == "FallbackToLogsOnError"
        assert stager["securityContext"]["readOnlyRootFilesystem"] is True
        assert stager["volumeMounts"] == [{"name": "tau-datasets", "mountPath": "/tau/data"}]
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        assert volumes["tau-datasets"] == {"name": "tau-datasets", "emptyDir": {"sizeLimit": size}}
        main = pod["containers"][0]
        mounts = {mount["mountPath"]: mount for mount in main["volumeMounts"]}
        assert mounts["/tau/data"] == {
            "name": "tau-datasets",
            "mountPath": "/tau/data",
            "readOnly": True,
        }
        assert mounts["/data"]["name"] == "tau-dataset"  # the PVC, where it always is
        assert env_of(main)["TAU_DATA_DIR"]["value"] == "/tau/data"
    assert staged_pods == (2 if kind == "rayjob" else 1)
    assert "$" not in render.STAGE_SCRIPT
    compile(render.STAGE_SCRIPT, "<stage>", "exec")


def test_what_a_cluster_run_reads_and_makes_is_no_problem_of_rendering() -> None:
    """Datasets are staged (above); output versions need the workspace's mounted claim, which
    the backend checks at submission (test_cluster_outputs), not the rendering."""
    for name in ("data-prep", "train-on-data"):
        assert kubernetes_problems(example_spec(name)) == []


def test_the_reference_cases_carry_what_they_say() -> None:
    by_name = {case.name: case for case in CASES}
    assert by_name["reference-gpu-data-volume"].spec.storage.data_access == "read-write"
    assert by_name["cpu-quickstart-data-volume"].spec.storage.data_access == "read-only"
    assert by_name["reference-kind-ray"].spec.compute.head is not None
    assert by_name["reference-kind-ray"].spec.compute.limits.cpus == "1"


def test_a_rayjob_leaves_its_ray_requirement_to_the_image() -> None:
    """examples/ray-train names ray[default,train] in runtime.pip (the local executor starts a
    Ray cluster only when the run's environment has Ray); on a cluster the image's Ray runs
    it, so the runtime environment installs the rest and never another Ray."""
    spec = example_spec("ray-train")
    assert spec.runtime.installs("ray")
    runtime_env = yaml.safe_load(render.runtime_env_yaml(spec, target_for(spec)) or "")
    assert runtime_env["pip"] == ["torch==2.5.1", "numpy==2.1.3"]
    no_ray = dataclasses.replace(
        spec, runtime=dataclasses.replace(spec.runtime, pip=("Ray==2.60.0",))
    )
    assert "pip" not in yaml.safe_load(render.runtime_env_yaml(no_ray, target_for(no_ray)) or "")
