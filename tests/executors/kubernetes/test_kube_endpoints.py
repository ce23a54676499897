"""Endpoints on the test cluster through the portal's own path: deployed with the serving
services, delivered through their outbox to the Kubernetes backend
(``executors.kubernetes.endpoints``), which makes the RayService and its token Secret; the
real KubeRay makes its Ray cluster, the real Kueue admits it or makes it wait; the watcher's
endpoint pass (``follow``) reports what it sees through ``serving.services.observe``. A scale
replaces the RayService with the new generation; a stop deletes it (Kueue frees the quota)
and revokes the token.

No Ray runs in the fake pods, so the endpoints stay ``deploying`` there (admitted,
starting), except where a test runs an endpoint's head pod here as its kubelet would
(:class:`HeadPod`): its init containers fetch the project and the SDK and stage the model from
the portal, and a real Ray head with the container's environment and working directory stands
for its Ray, named by the Ray cluster's head Service in the KubeRay operator's hosts file.
KubeRay deploys the Serve config to it as to a pod's, reads Ray Serve's status, and the
endpoint becomes ``ready`` through KubeRay's own ``Ready`` condition.
"""

from __future__ import annotations

import io
import json
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import kube as adapter
from catalog.ingest import asset_named, ingest_folder
from catalog.models import AssetVersion
from executors.kubernetes import labels
from executors.kubernetes.endpoints import follow
from identity.models import ApiToken
from serving import services
from serving.backends import backend_for_endpoint
from serving.delivery import deliver
from serving.models import Endpoint, EndpointDelivery, EndpointState
from tau.serving import LOOPBACK_HOOK, SETUP_HOOK_VARIABLE
from tests.cluster.kueue_objects import cluster_queue, local_queue
from tests.cluster.plugin import Kube, KubeCluster, wait_until
from tests.executors.kubernetes.test_kube_data_chain import FakeKubelet
from tests.runs.factories import zip_bytes, zip_directory
from tests.runs.processes import ROOT
from tests.scripts import load_script
from workspaces.models import PriorityClass, ResourceFlavor, WorkspaceQuota

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

RAY = "ray.io/v1"
KUEUE = "kueue.x-k8s.io/v1beta2"

SPEC = b"""schema_version: 1
name: reviews
run:
  workload_kind: rayservice
serve:
  import_path: app:app
  replicas: 2
compute:
  cpus: 1
  memory: 1Gi
runtime:
  image: rayproject/ray:2.60.0-py311
"""
APP = {"app.py": "app = None  # no Ray runs in the fake pods\n"}


@pytest.fixture
def on_the_cluster(
    settings: Any, kube_cluster: KubeCluster, monkeypatch: pytest.MonkeyPatch
) -> Iterator[adapter.KubeClient]:
    """This process on the Kubernetes backend, against the test cluster."""
    settings.TAU_BACKEND = "kubernetes"
    monkeypatch.setenv("TAU_KUBECONFIG", str(kube_cluster.kubeconfig))
    adapter.reset_client()
    yield adapter.client()
    adapter.reset_client()


def place(kube: Kube, world: Any, *, cpus: str) -> str:
    """alpha's namespace, a CPU flavor and a ClusterQueue of ``cpus`` CPUs behind the
    workspace's LocalQueue."""
    namespace = kube.namespace("ep")
    type(world.alpha).unscoped_objects.filter(pk=world.alpha.pk).update(namespace=namespace)
    world.alpha.namespace = namespace
    suffix = namespace.rsplit("-", 1)[1]
    flavor = kube.create(
        {"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": f"cpu-{suffix}"}}
    )["metadata"]["name"]
    kube.create(cluster_queue(f"cq-{suffix}", flavor, namespace, 0, cpu=cpus))
    kube.create(local_queue(world.alpha.local_queue, namespace, f"cq-{suffix}"))
    # alpha's top priority class, which its endpoints run at (it keeps them from preemption:
    # serving.preemption), on the cluster as the Kueue sync would make it.
    serving = f"serving-{suffix}"
    kube.create(
        {
            "apiVersion": KUEUE,
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": serving},
            "value": 5000,
        }
    )
    PriorityClass.objects.create(name=serving, value=5000)
    type(world.alpha).unscoped_objects.filter(pk=world.alpha.pk).update(
        allowed_priorities=["normal", serving]
    )
    world.alpha.refresh_from_db()
    # What the portal knows of alpha's quota (its policy checks a deployment against it): room
    # for the endpoint. Kueue's ClusterQueue above may hold less, as when other workloads of
    # the queue hold the rest.
    row = ResourceFlavor.objects.create(name=flavor)
    for resource, amount in (("cpu", Decimal(16)), ("memory", Decimal(64 * 2**30))):
        WorkspaceQuota.objects.create(
            workspace=world.alpha, flavor=row, resource=resource, nominal=amount
        )
    return namespace


def deliver_all(endpoint: Endpoint) -> None:
    for row in EndpointDelivery.objects.unscoped().filter(
        endpoint=endpoint, delivered_at__isnull=True, given_up_at__isnull=True
    ):
        assert deliver(row.pk), f"delivery {row.pk} ({row.action}) was not made"


def deploy(world: Any) -> Endpoint:
    return services.deploy_endpoint(
        workspace=world.alpha,
        user=world.users["researcher"],
        spec_source=SPEC,
        bundle=io.BytesIO(zip_bytes(APP)),
    )


def followed(client: adapter.KubeClient, endpoint: Endpoint, starts: str) -> Endpoint | None:
    follow(client)
    endpoint.refresh_from_db()
    return endpoint if endpoint.state_reason.startswith(starts) else None


def test_an_endpoint_is_made_admitted_scaled_and_stopped_on_the_cluster(
    world: Any, kube: Kube, on_the_cluster: adapter.KubeClient
) -> None:
    client = on_the_cluster
    namespace = place(kube, world, cpus="16")
    endpoint = deploy(world)
    deliver_all(endpoint)

    service = client.get(RAY, "RayService", "reviews", namespace)
    assert service["metadata"]["labels"][labels.ENDPOINT_ID] == str(endpoint.pk)
    assert service["metadata"]["labels"][labels.GENERATION] == "1"
    assert service["metadata"]["labels"][labels.KUEUE_QUEUE_NAME] == world.alpha.local_queue
    secret = client.get("v1", "Secret", "reviews-endpoint-token", namespace)
    assert secret["metadata"]["ownerReferences"][0]["uid"] == service["metadata"]["uid"]
    endpoint.refresh_from_db()
    token = endpoint.token
    assert token is not None
    assert (token.kind, token.revoked_at) == (ApiToken.Kind.ENDPOINT, None)

    # Kueue admits the Ray cluster KubeRay made for it; the watcher's pass says so.
    wait_until(
        "the endpoint to be reported admitted and starting",
        lambda: followed(client, endpoint, "Admitted"),
        timeout=120,
        describe=lambda: f"{endpoint.state}: {endpoint.state_reason}",
    )
    assert endpoint.state == EndpointState.DEPLOYING
    # At alpha's top priority: none of its runs may preempt it.
    (workload,) = client.list(KUEUE, "Workload", namespace)
    assert workload["spec"]["priorityClassRef"]["name"] == f"serving-{namespace.rsplit('-', 1)[1]}"
    assert workload["spec"]["priority"] == 5000
    queue_name = f"cq-{namespace.rsplit('-', 1)[1]}"
    wait_until(
        "Kueue to reserve the head's 2 CPUs and a CPU for each of the 2 replicas",
        lambda: reserved_cpus(kube, queue_name) == "4" or None,
        timeout=60,
        describe=lambda: f"reserved: {reserved_cpus(kube, queue_name)}",
    )

    # A scale is a new generation: the same RayService, replaced, with three workers.
    services.scale_endpoint(endpoint=endpoint, user=world.users["researcher"], replicas=3)
    deliver_all(endpoint)
    service = client.get(RAY, "RayService", "reviews", namespace)
    assert service["metadata"]["labels"][labels.GENERATION] == "2"
    group = service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    assert group["replicas"] == 3
    # What Kueue reserves then follows KubeRay's upgrade (a new Ray cluster of 3 workers
    # beside the old one, 4 + 5 CPUs, then 5 once the old one is deleted 60 s after the
    # switch), seen alone in ~90 s; under the suite's load KubeRay took over 120 s to start
    # it, so it is not waited for here. The quota freed by a stop is (below).
    # Each deployment's token replaces the one before.
    token.refresh_from_db()
    assert token.revoked_at is not None
    endpoint.refresh_from_db()
    assert endpoint.token is not None
    assert endpoint.token.pk != token.pk
    assert endpoint.token.revoked_at is None

    # A delivery of the old generation made late changes nothing.
    stale = Endpoint.objects.unscoped().get(pk=endpoint.pk)
    stale.generation = 1
    held = endpoint.token.pk
    backend_for_endpoint(endpoint).deploy(stale)
    endpoint.refresh_from_db()
    assert endpoint.token is not None
    assert endpoint.token.pk == held  # not even a new token
    assert (
        client.get(RAY, "RayService", "reviews", namespace)["metadata"]["labels"][labels.GENERATION]
        == "2"
    )

    services.stop_endpoint(endpoint=endpoint, user=world.users["researcher"])
    deliver_all(endpoint)

    def gone() -> bool | None:
        try:
            client.get(RAY, "RayService", "reviews", namespace)
        except adapter.NotFound:
            return True
        return None

    wait_until("the RayService to be deleted", gone, timeout=120)
    wait_until(
        "Kueue to free the endpoint's CPUs",
        lambda: reserved_cpus(kube, queue_name) == "0" or None,
        timeout=120,
        describe=lambda: f"reserved: {reserved_cpus(kube, queue_name)}",
    )
    endpoint.refresh_from_db()
    assert endpoint.token is not None
    assert endpoint.token.revoked_at is not None


def test_an_endpoint_bigger_than_its_workspace_s_quota_waits_saying_why(
    world: Any, kube: Kube, on_the_cluster: adapter.KubeClient
) -> None:
    client = on_the_cluster
    place(kube, world, cpus="3")  # the head (2 CPUs) and one 1-CPU replica: not both replicas
    endpoint = deploy(world)
    deliver_all(endpoint)

    def waiting_for_cpus() -> Endpoint | None:
        # Kueue's reason, in plain words, once Kueue has tried to admit it.
        seen = followed(client, endpoint, "")
        return seen if seen is not None and "CPU" in seen.state_reason else None

    wait_until(
        "the endpoint to be reported waiting for CPUs",
        waiting_for_cpus,
        timeout=120,
        describe=lambda: f"{endpoint.state}: {endpoint.state_reason}",
    )
    assert endpoint.state == EndpointState.DEPLOYING
    assert "quota" in endpoint.state_reason


# --- An endpoint that becomes ready ------------------------------------------------------------

SERVE_CPU = ROOT / "examples" / "serve-cpu"


def load_ray_submitter() -> Any:
    """deploy/cluster/ray_submitter.py (and through it the control plane's script and
    deploy/dev/ray_head.py), by path: deploy/ is not a package."""
    return load_script(ROOT / "deploy" / "cluster" / "ray_submitter.py", "taugrid_ray_submitter")


def reviews_model(world: Any, tmp_path: Path) -> AssetVersion:
    """alpha's ``reviews-classifier`` as examples/train-on-data writes it: weights over a
    three-word vocabulary, "good" the word that counts."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.json").write_text(json.dumps({"weights": [3.0, -3.0, 0.0], "bias": 0.0}))
    (folder / "vocab.txt").write_text("good\nbad\nfilm\n")
    asset = asset_named(world.alpha, "model", "reviews-classifier", user=world.users["researcher"])
    version = ingest_folder(asset, folder, source="upload", user=world.users["researcher"])
    assert version.state == AssetVersion.State.READY, version.error
    return version


class HeadPod:
    """The head pod of an endpoint's Ray cluster run here, as a kubelet would run it: its init
    containers as they are rendered (the project and the SDK fetched, the model staged, from
    the portal with the endpoint's token), then a real Ray head (deploy/dev/ray_head.py) with
    the Ray container's environment and working directory, Ray Serve's HTTP proxy on
    ``127.0.0.1`` and a port of its own, and its dashboard named by the cluster's head
    Service in the KubeRay operator's hosts file, as the RayJob tests' head is.

    Its readiness is a kubelet's too: KWOK reports a pod Ready as soon as it runs, but a real
    head pod is Ready only once its readiness probe (KubeRay's, on the raylet and the
    dashboard) passes. So the pod is reported not ready until this head answers, then Ready:
    KubeRay waits for its ``HeadPodReady`` condition before it calls the dashboard, and its
    reconcile on that change comes at once. (Reported Ready early, KubeRay's calls to a
    dashboard not yet up fail, and each failure doubles the delay of its next try: under
    load the endpoint then waited minutes for a retry.)"""

    def __init__(self, kube: Kube, cluster: KubeCluster, namespace: str, scratch: Path) -> None:
        self.kube = kube
        self.cluster = cluster
        self.namespace = namespace
        self.scratch = scratch
        self.submitter = load_ray_submitter()
        self.ray = self.submitter.ray_head
        self.head: Any = None
        self.pod_name = ""
        self.serve_port = 0

    def start(self, ray_cluster: str) -> None:
        def head_pod() -> dict[str, Any] | None:
            found = self.kube.list(
                "v1",
                "Pod",
                self.namespace,
                label_selector=f"ray.io/cluster={ray_cluster},ray.io/node-type=head",
            )
            return found[0] if found else None

        # KubeRay makes the pods once Kueue has admitted the Ray cluster. What runs here is the
        # head group's template as TauGrid rendered it (the pod adds KubeRay's own variables,
        # RAY_ADDRESS among them, which would point this head's jobs at a pod's address).
        def started_by_kwok() -> dict[str, Any] | None:
            found = head_pod()
            return found if found is not None and readiness(found) == "True" else None

        # KWOK has played its stage (Running and Ready) before the readiness is taken back:
        # it writes the pod no more after that, so nothing undoes it.
        pod = wait_until(f"{ray_cluster}'s head pod running", started_by_kwok, timeout=60)
        self.pod_name = pod["metadata"]["name"]
        self.report_ready(False)
        made = self.kube.get("ray.io/v1", "RayCluster", ray_cluster, self.namespace)
        assert made is not None
        spec = made["spec"]["headGroupSpec"]["template"]["spec"]
        kubelet = FakeKubelet(self.kube, self.namespace, self.scratch, self.scratch)
        volumes = {
            volume["name"]: self.scratch / "volumes" / volume["name"] for volume in spec["volumes"]
        }
        for folder in volumes.values():
            folder.mkdir(parents=True)
        for container in spec["initContainers"]:
            kubelet.run_container(container, volumes)
        (ray_container,) = spec["containers"]
        here, env = kubelet.placed(ray_container, volumes)
        # Ray Serve binds each replica's inter-deployment gRPC server on every interface: in
        # a pod, the pod's own; here, the machine's. Every worker of this head runs the SDK's
        # hook first (Ray's worker_process_setup_hook, as a job's runtime_env would set it),
        # as the local executor's do, so that it listens on loopback only.
        env[SETUP_HOOK_VARIABLE] = LOOPBACK_HOOK
        self.head = self.ray.start_head(
            self.scratch / "ray", env=env, cwd=Path(here(ray_container["workingDir"]))
        )
        (self.serve_port,) = self.ray.free_ports(1)
        self.ray.start_serve(self.head, self.serve_port)
        service = f"{ray_cluster}-head-svc.{self.namespace}.svc.cluster.local"
        hosts = self.submitter.controlplane.operator_hosts_file(self.cluster.state_dir)
        with hosts.open("a") as file:  # in place: the operator's bind mount holds the inode
            file.write(f"{self.head.dashboard_host} {service}\n")
        self.report_ready(True)

    def report_ready(self, ready: bool) -> None:
        """Write the head pod's readiness, as the kubelet does after a readiness probe."""
        pod = self.kube.get("v1", "Pod", self.pod_name, self.namespace)
        assert pod is not None, self.pod_name
        status = pod["status"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        said = "True" if ready else "False"
        conditions = [
            {**condition, "status": said, "lastTransitionTime": now}
            if condition["type"] in ("Ready", "ContainersReady") and condition.get("status") != said
            else condition
            for condition in status.get("conditions") or []
        ]
        containers = [
            {**container, "ready": ready} for container in status.get("containerStatuses") or []
        ]
        written = self.kube.patch_status(
            "v1",
            "Pod",
            self.pod_name,
            self.namespace,
            {"conditions": conditions, "containerStatuses": containers},
        )
        assert readiness(written) == said, written["status"]

    def ask(self, text: str) -> Any:
        """POST / to the application, straight to Ray Serve's proxy."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.serve_port}/",
            data=json.dumps({"text": text}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())

    def stop(self) -> None:
        if self.head is not None:
            self.ray.stop_head(self.head)


def readiness(pod: dict[str, Any]) -> str | None:
    """The status of the pod's ``Ready`` condition ("True", "False"), None before it has one."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return next((c["status"] for c in conditions if c["type"] == "Ready"), None)


def reserved_cpus(kube: Kube, cluster_queue_name: str) -> str:
    """The CPUs Kueue has reserved in the ClusterQueue, as its status says ("0" for none)."""
    queue = kube.get(KUEUE, "ClusterQueue", cluster_queue_name)
    assert queue is not None
    for flavor in (queue.get("status") or {}).get("flavorsReservation") or []:
        for resource in flavor.get("resources") or []:
            if resource["name"] == "cpu":
                return str(resource["total"])
    return "0"


def ready(client: adapter.KubeClient, endpoint: Endpoint) -> Endpoint | None:
    seen = followed(client, endpoint, "")
    return seen if seen is not None and seen.state == EndpointState.READY else None


def described(
    client: adapter.KubeClient, kube_cluster: KubeCluster, endpoint: Endpoint, namespace: str
) -> str:
    status = client.get(RAY, "RayService", endpoint.name, namespace).get("status")
    return (
        f"{endpoint.state}: {endpoint.state_reason}; the RayService's status: {status}"
        f"\nKubeRay's log about it:\n{kube_cluster.log_tail('kuberay-operator', endpoint.name)}"
    )


def test_the_serve_cpu_example_becomes_ready_through_kuberay_and_a_real_ray_serve(
    world: Any,
    kube: Kube,
    kube_cluster: KubeCluster,
    on_the_cluster: adapter.KubeClient,
    live_server: Any,
    settings: Any,
    tmp_path: Path,
) -> None:
    """examples/serve-cpu as written, on the model version it names: the RayService is
    admitted by Kueue (the ClusterQueue's CPUs reserved for its head and its replica), its
    head pod's init containers fetch the project and stage the model from the portal, KubeRay
    deploys the Serve config to the Ray head and reads Ray Serve's status, and the endpoint
    is ``ready`` through KubeRay's own ``Ready`` condition; the application answers with the
    staged model; stopped, Kueue frees the quota."""
    client = on_the_cluster
    settings.TAU_API_URL = live_server.url  # where the pods fetch the project and the model
    namespace = place(kube, world, cpus="16")
    queue_name = f"cq-{namespace.rsplit('-', 1)[1]}"
    model = reviews_model(world, tmp_path)
    endpoint = services.deploy_endpoint(
        workspace=world.alpha,
        user=world.users["researcher"],
        spec_source=(SERVE_CPU / "tau.yaml").read_bytes(),
        bundle=io.BytesIO(zip_directory(SERVE_CPU)),
    )
    assert endpoint.model_version == model
    deliver_all(endpoint)
    wait_until(
        "the endpoint to be reported admitted and starting",
        lambda: followed(client, endpoint, "Admitted"),
        timeout=120,
        describe=lambda: f"{endpoint.state}: {endpoint.state_reason}",
    )
    # The head (2 CPUs) and one 1-CPU replica, in the workspace's queue (Kueue writes the
    # ClusterQueue's status a moment after it admits).
    wait_until(
        "Kueue to reserve the endpoint's CPUs",
        lambda: reserved_cpus(kube, queue_name) == "3" or None,
        timeout=60,
        describe=lambda: str(kube.get(KUEUE, "ClusterQueue", queue_name)),
    )

    service = client.get(RAY, "RayService", endpoint.name, namespace)
    ray_cluster = service["status"]["pendingServiceStatus"]["rayClusterName"]
    pod = HeadPod(kube, kube_cluster, namespace, tmp_path / "pod")
    try:
        pod.start(ray_cluster)
        wait_until(
            "the endpoint to be ready",
            lambda: ready(client, endpoint),
            timeout=180,
            describe=lambda: described(client, kube_cluster, endpoint, namespace),
        )
        assert endpoint.state == EndpointState.READY, endpoint.state_reason
        assert endpoint.replicas_ready == endpoint.replicas_desired == 1
        assert endpoint.url == f"http://serve-cpu-serve-svc.{namespace}.svc:8000"
        # The application answers with the model the init container staged from the portal.
        assert pod.ask("a good film") == {"positive": 0.952574, "label": 1, "words": 2}
        active = client.get(RAY, "RayService", endpoint.name, namespace)["status"][
            "activeServiceStatus"
        ]
        assert active["applicationStatuses"]["serve-cpu"]["status"] == "RUNNING"
    finally:
        pod.stop()

    services.stop_endpoint(endpoint=endpoint, user=world.users["researcher"])
    deliver_all(endpoint)
    wait_until(
        "Kueue to free the endpoint's CPUs",
        lambda: reserved_cpus(kube, queue_name) == "0" or None,
        timeout=120,
        describe=lambda: f"reserved: {reserved_cpus(kube, queue_name)}",
    )
