"""An endpoint's route from outside the cluster on the test cluster, through the portal's own
path (``serving.services`` → the delivery outbox → ``executors.kubernetes.endpoints``), with
``TAU_ENDPOINT_ROUTE`` set: the Ingress is made beside the RayService and owned by it, left
alone when delivered again, replaced when the platform's settings change, and deleted with the
RayService by the real garbage collector when the endpoint stops. The test cluster serves no
Gateway API (deploy/cluster installs no Gateway CRDs), which is the other case worth proving:
an HTTPRoute asked of such a cluster fails the deployment saying so, after the RayService.
The last test installs the Gateway API's real HTTPRoute CRD for itself (fixture
``gateway_api``) and proves the HTTPRoute the same way as the Ingress.
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
from tests.cluster.plugin import Kube, KubeCluster, load_controlplane, wait_until

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


@pytest.fixture
def gateway_api(kube: Kube, kube_cluster: KubeCluster) -> Iterator[None]:
    """The Gateway API's HTTPRoute CRD (its standard channel, from the Go module the build
    fetched: deploy/cluster/versions.env), installed for one test and removed after it, so
    that the cluster serves no Gateway API to the others."""
    controlplane = load_controlplane()
    crd = controlplane.gateway_api_crd(controlplane.read_versions(), "httproutes")
    name = crd["metadata"]["name"]
    kube.create(crd)

    def established() -> bool | None:
        found = kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name) or {}
        conditions = {
            c["type"]: c["status"] for c in (found.get("status") or {}).get("conditions") or []
        }
        return True if conditions.get("Established") == "True" else None

    wait_until("the HTTPRoute CRD to be established", established, timeout=60)
    adapter.reset_client()  # the portal's client discovers the new kind afresh
    yield
    kube.delete("apiextensions.k8s.io/v1", "CustomResourceDefinition", name)
    wait_until(
        "the HTTPRoute CRD to be removed",
        lambda: (
            True
            if kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name) is None
            else None
        ),
        timeout=120,
    )
    adapter.reset_client()


def test_an_endpoint_s_httproute_passes_the_gateway_api_s_own_schema_and_goes_with_it(
    world: Any,
    kube: Kube,
    on_the_cluster: adapter.KubeClient,
    gateway_api: None,
    settings: Any,
) -> None:
    """Where the platform serves the Gateway API: the HTTPRoute as rendered (golden file
    endpoints/routes/gateway.yaml) is accepted by the real CRD's schema and its CEL rules,
    owned by the RayService, left alone when delivered again (the API server's defaults are
    no difference), and deleted with the RayService by the garbage collector."""
    client = adapter.client()
    settings.TAU_ENDPOINT_ROUTE = endpoint_route(
        kind="gateway", host=HOST, gateway="gateway-system/public"
    )
    namespace = place(kube, world, cpus="16")
    endpoint = deploy(world)
    deliver_all(endpoint)

    host = f"reviews-{world.alpha.slug}.serve.example.org"
    service = client.get(RAY, "RayService", "reviews", namespace)
    route = client.get(GATEWAY_API, "HTTPRoute", "reviews", namespace)
    (owner,) = route["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("RayService", service["metadata"]["uid"])
    assert route["metadata"]["labels"][labels.ENDPOINT_ID] == str(endpoint.pk)
    assert route["spec"]["hostnames"] == [host]
    (parent,) = route["spec"]["parentRefs"]
    assert (parent["namespace"], parent["name"], parent["kind"]) == (
        "gateway-system",
        "public",
        "Gateway",
    )
    (rule,) = route["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    assert (backend["name"], backend["port"]) == ("reviews-serve-svc", 8000)
    assert endpoints.endpoint_address(endpoint) == f"https://{host}"

    # Delivered again: the route the API server filled in with its defaults stays as it is.
    version = route["metadata"]["resourceVersion"]
    backend_for_endpoint(endpoint).deploy(endpoint)
    assert (
        client.get(GATEWAY_API, "HTTPRoute", "reviews", namespace)["metadata"]["resourceVersion"]
        == version
    )

    services.stop_endpoint(endpoint=endpoint, user=world.users["researcher"])
    deliver_all(endpoint)

    def gone() -> bool | None:
        try:
            client.get(GATEWAY_API, "HTTPRoute", "reviews", namespace)
        except adapter.NotFound:
            return True
        return None

    wait_until("the HTTPRoute to be deleted with its RayService", gone, timeout=120)
