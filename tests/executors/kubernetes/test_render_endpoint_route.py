"""An endpoint's route from outside the cluster (``render_endpoint.render_endpoint_route``,
``TAU_ENDPOINT_ROUTE``): golden files for an Ingress with the platform's certificate, an
Ingress whose certificate cert-manager makes, and an HTTPRoute on the platform's Gateway; then
the rules (owned by the RayService, all of the host to KubeRay's serve Service, TLS always,
TauGrid's labels, a host that is no DNS name refused).

``UPDATE_GOLDEN=1`` rewrites golden/endpoints/routes/ as for the other golden files.
"""

from __future__ import annotations

import dataclasses
import difflib
import os

import pytest

from executors.kubernetes import labels
from executors.kubernetes.render import Owner, RenderError
from executors.kubernetes.render_endpoint import (
    endpoint_host,
    render_endpoint_route,
    render_rayservice,
)
from portal.endpoint_routes import endpoint_route

from .render_cases import (
    GOLDEN,
    OWNER_UID,
    EndpointCase,
    dump,
    endpoint_route_cases,
    endpoint_target_for,
    example_spec,
    load,
    render_route_case,
)

CASES = endpoint_route_cases()
ROUTE_GOLDEN = GOLDEN / "endpoints" / "routes"
HOST = "serve-cpu-alpha.serve.example.org"


def by_name(name: str) -> EndpointCase:
    return next(case for case in CASES if case.name == name)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_rendered_routes_match_the_golden_file(case: EndpointCase) -> None:
    path = ROUTE_GOLDEN / f"{case.name}.yaml"
    rendered = [render_route_case(case.spec, case.target)]
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
                fromfile=f"golden/endpoints/routes/{path.name}",
                tofile="rendered",
            )
        )
        pytest.fail(f"rendered route differs from {path.name}:\n{diff}", pytrace=False)


def test_no_route_golden_file_is_stale() -> None:
    assert {path.stem for path in ROUTE_GOLDEN.glob("*.yaml")} == {case.name for case in CASES}


def test_an_ingress_sends_all_of_its_host_to_the_serve_service_with_tls() -> None:
    case = by_name("ingress")
    ingress = render_route_case(case.spec, case.target)
    assert (ingress["apiVersion"], ingress["kind"]) == ("networking.k8s.io/v1", "Ingress")
    metadata = ingress["metadata"]
    assert (metadata["name"], metadata["namespace"]) == ("serve-cpu", "tau-alpha")
    # Owned by the RayService, as its token Secret is: deleted with it.
    (owner,) = metadata["ownerReferences"]
    assert owner == {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "name": "serve-cpu",
        "uid": OWNER_UID,
        "blockOwnerDeletion": True,
    }
    assert metadata["labels"][labels.MANAGED_BY] == labels.MANAGED_BY_TAUGRID
    assert metadata["labels"][labels.ENDPOINT] == "serve-cpu"
    assert metadata["labels"][labels.ENDPOINT_ID] == "7"
    assert metadata["labels"][labels.WORKSPACE] == "alpha"
    assert "annotations" not in metadata
    spec = ingress["spec"]
    assert spec["ingressClassName"] == "nginx"
    assert spec["tls"] == [{"hosts": [HOST], "secretName": "serve-wildcard-tls"}]
    (rule,) = spec["rules"]
    assert rule["host"] == HOST
    assert rule["http"]["paths"] == [
        {
            "path": "/",
            "pathType": "Prefix",
            "backend": {"service": {"name": "serve-cpu-serve-svc", "port": {"number": 8000}}},
        }
    ]


def test_without_a_tls_secret_each_endpoint_names_its_own_for_cert_manager() -> None:
    case = by_name("ingress-cert-manager")
    ingress = render_route_case(case.spec, case.target)
    assert ingress["metadata"]["annotations"] == {"cert-manager.io/cluster-issuer": "letsencrypt"}
    assert "ingressClassName" not in ingress["spec"]  # the cluster's default class
    assert ingress["spec"]["tls"] == [{"hosts": [HOST], "secretName": "serve-cpu-endpoint-tls"}]


def test_an_httproute_attaches_to_the_platform_s_gateway() -> None:
    case = by_name("gateway")
    route = render_route_case(case.spec, case.target)
    assert (route["apiVersion"], route["kind"]) == ("gateway.networking.k8s.io/v1", "HTTPRoute")
    assert route["metadata"]["ownerReferences"][0]["kind"] == "RayService"
    assert route["metadata"]["labels"][labels.ENDPOINT_ID] == "7"
    spec = route["spec"]
    assert spec["parentRefs"] == [
        {
            "group": "gateway.networking.k8s.io",
            "kind": "Gateway",
            "namespace": "gateway-system",
            "name": "public",
        }
    ]
    assert spec["hostnames"] == [HOST]
    assert spec["rules"] == [
        {
            "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
            "backendRefs": [{"name": "serve-cpu-serve-svc", "port": 8000}],
        }
    ]
    assert "tls" not in spec  # the Gateway's listener terminates TLS


def test_the_host_is_made_from_the_endpoint_and_the_workspace() -> None:
    case = by_name("ingress")
    assert endpoint_host(case.target) == HOST
    other = dataclasses.replace(case.target, name="chat", workspace="beta")
    assert endpoint_host(other) == "chat-beta.serve.example.org"
    assert endpoint_host(dataclasses.replace(case.target, route=None)) is None


def test_a_host_that_is_no_dns_name_once_filled_is_refused_before_anything_is_made() -> None:
    spec = example_spec("serve-cpu")
    route = endpoint_route(kind="ingress", host="{endpoint}-{workspace}.serve.example.org")
    # A 40-character endpoint in a 30-character workspace: a label of 71 characters.
    target = endpoint_target_for(spec, name="e" * 40, workspace="w" * 30, route=route)
    with pytest.raises(RenderError, match=r"TAU_ENDPOINT_HOST\) part .* at most 63 characters"):
        render_rayservice(spec, target)


def test_without_a_route_there_is_nothing_to_render() -> None:
    spec = example_spec("serve-cpu")
    target = endpoint_target_for(spec)
    service = render_rayservice(spec, target)
    owner_case = by_name("ingress")
    assert service == render_rayservice(owner_case.spec, owner_case.target)  # route or not
    owner = Owner(api_version="ray.io/v1", kind="RayService", name="serve-cpu", uid=OWNER_UID)
    with pytest.raises(RenderError, match="no route is configured"):
        render_endpoint_route(spec, target, owner=owner)
