"""What Prometheus and Grafana are given (deploy/prometheus/, deploy/grafana/) checked with the
real tools: the alert rules pass ``promtool check rules`` and their unit tests, every query of
the dashboard parses and names only metrics that exist (the portal's own, as /metrics serves
them, or dcgm-exporter's), and a real Prometheus (/usr/bin/prometheus on 127.0.0.1, a 1 s
scrape) scrapes a live portal (gunicorn on the suite's PostgreSQL) with the bearer token file,
loads the rules, and answers the right numbers.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.conf import settings
from django.test import override_settings
from prometheus_client.parser import text_string_to_metric_families

from runs import delivery, submission
from runs.models import RunState
from telemetry.dcgm import LabelNames, MetricNames
from tests.portal.test_metrics import scraper
from tests.runs.factories import TINY_FILES, TINY_SPEC, make_run, zip_bytes
from tests.runs.processes import Portal, free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "taugrid-alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "taugrid-alerts.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "taugrid-dashboard.json"
PROMTOOL = "/usr/bin/promtool"
PROMETHEUS = "/usr/bin/prometheus"
TOKEN = "metrics-token-for-the-real-prometheus-0123"

#: What Grafana's query editor fills in before Prometheus sees a query.
GRAFANA_VARIABLES = {"$workspace": ".*", "$node": ".*", "$__rate_interval": "1m"}
#: PromQL words that are not metric names.
KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "inf",
    "nan",
}


def metric_names(expression: str) -> set[str]:
    """The metric names a PromQL expression reads: what is left once strings, label
    matchers, ranges, grouping clauses, functions, keywords and numbers are taken out."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expression)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", text):
        token = match.group()
        if token.lower() in KEYWORDS or text[match.end() :].lstrip().startswith("("):
            continue
        names.add(token)
    return names


def test_metric_names_finds_what_a_query_reads() -> None:
    """The helper the checks below rely on: a misspelt name is found, nothing else is."""
    assert metric_names(
        'sum by (state) (clamp_min(delta(taugird_runs{state=~"a|b"}[1h]), 0)) > 1e3'
    ) == {"taugird_runs"}
    assert metric_names(
        "time() - max(x_timestamp_seconds offset 5m) and on (job) up == bool 0"
    ) == {"x_timestamp_seconds", "up"}


@pytest.fixture
def known_metrics(db: None) -> set[str]:
    """The portal's metric names as /metrics serves them (the watcher's too: the Kubernetes
    backend), dcgm-exporter's default names TauGrid reads, and Prometheus' own ``up``."""
    with override_settings(TAU_BACKEND="kubernetes"):
        response = scraper().get("/metrics")
    assert response.status_code == 200
    names = {"up"}
    for family in text_string_to_metric_families(response.content.decode()):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    assert "taugrid_kube_watcher_heartbeat_timestamp_seconds" in names
    dcgm = MetricNames()
    names.update(getattr(dcgm, field.name) for field in fields(dcgm) if field.name != "labels")
    return names


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


# --- alert rules ------------------------------------------------------------------------------


def test_the_alert_rules_pass_promtool_and_their_unit_tests() -> None:
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout
    tested = promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_the_rule_tests_can_fail(tmp_path: Path) -> None:
    """The unit tests compare what fires: an XID said wrong is caught."""
    (tmp_path / RULES.name).write_text(RULES.read_text())
    wrong = RULE_TESTS.read_text().replace("reported XID 79", "reported XID 48")
    (tmp_path / RULE_TESTS.name).write_text(wrong)
    tested = promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert tested.returncode != 0
    assert "XID 79" in tested.stdout + tested.stderr


def test_the_alerts_the_brief_asks_for_exist_and_name_real_metrics(
    known_metrics: set[str],
) -> None:
    rules = [
        rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]
    names = {rule["alert"] for rule in rules}
    assert {
        "TauGridKubeWatcherLagging",
        "TauGridDeliveriesFailing",
        "TauGridKueueSyncErrors",
        "TauGridGpuFleetSyncStale",
        "TauGridGpuXidError",
        "TauGridQueueGrowing",
    } <= names
    for rule in rules:
        read = metric_names(rule["expr"])
        assert read, rule["alert"]
        assert read <= known_metrics, f"{rule['alert']} reads unknown {read - known_metrics}"
        assert rule["labels"]["severity"] in {"critical", "warning"}
        assert rule["annotations"]["summary"]


# --- the Grafana dashboard -------------------------------------------------------------------


def dashboard_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from dashboard_panels(panel.get("panels", []))


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        target["expr"]
        for panel in dashboard_panels(dashboard["panels"])
        for target in panel.get("targets", [])
    ]


def as_prometheus_sees_it(expression: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expression = expression.replace(variable, value)
    assert "$" not in expression, f"a Grafana variable the test does not know: {expression}"
    return expression


def test_the_dashboard_loads_and_every_query_parses_and_reads_real_metrics(
    known_metrics: set[str], tmp_path: Path
) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "taugrid-portal"
    panels = list(dashboard_panels(dashboard["panels"]))
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]), panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"], panel["title"]
    queries = dashboard_queries()
    titles = " ".join(panel["title"] for panel in panels)
    assert "GPU utilisation per node" in titles
    read = set().union(*(metric_names(query) for query in queries))
    assert read <= known_metrics, f"the dashboard reads unknown metrics: {read - known_metrics}"
    for wanted in (
        "DCGM_FI_DEV_GPU_UTIL",
        "taugrid_runs",
        "taugrid_queue_depth",
        "taugrid_submission_latency_seconds",
        "taugrid_delivery_latency_seconds",
        "taugrid_kube_watcher_heartbeat_timestamp_seconds",
        "taugrid_kueue_sync_errors",
        "taugrid_deliveries_failing",
    ):
        assert wanted in read, f"no panel shows {wanted}"
    # Its template variables read real metrics and labels too.
    host_labels = set(LabelNames().host)
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        found = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["definition"])
        assert found, variable["definition"]
        assert found.group(1) in known_metrics
        assert found.group(2) in {"workspace"} | host_labels
    # Every query as Prometheus will see it: promtool parses each as a recording rule.
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{number}", "expr": as_prometheus_sees_it(query)}
                    for number, query in enumerate(queries)
                ],
            }
        ]
    }
    generated = tmp_path / "dashboard-queries.yml"
    generated.write_text(yaml.safe_dump(rules))
    checked = promtool("check", "rules", str(generated))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"{len(queries)} rules found" in checked.stdout


# --- a real Prometheus scraping a live portal -------------------------------------------------


class PrometheusServer:
    """/usr/bin/prometheus on 127.0.0.1 with its own data folder, scraping every second."""

    def __init__(self, folder: Path, scrape_configs: list[dict[str, Any]]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.folder = folder
        config = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "rule_files": [str(RULES)],
            "scrape_configs": scrape_configs,
        }
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = folder / "prometheus.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={self.folder / 'prometheus.yml'}",
                    f"--storage.tsdb.path={self.folder / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(self._ready, timeout=60, what=f"Prometheus to start ({self.log})")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                return int(response.status) == 200
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=5) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def value(self, query: str) -> float | None:
        """The single value an instant query answers, None while it answers nothing."""
        result = self.api("query", query=query)["result"]
        if not result:
            return None
        assert len(result) == 1, result
        return float(result[0]["value"][1])

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def scrape_job(name: str, port: int, token_file: Path) -> dict[str, Any]:
    return {
        "job_name": name,
        "metrics_path": "/metrics",
        "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
        "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
    }


@pytest.fixture
def live_portal(tmp_path: Path) -> Iterator[Portal]:
    portal = Portal(
        broker_url=settings.CELERY_BROKER_URL,
        var_dir=tmp_path / "var",
        extra_env={"TAU_METRICS_TOKEN": TOKEN},
    )
    try:
        portal.start(worker=False, beat=False)
        yield portal
    finally:
        portal.stop()


@pytest.fixture
def prometheus(tmp_path: Path, live_portal: Portal) -> Iterator[PrometheusServer]:
    right, wrong = tmp_path / "token", tmp_path / "wrong-token"
    right.write_text(TOKEN + "\n")
    wrong.write_text("not-the-token\n")
    folder = tmp_path / "prometheus"
    folder.mkdir()
    server = PrometheusServer(
        folder,
        [
            scrape_job("taugrid", live_portal.port, right),
            scrape_job("taugrid-wrong-token", live_portal.port, wrong),
        ],
    )
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.mark.django_db(transaction=True)
def test_a_real_prometheus_scrapes_a_live_portal_with_the_token_file(
    world: Any, live_portal: Portal, prometheus: PrometheusServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No worker runs: the submissions' delivery tasks are not left in the session's broker.
    monkeypatch.setattr(delivery, "publish", lambda delivery_id: None)
    for _ in range(3):
        make_run(world, state=RunState.QUEUED)
    submission.submit(
        workspace=world.beta,
        user=world.users["outsider"],
        spec_source=TINY_SPEC,
        bundle=io.BytesIO(zip_bytes(TINY_FILES)),
    )
    expected = {
        'taugrid_runs{job="taugrid",workspace="alpha",state="queued"}': 3.0,
        'taugrid_runs{job="taugrid",workspace="alpha",state="running"}': 0.0,
        'taugrid_queue_depth{job="taugrid",workspace="beta"}': 1.0,
        'taugrid_deliveries_pending{job="taugrid",action="submit"}': 4.0,
    }

    def answers() -> dict[str, float | None]:
        return {query: prometheus.value(query) for query in expected}

    # The rows were written while Prometheus was already scraping: wait for a scrape after
    # the last of them.
    wait_for(
        lambda: answers() == expected,
        timeout=60,
        what="Prometheus to scrape the runs the test made",
    )
    assert prometheus.value('up{job="taugrid"}') == 1
    # The same portal, scraped with a wrong token: refused (401), so the target is down
    # (scrapes of the two jobs are spread over the interval: it may come a moment later).
    wait_for(
        lambda: prometheus.value('up{job="taugrid-wrong-token"}') is not None,
        timeout=10,
        what="Prometheus to scrape with the wrong token",
    )
    assert prometheus.value('up{job="taugrid-wrong-token"}') == 0
    refused = [
        target
        for target in prometheus.api("targets")["activeTargets"]
        if target["labels"]["job"] == "taugrid-wrong-token"
    ]
    assert len(refused) == 1
    assert "401" in refused[0]["lastError"], refused[0]
    assert prometheus.value('count({job="taugrid-wrong-token", __name__=~"taugrid_.*"})') is None

    # The alert rules are loaded and evaluated without errors against the real series.
    never = "0001-01-01T00:00:00Z"

    def rules() -> list[dict[str, Any]]:
        return [rule for group in prometheus.api("rules")["groups"] for rule in group["rules"]]

    wait_for(
        lambda: bool(rules()) and all(rule["lastEvaluation"] != never for rule in rules()),
        timeout=30,
        what="Prometheus to evaluate the alert rules",
    )
    loaded = rules()
    assert {rule["name"] for rule in loaded} >= {"TauGridKubeWatcherLagging", "TauGridGpuXidError"}
    assert [rule["name"] for rule in loaded if rule["health"] != "ok"] == []
    # Every dashboard query runs in a real Prometheus (not only parses).
    for query in dashboard_queries():
        prometheus.api("query", query=as_prometheus_sees_it(query), time=str(time.time()))
