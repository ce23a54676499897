"""An endpoint's route from outside the cluster on the test cluster, through the portal's own
path (``serving.services`` → the delivery outbox → ``executors.kubernetes.endpoints``), with
``TAU_ENDPOINT_ROUTE`` set: the Ingress is made beside the RayService and owned by it, left
alone when delivered again, replaced when the platform's settings change, and deleted with the
RayService by the real garbage collector when the endpoint stops. The test cluster serves no
Gateway API (deploy/cluster installs no Gateway CRDs), which is the other case worth proving:
an HTTPRoute asked of such a cluster fails the deployment saying so, after the RayService.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import kube as adapter
from executors.kubernetes import endpoints, labels
from executors.kubernetes.endpoints import EndpointDeliveryError
from executors.kubernetes.render_endpoint import GATEWAY_API, INGRESS_API
from portal.endpoint_routes import endpoint_route
from serving import services
from serving.backends import backend_for_endpoint
from tests.cluster.plugin import Kube, KubeCluster, wait_until

from .test_kube_endpoints import deliver_all, deploy, place

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

RAY = "ray.io/v1"
HOST = "{endpoint}-{workspace}.serve.example.org"


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


def test_an_endpoint_s_ingress_is_owned_by_its_rayservice_kept_in_step_and_deleted_with_it(
    world: Any, kube: Kube, on_the_cluster: adapter.KubeClient, settings: Any
) -> None:
    client = on_the_cluster
    settings.TAU_ENDPOINT_ROUTE = endpoint_route(
        kind="ingress", host=HOST, ingress_class="nginx", tls_secret="serve-wildcard-tls"
    )
    namespace = place(kube, world, cpus="16")
    endpoint = deploy(world)
    deliver_all(endpoint)

    host = f"reviews-{world.alpha.slug}.serve.example.org"
    service = client.get(RAY, "RayService", "reviews", namespace)
    ingress = client.get(INGRESS_API, "Ingress", "reviews", namespace)
    (owner,) = ingress["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("RayService", service["metadata"]["uid"])
    assert ingress["metadata"]["labels"][labels.ENDPOINT_ID] == str(endpoint.pk)
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [{"hosts": [host], "secretName": "serve-wildcard-tls"}]
    (path,) = ingress["spec"]["rules"][0]["http"]["paths"]
    assert path["backend"]["service"] == {"name": "reviews-serve-svc", "port": {"number": 8000}}
    assert endpoints.endpoint_address(endpoint) == f"https://{host}"

    # Delivered again with the same settings: the Ingress is left as it is.
    version = ingress["metadata"]["resourceVersion"]
    backend_for_endpoint(endpoint).deploy(endpoint)
    ingress = client.get(INGRESS_API, "Ingress", "reviews", namespace)
    assert ingress["metadata"]["resourceVersion"] == version

    # The platform moves to cert-manager: the next deployment replaces the Ingress.
    settings.TAU_ENDPOINT_ROUTE = endpoint_route(
        kind="ingress", host=HOST, annotations='{"cert-manager.io/cluster-issuer": "letsencrypt"}'
    )
    backend_for_endpoint(endpoint).deploy(endpoint)
    ingress = client.get(INGRESS_API, "Ingress", "reviews", namespace)
    assert ingress["metadata"]["annotations"]["cert-manager.io/cluster-issuer"] == "letsencrypt"
    assert ingress["spec"]["tls"] == [{"hosts": [host], "secretName": "reviews-endpoint-tls"}]
    assert "ingressClassName" not in ingress["spec"]
    assert ingress["metadata"]["ownerReferences"][0]["uid"] == service["metadata"]["uid"]

    services.stop_endpoint(endpoint=endpoint, user=world.users["researcher"])
    deliver_all(endpoint)

    def gone() -> bool | None:
        try:
            client.get(INGRESS_API, "Ingress", "reviews", namespace)
        except adapter.NotFound:
            return True
        return None

    wait_until("the Ingress to be deleted with its RayService", gone, timeout=120)


def test_an_httproute_on_a_cluster_without_the_gateway_api_fails_the_deployment_saying_so(
    world: Any, kube: Kube, on_the_cluster: adapter.KubeClient, settings: Any
) -> None:
    client = on_the_cluster
    with pytest.raises(adapter.UnknownKind):
        client.resource(GATEWAY_API, "HTTPRoute")  # the premise: no Gateway API CRDs here
    settings.TAU_ENDPOINT_ROUTE = endpoint_route(
        kind="gateway", host=HOST, gateway="gateway-system/public"
    )
    namespace = place(kube, world, cpus="16")
    endpoint = deploy(world)
    with pytest.raises(EndpointDeliveryError, match=r"HTTPRoute .*are its CRDs installed"):
        backend_for_endpoint(endpoint).deploy(endpoint)
    # What could be made was: the endpoint serves inside the cluster and through the proxy.
    service = client.get(RAY, "RayService", "reviews", namespace)
    assert service["metadata"]["labels"][labels.ENDPOINT_ID] == str(endpoint.pk)
    client.delete(RAY, "RayService", "reviews", namespace, missing_ok=True)
