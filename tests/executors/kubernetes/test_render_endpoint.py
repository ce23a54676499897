"""Rendering endpoints into Kubernetes objects (executors/kubernetes/render_endpoint.py):
golden files for every endpoint case, then the rules one by one (Kueue labels, a fixed worker
group, the Serve config through the SDK's builder, code and model in every Ray pod, the token
only where it is needed, refusals).

``UPDATE_GOLDEN=1 pytest tests/executors/kubernetes/test_render_endpoint.py`` rewrites
tests/executors/kubernetes/golden/endpoints/ (review the diff); in CI that variable makes the
test fail.
"""

from __future__ import annotations

import difflib
import os
from decimal import Decimal
from typing import Any

import pytest
import yaml

from executors.kubernetes import labels
from executors.kubernetes.endpoints import KubernetesEndpoints
from executors.kubernetes.render import FETCH_SCRIPT, STAGE_SCRIPT, Flavor, RenderError
from executors.kubernetes.render_endpoint import (
    SERVE_BUILDER,
    bundle_url,
    model_url,
    render_rayservice,
    worker_count,
)
from tau.quantity import parse_quantity
from tau.spec import spec_hash
from tau.spec.model import EnvVar
from tests.cluster.kueue_objects import H100_LABELS

from .render_cases import (
    BUNDLE_SHA256,
    GOLDEN,
    EndpointCase,
    dump,
    endpoint_cases,
    endpoint_target_for,
    example_spec,
    load,
    render_endpoint_case,
    with_changes,
)
from .test_render import without_sdk

CASES = endpoint_cases()
ENDPOINT_GOLDEN = GOLDEN / "endpoints"
#: The OpenAI-compatible LLM examples (one GPU per replica; they run only where GPUs are).
LLM_EXAMPLES = ("vllm-serve", "sglang-serve", "trtllm-serve")


def by_name(name: str) -> EndpointCase:
    return next(case for case in CASES if case.name == name)


def serve_config(service: dict[str, Any]) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(service["spec"]["serveConfigV2"])
    return loaded


def ray_pods(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    cluster = service["spec"]["rayClusterConfig"]
    return {
        "head": cluster["headGroupSpec"]["template"]["spec"],
        "worker": cluster["workerGroupSpecs"][0]["template"]["spec"],
    }


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_rendered_endpoint_objects_match_the_golden_file(case: EndpointCase) -> None:
    path = ENDPOINT_GOLDEN / f"{case.name}.yaml"
    rendered = without_sdk(render_endpoint_case(case.spec, case.target))
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
                fromfile=f"golden/endpoints/{path.name}",
                tofile="rendered",
            )
        )
        pytest.fail(f"rendered objects differ from {path.name}:\n{diff}", pytrace=False)


def test_every_endpoint_example_is_a_case_and_no_golden_file_is_stale() -> None:
    names = {case.name for case in CASES}
    assert {"serve-cpu", *LLM_EXAMPLES} <= names
    assert {path.stem for path in ENDPOINT_GOLDEN.glob("*.yaml")} == names


def test_the_rayservice_waits_in_the_workspace_queue_and_has_no_deadline() -> None:
    case = by_name("serve-gpu-autoscaling")
    service = render_rayservice(case.spec, case.target)
    metadata = service["metadata"]
    assert (metadata["name"], metadata["namespace"]) == ("serve-cpu", "tau-alpha")
    assert metadata["labels"][labels.KUEUE_QUEUE_NAME] == "alpha"
    assert metadata["labels"][labels.KUEUE_PRIORITY_CLASS] == "high"
    assert metadata["labels"][labels.ENDPOINT] == "serve-cpu"
    assert metadata["labels"][labels.ENDPOINT_ID] == "7"
    assert metadata["labels"][labels.GENERATION] == "1"
    assert labels.KUEUE_MAX_EXEC_TIME_SECONDS not in metadata["labels"]
    assert metadata["annotations"] == {
        labels.SPEC_HASH: spec_hash(case.spec),
        labels.BUNDLE_SHA256: BUNDLE_SHA256,
    }
    spec = service["spec"]
    # Kueue suspends the Ray cluster itself; a deadline would end a service.
    assert "suspend" not in spec["rayClusterConfig"]
    assert "activeDeadlineSeconds" not in spec
    assert spec["upgradeStrategy"] == {"type": "NewCluster"}
    # Kueue refuses Ray's autoscaler: the group is as big as the most replicas, fixed.
    assert "enableInTreeAutoscaling" not in spec["rayClusterConfig"]
    group = spec["rayClusterConfig"]["workerGroupSpecs"][0]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 3
    assert worker_count(case.spec) == 3


def test_the_serve_config_sizes_the_project_s_application_through_the_builder() -> None:
    cpu = by_name("serve-cpu")
    config = serve_config(render_rayservice(cpu.spec, cpu.target))
    assert config == {
        "applications": [
            {
                "name": "serve-cpu",
                "route_prefix": "/",
                "import_path": SERVE_BUILDER,
                "args": {
                    "import_path": "app:app",
                    "num_replicas": 1,
                    "ray_actor_options": {"num_cpus": 1},
                },
            }
        ]
    }
    gpu = by_name("serve-gpu-autoscaling")
    args = serve_config(render_rayservice(gpu.spec, gpu.target))["applications"][0]["args"]
    assert args["ray_actor_options"] == {"num_cpus": 8, "num_gpus": 1}
    assert args["autoscaling_config"] == {
        "min_replicas": 1,
        "max_replicas": 3,
        "target_ongoing_requests": 4,
    }
    assert "num_replicas" not in args
    scaled = by_name("serve-cpu-scaled")
    service = render_rayservice(scaled.spec, scaled.target)
    assert serve_config(service)["applications"][0]["args"]["num_replicas"] == 2
    assert service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["replicas"] == 2
    assert service["metadata"]["labels"][labels.GENERATION] == "3"


def test_a_fractional_cpu_is_what_ray_takes() -> None:
    spec = with_changes(example_spec("serve-cpu"), compute={"cpus": "500m"})
    args = serve_config(render_rayservice(spec, endpoint_target_for(spec)))["applications"][0]
    assert args["args"]["ray_actor_options"] == {"num_cpus": 0.5}


def test_pip_requirements_become_the_application_s_runtime_env_without_ray() -> None:
    spec = example_spec("serve-cpu")
    assert any(req.startswith("ray[serve]") for req in spec.runtime.pip)
    application = serve_config(render_rayservice(spec, endpoint_target_for(spec)))
    assert "runtime_env" not in application["applications"][0]  # only Ray: nothing to install
    more = with_changes(spec, runtime={"pip": ("ray[serve]==2.60.0", "numpy==2.1.3")})
    application = serve_config(render_rayservice(more, endpoint_target_for(more)))
    assert application["applications"][0]["runtime_env"] == {"pip": ["numpy==2.1.3"]}


def test_every_ray_pod_fetches_the_code_and_stages_the_model_before_it_starts() -> None:
    case = by_name("serve-cpu")
    service = render_rayservice(case.spec, case.target)
    for component, pod in ray_pods(service).items():
        fetcher, stager = pod["initContainers"]
        assert fetcher["command"][:4] == ["python3", "-I", "-c", FETCH_SCRIPT]
        assert fetcher["command"][4:6] == [
            "https://taugrid.example.org/api/v1/workspaces/alpha/endpoints/serve-cpu/bundle/",
            BUNDLE_SHA256,
        ]
        assert bundle_url(case.target) == fetcher["command"][4]
        assert stager["command"][:4] == ["python3", "-I", "-c", STAGE_SCRIPT]
        assert stager["command"][4] == model_url(case.target)
        assert stager["command"][7].endswith("/endpoints/serve-cpu/report/model-staged/")
        for init in (fetcher, stager):
            # The token reaches the init containers only, from the endpoint's Secret.
            assert env_of(init)["TAU_RUN_TOKEN"] == {
                "secretKeyRef": {"name": "serve-cpu-endpoint-token", "key": "token"}
            }
            assert init["securityContext"]["runAsNonRoot"] is True
        (container,) = pod["containers"]
        env = env_of(container)
        assert "TAU_RUN_TOKEN" not in env, component
        assert env["TAU_ENDPOINT"] == "serve-cpu"
        assert env["TAU_WORKSPACE"] == "alpha"
        assert env["TAU_ENDPOINT_GENERATION"] == "1"
        assert env["TAU_MODEL_DIR"] == "/tau/model"
        assert env["PYTHONPATH"] == "/tau/sdk:/tau/code"
        assert container["workingDir"] == "/tau/code"
        mounts = {mount["mountPath"]: mount for mount in container["volumeMounts"]}
        assert mounts["/tau/model"]["readOnly"] is True
        assert mounts["/tau/code"]["readOnly"] is True
    # The model volume is as big as the model needs (2 files of 5,000 bytes), no more.
    volumes = {v["name"]: v for v in ray_pods(service)["worker"]["volumes"]}
    assert int(volumes["tau-model"]["emptyDir"]["sizeLimit"]) < 20 * 2**20


def test_without_a_model_nothing_is_staged() -> None:
    case = by_name("serve-cpu-no-model")
    for pod in ray_pods(render_rayservice(case.spec, case.target)).values():
        assert [init["name"] for init in pod["initContainers"]] == ["tau-fetch-bundle"]
        assert "TAU_MODEL_DIR" not in env_of(pod["containers"][0])


def test_gpus_only_on_the_workers_of_the_chosen_flavor() -> None:
    case = by_name("serve-gpu-autoscaling")
    pods = ray_pods(render_rayservice(case.spec, case.target))
    worker = pods["worker"]["containers"][0]["resources"]
    assert worker["requests"] == {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"}
    assert worker["limits"]["nvidia.com/gpu"] == "1"
    assert pods["worker"]["nodeSelector"] == dict(H100_LABELS)
    assert "nodeSelector" not in pods["head"]
    assert "nvidia.com/gpu" not in pods["head"]["containers"][0]["resources"]["requests"]


def test_the_spec_s_pythonpath_comes_after_the_sdk_and_the_project() -> None:
    spec = with_changes(
        example_spec("serve-cpu"), runtime={"env": (EnvVar("PYTHONPATH", "/opt/lib"),)}
    )
    service = render_rayservice(spec, endpoint_target_for(spec))
    for pod in ray_pods(service).values():
        assert env_of(pod["containers"][0])["PYTHONPATH"] == "/tau/sdk:/tau/code:/opt/lib"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": "x" * 41}, "endpoint name"),
        ({"generation": 0}, "generation start at 1"),
        ({"bundle_sha256": "abc"}, "is not a SHA-256 hex digest"),
        ({"portal_url": "taugrid.example.org"}, r"is not an http\(s\) URL"),
        ({"staged_model": None}, "serve.model and the staged model version go together"),
        ({"flavor": Flavor("h100", H100_LABELS)}, "the spec sets no compute.gpu_type"),
        ({"namespace": "Tau_Alpha"}, "namespace"),
    ],
)
def test_a_target_that_cannot_be_rendered_is_refused_saying_why(
    change: dict[str, Any], message: str
) -> None:
    spec = example_spec("serve-cpu")
    with pytest.raises(RenderError, match=message):
        render_rayservice(spec, endpoint_target_for(spec, **change))


def test_only_an_endpoint_spec_renders_as_a_rayservice() -> None:
    run_spec = example_spec("cpu-quickstart")
    endpoint = endpoint_target_for(example_spec("serve-cpu"))
    with pytest.raises(RenderError, match="not 'rayservice'"):
        render_rayservice(run_spec, endpoint)
    unset_image = with_changes(example_spec("serve-cpu"), runtime={"image": None})
    with pytest.raises(RenderError, match=r"runtime\.image is unset"):
        render_rayservice(unset_image, endpoint)


def test_a_bigger_model_gets_a_bigger_volume() -> None:
    spec = example_spec("serve-cpu")
    small = render_rayservice(spec, endpoint_target_for(spec, staged_model=(2, 5_000)))
    big = render_rayservice(spec, endpoint_target_for(spec, staged_model=(2, 5 * 2**30)))

    def size(service: dict[str, Any]) -> int:
        volumes = {v["name"]: v for v in ray_pods(service)["worker"]["volumes"]}
        return int(volumes["tau-model"]["emptyDir"]["sizeLimit"])

    assert size(big) - size(small) == 5 * 2**30 - 5_000


@pytest.mark.parametrize("name", LLM_EXAMPLES)
def test_an_llm_example_holds_one_gpu_per_replica_on_its_workers_only(name: str) -> None:
    """The engine's replica is the application's ingress: the builder gives it the replica's
    GPU and CPUs, one Ray worker pod's worth, and the head stays CPU-only."""
    case = by_name(name)
    service = render_rayservice(case.spec, case.target)
    (application,) = serve_config(service)["applications"]
    assert application["route_prefix"] == "/"
    assert application["args"]["import_path"] == "app:app"
    assert application["args"]["num_replicas"] == 1
    assert application["args"]["ray_actor_options"] == {"num_cpus": 8, "num_gpus": 1}
    assert "runtime_env" not in application  # the engine is in the image, nothing installed
    group = service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 1
    pods = ray_pods(service)
    worker = pods["worker"]["containers"][0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert worker["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert worker["image"] == case.spec.runtime.image
    assert "nvidia.com/gpu" not in pods["head"]["containers"][0]["resources"]["limits"]
    # Every Ray pod imports the application (the controller on the head builds it).
    for pod in pods.values():
        assert pod["containers"][0]["image"] == case.spec.runtime.image
        assert env_of(pod["containers"][0])["PYTHONPATH"] == "/tau/sdk:/tau/code"


def test_the_vllm_example_serves_its_workspace_model_and_trtllm_runs_on_h100s() -> None:
    vllm = ray_pods(render_rayservice(by_name("vllm-serve").spec, by_name("vllm-serve").target))
    for pod in vllm.values():
        assert [init["name"] for init in pod["initContainers"]] == [
            "tau-fetch-bundle",
            "tau-stage-model",
        ]
        env = env_of(pod["containers"][0])
        assert env["TAU_MODEL_DIR"] == "/tau/model"
        assert env["SERVED_MODEL_NAME"] == "support-assistant"
    trtllm = by_name("trtllm-serve")
    pods = ray_pods(render_rayservice(trtllm.spec, trtllm.target))
    assert pods["worker"]["nodeSelector"] == dict(H100_LABELS)
    assert "nodeSelector" not in pods["head"]
    # The Hub token reaches the Ray containers, from its Secret; the init containers never.
    for pod in pods.values():
        assert env_of(pod["containers"][0])["HF_TOKEN"] == {
            "secretKeyRef": {"name": "hf-token", "key": "token"}
        }
        for init in pod["initContainers"]:
            assert "HF_TOKEN" not in env_of(init)


def pod_requests(pod: dict[str, Any]) -> dict[str, Decimal]:
    """What Kueue counts for one pod: per resource, the larger of its containers' requests
    together and any one init container's."""

    def requests(container: dict[str, Any]) -> dict[str, Decimal]:
        asked = container.get("resources", {}).get("requests", {})
        return {name: parse_quantity(str(value)) for name, value in asked.items()}

    total: dict[str, Decimal] = {}
    for container in pod["containers"]:
        for name, value in requests(container).items():
            total[name] = total.get(name, Decimal(0)) + value
    for container in pod.get("initContainers", []):
        for name, value in requests(container).items():
            total[name] = max(total.get(name, Decimal(0)), value)
    return total


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_the_quota_an_endpoint_holds_is_what_its_rendered_pods_request(case: EndpointCase) -> None:
    """The preemption rules (serving/preemption.py) add up what endpoints hold without
    rendering them: the same figures as the pods Kueue admits."""
    service = render_rayservice(case.spec, case.target)
    pods = ray_pods(service)
    workers = service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["replicas"]
    rendered = pod_requests(pods["head"])
    for name, value in pod_requests(pods["worker"]).items():
        rendered[name] = rendered.get(name, Decimal(0)) + value * workers
    endpoints = KubernetesEndpoints(backend=None)  # type: ignore[arg-type]
    assert endpoints.quota_held(case.spec, worker_count(case.spec)) == rendered
