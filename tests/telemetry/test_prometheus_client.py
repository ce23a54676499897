"""The Prometheus client's edges, against a fake HTTP server on loopback: what a real
Prometheus does not easily do on demand (garbage, 500s, hanging, sentinel values). The main
path, against the real Prometheus, is tests/telemetry/test_prometheus.py."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

import pytest

from telemetry.dcgm import DcgmTelemetry, MetricNames
from telemetry.prometheus import (
    PrometheusClient,
    TelemetryQueryError,
    TelemetryUnavailable,
    fit_step,
    match_any,
    quote,
    regex_alternation,
    regex_escape,
)

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


@dataclass
class Answer:
    status: int
    body: bytes
    content_type: str = "application/json"
    delay: float = 0.0


@dataclass
class FakePrometheus:
    """Answers each request with ``respond(path, form)``; keeps what it was asked."""

    respond: Callable[[str, dict[str, str]], Answer]
    requests: list[tuple[str, dict[str, str], dict[str, str]]] = field(default_factory=list)
    url: str = ""


def vector(*series: tuple[dict[str, str], str]) -> Answer:
    result = [{"metric": labels, "value": [NOW.timestamp(), value]} for labels, value in series]
    body = {"status": "success", "data": {"resultType": "vector", "result": result}}
    return Answer(200, json.dumps(body).encode())


def error(status: int, error_type: str, message: str) -> Answer:
    body = {"status": "error", "errorType": error_type, "error": message}
    return Answer(status, json.dumps(body).encode())


@pytest.fixture
def fake() -> Iterator[FakePrometheus]:
    state = FakePrometheus(respond=lambda path, form: vector())

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
            state.requests.append((self.path, form, dict(self.headers)))
            answer = state.respond(self.path, form)
            if answer.delay:
                time.sleep(answer.delay)
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            self.wfile.write(answer.body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield state
    server.shutdown()
    server.server_close()


def test_a_query_is_a_post_with_the_expression_time_and_server_side_timeout(
    fake: FakePrometheus,
) -> None:
    fake.respond = lambda path, form: vector(({"gpu": "0"}, "97"))
    with PrometheusClient(fake.url + "/", timeout=1.5, token="s3cret-token") as client:
        samples = client.query("DCGM_FI_DEV_GPU_UTIL", at=NOW)
    assert [(dict(s.labels), s.value) for s in samples] == [({"gpu": "0"}, 97.0)]
    path, form, headers = fake.requests[0]
    assert path == "/api/v1/query"
    assert form == {
        "query": "DCGM_FI_DEV_GPU_UTIL",
        "time": f"{NOW.timestamp():.3f}",
        "timeout": "1.5s",
    }
    assert headers["Authorization"] == "Bearer s3cret-token"


def test_nan_infinities_and_dcgm_sentinels_are_dropped(fake: FakePrometheus) -> None:
    fake.respond = lambda path, form: vector(
        ({"gpu": "0"}, "NaN"),
        ({"gpu": "1"}, "+Inf"),
        ({"gpu": "2"}, "-Inf"),
        ({"gpu": "3"}, "9223372036854775794"),
        ({"gpu": "4"}, "9.223372036854776e+18"),
        ({"gpu": "5"}, "9200000000000000000"),
        ({"gpu": "6"}, "0"),
        ({"gpu": "7"}, "9.1e18"),
    )
    samples = PrometheusClient(fake.url).query("x")
    assert {s.labels["gpu"]: s.value for s in samples} == {"6": 0.0, "7": 9.1e18}


def test_range_points_drop_unusable_values_and_empty_series(fake: FakePrometheus) -> None:
    start = NOW - timedelta(minutes=1)
    body = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {
                    "metric": {"gpu": "0"},
                    "values": [
                        [start.timestamp(), "1"],
                        [NOW.timestamp() - 30, "NaN"],
                        [NOW.timestamp(), "3.5"],
                    ],
                },
                {"metric": {"gpu": "1"}, "values": [[NOW.timestamp(), "9223372036854775794"]]},
            ],
        },
    }
    fake.respond = lambda path, form: Answer(200, json.dumps(body).encode())
    series = PrometheusClient(fake.url).query_range("x", start, NOW, 30)
    assert len(series) == 1
    assert series[0].labels == {"gpu": "0"}
    assert series[0].points == [(start, 1.0), (NOW, 3.5)]
    _path, form, _headers = fake.requests[0]
    assert form["step"] == "30"
    assert form["start"] == f"{start.timestamp():.3f}"


def test_a_scalar_answer_is_one_sample_without_labels(fake: FakePrometheus) -> None:
    body = {"status": "success", "data": {"resultType": "scalar", "result": [NOW.timestamp(), "2"]}}
    fake.respond = lambda path, form: Answer(200, json.dumps(body).encode())
    samples = PrometheusClient(fake.url).query("1+1")
    assert [(dict(s.labels), s.value) for s in samples] == [({}, 2.0)]


@pytest.mark.parametrize(
    ("answer", "kind", "words"),
    [
        (error(400, "bad_data", 'parse error: unexpected "{"'), TelemetryQueryError, "bad_data"),
        (error(422, "execution", "many-to-many matching"), TelemetryQueryError, "many-to-many"),
        (
            error(503, "timeout", "query timed out in expression evaluation"),
            TelemetryUnavailable,
            "timeout",
        ),
        (error(503, "unavailable", "TSDB not ready"), TelemetryUnavailable, "TSDB not ready"),
        (error(422, "timeout", "query timed out"), TelemetryUnavailable, "timed out"),
        (
            Answer(500, b"<html>Internal Server Error</html>", "text/html"),
            TelemetryUnavailable,
            "server error (500",
        ),
        (Answer(502, b"Bad Gateway", "text/plain"), TelemetryUnavailable, "Bad Gateway"),
        (Answer(200, b"not json at all", "text/plain"), TelemetryUnavailable, "not its API"),
        (Answer(200, b'{"status": "success"}'), TelemetryUnavailable, "no data"),
        (
            Answer(200, b'{"status":"success","data":{"resultType":"matrix","result":[]}}'),
            TelemetryUnavailable,
            "not a vector",
        ),
        (Answer(401, b"Unauthorized", "text/plain"), TelemetryUnavailable, "TAU_PROMETHEUS_TOKEN"),
        (Answer(403, b"Forbidden", "text/plain"), TelemetryUnavailable, "credentials"),
        (Answer(404, b"404 page not found", "text/plain"), TelemetryUnavailable, "without /api/v1"),
    ],
)
def test_failures_are_sorted_into_unavailable_and_bad_query(
    fake: FakePrometheus, answer: Answer, kind: type[Exception], words: str
) -> None:
    fake.respond = lambda path, form: answer
    with pytest.raises(kind) as raised:
        PrometheusClient(fake.url, token="s3cret-token").query("up")
    message = str(raised.value)
    assert words in message
    assert f"Prometheus at {fake.url}" in message
    assert "s3cret-token" not in message


def test_a_hanging_prometheus_fails_within_the_timeout(fake: FakePrometheus) -> None:
    fake.respond = lambda path, form: Answer(200, b"{}", delay=3.0)
    started = time.monotonic()
    with pytest.raises(TelemetryUnavailable, match=r"did not answer within 0.5 s"):
        PrometheusClient(fake.url, timeout=0.5).query("up")
    assert time.monotonic() - started < 2.5  # not the 3 s the answer takes (a loaded machine)


def test_nothing_listening_is_unavailable_naming_the_address_without_its_password() -> None:
    from tests.telemetry.plugin import free_port

    url = f"http://admin:hunter2@127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(TelemetryUnavailable) as raised:
        PrometheusClient(url).query("up")
    assert time.monotonic() - started < 2.0
    message = str(raised.value)
    assert "connection refused" in message
    assert "hunter2" not in message
    assert "127.0.0.1" in message


def test_proxies_from_the_environment_are_not_used(
    fake: FakePrometheus, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A proxy that does not exist: a client that honoured it could not reach the server.
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("ALL_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    fake.respond = lambda path, form: vector(({"gpu": "0"}, "1"))
    assert len(PrometheusClient(fake.url).query("up")) == 1


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (lambda c: c.query("up", at=datetime(2026, 1, 1)), "no time zone"),  # noqa: DTZ001
        (lambda c: c.query_range("up", NOW, NOW - timedelta(seconds=1), 15), "not end before"),
        (lambda c: c.query_range("up", NOW - timedelta(hours=1), NOW, 0), "step must be"),
        (lambda c: c.query_range("up", NOW - timedelta(days=3), NOW, 1), "11000 points"),
    ],
)
def test_bad_arguments_are_refused_before_asking(
    fake: FakePrometheus, bad: Callable[[PrometheusClient], object], words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        bad(PrometheusClient(fake.url))
    assert fake.requests == []


@pytest.mark.parametrize("url", ["prometheus:9090", "ftp://x", "", "http://"])
def test_a_url_that_is_not_http_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="http"):
        PrometheusClient(url)


@pytest.mark.parametrize(
    ("window", "points", "minimum", "step"),
    [
        (timedelta(minutes=15), 240, 15.0, 15.0),  # 3.75 s -> the scrape interval
        (timedelta(hours=1), 240, 15.0, 15.0),  # exactly 15
        (timedelta(hours=2), 240, 15.0, 30.0),
        (timedelta(hours=3), 240, 15.0, 60.0),  # 45 s -> 1 m
        (timedelta(hours=6), 240, 15.0, 120.0),  # 90 s -> 2 m
        (timedelta(hours=24), 240, 15.0, 600.0),  # 360 s -> 10 m
        (timedelta(days=7), 240, 15.0, 3600.0),  # 42 min -> 1 h
        (timedelta(days=30), 240, 15.0, 10800.0),  # 3 h
        (timedelta(days=400), 240, 15.0, 172800.0),  # 40 h -> whole days
        (timedelta(seconds=60), 240, 1.0, 1.0),
        (timedelta(seconds=600), 240, 1.0, 5.0),  # 2.5 s -> 5 s
        (timedelta(hours=1), 240, 20.0, 30.0),  # a 20 s scrape: never below it
        (timedelta(hours=1), 60, 15.0, 60.0),
    ],
)
def test_fit_step_rounds_up_to_a_ladder_and_never_below_the_scrape(
    window: timedelta, points: int, minimum: float, step: float
) -> None:
    assert fit_step(NOW - window, NOW, points=points, minimum=minimum) == step


def test_fit_step_refuses_an_empty_window() -> None:
    with pytest.raises(ValueError, match="end after it starts"):
        fit_step(NOW, NOW)


@pytest.mark.parametrize(
    ("value", "literal"),
    [
        ("run-1", '"run-1"'),
        ('a"b', '"a\\"b"'),
        ("a\\b", '"a\\\\b"'),
        ('x"} or vector(1) or {"', '"x\\"} or vector(1) or {\\""'),
        ("line\nbreak", '"line\\nbreak"'),
    ],
)
def test_quote_escapes_what_could_end_the_string(value: str, literal: str) -> None:
    assert quote(value) == literal


def test_regex_helpers_escape_re2_specials_but_not_spaces() -> None:
    assert regex_escape("run.a+(b)|c*[d]{e}^$?\\") == r"run\.a\+\(b\)\|c\*\[d\]\{e\}\^\$\?\\"
    assert regex_escape("a b-c") == "a b-c"  # RE2 rejects "\ " and "\-" is pointless
    assert regex_alternation(["b", "a.b", "b"]) == r"a\.b|b"
    assert match_any("pod", ["only"]) == 'pod="only"'
    assert match_any("pod", ["run.b", "run-a"]) == 'pod=~"run-a|run\\\\.b"'
    with pytest.raises(ValueError, match="none"):
        regex_alternation([])
    with pytest.raises(ValueError, match="empty value"):
        match_any("pod", ["", "a"])


# --- MetricNames and the adapter's refusals -------------------------------------------------


def test_overrides_replace_defaults_and_empty_strings_keep_them() -> None:
    assert MetricNames.from_overrides("", "") == MetricNames()
    names = MetricNames.from_overrides(
        '{"utilization": "nvidia_gpu_utilization", "xid": "DCGM_EXP_XID_ERRORS_COUNT"}',
        '{"host": "node", "pod": "exported_pod", "namespace": "exported_namespace"}',
    )
    assert names.utilization == "nvidia_gpu_utilization"
    assert names.xid == "DCGM_EXP_XID_ERRORS_COUNT"
    assert names.power_w == "DCGM_FI_DEV_POWER_USAGE"
    assert names.labels.host == ("node",)
    assert names.labels.pod == "exported_pod"
    assert names.labels.uuid == "UUID"


@pytest.mark.parametrize(
    ("metrics", "labels", "words"),
    [
        (
            '{"utilisation": "x"}',
            "",
            ["TAU_DCGM_METRICS", "'utilisation'", "utilization, memory_used_mib"],
        ),
        ("", '{"hostname": "x"}', ["TAU_DCGM_LABELS", "'hostname'", "host, gpu, uuid"]),
        ('{"power_w": 3}', "", ["TAU_DCGM_METRICS['power_w']", "must be a string", "3"]),
        ("", '{"host": ["a", "b"]}', ["TAU_DCGM_LABELS['host']", "must be a string"]),
        ('{"power_w": "power usage"}', "", ["not a valid Prometheus name"]),
        ('{"power_w": "x{a=\\"b\\"}"}', "", ["not a valid Prometheus name"]),
        ("", '{"pod": "exported:pod"}', ["not a valid Prometheus name"]),
        ("", '{"pod": "__name__"}', ["not a valid Prometheus name"]),
        ("{not json", "", ["TAU_DCGM_METRICS is not JSON"]),
        ('["utilization"]', "", ["must be a JSON object"]),
    ],
)
def test_bad_overrides_name_the_setting_the_key_and_what_is_valid(
    metrics: str, labels: str, words: list[str]
) -> None:
    with pytest.raises(ValueError, match="TAU_DCGM_") as raised:
        MetricNames.from_overrides(metrics, labels)
    for word in words:
        assert word in str(raised.value)


def test_narrowing_that_would_be_wider_than_meant_is_refused(fake: FakePrometheus) -> None:
    telemetry = DcgmTelemetry(PrometheusClient(fake.url))
    with pytest.raises(ValueError, match="namespace"):
        telemetry.current(pods=["run-1"])  # the same pod name may exist in another namespace
    with pytest.raises(ValueError, match="empty"):
        telemetry.current(namespace="")
    with pytest.raises(TypeError, match="collections"):
        telemetry.current(namespace="tau-a", pods="run-1")
    with pytest.raises(ValueError, match="not a GPU telemetry field"):
        telemetry.history("utilisation", NOW - timedelta(hours=1), NOW)
    with pytest.raises(ValueError, match="how must be"):
        telemetry.host_history("utilization", NOW - timedelta(hours=1), NOW, how="median")  # type: ignore[arg-type]
    assert fake.requests == []


def test_an_empty_pod_or_host_list_asks_nothing_and_answers_nothing(fake: FakePrometheus) -> None:
    telemetry = DcgmTelemetry(PrometheusClient(fake.url))
    start = NOW - timedelta(hours=1)
    assert telemetry.current(namespace="tau-a", pods=[]) == []
    assert telemetry.current(hosts=[]) == []
    assert telemetry.history("utilization", start, NOW, namespace="tau-a", pods=set()) == {}
    assert telemetry.pod_history("utilization", start, NOW, namespace="tau-a", pods=[]) == {}
    assert telemetry.window_stats("utilization", start, NOW, hosts=()) == {}
    assert fake.requests == []


def test_current_asks_one_query_per_metric_narrowed_in_the_selector(fake: FakePrometheus) -> None:
    telemetry = DcgmTelemetry(PrometheusClient(fake.url))
    telemetry.current(namespace="tau-alpha", pods=["run-b", "run.a"])
    queries = [form["query"] for _path, form, _headers in fake.requests]
    assert len(queries) == 9
    by = "max by (Hostname, hostname, gpu, UUID, modelName, namespace, pod, container)"
    assert queries[0] == (
        f"{by} ("
        '(DCGM_FI_DEV_GPU_UTIL{namespace="tau-alpha", pod=~"run-b|run\\\\.a"}) < 2147483632)'
    )
    fake.requests.clear()
    telemetry.current(hosts=["gpu-h100-1"])
    assert fake.requests[0][1]["query"] == (
        f"{by} ("
        '(DCGM_FI_DEV_GPU_UTIL{Hostname="gpu-h100-1"} or '
        'DCGM_FI_DEV_GPU_UTIL{hostname="gpu-h100-1"}) < 2147483632)'
    )
