"""Endpoints on the test cluster through the portal's own path: deployed with the serving
services, delivered through their outbox to the Kubernetes backend
(``executors.kubernetes.endpoints``), which makes the RayService and its token Secret; the
real KubeRay makes its Ray cluster, the real Kueue admits it or makes it wait; the watcher's
endpoint pass (``follow``) reports what it sees through ``serving.services.observe``. A scale
replaces the RayService with the new generation; a stop deletes it (Kueue frees the quota)
and revokes the token.

No Ray runs in the fake pods, so the endpoints stay ``deploying`` here (admitted, starting);
what KubeRay's status says once Ray Serve answers is read by
``executors.kubernetes.endpoint_status`` (test_endpoint_status.py).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

import kube as adapter
from executors.kubernetes import labels
from executors.kubernetes.endpoints import follow
from identity.models import ApiToken
from serving import services
from serving.backends import backend_for_endpoint
from serving.delivery import deliver
from serving.models import Endpoint, EndpointDelivery, EndpointState
from tests.cluster.kueue_objects import cluster_queue, local_queue
from tests.cluster.plugin import Kube, KubeCluster, wait_until
from tests.runs.factories import zip_bytes
from workspaces.models import ResourceFlavor, WorkspaceQuota

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

    # A scale is a new generation: the same RayService, replaced, with three workers.
    services.scale_endpoint(endpoint=endpoint, user=world.users["researcher"], replicas=3)
    deliver_all(endpoint)
    service = client.get(RAY, "RayService", "reviews", namespace)
    assert service["metadata"]["labels"][labels.GENERATION] == "2"
    group = service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    assert group["replicas"] == 3
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
