"""The route to endpoints from outside the cluster, as the settings describe it
(portal/endpoint_routes.py, ``TAU_ENDPOINT_ROUTE`` and the settings beside it): what each
kind needs, and every wrong value refused at start-up saying which variable and why."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from portal.endpoint_routes import EndpointRoute, endpoint_route, host_pattern_problem
from portal.env import ImproperlyConfiguredEnv

from .test_settings import clean_env, run_python

HOST = "{endpoint}-{workspace}.serve.example.org"


def test_none_is_the_default_and_means_no_route() -> None:
    assert endpoint_route(kind="none", host="") is None
    assert endpoint_route(kind="", host="") is None


def test_an_ingress_with_the_platform_s_certificate_and_options() -> None:
    route = endpoint_route(
        kind="ingress",
        host=HOST,
        ingress_class="nginx",
        tls_secret="serve-wildcard-tls",
        annotations='{"nginx.ingress.kubernetes.io/proxy-read-timeout": "300"}',
    )
    assert route == EndpointRoute(
        kind="ingress",
        host_pattern=HOST,
        ingress_class="nginx",
        tls_secret="serve-wildcard-tls",
        annotations={"nginx.ingress.kubernetes.io/proxy-read-timeout": "300"},
    )
    assert route.host(endpoint="chat", workspace="alpha") == "chat-alpha.serve.example.org"


def test_a_gateway_route_names_the_platform_s_gateway() -> None:
    route = endpoint_route(kind="gateway", host=HOST, gateway="gateway-system/public")
    assert route is not None
    assert (route.kind, route.gateway_namespace, route.gateway_name) == (
        "gateway",
        "gateway-system",
        "public",
    )


@pytest.mark.parametrize(
    "pattern",
    [
        "{endpoint}-{workspace}.serve.example.org",
        "{endpoint}.{workspace}.serve.example.org",
        "serve-{workspace}-{endpoint}.apps.example.org",
    ],
)
def test_good_host_patterns(pattern: str) -> None:
    assert host_pattern_problem(pattern) is None


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("{endpoint}.serve.example.org", "must contain {workspace}"),
        ("serve.example.org", "must contain {endpoint} and {workspace}"),
        ("{endpoint}-{workspace}-{region}.example.org", "no placeholder but"),
        ("{endpoint}_{workspace}.example.org", "is not a DNS name once filled"),
        ("{endpoint}-{workspace}.Serve.example.org", "is not a DNS name once filled"),
        ("https://{endpoint}-{workspace}.example.org", "is not a DNS name once filled"),
        ("{endpoint}-{workspace}", "not a fully qualified host name"),
        ("{endpoint}-{workspace}." + "x" * 64 + ".org", "at most 63 characters"),
    ],
)
def test_bad_host_patterns_say_what_is_wrong(pattern: str, message: str) -> None:
    with pytest.raises(ImproperlyConfiguredEnv, match=r"TAU_ENDPOINT_HOST .*" + re.escape(message)):
        endpoint_route(kind="ingress", host=pattern)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"kind": "loadbalancer", "host": HOST}, "TAU_ENDPOINT_ROUTE must be none, ingress or"),
        ({"kind": "ingress", "host": ""}, "TAU_ENDPOINT_HOST must be set"),
        ({"kind": "gateway", "host": HOST}, "TAU_ENDPOINT_GATEWAY must name"),
        ({"kind": "gateway", "host": HOST, "gateway": "public"}, "as namespace/name"),
        ({"kind": "gateway", "host": HOST, "gateway": "a/b/c"}, "as namespace/name"),
        (
            {"kind": "gateway", "host": HOST, "gateway": "gw/public", "tls_secret": "x"},
            "TAU_ENDPOINT_TLS_SECRET apply to TAU_ENDPOINT_ROUTE=ingress only",
        ),
        (
            {"kind": "ingress", "host": HOST, "gateway": "gw/public"},
            "TAU_ENDPOINT_GATEWAY applies to TAU_ENDPOINT_ROUTE=gateway only",
        ),
        ({"kind": "none", "host": HOST}, "TAU_ENDPOINT_HOST only mean something"),
        ({"kind": "ingress", "host": HOST, "annotations": "[1]"}, "must be a JSON object"),
        ({"kind": "ingress", "host": HOST, "annotations": "{"}, "must be a JSON object"),
        ({"kind": "ingress", "host": HOST, "annotations": '{"a": 1}'}, "values are strings"),
        ({"kind": "ingress", "host": HOST, "annotations": '{"a b": "c"}'}, "no annotation key"),
        ({"kind": "ingress", "host": HOST, "tls_secret": "Wild_Card"}, "is no Secret name"),
        ({"kind": "ingress", "host": HOST, "ingress_class": "Nginx!"}, "is no IngressClass"),
    ],
)
def test_wrong_settings_are_refused_saying_which_and_why(
    given: dict[str, Any], message: str
) -> None:
    with pytest.raises(ImproperlyConfiguredEnv, match=re.escape(message)):
        endpoint_route(**given)


@pytest.mark.slow  # starts Python with the settings (0.5-1 s a start)
def test_the_portal_does_not_start_with_a_bad_host_pattern(tmp_path: Path) -> None:
    show = "import django; django.setup(); from django.conf import settings as s; "
    show += "print(s.TAU_ENDPOINT_ROUTE)"
    bad = clean_env(
        tmp_path, TAU_ENDPOINT_ROUTE="ingress", TAU_ENDPOINT_HOST="serve.example.org/{endpoint}"
    )
    result = run_python(show, bad)
    assert result.returncode != 0
    assert "TAU_ENDPOINT_HOST 'serve.example.org/{endpoint}' must contain {workspace}" in (
        result.stderr
    )
    good = clean_env(
        tmp_path,
        TAU_ENDPOINT_ROUTE="gateway",
        TAU_ENDPOINT_HOST=HOST,
        TAU_ENDPOINT_GATEWAY="gateway-system/public",
    )
    result = run_python(show, good)
    assert result.returncode == 0, result.stderr
    assert "gateway_name='public'" in result.stdout
