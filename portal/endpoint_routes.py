"""How endpoints are reached from outside the cluster, as the platform configures it
(``TAU_ENDPOINT_ROUTE`` and the settings beside it, docs/configuration.md): read and checked
when the settings load, so a wrong value stops the portal at start-up with a message naming
the variable, not a failed deployment later.

Inside the cluster an endpoint is always KubeRay's serve Service. With a route configured each
endpoint on Kubernetes also gets an Ingress (``ingress``) or a Gateway API HTTPRoute attached
to the platform's Gateway (``gateway``) for a host made from :attr:`EndpointRoute.host_pattern`
(``executors.kubernetes.render_endpoint.render_endpoint_route`` renders it). TLS is always on:
an Ingress names a Secret (one wildcard certificate the platform copies into each workspace
namespace, or one per endpoint that cert-manager fills, asked for by an annotation); behind a
Gateway, TLS is the Gateway listener's certificate, so the TLS Secret setting does not apply.

Nothing here authenticates a request: a route reaches Ray Serve directly, and only the
portal's proxy route checks a token (docs/kubernetes.md says what is and is not enforced).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from portal.env import ImproperlyConfiguredEnv
from tau.k8s_names import dns1123_label_problem, dns1123_subdomain_problem, label_key_problem

#: What ``TAU_ENDPOINT_ROUTE`` may say.
ROUTE_KINDS: Final = ("none", "ingress", "gateway")
#: The two placeholders a host pattern must hold.
PLACEHOLDERS: Final = ("{endpoint}", "{workspace}")
#: Names the pattern is tried with at start-up (the real ones are checked when rendering).
_SAMPLE: Final = {"endpoint": "chat", "workspace": "alpha"}

RouteKind = Literal["ingress", "gateway"]


@dataclass(frozen=True, slots=True)
class EndpointRoute:
    """The platform's route to endpoints (module docstring); ``None`` in the settings when
    ``TAU_ENDPOINT_ROUTE=none``."""

    kind: RouteKind
    #: E.g. ``{endpoint}-{workspace}.serve.example.org``.
    host_pattern: str
    #: The Ingress's ``ingressClassName``; empty: the cluster's default class.
    ingress_class: str = ""
    #: The Ingress's TLS Secret in each workspace namespace; empty: one per endpoint
    #: (``<endpoint>-endpoint-tls``), for cert-manager to fill.
    tls_secret: str = ""
    #: The Ingress's annotations (cert-manager's issuer, the controller's options).
    annotations: Mapping[str, str] = field(default_factory=dict)
    #: The Gateway an HTTPRoute attaches to (its ``parentRefs``).
    gateway_namespace: str = ""
    gateway_name: str = ""

    def host(self, *, endpoint: str, workspace: str) -> str:
        """The endpoint's host name (checked by the renderer: a long name can make a label
        longer than DNS allows)."""
        return self.host_pattern.replace("{endpoint}", endpoint).replace("{workspace}", workspace)


def host_pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot make host names, or None."""
    missing = [placeholder for placeholder in PLACEHOLDERS if placeholder not in pattern]
    if missing:
        return (
            f"must contain {' and '.join(missing)}, so that each endpoint of each workspace "
            "gets a host of its own, e.g. {endpoint}-{workspace}.serve.example.org"
        )
    filled = pattern.replace("{endpoint}", _SAMPLE["endpoint"]).replace(
        "{workspace}", _SAMPLE["workspace"]
    )
    if "{" in filled or "}" in filled:
        return "may hold no placeholder but {endpoint} and {workspace}"
    problem = dns1123_subdomain_problem(filled)
    if problem:
        return f"is not a DNS name once filled ({filled!r}): it {problem}"
    if "." not in filled:
        return f"is not a fully qualified host name once filled ({filled!r})"
    for label in filled.split("."):
        problem = dns1123_label_problem(label)
        if problem:
            return f"has a part that is not a DNS label once filled ({label!r}): it {problem}"
    return None


def _annotations(raw: str) -> dict[str, str]:
    name = "TAU_ENDPOINT_INGRESS_ANNOTATIONS"
    try:
        loaded = json.loads(raw)
    except ValueError as exc:
        raise ImproperlyConfiguredEnv(
            f'{name} must be a JSON object of strings, e.g. {{"cert-manager.io/cluster-issuer": '
            f'"letsencrypt"}}: {exc}'
        ) from None
    if not isinstance(loaded, dict) or not all(isinstance(value, str) for value in loaded.values()):
        raise ImproperlyConfiguredEnv(f"{name} must be a JSON object whose values are strings")
    for key in loaded:
        problem = label_key_problem(key)
        if problem:
            raise ImproperlyConfiguredEnv(
                f"{name}: the key {key!r} is no annotation key: {problem}"
            )
    return dict(loaded)


def endpoint_route(
    *,
    kind: str,
    host: str,
    ingress_class: str = "",
    tls_secret: str = "",
    annotations: str = "",
    gateway: str = "",
) -> EndpointRoute | None:
    """The route the settings describe (``TAU_ENDPOINT_ROUTE``, ``TAU_ENDPOINT_HOST``,
    ``TAU_ENDPOINT_INGRESS_CLASS``, ``TAU_ENDPOINT_TLS_SECRET``,
    ``TAU_ENDPOINT_INGRESS_ANNOTATIONS``, ``TAU_ENDPOINT_GATEWAY``), or None for ``none``;
    :class:`~portal.env.ImproperlyConfiguredEnv` saying which variable is wrong and why."""
    kind = kind.strip().lower() or "none"
    if kind not in ROUTE_KINDS:
        raise ImproperlyConfiguredEnv(
            f"TAU_ENDPOINT_ROUTE must be none, ingress or gateway, got {kind!r}"
        )
    given = {
        "TAU_ENDPOINT_HOST": host,
        "TAU_ENDPOINT_INGRESS_CLASS": ingress_class,
        "TAU_ENDPOINT_TLS_SECRET": tls_secret,
        "TAU_ENDPOINT_INGRESS_ANNOTATIONS": annotations,
        "TAU_ENDPOINT_GATEWAY": gateway,
    }
    if kind == "none":
        set_anyway = [name for name, value in given.items() if value.strip()]
        if set_anyway:
            raise ImproperlyConfiguredEnv(
                f"{', '.join(set_anyway)} only mean something with TAU_ENDPOINT_ROUTE=ingress or "
                "gateway (it is none): set the route, or unset them"
            )
        return None
    host = host.strip()
    if not host:
        raise ImproperlyConfiguredEnv(
            f"TAU_ENDPOINT_HOST must be set when TAU_ENDPOINT_ROUTE={kind}, "
            "e.g. {endpoint}-{workspace}.serve.example.org"
        )
    problem = host_pattern_problem(host)
    if problem:
        raise ImproperlyConfiguredEnv(f"TAU_ENDPOINT_HOST {host!r} {problem}")
    if kind == "gateway":
        ingress_only = [
            name
            for name in (
                "TAU_ENDPOINT_INGRESS_CLASS",
                "TAU_ENDPOINT_TLS_SECRET",
                "TAU_ENDPOINT_INGRESS_ANNOTATIONS",
            )
            if given[name].strip()
        ]
        if ingress_only:
            raise ImproperlyConfiguredEnv(
                f"{', '.join(ingress_only)} apply to TAU_ENDPOINT_ROUTE=ingress only: behind a "
                "Gateway, TLS and the controller's options are the Gateway's (its listener's "
                "certificateRefs)"
            )
        namespace, slash, name = gateway.strip().partition("/")
        if not slash or dns1123_label_problem(namespace) or dns1123_subdomain_problem(name):
            raise ImproperlyConfiguredEnv(
                "TAU_ENDPOINT_GATEWAY must name the platform's Gateway as namespace/name "
                f"(e.g. gateway-system/public), got {gateway!r}"
            )
        return EndpointRoute(
            kind="gateway", host_pattern=host, gateway_namespace=namespace, gateway_name=name
        )
    if gateway.strip():
        raise ImproperlyConfiguredEnv(
            "TAU_ENDPOINT_GATEWAY applies to TAU_ENDPOINT_ROUTE=gateway only"
        )
    ingress_class = ingress_class.strip()
    if ingress_class and dns1123_subdomain_problem(ingress_class):
        raise ImproperlyConfiguredEnv(
            f"TAU_ENDPOINT_INGRESS_CLASS {ingress_class!r} is no IngressClass name: it "
            f"{dns1123_subdomain_problem(ingress_class)}"
        )
    tls_secret = tls_secret.strip()
    if tls_secret and dns1123_subdomain_problem(tls_secret):
        raise ImproperlyConfiguredEnv(
            f"TAU_ENDPOINT_TLS_SECRET {tls_secret!r} is no Secret name: it "
            f"{dns1123_subdomain_problem(tls_secret)}"
        )
    return EndpointRoute(
        kind="ingress",
        host_pattern=host,
        ingress_class=ingress_class,
        tls_secret=tls_secret,
        annotations=_annotations(annotations) if annotations.strip() else {},
    )
