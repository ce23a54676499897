"""The rendering cases shared by the golden tests and the control-plane tests: every example
with fixed run inputs (``examples/<name>/tau.yaml`` as ``<name>``, its GPU form
``examples/<name>/tau.gpu.yaml`` as ``<name>-gpu``, on the flavor it names), plus variants for
what the examples leave out (a priority, a flavor, a deadline, a resumed attempt, a PVC, no
bundle)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from executors.kubernetes.render import (
    Flavor,
    Manifest,
    Owner,
    RunTarget,
    render_dependents,
    render_workload,
    run_token_secret_name,
)
from executors.kubernetes.render_endpoint import (
    EndpointTarget,
    endpoint_secret_name,
    render_endpoint_route,
    render_endpoint_secret,
    render_rayservice,
)
from portal.endpoint_routes import endpoint_route
from tau.spec import Autoscaling, Spec, load_spec
from tests.cluster.kueue_objects import H100_LABELS

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"
GOLDEN = Path(__file__).resolve().parent / "golden"
REFERENCE = REPO / "tests" / "spec" / "reference"

#: Fixed inputs, so the rendered objects are byte-for-byte stable.
RUN_ID = 42
SUFFIX = "k3x9q2"
BUNDLE_SHA256 = "3f" * 32
TOKEN = "tau_run_golden.not-a-real-token"
OWNER_UID = "6f1f1e0e-0000-4000-8000-000000000042"
PORTAL_URL = "https://taugrid.example.org"


@dataclass(frozen=True)
class Case:
    name: str
    spec: Spec
    target: RunTarget


#: The file of an example's GPU form, beside its ``tau.yaml`` (the CPU form).
GPU_FORM = "tau.gpu.yaml"


def example_spec(name: str, form: str = "tau.yaml") -> Spec:
    return load_spec((EXAMPLES / name / form).read_bytes())


def gpu_forms() -> list[str]:
    """The examples with a GPU form, by name."""
    return [path.parent.name for path in sorted(EXAMPLES.glob(f"*/{GPU_FORM}"))]


def target_for(spec: Spec, **changes: Any) -> RunTarget:
    run_name = f"{spec.name}-{SUFFIX}"
    target = RunTarget(
        run_id=RUN_ID,
        run_name=run_name,
        workspace="alpha",
        namespace="tau-alpha",
        local_queue="alpha",
        attempt=1,
        portal_url=PORTAL_URL,
        token_secret=run_token_secret_name(run_name, max(1, changes.get("attempt", 1))),
        bundle_sha256=BUNDLE_SHA256,
    )
    return dataclasses.replace(target, **changes)


def with_changes(spec: Spec, **blocks: dict[str, Any]) -> Spec:
    """``spec`` with fields of its blocks replaced, e.g. ``queue={"priority": "high"}``."""
    replaced = {
        block: dataclasses.replace(getattr(spec, block), **fields)
        for block, fields in blocks.items()
    }
    return dataclasses.replace(spec, **replaced)


def cases() -> list[Case]:
    found = [
        # An example that reads datasets or models: as pinned, 3 files of 1.5 MB in all (the
        # stager).
        Case(
            path.parent.name,
            spec,
            target_for(
                spec,
                staged_data=(3, 1_500_000) if spec.inputs.datasets or spec.inputs.models else None,
            ),
        )
        for path in sorted(EXAMPLES.glob("*/tau.yaml"))
        for spec in [load_spec(path.read_bytes())]
        if not spec.is_endpoint  # endpoints: endpoint_cases()
    ]
    for name in gpu_forms():
        spec = example_spec(name, GPU_FORM)
        flavor = Flavor(spec.compute.gpu_type, H100_LABELS) if spec.compute.gpu_type else None
        found.append(Case(f"{name}-gpu", spec, target_for(spec, flavor=flavor)))
    gpu = with_changes(
        example_spec("gpu-quickstart"),
        compute={"gpu_type": "h100"},
        queue={"priority": "high"},
        run={"max_runtime": 7200, "args": ("--name", 'it\'s a "test"', "$HOME")},
    )
    found.append(
        Case(
            "gpu-quickstart-retry-on-h100",
            gpu,
            target_for(
                gpu,
                attempt=3,
                flavor=Flavor("h100", H100_LABELS),
                resume_from="/tau/checkpoints/step-400",
                retry_reason="preempted",
                data_volume={"persistentVolumeClaim": {"claimName": "tau-data-alpha"}},
            ),
        )
    )
    cpu = example_spec("cpu-quickstart")
    found.append(Case("cpu-quickstart-no-bundle", cpu, target_for(cpu, bundle_sha256=None)))
    # Configs written for the reference TauGrid CLI: a head and workers sized apart with
    # limits above requests, a GPU RayJob with a read-write data volume, a tiny CPU Job, and
    # a Ray Tune sweep (its driver around the entry point, the sweep in the runtime env).
    for name in ("kind-ray", "gpu-data-volume", "kind-job", "tune-grid"):
        spec = load_spec((REFERENCE / f"{name}.yaml").read_bytes())
        flavor = Flavor(spec.compute.gpu_type, H100_LABELS) if spec.compute.gpu_type else None
        found.append(Case(f"reference-{name}", spec, target_for(spec, flavor=flavor)))
    # TauGrid's own v1: a read-only data volume.
    data = load_spec(
        (EXAMPLES / "cpu-quickstart" / "tau.yaml").read_text()
        + "storage:\n  data_pvc: shared-datasets\n"
    )
    found.append(Case("cpu-quickstart-data-volume", data, target_for(data)))
    return found


def render_case(spec: Spec, target: RunTarget, *, uid: str = OWNER_UID) -> list[Manifest]:
    """The workload and its dependents, as the backend would create them."""
    workload = render_workload(spec, target)
    owner = Owner(
        api_version=workload["apiVersion"],
        kind=workload["kind"],
        name=workload["metadata"]["name"],
        uid=uid,
    )
    return [workload, *render_dependents(spec, target, token=TOKEN, owner=owner)]


class _GoldenDumper(yaml.SafeDumper):
    """Readable golden files: no anchors, multi-line strings as literal blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_GoldenDumper.add_representer(str, _represent_str)


def dump(objects: list[Manifest]) -> str:
    return yaml.dump_all(
        objects, Dumper=_GoldenDumper, sort_keys=False, width=100, allow_unicode=True
    )


def load(text: str) -> list[Manifest]:
    return [document for document in yaml.safe_load_all(text) if document is not None]


# ---------------------------------------------------------------------------------------------
# Endpoints (executors.kubernetes.render_endpoint)
# ---------------------------------------------------------------------------------------------

ENDPOINT_ID = 7
ENDPOINT_TOKEN = "tau_ep_golden.not-a-real-token"


@dataclass(frozen=True)
class EndpointCase:
    name: str
    spec: Spec
    target: EndpointTarget


def endpoint_target_for(spec: Spec, **changes: Any) -> EndpointTarget:
    name = changes.pop("name", spec.name)
    target = EndpointTarget(
        endpoint_id=ENDPOINT_ID,
        name=name,
        workspace="alpha",
        namespace="tau-alpha",
        local_queue="alpha",
        generation=1,
        portal_url=PORTAL_URL,
        token_secret=endpoint_secret_name(name),
        bundle_sha256=BUNDLE_SHA256,
        staged_model=(2, 5_000) if spec.serve is not None and spec.serve.model else None,
    )
    return dataclasses.replace(target, **changes)


def serve_block(spec: Spec, **fields: Any) -> Spec:
    assert spec.serve is not None
    return dataclasses.replace(spec, serve=dataclasses.replace(spec.serve, **fields))


def endpoint_cases() -> list[EndpointCase]:
    """Every endpoint example as written (the CPU one and the LLM ones on GPUs), and the
    variants they leave out: on GPUs of a flavor with a priority and autoscaling, a later
    generation with two replicas, no model."""
    found = [
        # An example that names a GPU type (trtllm-serve: h100) on the flavor it names.
        EndpointCase(
            path.parent.name,
            spec,
            endpoint_target_for(
                spec,
                flavor=Flavor(spec.compute.gpu_type, H100_LABELS)
                if spec.compute.gpu_type
                else None,
            ),
        )
        for path in sorted(EXAMPLES.glob("*/tau.yaml"))
        for spec in [load_spec(path.read_bytes())]
        if spec.is_endpoint
    ]
    cpu = example_spec("serve-cpu")
    gpu = serve_block(
        with_changes(
            cpu,
            compute={"gpus": 1, "cpus": "8", "memory": "32Gi", "gpu_type": "h100"},
            queue={"priority": "high"},
        ),
        replicas=None,
        autoscaling=Autoscaling(min_replicas=1, max_replicas=3, target_ongoing_requests=4),
    )
    found.append(
        EndpointCase(
            "serve-gpu-autoscaling",
            gpu,
            endpoint_target_for(gpu, flavor=Flavor("h100", H100_LABELS)),
        )
    )
    scaled = serve_block(cpu, replicas=2)
    found.append(
        EndpointCase("serve-cpu-scaled", scaled, endpoint_target_for(scaled, generation=3))
    )
    bare = serve_block(cpu, model=None)
    found.append(EndpointCase("serve-cpu-no-model", bare, endpoint_target_for(bare)))
    return found


def render_endpoint_case(
    spec: Spec, target: EndpointTarget, *, uid: str = OWNER_UID
) -> list[Manifest]:
    """The RayService and its Secret, as the backend would create them."""
    service = render_rayservice(spec, target)
    owner = Owner(
        api_version=service["apiVersion"],
        kind=service["kind"],
        name=service["metadata"]["name"],
        uid=uid,
    )
    return [service, render_endpoint_secret(spec, target, token=ENDPOINT_TOKEN, owner=owner)]


def endpoint_route_cases() -> list[EndpointCase]:
    """serve-cpu with each kind of route from outside the cluster (``TAU_ENDPOINT_ROUTE``): an
    Ingress of a class with the platform's wildcard certificate, an Ingress whose certificate
    cert-manager makes (the annotation, no Secret named), an HTTPRoute on the platform's
    Gateway. Golden files in golden/endpoints/routes/ (the route only: the RayService and its
    Secret are serve-cpu's)."""
    cpu = example_spec("serve-cpu")
    host = "{endpoint}-{workspace}.serve.example.org"
    routes = {
        "ingress": endpoint_route(
            kind="ingress", host=host, ingress_class="nginx", tls_secret="serve-wildcard-tls"
        ),
        "ingress-cert-manager": endpoint_route(
            kind="ingress",
            host=host,
            annotations='{"cert-manager.io/cluster-issuer": "letsencrypt"}',
        ),
        "gateway": endpoint_route(kind="gateway", host=host, gateway="gateway-system/public"),
    }
    return [
        EndpointCase(name, cpu, endpoint_target_for(cpu, route=route))
        for name, route in routes.items()
    ]


def render_route_case(spec: Spec, target: EndpointTarget, *, uid: str = OWNER_UID) -> Manifest:
    """The endpoint's Ingress or HTTPRoute, owned by its RayService as the backend makes it."""
    service = render_rayservice(spec, target)
    owner = Owner(
        api_version=service["apiVersion"],
        kind=service["kind"],
        name=service["metadata"]["name"],
        uid=uid,
    )
    return render_endpoint_route(spec, target, owner=owner)
