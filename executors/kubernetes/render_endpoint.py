"""An endpoint as Kubernetes objects: the KubeRay ``RayService`` that Kueue admits through the
Ray cluster KubeRay makes for it, and the Secret that goes with it. Pure functions like
``executors.kubernetes.render`` (whose pieces they share): golden files and the real API
server test them (tests/executors/kubernetes/test_render_endpoint*.py).

What gets rendered, and why
===========================

**One object per endpoint.** The RayService is named after the endpoint (a DNS-1035 label of
at most 40 characters: KubeRay allows 47, and names its Ray clusters after it). An update
(a new model version, a new config) changes the same object: KubeRay's upgrade
(``upgradeStrategy: NewCluster``) brings up a new Ray cluster beside the old one and moves the
traffic once the new one serves, so an update drops no request. ``taugrid.io/generation`` on
the object says which of the endpoint's deployments it is.

**Kueue.** The RayService carries ``kueue.x-k8s.io/queue-name`` (the workspace's LocalQueue)
and, when the spec has one, ``kueue.x-k8s.io/priority-class``; KubeRay copies both to the Ray
cluster it creates, which is what Kueue admits (Kueue's RayCluster integration; its
RayService page). So an endpoint's GPUs count against the same ClusterQueue as the
workspace's training, and an endpoint waits in the same queue when there is no room. Kueue
refuses Ray's own autoscaler for the clusters it manages, so the worker group has a fixed
size: ``serve.replicas`` workers, or ``serve.autoscaling.max_replicas`` — Ray Serve then
scales its replicas inside the admitted workers (an idle endpoint still holds its quota;
``min_replicas`` saves compute inside the pods, not quota). There is no deadline: an endpoint
runs until it is stopped.

**The application.** ``serveConfigV2`` names one application, called after the endpoint, at
``serve.route_prefix``, whose import path is the SDK's builder ``tau.serving:app`` with the
project's ``serve.import_path`` and the sizes as ``args``: Ray Serve sizes deployments by
name, and the project's deployment name is only known once its code is imported
(``tau/serving.py``). Each replica asks Ray for ``compute.cpus`` CPUs and ``compute.gpus``
GPUs, exactly one worker pod's worth, so the replicas spread one per worker. The Ray head is
CPU-only and takes no replica (``num-cpus: 0``), as for a RayJob. ``runtime.pip`` becomes
the application's ``runtime_env`` (Ray itself left out: the image's Ray runs the cluster).

**Code and model.** Every Ray pod (head and workers: the application is imported wherever
Serve starts a replica, and by the controller on the head) gets the bundle fetcher
(``render.FETCH_SCRIPT``) as an init container, with the endpoint's own bundle URL and digest
and the workload SDK; the container starts in ``/tau/code`` with the SDK and the project on
``PYTHONPATH``. ``serve.model``, pinned when the endpoint was deployed, is staged the way a
run's datasets are (``render.STAGE_SCRIPT``: every file's SHA-256 checked before it gets its
name) into a read-only volume at ``/tau/model``, which ``TAU_MODEL_DIR`` names. Both read the
portal with the endpoint's token (``TAU_RUN_TOKEN`` in the init containers, from the Secret
:func:`render_endpoint_secret`), which lets a workload fetch what it was deployed with and
nothing else.

**Environment.** Every container gets ``TAU_ENDPOINT``, ``TAU_WORKSPACE``,
``TAU_ENDPOINT_GENERATION`` and ``TAU_API_URL``; the Ray containers also the spec's ``env``
and ``secrets``. The token stays in the init containers: serving code has no use for it.

**A route from outside** (:func:`render_endpoint_route`), where the platform configures one
(``TAU_ENDPOINT_ROUTE``, :mod:`portal.endpoint_routes`): a ``networking.k8s.io/v1`` Ingress or a
``gateway.networking.k8s.io/v1`` HTTPRoute named after the endpoint, owned by the RayService
like the Secret (deleted with it), sending all of its host (``/``) to KubeRay's serve Service,
``<endpoint>-serve-svc`` port 8000, which follows the RayService's active Ray cluster across an
upgrade. The Ingress terminates TLS with the configured Secret, or with
``<endpoint>-endpoint-tls`` for cert-manager to fill; an HTTPRoute has no TLS of its own (the
Gateway's listener terminates it). Ray Serve's proxy applies ``serve.route_prefix`` behind it.
A route checks no token: the portal's proxy route is the authenticated path.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import yaml

from executors.kubernetes import labels
from executors.kubernetes.render import (
    CODE_DIR,
    DEFAULT_FETCHER_IMAGE,
    FETCH_DIR,
    FETCH_SCRIPT,
    FETCHER_RESOURCES,
    MAX_BUNDLE_BYTES,
    RAY_WORKER_GROUP,
    RUN_TOKEN_KEY,
    SDK_DIR,
    SHM_DIR,
    STAGE_SCRIPT,
    Flavor,
    Manifest,
    Owner,
    RenderError,
    staged_volume_bytes,
)
from portal.endpoint_routes import EndpointRoute
from runs import workload_sdk
from tau.k8s_names import (
    GPU_RESOURCE,
    dns1035_label_problem,
    dns1123_label_problem,
    dns1123_subdomain_problem,
    label_key_problem,
    label_value_problem,
)
from tau.spec import Spec, spec_hash
from tau.spec.model import project_name

#: Endpoint names: KubeRay allows a RayService 47 characters, and TauGrid keeps room.
ENDPOINT_NAME_MAX_LENGTH: Final = 40
#: The SDK's application builder (``tau/serving.py``).
SERVE_BUILDER: Final = "tau.serving:app"
#: Where ``serve.model`` is staged (``TAU_MODEL_DIR``).
MODEL_DIR: Final = "/tau/model"
#: KubeRay's serve Service of a RayService: ``<RayService>-serve-svc``, port 8000 (Ray Serve's
#: proxy), always pointing at the Ray cluster that serves.
SERVE_SERVICE_SUFFIX: Final = "-serve-svc"
SERVE_PORT: Final = 8000
INGRESS_API: Final = "networking.k8s.io/v1"
GATEWAY_API: Final = "gateway.networking.k8s.io/v1"

ENV_ENDPOINT: Final = "TAU_ENDPOINT"
ENV_WORKSPACE: Final = "TAU_WORKSPACE"
ENV_GENERATION: Final = "TAU_ENDPOINT_GENERATION"
ENV_API_URL: Final = "TAU_API_URL"
ENV_MODEL_DIR: Final = "TAU_MODEL_DIR"
#: The name the fetcher and the stager read their token from (the scripts are the runs').
ENV_TOKEN: Final = "TAU_RUN_TOKEN"  # noqa: S105 - a variable name

_CODE_VOLUME = "tau-code"
_MODEL_VOLUME = "tau-model"
_SHM_VOLUME = "tau-shm"
_FETCHER = "tau-fetch-bundle"
_STAGER = "tau-stage-model"


@dataclass(frozen=True, slots=True)
class EndpointTarget:
    """Everything about one deployment of an endpoint that is not in its spec."""

    endpoint_id: int
    #: The endpoint's name: the RayService's too.
    name: str
    #: The workspace's slug.
    workspace: str
    namespace: str
    local_queue: str
    #: 1 at the first deployment; one more at every update or scale.
    generation: int
    #: The portal as workloads reach it, e.g. ``https://taugrid.example.org``.
    portal_url: str
    #: The Secret holding the endpoint's token (:func:`render_endpoint_secret`).
    token_secret: str
    #: SHA-256 of the project zip holding the Ray Serve application.
    bundle_sha256: str
    #: Required when the spec sets ``compute.gpu_type`` (and only then).
    flavor: Flavor | None = None
    #: The pinned ``serve.model`` version to stage: (files, bytes); None = no model.
    staged_model: tuple[int, int] | None = None
    fetcher_image: str = DEFAULT_FETCHER_IMAGE
    #: The platform's route from outside the cluster (``TAU_ENDPOINT_ROUTE``); None: none.
    route: EndpointRoute | None = None

    @property
    def api_base(self) -> str:
        """The endpoint's own address in the portal's API."""
        base = self.portal_url.rstrip("/")
        return f"{base}/api/v1/workspaces/{self.workspace}/endpoints/{self.name}/"


def endpoint_secret_name(name: str) -> str:
    return f"{name}-endpoint-token"


def endpoint_tls_secret_name(name: str) -> str:
    """The TLS Secret of an endpoint's Ingress when the platform names none (cert-manager's)."""
    return f"{name}-endpoint-tls"


def serve_service_name(name: str) -> str:
    return f"{name}{SERVE_SERVICE_SUFFIX}"


def endpoint_host(target: EndpointTarget) -> str | None:
    """The endpoint's host name outside the cluster, or None without a route."""
    if target.route is None:
        return None
    return target.route.host(endpoint=target.name, workspace=target.workspace)


def bundle_url(target: EndpointTarget) -> str:
    """Where the fetcher downloads the endpoint's project zip (endpoint token auth)."""
    return f"{target.api_base}bundle/"


def model_url(target: EndpointTarget) -> str:
    """The listing of the pinned model version's files (the stager's input)."""
    return f"{target.api_base}model/"


def _check(spec: Spec, target: EndpointTarget) -> None:
    problems: list[str] = []
    if spec.run.workload_kind != "rayservice" or spec.serve is None:
        problems.append(f"workload_kind is {spec.run.workload_kind!r}, not 'rayservice'")
    name_problem = dns1035_label_problem(target.name, max_length=ENDPOINT_NAME_MAX_LENGTH)
    if name_problem:
        problems.append(f"endpoint name {target.name!r} {name_problem}")
    for what, value, check in (
        ("namespace", target.namespace, dns1123_label_problem),
        ("LocalQueue name", target.local_queue, dns1123_label_problem),
        ("workspace", target.workspace, label_value_problem),
        ("token Secret name", target.token_secret, dns1123_subdomain_problem),
        ("spec name", spec.name, label_value_problem),
    ):
        problem = check(value)
        if problem:
            problems.append(f"{what} {value!r} {problem}")
    if spec.queue.priority is not None:
        problem = label_value_problem(spec.queue.priority)
        if problem:
            problems.append(f"priority {spec.queue.priority!r} {problem}")
    if target.endpoint_id < 1 or target.generation < 1:
        problems.append("endpoint_id and generation start at 1")
    if not target.portal_url.startswith(("http://", "https://")):
        problems.append(f"portal URL {target.portal_url!r} is not an http(s) URL")
    digest = target.bundle_sha256
    if len(digest) != 64 or digest.strip("0123456789abcdef"):
        problems.append(f"bundle digest {digest!r} is not a SHA-256 hex digest")
    if spec.runtime.image is None:
        problems.append("runtime.image is unset (workspace policy fills it before rendering)")
    if spec.inputs.datasets:
        problems.append("inputs.datasets: an endpoint reads a model (serve.model), not datasets")
    if (spec.serve is not None and spec.serve.model is not None) != (
        target.staged_model is not None
    ):
        problems.append("serve.model and the staged model version go together")
    gpu_type = spec.compute.gpu_type
    if gpu_type is not None and (target.flavor is None or target.flavor.name != gpu_type):
        problems.append(f"compute.gpu_type is {gpu_type!r}, so the flavor {gpu_type!r} is needed")
    if gpu_type is None and target.flavor is not None:
        problems.append("a flavor was given but the spec sets no compute.gpu_type")
    if target.flavor is not None:
        for key, value in target.flavor.node_labels.items():
            problem = label_key_problem(key) or label_value_problem(value)
            if problem:
                problems.append(f"flavor node label {key}={value!r}: {problem}")
    host = endpoint_host(target)
    if host is not None:
        problem = dns1123_subdomain_problem(host) or next(
            (
                f"part {label!r} {found}"
                for label in host.split(".")
                if (found := dns1123_label_problem(label))
            ),
            None,
        )
        if problem:
            problems.append(f"the endpoint's host {host!r} (TAU_ENDPOINT_HOST) {problem}")
    if problems:
        raise RenderError("; ".join(problems))


def _object_labels(spec: Spec, target: EndpointTarget) -> dict[str, str]:
    return {
        labels.MANAGED_BY: labels.MANAGED_BY_TAUGRID,
        labels.WORKSPACE: target.workspace,
        labels.ENDPOINT: target.name,
        labels.ENDPOINT_ID: str(target.endpoint_id),
        labels.SPEC_NAME: spec.name,
    }


def _literal(text: str) -> str:
    # The kubelet expands $(NAME) in env values and args: $$ keeps a $.
    return text.replace("$", "$$")


def _env_var(name: str, value: str) -> Manifest:
    return {"name": name, "value": _literal(value)} if value else {"name": name}


def _platform_env(target: EndpointTarget) -> list[Manifest]:
    return [
        _env_var(ENV_ENDPOINT, target.name),
        _env_var(ENV_WORKSPACE, target.workspace),
        _env_var(ENV_GENERATION, str(target.generation)),
        _env_var(ENV_API_URL, target.portal_url.rstrip("/")),
    ]


def _token_env(target: EndpointTarget) -> Manifest:
    return {
        "name": ENV_TOKEN,
        "valueFrom": {"secretKeyRef": {"name": target.token_secret, "key": RUN_TOKEN_KEY}},
    }


def _user_env(spec: Spec, target: EndpointTarget) -> list[Manifest]:
    env = _platform_env(target)
    if target.staged_model is not None:
        env.append(_env_var(ENV_MODEL_DIR, MODEL_DIR))
    env += [_env_var(variable.name, variable.value) for variable in spec.runtime.env]
    env += [
        {"name": ref.env, "valueFrom": {"secretKeyRef": {"name": ref.secret, "key": ref.key}}}
        for ref in spec.runtime.secrets
    ]
    # The SDK (the builder) and the project: a PYTHONPATH of the spec's own comes after them.
    for variable in env:
        if variable["name"] == "PYTHONPATH":
            if "valueFrom" not in variable:
                own = variable.get("value")
                variable["value"] = f"{SDK_DIR}:{CODE_DIR}" + (f":{own}" if own else "")
            return env
    return [*env, {"name": "PYTHONPATH", "value": f"{SDK_DIR}:{CODE_DIR}"}]


def _security() -> Manifest:
    return {
        "runAsUser": 65534,
        "runAsGroup": 65534,
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _same(amounts: Mapping[str, str]) -> Manifest:
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _fetcher(target: EndpointTarget) -> Manifest:
    return {
        "name": _FETCHER,
        "image": target.fetcher_image,
        "command": [
            "python3",
            "-I",
            "-c",
            FETCH_SCRIPT,
            _literal(bundle_url(target)),
            target.bundle_sha256,
            FETCH_DIR,
            str(MAX_BUNDLE_BYTES),
            workload_sdk.packed(),
        ],
        "env": [*_platform_env(target), _token_env(target)],
        "resources": _same(FETCHER_RESOURCES),
        "volumeMounts": [{"name": _CODE_VOLUME, "mountPath": FETCH_DIR}],
        "securityContext": _security(),
    }


def _stager(target: EndpointTarget) -> Manifest:
    assert target.staged_model is not None
    return {
        "name": _STAGER,
        "image": target.fetcher_image,
        "command": [
            "python3",
            "-I",
            "-c",
            STAGE_SCRIPT,
            _literal(model_url(target)),
            MODEL_DIR,
            str(target.staged_model[1]),
            _literal(f"{target.api_base}report/model-staged/"),
        ],
        "env": [*_platform_env(target), _token_env(target)],
        "resources": _same(FETCHER_RESOURCES),
        "volumeMounts": [{"name": _MODEL_VOLUME, "mountPath": MODEL_DIR}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": _security(),
    }


def _ray_pod(
    spec: Spec, target: EndpointTarget, *, container: str, resources: Manifest, memory_limit: str
) -> Manifest:
    mounts: list[Manifest] = [
        {"name": _CODE_VOLUME, "mountPath": CODE_DIR, "subPath": "code", "readOnly": True},
        {"name": _CODE_VOLUME, "mountPath": SDK_DIR, "subPath": "sdk", "readOnly": True},
        {"name": _SHM_VOLUME, "mountPath": SHM_DIR},
    ]
    volumes: list[Manifest] = [
        {"name": _CODE_VOLUME, "emptyDir": {}},
        # /dev/shm as big as the container's memory limit, as for runs (render's docstring).
        {"name": _SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": memory_limit}},
    ]
    init = [_fetcher(target)]
    if target.staged_model is not None:
        mounts.append({"name": _MODEL_VOLUME, "mountPath": MODEL_DIR, "readOnly": True})
        size = str(staged_volume_bytes(*target.staged_model))
        volumes.append({"name": _MODEL_VOLUME, "emptyDir": {"sizeLimit": size}})
        init.append(_stager(target))
    return {
        "enableServiceLinks": False,
        "initContainers": init,
        "containers": [
            {
                "name": container,
                "image": spec.runtime.image,
                "workingDir": CODE_DIR,
                "env": _user_env(spec, target),
                "resources": resources,
                "volumeMounts": mounts,
            }
        ],
        "volumes": volumes,
    }


def worker_count(spec: Spec, replicas: int | None = None) -> int:
    """The Ray workers an endpoint holds (Kueue admits them all at once): one per replica
    (``replicas``, else the spec's), or the most replicas autoscaling may reach."""
    serve = spec.serve
    assert serve is not None
    if serve.autoscaling is not None:
        return serve.autoscaling.max_replicas
    return replicas if replicas is not None else (serve.replicas or 1)


def _number(quantity: str) -> int | float:
    """A CPU quantity as Ray takes it: ``"8"`` → 8, ``"500m"`` → 0.5."""
    from tau.quantity import parse_quantity

    value = parse_quantity(quantity)
    return int(value) if value == int(value) else float(value)


def serve_config(spec: Spec, target: EndpointTarget) -> dict[str, Any]:
    """The Serve config (``serveConfigV2``) as data: one application, the SDK's builder."""
    serve = spec.serve
    assert serve is not None
    actor: dict[str, Any] = {"num_cpus": _number(spec.compute.cpus)}
    if spec.compute.gpus:
        actor["num_gpus"] = spec.compute.gpus
    args: dict[str, Any] = {"import_path": serve.import_path, "ray_actor_options": actor}
    if serve.autoscaling is not None:
        args["autoscaling_config"] = serve.autoscaling.to_dict()
    else:
        args["num_replicas"] = serve.replicas or 1
    application: dict[str, Any] = {
        "name": target.name,
        "route_prefix": serve.route_prefix,
        "import_path": SERVE_BUILDER,
        "args": args,
    }
    # As for a RayJob, Ray itself is the image's: another Ray in the runtime environment
    # would not talk to the cluster.
    pip = [requirement for requirement in spec.runtime.pip if project_name(requirement) != "ray"]
    if pip:
        application["runtime_env"] = {"pip": pip}
    return {"applications": [application]}


def render_rayservice(spec: Spec, target: EndpointTarget) -> Manifest:
    """A KubeRay ``ray.io/v1`` RayService for a ``workload_kind: rayservice`` spec."""
    _check(spec, target)
    compute = spec.compute
    head = compute.ray_head
    worker_requests = {"cpu": compute.cpus, "memory": compute.memory}
    worker_limits = {"cpu": compute.cpu_limit, "memory": compute.memory_limit}
    if compute.gpus:
        worker_requests[GPU_RESOURCE] = worker_limits[GPU_RESOURCE] = str(compute.gpus)
    head_pod = _ray_pod(
        spec,
        target,
        container="ray-head",
        resources={
            "requests": {"cpu": head.cpus, "memory": head.memory},
            "limits": {"cpu": head.cpu_limit, "memory": head.memory_limit},
        },
        memory_limit=head.memory_limit,
    )
    worker_pod = _ray_pod(
        spec,
        target,
        container="ray-worker",
        resources={"requests": worker_requests, "limits": worker_limits},
        memory_limit=compute.memory_limit,
    )
    if target.flavor is not None:
        worker_pod["nodeSelector"] = dict(target.flavor.node_labels)
    workers = worker_count(spec)

    object_labels = _object_labels(spec, target)
    object_labels[labels.GENERATION] = str(target.generation)
    object_labels[labels.KUEUE_QUEUE_NAME] = target.local_queue
    if spec.queue.priority is not None:
        object_labels[labels.KUEUE_PRIORITY_CLASS] = spec.queue.priority

    def pod_metadata(component: str) -> Manifest:
        pod_labels = _object_labels(spec, target)
        pod_labels[labels.COMPONENT] = component
        return {"labels": pod_labels}

    dumped: str = yaml.dump(
        serve_config(spec, target),
        Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper),
        default_flow_style=False,
        sort_keys=True,
        allow_unicode=True,
        width=2**16,
    )
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {
            "name": target.name,
            "namespace": target.namespace,
            "labels": object_labels,
            "annotations": {
                labels.SPEC_HASH: spec_hash(spec),
                labels.BUNDLE_SHA256: target.bundle_sha256,
            },
        },
        "spec": {
            "serveConfigV2": dumped,
            "upgradeStrategy": {"type": "NewCluster"},
            "rayClusterConfig": {
                "headGroupSpec": {
                    "rayStartParams": {"num-cpus": "0"},
                    "template": {"metadata": pod_metadata(labels.COMPONENT_HEAD), "spec": head_pod},
                },
                "workerGroupSpecs": [
                    {
                        "groupName": RAY_WORKER_GROUP,
                        "replicas": workers,
                        "minReplicas": workers,
                        "maxReplicas": workers,
                        "rayStartParams": {},
                        "template": {
                            "metadata": pod_metadata(labels.COMPONENT_WORKER),
                            "spec": worker_pod,
                        },
                    }
                ],
            },
        },
    }


def render_endpoint_secret(
    spec: Spec, target: EndpointTarget, *, token: str, owner: Owner
) -> Manifest:
    """The Secret holding the endpoint's token, owned by (and deleted with) the RayService.
    Not immutable: a token rotation replaces its value in place."""
    _check(spec, target)
    if not token or not token.isprintable():
        raise RenderError("the endpoint token must be non-empty printable text")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": target.token_secret,
            "namespace": target.namespace,
            "labels": _object_labels(spec, target),
            "ownerReferences": [owner.reference()],
        },
        "type": "Opaque",
        "data": {RUN_TOKEN_KEY: base64.b64encode(token.encode("utf-8")).decode("ascii")},
    }


def render_endpoint_route(spec: Spec, target: EndpointTarget, *, owner: Owner) -> Manifest:
    """The endpoint's route from outside the cluster (module docstring): an Ingress or an
    HTTPRoute, as ``target.route`` says, owned by (and deleted with) the RayService."""
    _check(spec, target)
    route, host = target.route, endpoint_host(target)
    if route is None or host is None:
        raise RenderError("no route is configured (TAU_ENDPOINT_ROUTE=none)")
    metadata: Manifest = {
        "name": target.name,
        "namespace": target.namespace,
        "labels": _object_labels(spec, target),
        "ownerReferences": [owner.reference()],
    }
    service = serve_service_name(target.name)
    if route.kind == "gateway":
        return {
            "apiVersion": GATEWAY_API,
            "kind": "HTTPRoute",
            "metadata": metadata,
            "spec": {
                "parentRefs": [
                    {
                        "group": "gateway.networking.k8s.io",
                        "kind": "Gateway",
                        "namespace": route.gateway_namespace,
                        "name": route.gateway_name,
                    }
                ],
                "hostnames": [host],
                "rules": [
                    {
                        "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                        "backendRefs": [{"name": service, "port": SERVE_PORT}],
                    }
                ],
            },
        }
    if route.annotations:
        metadata["annotations"] = dict(route.annotations)
    spec_part: Manifest = {}
    if route.ingress_class:
        spec_part["ingressClassName"] = route.ingress_class
    spec_part["tls"] = [
        {"hosts": [host], "secretName": route.tls_secret or endpoint_tls_secret_name(target.name)}
    ]
    spec_part["rules"] = [
        {
            "host": host,
            "http": {
                "paths": [
                    {
                        "path": "/",
                        "pathType": "Prefix",
                        "backend": {"service": {"name": service, "port": {"number": SERVE_PORT}}},
                    }
                ]
            },
        }
    ]
    return {
        "apiVersion": INGRESS_API,
        "kind": "Ingress",
        "metadata": metadata,
        "spec": spec_part,
    }
