"""Bad input is a 400 with a clear message, never a server error (issue 11, section 4).

First the inputs that were 500s, one test each. Then a property test: hostile values (huge
numbers, bad dates, deep JSON, odd Unicode, very long strings) for every query parameter
the project reads, on every page and API route (the URL resolver's routes, as the access
matrix walks them), and hostile JSON bodies for every API route that takes one, as a
signed-in member and, for the report routes, with the run's or the endpoint's own token. The
Django test client raises whatever a view raises, so a server error fails the test with its
traceback.
"""

from __future__ import annotations

import ast
import base64
import functools
import inspect
import json
import re
import textwrap
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import pytest
from django import forms
from django.contrib.auth import get_user_model
from django.urls import resolve
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from runs.api import views as api_views
from runs.models import Run
from serving.api import workload
from serving.models import Endpoint
from serving.workload_tokens import issue_endpoint_token
from tests.conftest import CAST
from tests.runs.factories import make_run
from tests.runs.test_api import bearer, run_token, run_url
from tests.test_access_matrix import MATRIX, _url
from workspaces.models import WorkspaceQuota

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/workspaces/alpha/runs/"


# --- the inputs that were server errors ----------------------------------------------------------


@pytest.mark.parametrize("page", ["/audit/", "/w/alpha/audit/"])
def test_an_audit_date_out_of_range_is_a_400(world: Any, page: str) -> None:
    client = world.client_for("platform_admin")
    for params in ({"until": "9999-12-31"}, {"since": "0001-01-01"}):
        response = client.get(page, params)
        assert response.status_code == 400
        assert "Give a date between 1900-01-01 and 9998-12-31." in response.content.decode()
    assert client.get(page, {"until": "9998-12-31", "since": "1900-01-01"}).status_code == 200


def test_a_damaged_run_list_cursor_is_a_400(world: Any) -> None:
    client = world.client_for("researcher")
    for after in ("2026-13-45T00:00:00_1", "2026-01-01T00:00:00_²", "9999-12-31T23:59:59-10:00_1"):
        response = client.get("/w/alpha/runs/", {"after": after})
        assert response.status_code == 400, after
        assert "The page address is damaged" in response.content.decode()
    make_run(world)
    ok = client.get("/w/alpha/runs/", {"after": "2099-01-01T00:00:00+00:00_9"})
    assert ok.status_code == 200
    assert len(ok.context["runs"]) == 1


def cursor(position: str) -> str:
    return base64.b64encode(f"p={position}".encode()).decode()


@pytest.mark.parametrize(
    "value",
    [
        cursor("2026-13-45 00:00:00+00:00"),
        cursor("hello"),
        cursor("0001-01-01 00:00:00+01:00"),
        "é",
    ],
)
def test_an_api_cursor_that_is_no_time_is_a_404(world: Any, value: str) -> None:
    """It names no page (DRF's answer to a cursor it cannot decode, too)."""
    response = world.api_client_for("researcher").get(RUNS, {"cursor": value})
    assert response.status_code == 404
    assert "Not a cursor this API gave out" in response.json()["detail"]


def test_a_cursor_the_api_gave_out_still_works(world: Any) -> None:
    for _ in range(3):
        make_run(world)
    client = world.api_client_for("researcher")
    first = client.get(RUNS, {"limit": 2}).json()
    second = client.get(first["next"])
    assert second.status_code == 200
    assert len(second.json()["results"]) == 1


def test_a_step_beyond_64_bits_is_a_400(world: Any) -> None:
    run = make_run(world)
    client = bearer(run_token(world, run))
    metrics = client.post(
        run_url(run.name, "run-report-metrics"),
        {"rows": [{"step": 2**63, "loss": 1.0}]},
        format="json",
    )
    assert metrics.status_code == 400
    checkpoint = client.post(
        run_url(run.name, "run-report-checkpoints"),
        {"step": 2**63, "path": "step-1"},
        format="json",
    )
    assert checkpoint.status_code == 400
    # Steps end up in the run's evidence, which holds integers exactly up to 2^53 - 1.
    assert "less than or equal to 9007199254740991" in checkpoint.json()["step"][0]


def test_json_nested_a_thousand_levels_is_a_400(world: Any) -> None:
    run = make_run(world)
    client = bearer(run_token(world, run))
    body = '{"kind": "x", "data": {"a": ' + "[" * 1000 + "]" * 1000 + "}}"
    response = client.post(
        run_url(run.name, "run-report-events"), body, content_type="application/json"
    )
    assert response.status_code == 400
    assert "nested deeper" in response.json()["detail"]


@pytest.mark.parametrize("body", ["null", "[]", "3", '"text"', "true"])
def test_a_json_body_that_is_not_an_object_is_a_400(world: Any, body: str) -> None:
    """``null`` as a workspace PATCH body was a 500 (``set(None)``); every operation takes an
    object, so the parser refuses anything else for all of them."""
    api = world.api_client_for("workspace_admin")
    for method, url in [
        ("patch", "/api/v1/workspaces/alpha/"),
        ("post", "/api/v1/workspaces/alpha/members/"),
    ]:
        response = getattr(api, method)(url, body, content_type="application/json")
        assert response.status_code == 400, (method, url, response.content)
        assert "the body must be a JSON object" in response.json()["detail"]


def test_a_nul_in_a_run_name_or_filter_is_not_a_database_error(world: Any) -> None:
    run = make_run(world)
    api = world.api_client_for("researcher")
    assert api.get(RUNS + "a%00b/").status_code == 404
    assert api.get(RUNS, {"name": "a\x00"}).status_code == 400
    assert api.get(RUNS, {"submitter": "\x00"}).status_code == 400
    page = world.client_for("researcher").get("/w/alpha/runs/", {"q": "\x00"})
    assert page.status_code == 400
    assert "NUL" in page.content.decode()
    token = bearer(run_token(world, run))
    assert (
        token.post(RUNS + "a%00b/report/events/", {"kind": "x"}, format="json").status_code == 404
    )


# --- what each route reads ----------------------------------------------------------------------

_READS = [
    re.compile(r"""(?:GET|query_params|params)\.(?:get|getlist)\(\s*["'](\w+)["']"""),
    re.compile(r"""_(?:int|text)_param\(\s*[\w.]+,\s*["'](\w+)["']"""),
]
#: Read by libraries on the project's routes.
DRF_PARAMETERS = {"format", "cursor", "limit"}
ADMIN_PARAMETERS = {"q", "o", "p", "e", "all", "_to_field", "_popup", "_changelist_filters"}
OIDC_PARAMETERS = {"code", "state", "error"}


def _read_in(module: ModuleType) -> set[str]:
    """The query parameters a view's module reads, found in its source, and the fields of
    the forms it defines (the audit filters)."""
    names: set[str] = set()
    source = inspect.getsource(module)
    for pattern in _READS:
        names.update(pattern.findall(source))
    for _, member in inspect.getmembers(module, inspect.isclass):
        if issubclass(member, forms.Form) and member.__module__ == module.__name__:
            names.update(member.base_fields)
    return names


def _own(value: Any, module: ModuleType) -> bool:
    return (inspect.isfunction(value) or inspect.isclass(value)) and (
        value.__module__ == module.__name__
    )


@functools.cache  # the property tests below ask for every example
def _read_by(view: Any, module: ModuleType) -> frozenset[str]:
    """The query parameters a view reads: what its own source reads, and what every class
    and function of its module that it names reads, followed through (its bases and mixins
    there, the helpers it calls, their helpers, the forms it fills, the class of an object it
    uses), the forms' fields too. Several views share a module (runs.views: the run list,
    the run page, the queue, the comparison...), and each read every parameter of all of
    them, a request per parameter and bad value that the view never looks at (a third of
    this walk's requests, and the costliest: whole pages). Where the view names something
    of its module that the walk cannot follow (a table of functions or classes, a partial
    or other callable object, a source that cannot be read), it is the whole module's
    reads, as before. Other modules' code
    is not read, here as before."""
    namespace = vars(module)
    names: set[str] = set()
    seen: set[int] = set()
    todo: list[Any] = [view]
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        try:
            source = textwrap.dedent(inspect.getsource(item))
        except (OSError, TypeError):
            return frozenset(_read_in(module))
        for pattern in _READS:
            names.update(pattern.findall(source))
        if inspect.isclass(item):
            if issubclass(item, forms.Form):
                names.update(item.base_fields)
            todo += [base for base in item.__mro__[1:] if _own(base, module)]
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.Name) or node.id not in namespace:
                continue
            value = namespace[node.id]
            if callable(value) and not inspect.isclass(value):
                value = inspect.unwrap(value)  # a cached or decorated helper: its function
            if _own(value, module):
                todo.append(value)
            elif _own(type(value), module):
                todo.append(type(value))
            elif callable(value) and not (inspect.isroutine(value) or inspect.isclass(value)):
                return frozenset(_read_in(module))  # a partial, a callable object: unplaced
            elif isinstance(value, dict | list | tuple | set | frozenset):
                elements = value.values() if isinstance(value, dict) else value
                if any(callable(element) for element in elements):
                    return frozenset(_read_in(module))
    return frozenset(names)


@functools.cache
def _schema() -> dict[str, Any]:
    client = APIClient()
    client.force_authenticate(get_user_model().objects.get(username="rob"))
    schema = client.get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    found: dict[str, Any] = schema.json()
    return found


def _schema_parameters() -> dict[str, set[str]]:
    """The query parameters of each API path, from the OpenAPI schema."""
    return {
        path: {
            parameter["name"]
            for operation in operations.values()
            for parameter in operation.get("parameters", [])
            if parameter["in"] == "query"
        }
        for path, operations in _schema()["paths"].items()
    }


def _schema_path(url: str) -> str | None:
    shape = re.sub(r"/(alpha|tiny-[a-z0-9]+|rob)/", "/x/", url)
    for path in _schema()["paths"]:
        if re.sub(r"\{[a-z_]+\}", "x", path) == shape:
            return str(path)
    return None


def body_fields(url: str, method: str) -> list[str]:
    """The fields of the route's JSON request body, from the OpenAPI schema."""
    schema = _schema()
    path = _schema_path(url)
    operation = schema["paths"].get(path, {}).get(method.lower(), {}) if path else {}
    content = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
    reference = content.get("schema", {}).get("$ref", "")
    component = schema["components"]["schemas"].get(reference.rsplit("/", 1)[-1], {})
    return sorted(component.get("properties", {}))


def parameters_of(key: str, url: str) -> list[str]:
    """Every query parameter the route's view may read: the names its code reads
    (:func:`_read_by`), the schema's parameters for an API route, and what the libraries
    under it read."""
    match = resolve(urlsplit(url).path)
    view = getattr(match.func, "view_class", None) or getattr(match.func, "cls", match.func)
    module = inspect.getmodule(view)
    assert module is not None
    names: set[str] = {"format"}
    if module.__name__.startswith("django.contrib.admin"):
        names |= ADMIN_PARAMETERS | {"next"}
    elif module.__name__.startswith(("portal", "workspaces", "runs", "evidence", "serving")):
        names |= _read_by(view, module)
    if key.startswith("oidc-"):
        names |= OIDC_PARAMETERS
    if key.startswith("api:"):
        names |= DRF_PARAMETERS | _schema_parameters().get(_schema_path(url) or "", set())
    return sorted(names)


def test_the_walk_finds_what_the_routes_read(world: Any, urls: dict[str, str]) -> None:
    """A guard against patterns that silently find nothing."""
    assert {"after", "q", "submitter"} <= set(parameters_of("runs", urls["runs"]))
    # Each view of a module reads its own: the run page its attempt, the list its filters.
    assert "attempt" in parameters_of("run-page", urls["run-page"])
    assert "attempt" not in parameters_of("runs", urls["runs"])
    assert {"a", "b", "run"} <= set(parameters_of("run-compare", urls["run-compare"]))
    assert {"since", "until", "before", "actor"} <= set(parameters_of("audit", urls["audit"]))
    assert {"keys", "max_points"} <= set(parameters_of("api:run-metrics", urls["api:run-metrics"]))
    events = set(parameters_of("api:run-events", urls["api:run-events"]))
    assert {"after", "limit", "cursor"} <= events
    assert {"tail", "offset", "attempt"} <= set(parameters_of("api:run-logs", urls["api:run-logs"]))
    assert body_fields(urls["api:run-report-metrics"], "POST") == ["rows"]
    assert body_fields(urls["api:run-report-events"], "POST") == ["data", "kind", "message"]
    assert "role" in body_fields(urls["api:member-detail"], "PATCH")


# --- hostile values ------------------------------------------------------------------------------

#: Values that broke something once, or are known to break code like this: sent to every
#: parameter of every route, one at a time.
KNOWN_BAD = [
    "9999-12-31",
    "2026-13-45T00:00:00_1",
    "9999-12-31T23:59:59-10:00_1",
    "9" * 30,
    "²",
    "a\x00b",
    "\u202e" + "x" * 5000,
    base64.b64encode(b"p=2026-13-45 00:00:00+00:00").decode(),
]


_NO_SURROGATES = st.characters(blacklist_categories=["Cs"])
huge_numbers = st.sampled_from(
    [
        str(2**31),
        str(2**63),
        str(2**64 + 1),
        "-" + str(2**63 + 1),
        "9" * 30,
        "9" * 5000,
        "1e999",
        "-0",
        "0x10",
        "1_000",
        "١٢",
        "²",
        "NaN",
        "inf",
    ]
)
bad_dates = st.one_of(
    st.sampled_from(
        [
            "9999-12-31",
            "0001-01-01",
            "2026-13-45",
            "2026-02-30",
            "2026-13-45T00:00:00_1",
            "9999-12-31T23:59:59-10:00_1",
            "0001-01-01T00:00:00+14:00_1",
            "2026-01-01T00:00:00_99999999999999999999",
            "2026-01-01T25:61:61",
            "0000-00-00",
        ]
    ),
    st.builds(
        "{:04d}-{:02d}-{:02d}T{:02d}:00:00{}_{}".format,
        st.integers(0, 9999),
        st.integers(0, 99),
        st.integers(0, 99),
        st.integers(0, 99),
        st.sampled_from(["", "Z", "+14:00", "-12:00", "+99:99"]),
        st.sampled_from(["1", "x", "", "9" * 25]),
    ),
)
odd_text = st.one_of(
    st.text(_NO_SURROGATES, max_size=40),
    st.sampled_from(["\x00", "a\x00b", "\u202e", "\u200b", "%00", "../../etc/passwd", "'\"<>&"]),
    st.just("x" * 20_000),
)
cursors = st.builds(
    lambda text: base64.b64encode(text.encode("utf-8", "replace")).decode(),
    st.one_of(
        st.builds(
            "o={}&r={}&p={}".format, huge_numbers, st.sampled_from(["0", "1", "x"]), bad_dates
        ),
        st.builds("p={}".format, odd_text),
    ),
)
hostile_values = st.one_of(st.sampled_from(KNOWN_BAD), huge_numbers, bad_dates, odd_text, cursors)


def queries(names: list[str]) -> st.SearchStrategy[dict[str, str]]:
    return st.dictionaries(st.sampled_from(names), hostile_values, min_size=1, max_size=3)


def json_leaves() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.sampled_from([2**63, -(2**63) - 1, 10**300, 0]),
        st.floats(allow_nan=False, allow_infinity=False),
        odd_text,
        bad_dates,
    )


def json_values() -> st.SearchStrategy[Any]:
    return st.recursive(
        json_leaves(),
        lambda children: st.one_of(
            st.lists(children, max_size=3),
            st.dictionaries(st.text(_NO_SURROGATES, max_size=8), children, max_size=3),
        ),
        max_leaves=8,
    )


#: Bodies no JSON library writes: nesting past any parser's recursion, escapes for NUL and
#: lone surrogates, numbers beyond floats, constants JSON does not have.
RAW_BODIES = [
    '{"a": ' + "[" * 1000 + "]" * 1000 + "}",
    "[" * 5000,
    '{"kind": "x", "message": "\\u0000", "data": {"\\ud800": "\\udfff"}}',
    '{"rows": [{"step": 1, "loss": 1' + "0" * 400 + "}]}",
    '{"rows": [{"step": 1e999, "loss": NaN}]}',
    '{"step": 1, "path": "\\u0000"}',
    '{"checkpoint": ' + "9" * 5000 + "}",
    "not json",
    "",
]


def bodies(fields: list[str]) -> st.SearchStrategy[str]:
    shaped = st.dictionaries(
        st.sampled_from(fields) if fields else st.text(_NO_SURROGATES, max_size=8),
        json_values(),
        max_size=4,
    )
    rows = st.builds(
        lambda rows: {"rows": rows},
        st.lists(st.dictionaries(st.text(_NO_SURROGATES, max_size=6), json_leaves()), max_size=3),
    )
    return st.one_of(
        st.builds(json.dumps, st.one_of(shaped, rows, json_values())),
        st.sampled_from(RAW_BODIES),
    )


# --- the routes -----------------------------------------------------------------------------------


def get_routes() -> list[str]:
    return sorted(key for key, route in MATRIX.items() if "GET" in route.methods)


def json_routes() -> list[tuple[str, str]]:
    return sorted(
        (key, method)
        for key, route in MATRIX.items()
        if route.api and not route.multipart
        for method in route.methods
        if method in {"POST", "PATCH", "PUT"}
    )


def is_run_route(key: str) -> bool:
    return key.startswith("api:run-")


def reader_of(key: str) -> str:
    """Who reads the route as far as its view goes: the least privileged member that gets
    in (a researcher, for most), so the parameters are read at all."""
    codes = MATRIX[key].methods["GET"]
    for who in ("researcher", "workspace_admin", "platform_admin"):
        if codes[who] < 300:
            return who
    return "platform_admin"


def client_for(world: Any, key: str) -> Any:
    who = reader_of(key)
    return world.api_client_for(who) if MATRIX[key].api else world.client_for(who)


@pytest.fixture
def urls(world: Any) -> dict[str, str]:
    """Each route's URL, its objects made once (a run, a member, a token...)."""
    made: dict[int, dict[str, Any]] = {}  # routes sharing a way to make them share the object
    for route in MATRIX.values():
        if id(route.kwargs) not in made:
            made[id(route.kwargs)] = route.kwargs(world)
    return {key: _url(key, made[id(route.kwargs)]) for key, route in MATRIX.items()}


@pytest.fixture
def run_clients() -> dict[str, APIClient]:
    return {}


def holder_client(world: Any, url: str, clients: dict[str, APIClient]) -> APIClient | None:
    """A client with the own token of the run or the endpoint of alpha that ``url`` names
    (the token its report and workload routes take), made once per run or endpoint in
    ``clients``; None where the URL names neither."""
    path = urlsplit(url).path
    for kind in ("runs", "endpoints"):
        name = path.partition(f"/{kind}/")[2].split("/")[0]
        if name:
            break
    else:
        return None
    if f"{kind}/{name}" not in clients:
        token: str | None
        if kind == "runs":
            token = run_token(world, Run.objects.for_workspace(world.alpha).get(name=name))
        else:
            endpoint = Endpoint.objects.for_workspace(world.alpha).get(name=name)
            token = issue_endpoint_token(endpoint)  # one live per endpoint: issued once
        assert token is not None
        clients[f"{kind}/{name}"] = bearer(token)
    return clients[f"{kind}/{name}"]


FUZZ = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,  # the same examples on every run: a failure is never a fluke
    database=None,  # nothing written into the working tree
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.slow
def test_no_known_bad_value_causes_a_server_error(world: Any, urls: dict[str, str]) -> None:
    """Every parameter of every page and API route of the project's own (the admin is
    Django's, and in the property test below), one known-bad value at a time."""
    for key in (key for key in get_routes() if not key.startswith("admin")):
        client = client_for(world, key)
        for name in parameters_of(key, urls[key]):
            for value in KNOWN_BAD:
                response = client.get(urls[key], {name: value})
                assert response.status_code < 500, (key, name, value)


@FUZZ
@given(data=st.data())
def test_no_query_parameter_causes_a_server_error(
    world: Any, urls: dict[str, str], data: st.DataObject
) -> None:
    key = data.draw(st.sampled_from(get_routes()), label="route")
    names = parameters_of(key, urls[key])
    params = data.draw(queries(names), label="query")
    response = client_for(world, key).get(urls[key], params)
    assert response.status_code < 500, (key, params)


@FUZZ
@given(data=st.data())
def test_no_json_body_causes_a_server_error(
    world: Any,
    urls: dict[str, str],
    run_clients: dict[str, APIClient],
    monkeypatch: Any,
    data: st.DataObject,
) -> None:
    monkeypatch.setattr(api_views, "REPORTS_PER_MINUTE", 10**9)
    monkeypatch.setattr(workload, "REPORTS_PER_MINUTE", 10**9)
    key, method = data.draw(st.sampled_from(json_routes()), label="route")
    url = urls[key]
    # The report routes with the run's or the endpoint's own token; the others as its admin.
    holder = holder_client(world, url, run_clients) if "report" in key else None
    client = holder if holder is not None else world.api_client_for("workspace_admin")
    fields = body_fields(url, method)
    body = data.draw(bodies(fields), label="body")
    if not is_run_route(key) and body.count("[") + body.count("{") > 200:
        body = "{}"  # see test_deep_json_outside_the_runs_api_is_still_a_server_error
    response = getattr(client, method.lower())(url, body, content_type="application/json")
    assert response.status_code < 500, (key, body[:200])


def test_options_on_every_api_route_is_never_a_server_error(
    world: Any, urls: dict[str, str]
) -> None:
    """OPTIONS on every API route, as each of the cast and, on a run's or an endpoint's
    routes, with its own token. DRF describes each write the caller may make by the
    serializer its view names for it: a view that named none answered a 500 (the endpoints
    list and the invoke route to any member, a run's report routes to the run's token)."""
    holders: dict[str, APIClient] = {}
    checked = 0
    for key, route in MATRIX.items():
        if not route.api:
            continue
        callers = {who: world.api_client_for(who) for who in CAST}
        holder = holder_client(world, urls[key], holders)
        if holder is not None:
            callers["its own token"] = holder
        for who, client in callers.items():
            response = client.options(urls[key])
            assert response.status_code in (200, 401, 403, 404), (key, who, response.content)
            checked += 1
    assert checked > 60 * len(CAST)
    # Each write is described by the body it takes, where it takes a serializer's.
    deploy = world.api_client_for("researcher").options(urls["api:endpoint-list"]).json()
    assert set(deploy["actions"]["POST"]) == {"spec", "bundle", "name"}
    report = holder_client(world, urls["api:run-report-metrics"], holders)
    assert report is not None
    assert set(report.options(urls["api:run-report-metrics"]).json()["actions"]["POST"]) == {"rows"}
    invoke = world.api_client_for("researcher").options(urls["api:endpoint-invoke"]).json()
    assert "actions" not in invoke  # what it sends on is the endpoint's, not a serializer's


def test_deep_json_outside_the_runs_api_is_a_400(world: Any) -> None:
    """Every API route parses JSON with the bounded parser, not only the runs API."""
    response = world.api_client_for("workspace_admin").patch(
        "/api/v1/workspaces/alpha/",
        '{"description": ' + "[" * 1000 + "]" * 1000 + "}",
        content_type="application/json",
    )
    assert response.status_code == 400
    assert "nested deeper than" in response.json()["detail"]


def test_a_json_body_too_large_for_any_route_is_a_413_unread(world: Any, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 64
    response = world.api_client_for("workspace_admin").patch(
        "/api/v1/workspaces/alpha/",
        json.dumps({"description": "d" * 100}),
        content_type="application/json",
    )
    assert response.status_code == 413
    assert "at most 64 bytes" in response.json()["detail"]


def test_an_empty_to_field_in_the_admin_is_a_400(world: Any) -> None:
    """Django's admin asks the model for a field named ''; the site refuses it first."""
    quota = WorkspaceQuota.objects.for_workspace(world.alpha).first()
    assert quota is not None
    url = f"/admin/workspaces/workspacequota/{quota.pk}/change/"
    response = world.client_for("platform_admin").get(url, {"_to_field": ""})
    assert response.status_code == 400
