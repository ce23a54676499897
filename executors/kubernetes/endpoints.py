"""Endpoints on a cluster: the Kubernetes backend's :class:`serving.backends.EndpointBackend`.

``deploy`` makes the endpoint's RayService (``render_endpoint``) say its current generation:
created the first time, replaced when the endpoint has a newer generation than the object
(KubeRay's upgrade then brings the new Ray cluster up beside the old one), left alone when the
object is already that generation or a newer one (a late delivery). Then its token Secret,
owned by the RayService, with a token issued for this deployment (the pods fetch the project
zip and stage the model with it). ``stop`` deletes the RayService (its Ray clusters, pods and
Secret go with it, and Kueue frees the quota) and revokes the token.

What happens then comes back through the watcher (:func:`follow`, called from its loop): it
reads each endpoint's RayService and the Kueue Workload of its Ray cluster and reports the
state :mod:`executors.kubernetes.endpoint_status` reads from them through
``serving.services.observe``. An endpoint's address is KubeRay's serve Service,
``http://<endpoint>-serve-svc.<namespace>.svc:8000`` (reachable from inside the cluster, where
the portal runs; the proxy route always goes there), or ``https://<host>`` where the platform
configures a route from outside (``TAU_ENDPOINT_ROUTE``): ``deploy`` then also makes the
endpoint's Ingress or HTTPRoute, owned by the RayService (so ``stop`` deletes it with the
RayService), and replaces it when it says something else than the settings now say. A cluster
that does not serve the route's API (no Gateway API CRDs) fails the deployment saying so.
An endpoint's traffic figures come from Ray Serve's metrics in the portal's Prometheus
(:mod:`executors.kubernetes.endpoint_metrics`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from datetime import timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final, Protocol

from django.conf import settings
from django.utils import timezone

from catalog.models import AssetVersion
from executors.kubernetes import labels
from executors.kubernetes.endpoint_metrics import endpoint_metrics
from executors.kubernetes.endpoint_status import observe_endpoint
from executors.kubernetes.render import Flavor, Owner
from executors.kubernetes.render_endpoint import (
    GATEWAY_API,
    INGRESS_API,
    SERVE_PORT,
    SERVE_SERVICE_SUFFIX,
    EndpointTarget,
    endpoint_secret_name,
    render_endpoint_route,
    render_endpoint_secret,
    render_rayservice,
    worker_count,
)
from kube import Conflict, KubeClient, KubeError, NotFound, UnknownKind
from kube.pod_logs import read_pod_log
from portal.endpoint_routes import EndpointRoute
from serving.backends import EndpointLog, EndpointMetrics
from serving.models import LIVE_STATES, Endpoint, EndpointState
from tau.k8s_names import GPU_RESOURCE
from tau.quantity import parse_quantity
from tau.spec import Spec, spec_from_dict
from workspaces.models import ResourceFlavor

if TYPE_CHECKING:
    from workspaces.models import Workspace

logger = logging.getLogger(__name__)

RAY: Final = "ray.io/v1"
KUEUE: Final = "kueue.x-k8s.io/v1beta2"
#: The label KubeRay puts on the Ray clusters of a RayService.
ORIGINATED_FROM: Final = "ray.io/originated-from-cr-name"
#: The most of a pod's log read at once.
LOG_LIMIT_BYTES: Final = 4 * 2**20
#: The serving container of each kind of Ray pod (the init containers have logs of their own).
_CONTAINERS: Final = {labels.COMPONENT_HEAD: "ray-head", labels.COMPONENT_WORKER: "ray-worker"}


class EndpointDeliveryError(RuntimeError):
    """The endpoint's objects cannot be made as asked; the message says why, for people."""


def endpoint_target(endpoint: Endpoint) -> tuple[Spec, EndpointTarget]:
    """The spec and the render target of the endpoint's current generation: its tau.yaml,
    with the replicas a scale asked for since (``Endpoint.replicas_desired``)."""
    spec = spec_from_dict(endpoint.spec)
    if spec.serve is not None and spec.serve.autoscaling is None:
        serve = dataclasses.replace(spec.serve, replicas=endpoint.replicas_desired)
        spec = dataclasses.replace(spec, serve=serve)
    workspace = endpoint.workspace
    flavor = None
    gpu_type = spec.compute.gpu_type
    if gpu_type is not None:
        node_labels = (
            ResourceFlavor.objects.filter(name=gpu_type)
            .values_list("node_labels", flat=True)
            .first()
        )
        if node_labels is None:
            raise EndpointDeliveryError(
                f"compute.gpu_type names the flavor {gpu_type!r}, which no longer exists"
            )
        flavor = Flavor(gpu_type, dict(node_labels))
    bundle = endpoint.bundle
    if bundle is None:
        raise EndpointDeliveryError("an endpoint needs its project zip (its Ray Serve application)")
    staged = None
    if endpoint.model_version_id is not None:
        version = AssetVersion.objects.unscoped().get(pk=endpoint.model_version_id)
        staged = (version.files_count, version.bytes)
    target = EndpointTarget(
        endpoint_id=endpoint.pk,
        name=endpoint.name,
        workspace=workspace.slug,
        namespace=workspace.namespace,
        local_queue=workspace.local_queue,
        generation=endpoint.generation,
        portal_url=settings.TAU_API_URL,
        token_secret=endpoint_secret_name(endpoint.name),
        bundle_sha256=bundle.sha256,
        flavor=flavor,
        staged_model=staged,
        route=settings.TAU_ENDPOINT_ROUTE,
    )
    return spec, target


def _labels(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    found: Mapping[str, str] = ((obj or {}).get("metadata") or {}).get("labels") or {}
    return found


def _is_ours(obj: Mapping[str, Any], endpoint: Endpoint) -> bool:
    found = _labels(obj)
    return found.get(labels.MANAGED_BY) == labels.MANAGED_BY_TAUGRID and found.get(
        labels.ENDPOINT_ID
    ) == str(endpoint.pk)


def _generation(obj: Mapping[str, Any]) -> int:
    try:
        return int(_labels(obj).get(labels.GENERATION) or 0)
    except ValueError:
        return 0


class _RunBackend(Protocol):
    """What the endpoints ask of the Kubernetes run backend they belong to (typed here:
    the backend imports this module)."""

    @property
    def client(self) -> KubeClient: ...

    def submission_problems(self, spec: Spec, workspace: Workspace) -> list[tuple[str, str]]: ...


class KubernetesEndpoints:
    """The Kubernetes backend's endpoints (module docstring)."""

    #: Kueue preempts the Ray clusters it admitted like any workload (serving.preemption).
    preempts = True

    def __init__(self, backend: _RunBackend) -> None:
        self._backend = backend

    @property
    def client(self) -> KubeClient:
        return self._backend.client

    def quota_held(self, spec: Spec, replicas: int) -> dict[str, Decimal]:
        """What Kueue reserves for the endpoint's Ray cluster, as :func:`render_rayservice`
        asks for it: the head, and the worker group (:func:`worker_count`: one worker per
        replica, or ``serve.autoscaling.max_replicas`` of them: the group is fixed)."""
        compute = spec.compute
        head = compute.ray_head
        workers = worker_count(spec, replicas)
        held = {
            "cpu": parse_quantity(head.cpus) + parse_quantity(compute.cpus) * workers,
            "memory": parse_quantity(head.memory) + parse_quantity(compute.memory) * workers,
        }
        if compute.gpus:
            held[GPU_RESOURCE] = Decimal(compute.gpus * workers)
        return held

    # -- instructions ------------------------------------------------------------------------

    def deploy_problems(self, spec: Spec, workspace: Workspace) -> list[tuple[str, str]]:
        """What the cluster could never run, as for a run: a replica no node could hold (its
        GPUs, CPUs or memory above every node's), or what the renderer cannot carry."""
        return self._backend.submission_problems(spec, workspace)

    def deploy(self, endpoint: Endpoint) -> None:
        current = Endpoint.objects.unscoped().filter(pk=endpoint.pk).first()
        if current is None or current.deleted_at is not None or current.state not in LIVE_STATES:
            logger.info("endpoint %s is not wanted running any more; nothing made", endpoint.name)
            return
        if current.generation > endpoint.generation:
            endpoint = current  # a newer generation was asked for meanwhile: deploy that one
        spec, target = endpoint_target(endpoint)
        body = render_rayservice(spec, target)
        try:
            existing: dict[str, Any] | None = self.client.get(
                RAY, "RayService", target.name, target.namespace
            )
        except NotFound:
            existing = None
        made = False
        if existing is None:
            try:
                service = self.client.create(body)
                made = True
            except Conflict:
                service = self.client.get(RAY, "RayService", target.name, target.namespace)
        else:
            service = existing
        if not _is_ours(service, endpoint):
            raise EndpointDeliveryError(
                f"a RayService {target.name} already exists in {target.namespace} and is not "
                "this endpoint's; it is left as it is"
            )
        if (service.get("metadata") or {}).get("deletionTimestamp"):
            raise EndpointDeliveryError(
                f"the RayService {target.name} of an earlier deployment is still being deleted; "
                "the endpoint is deployed again once it is gone"
            )
        if _generation(service) > target.generation:
            return  # an older generation's delivery, after a newer one: changes nothing
        if _generation(service) < target.generation:
            body["metadata"]["resourceVersion"] = service["metadata"]["resourceVersion"]
            service = self.client.update(body)
            made = True
        self._ensure_secret(endpoint, spec, target, service, new_generation=made)
        if target.route is not None:
            self._ensure_route(endpoint, spec, target, service)

    def _ensure_route(
        self, endpoint: Endpoint, spec: Spec, target: EndpointTarget, service: Mapping[str, Any]
    ) -> None:
        """The endpoint's Ingress or HTTPRoute, owned by the RayService: made if missing,
        replaced when it lacks something the settings now render (a new host pattern, TLS
        Secret, annotation or Gateway), left alone when it says all of it. What others added
        (defaults the API server fills in, a controller's own annotations) is no difference,
        so an annotation dropped from the settings stays until the route is next replaced."""
        body = render_endpoint_route(spec, target, owner=Owner.of(service))
        kind = str(body["kind"])
        api = GATEWAY_API if kind == "HTTPRoute" else INGRESS_API
        try:
            try:
                found: dict[str, Any] | None = self.client.get(
                    api, kind, target.name, target.namespace
                )
            except NotFound:
                found = None
            if found is None:
                try:
                    self.client.create(body)
                    return
                except Conflict:
                    found = self.client.get(api, kind, target.name, target.namespace)
        except UnknownKind as exc:
            what = (
                "the Gateway API's HTTPRoute (gateway.networking.k8s.io/v1: are its CRDs "
                "installed?)"
                if kind == "HTTPRoute"
                else "Ingress (networking.k8s.io/v1)"
            )
            raise EndpointDeliveryError(
                f"TAU_ENDPOINT_ROUTE={'gateway' if kind == 'HTTPRoute' else 'ingress'} asks for "
                f"{what}, which this cluster does not serve ({exc}); the RayService was made, "
                "reachable inside the cluster and through the portal's proxy route"
            ) from None
        if not _is_ours(found, endpoint):
            raise EndpointDeliveryError(
                f"an {kind} {target.name} already exists in {target.namespace} and is not this "
                "endpoint's; it is left as it is"
            )
        metadata = found.get("metadata") or {}
        same = (
            _holds(found.get("spec"), body["spec"])
            and _holds(metadata.get("annotations") or {}, body["metadata"].get("annotations") or {})
            and _holds(metadata.get("ownerReferences"), body["metadata"]["ownerReferences"])
            and _holds(metadata.get("labels"), body["metadata"]["labels"])
        )
        if not same:
            body["metadata"]["resourceVersion"] = metadata["resourceVersion"]
            self.client.update(body)

    def _ensure_secret(
        self,
        endpoint: Endpoint,
        spec: Spec,
        target: EndpointTarget,
        service: Mapping[str, Any],
        *,
        new_generation: bool,
    ) -> None:
        """The token Secret, owned by the RayService, with a token issued for this generation;
        a delivery made again for the same generation leaves the token as it is."""
        from serving.workload_tokens import issue_endpoint_token

        owner = Owner.of(service)
        try:
            found: dict[str, Any] | None = self.client.get(
                "v1", "Secret", target.token_secret, target.namespace
            )
        except NotFound:
            found = None
        if found is not None and not _is_ours(found, endpoint):
            raise EndpointDeliveryError(
                f"a Secret {target.token_secret} already exists in {target.namespace} and is "
                "not this endpoint's; it is left as it is"
            )
        owners = ((found or {}).get("metadata") or {}).get("ownerReferences") or []
        if (
            found is not None
            and not new_generation
            and any(reference.get("uid") == owner.uid for reference in owners)
        ):
            return
        token = issue_endpoint_token(endpoint)
        if token is None:
            raise EndpointDeliveryError(
                f"no token can be issued: {endpoint.created_by_username} can no longer act, "
                "or the endpoint was stopped meanwhile"
            )
        secret = render_endpoint_secret(spec, target, token=token, owner=owner)
        if found is None:
            self.client.create(secret)
        else:
            secret["metadata"]["resourceVersion"] = found["metadata"]["resourceVersion"]
            self.client.update(secret)

    def stop(self, endpoint: Endpoint) -> None:
        from serving.workload_tokens import revoke_endpoint_tokens

        namespace = endpoint.workspace.namespace
        try:
            existing: dict[str, Any] | None = self.client.get(
                RAY, "RayService", endpoint.name, namespace
            )
        except NotFound:
            existing = None
        if existing is not None and _is_ours(existing, endpoint):
            self.client.delete(
                RAY,
                "RayService",
                endpoint.name,
                namespace,
                propagation="Foreground",
                missing_ok=True,
            )
        revoke_endpoint_tokens(endpoint)

    # -- what pages and the API ask ----------------------------------------------------------

    def invoke_address(self, endpoint: Endpoint) -> str | None:
        if endpoint.state not in {EndpointState.READY, EndpointState.UPDATING}:
            return None
        spec = spec_from_dict(endpoint.spec)
        prefix = spec.serve.route_prefix if spec.serve is not None else "/"
        host = f"{endpoint.name}{SERVE_SERVICE_SUFFIX}.{endpoint.workspace.namespace}.svc"
        return f"http://{host}:{SERVE_PORT}{prefix.rstrip('/')}"

    def _pods(self, endpoint: Endpoint) -> list[dict[str, Any]]:
        namespace = endpoint.workspace.namespace
        pods: list[dict[str, Any]] = []
        for cluster in self.client.list(
            RAY, "RayCluster", namespace, label_selector=f"{ORIGINATED_FROM}={endpoint.name}"
        ):
            name = cluster["metadata"]["name"]
            pods += self.client.list(
                "v1", "Pod", namespace, label_selector=f"ray.io/cluster={name}"
            )
        return sorted(pods, key=lambda pod: str(pod["metadata"]["name"]))

    def read_log(
        self,
        endpoint: Endpoint,
        *,
        offset: int | None,
        tail_lines: int | None,
        replica: str | None = None,
    ) -> EndpointLog:
        """A Ray pod's log (``replica`` names the pod; by default the first worker, where a
        replica runs), its last lines or from ``offset``."""
        pods = self._pods(endpoint)
        names = tuple(str(pod["metadata"]["name"]) for pod in pods)
        if not pods:
            return EndpointLog("", 0, 0, 0, replicas=names, note="No Ray pod of it exists now.")
        workers = [
            pod for pod in pods if _labels(pod).get(labels.COMPONENT) == labels.COMPONENT_WORKER
        ]
        chosen = next((pod for pod in pods if pod["metadata"]["name"] == replica), None)
        pod = chosen or (workers or pods)[0]
        name = str(pod["metadata"]["name"])
        try:
            data = read_pod_log(
                self.client,
                endpoint.workspace.namespace,
                name,
                container=_CONTAINERS.get(_labels(pod).get(labels.COMPONENT, ""), None),
                limit_bytes=LOG_LIMIT_BYTES if tail_lines is None else None,
                tail_lines=tail_lines,
            )
        except KubeError as exc:
            return EndpointLog("", 0, 0, 0, replica=name, replicas=names, note=str(exc))
        start = min(offset or 0, len(data))
        piece = data[start:].decode("utf-8", errors="replace")
        return EndpointLog(piece, start, len(data), len(data), replica=name, replicas=names)

    def metrics(self, endpoint: Endpoint) -> EndpointMetrics:
        """Ray Serve's request rate, error rate and latency, and its pods' GPU utilisation,
        from the portal's Prometheus (:mod:`executors.kubernetes.endpoint_metrics`): no
        Kubernetes API call, and never an exception (a note says what is missing)."""
        return endpoint_metrics(endpoint)


def _workload_of(client: KubeClient, service: Mapping[str, Any]) -> dict[str, Any] | None:
    """The Kueue Workload of the Ray cluster the RayService is bringing up (its pending one
    during an upgrade, else its active one)."""
    status = service.get("status") or {}
    namespace = str((service.get("metadata") or {}).get("namespace") or "")
    for which in ("pendingServiceStatus", "activeServiceStatus"):
        name = (status.get(which) or {}).get("rayClusterName")
        if not name:
            continue
        try:
            cluster = client.get(RAY, "RayCluster", name, namespace)
        except NotFound:
            continue
        uid = cluster["metadata"]["uid"]
        found = client.list(
            KUEUE, "Workload", namespace, label_selector=f"{labels.KUEUE_JOB_UID}={uid}"
        )
        if found:
            return dict(found[0])
    # KubeRay made the cluster before recording its name: find it by its label.
    name = str((service.get("metadata") or {}).get("name") or "")
    for cluster in client.list(
        RAY, "RayCluster", namespace, label_selector=f"{ORIGINATED_FROM}={name}"
    ):
        uid = cluster["metadata"]["uid"]
        found = client.list(
            KUEUE, "Workload", namespace, label_selector=f"{labels.KUEUE_JOB_UID}={uid}"
        )
        if found:
            return dict(found[0])
    return None


def follow(client: KubeClient) -> int:
    """One pass over the live endpoints of this backend: read each one's RayService (and its
    Ray cluster's Workload while it is not serving) and report what they say. How many
    endpoints changed."""
    from serving.services import observe

    changed = 0
    live = (
        Endpoint.objects.unscoped()
        .filter(backend="kubernetes", deleted_at__isnull=True, state__in=LIVE_STATES)
        .select_related("workspace")
    )
    for endpoint in live:
        namespace = endpoint.workspace.namespace
        try:
            service: dict[str, Any] | None = client.get(RAY, "RayService", endpoint.name, namespace)
        except NotFound:
            service = None
        except KubeError as exc:
            logger.warning("endpoint %s not read: %s", endpoint.name, exc)
            continue
        if service is None or not _is_ours(service, endpoint):
            continue  # not made yet (its delivery is on its way) or not ours: nothing to say
        if _generation(service) < endpoint.generation:
            continue  # the new generation's delivery is on its way
        workload = None
        ready = any(
            entry.get("type") == "Ready" and entry.get("status") == "True"
            for entry in (service.get("status") or {}).get("conditions") or []
        )
        if not ready:
            try:
                workload = _workload_of(client, service)
            except KubeError as exc:
                logger.warning("endpoint %s: its Workload not read: %s", endpoint.name, exc)
        seen = observe_endpoint(service, application=endpoint.name, workload=workload)
        if seen is None:
            continue
        url = ""
        if seen.state in {"ready", "updating"}:
            url = endpoint_address(endpoint)
        if observe(
            endpoint,
            state=seen.state,
            reason=seen.reason,
            replicas_ready=seen.replicas_ready,
            url=url or None,
            generation=_generation(service),
        ):
            changed += 1
        if seen.state in SERVING_OBSERVED:
            _record_traffic(endpoint)
    return changed


#: The states in which an endpoint serves, as the watcher's pass sees them.
SERVING_OBSERVED: Final = frozenset({"ready", "updating", "unhealthy"})
#: How often the watcher's pass records an endpoint's traffic for its pages, its list and
#: the idle count (``Endpoint.requests_per_second`` …, ``last_request_at``).
TRAFFIC_RECORDED_EVERY: Final = timedelta(seconds=30)


def _record_traffic(endpoint: Endpoint) -> None:
    """What Prometheus says of the endpoint's traffic (:func:`endpoint_metrics`), recorded at
    most every :data:`TRAFFIC_RECORDED_EVERY` and only when there is a figure: the pages show
    what the local agent records for its endpoints, and requests sent straight to the
    endpoint's address (past the proxy) count against "idle" too. Without a Prometheus
    setting, nothing is asked."""
    from serving.services import record_metrics

    if not settings.TAU_PROMETHEUS_URL:
        return
    if endpoint.metrics_at is not None and (
        timezone.now() - endpoint.metrics_at < TRAFFIC_RECORDED_EVERY
    ):
        return
    measured = endpoint_metrics(endpoint)
    if measured.requests_per_second is None:
        return  # Prometheus down, or no series of its pods yet: the note is the API's
    record_metrics(
        endpoint,
        requests_per_second=measured.requests_per_second,
        latency_p95_ms=measured.latency_p95_ms,
        error_rate=measured.error_rate,
    )


def _holds(found: Any, wanted: Any) -> bool:
    """Whether ``found`` (as the API server keeps it) says everything ``wanted`` says: the
    defaults the server adds (an HTTPRoute backend's ``kind: Service``, ``weight: 1``) are no
    difference."""
    if isinstance(wanted, Mapping):
        return isinstance(found, Mapping) and all(
            key in found and _holds(found[key], value) for key, value in wanted.items()
        )
    if isinstance(wanted, list):
        return (
            isinstance(found, list)
            and len(found) == len(wanted)
            and all(_holds(a, b) for a, b in zip(found, wanted, strict=True))
        )
    return bool(found == wanted)


def endpoint_address(endpoint: Endpoint) -> str:
    """The endpoint's ``url``: ``https://<host>`` with a route configured, else KubeRay's
    serve Service in its namespace."""
    route: EndpointRoute | None = settings.TAU_ENDPOINT_ROUTE
    if route is not None:
        return f"https://{route.host(endpoint=endpoint.name, workspace=endpoint.workspace.slug)}"
    host = f"{endpoint.name}{SERVE_SERVICE_SUFFIX}.{endpoint.workspace.namespace}.svc"
    return f"http://{host}:{SERVE_PORT}"
