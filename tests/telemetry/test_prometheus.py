"""The telemetry adapter against a real Prometheus (Debian's 2.42) scraping the replayed
dcgm-exporter (tests/telemetry/plugin.py): the numbers that come back are the frame being
served, one query per metric whatever the fleet, a pod-narrowed question never sees another
pod, history moves at the fitted step, a stopped Prometheus fails fast, names are
configurable and both host label spellings work."""

from __future__ import annotations

import itertools
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from telemetry.dcgm import DcgmTelemetry, MetricNames
from telemetry.prometheus import InstantSample, TelemetryQueryError, TelemetryUnavailable
from telemetry.samples import GpuSample
from tests.telemetry.plugin import HOSTS, PrometheusServer, load_replay

pytestmark = pytest.mark.services

HOST_1, HOST_2 = HOSTS
DATA = Path(__file__).resolve().parent / "data"
TRAINING = DATA / "h100x8-training.jsonl"
BLANK = 2147483632


def now() -> datetime:
    return datetime.now(tz=UTC)


def expected(exporter: Any, host: str, gpu: int) -> GpuSample:
    """The GpuSample the served values make (dcgm's blanks and unserved fields: None)."""
    served = exporter.served(host, gpu)

    def value(field: str) -> float | None:
        raw = served[field]
        return None if raw is None or raw >= BLANK else float(raw)

    xid = value("xid")
    assignment = exporter.assignment(host, gpu)
    return GpuSample(
        host=host,
        index=gpu,
        uuid=exporter.uuid(host, gpu),
        model=exporter.model(host, gpu),
        utilization=value("utilization"),
        memory_used_mib=value("memory_used_mib"),
        memory_free_mib=value("memory_free_mib"),
        temperature_c=value("temperature_c"),
        power_w=value("power_w"),
        sm_clock_mhz=value("sm_clock_mhz"),
        xid=None if xid is None else int(xid),
        tensor_active=value("tensor_active"),
        dram_active=value("dram_active"),
        namespace=assignment.namespace if assignment else None,
        pod=assignment.pod if assignment else None,
        container=assignment.container if assignment else None,
    )


def spacing(moments: list[datetime]) -> set[float]:
    """The distinct gaps between consecutive points, in seconds."""
    return {(b - a).total_seconds() for a, b in itertools.pairwise(moments)}


def every_gpu(exporter: Any) -> list[tuple[str, int]]:
    return [(host, gpu) for host in exporter.hosts for gpu in range(exporter.gpus(host))]


def gpus_of(samples: list[GpuSample]) -> set[tuple[str, int]]:
    return {(sample.host, sample.index) for sample in samples}


def count_is(number: int) -> Any:
    def holds(samples: list[InstantSample]) -> bool:
        return number == (int(samples[0].value) if samples else 0)

    holds.__name__ = f"count_is_{number}"
    return holds


def test_current_gives_every_gpu_of_every_host_the_values_of_the_frame_served(
    prometheus: PrometheusServer, dcgm_exporter: Any
) -> None:
    dcgm_exporter.frame = 100
    prometheus.wait_until_served()

    samples = prometheus.telemetry().current()

    assert samples == [expected(dcgm_exporter, host, gpu) for host, gpu in every_gpu(dcgm_exporter)]
    assert len(samples) == 16
    # The same numbers read straight from the frame file, not through the exporter: host N
    # replays frame (100 + 37 N) of the training recording.
    lines = TRAINING.read_text(encoding="utf-8").splitlines()
    fields = json.loads(lines[0])["fields"]
    frames = lines[1:]
    offset = load_replay().HOST_OFFSET_FRAMES
    for host_index, host in enumerate(HOSTS):
        rows = json.loads(frames[(100 + host_index * offset) % len(frames)])["gpus"]
        for sample in (s for s in samples if s.host == host):
            row = dict(zip(fields, rows[sample.index], strict=True))
            assert sample.utilization == row["utilization"]
            assert sample.memory_used_mib == row["memory_used_mib"]
            assert sample.memory_free_mib == row["memory_free_mib"]
            assert sample.temperature_c == row["temperature_c"]
            assert sample.power_w == row["power_w"]
            assert sample.sm_clock_mhz == row["sm_clock_mhz"]
            assert sample.tensor_active == row["tensor_active"]
            assert sample.xid == 0
            assert sample.model == "NVIDIA H100 80GB HBM3"
            assert sample.uuid.startswith("GPU-")
    # Two hosts, two different sets of numbers: a host mix-up could not pass.
    power = {host: [s.power_w for s in samples if s.host == host] for host in HOSTS}
    assert power[HOST_1] != power[HOST_2]
    assert len({s.uuid for s in samples}) == 16


def test_current_is_one_query_per_metric_whatever_the_size_of_the_fleet(
    prometheus: PrometheusServer, dcgm_exporter: Any
) -> None:
    telemetry = prometheus.telemetry()
    for hosts in (HOSTS, [f"gpu-node-{n:02d}" for n in range(25)]):
        dcgm_exporter.set_hosts(hosts, gpus=8)
        dcgm_exporter.frame = 7
        prometheus.wait_until_served()
        before = prometheus.queries_answered()
        samples = telemetry.current()
        answered = prometheus.queries_answered() - before
        assert answered == 9, f"{answered} queries for {len(samples)} GPUs"
        assert len(samples) == 8 * len(hosts)
        assert gpus_of(samples) == set(every_gpu(dcgm_exporter))
    # One host's GPUs: still one query per metric, not one per GPU.
    before = prometheus.queries_answered()
    one_host = telemetry.current(hosts=["gpu-node-03"])
    assert prometheus.queries_answered() - before == 9
    assert gpus_of(one_host) == {("gpu-node-03", gpu) for gpu in range(8)}
    assert one_host == [expected(dcgm_exporter, "gpu-node-03", gpu) for gpu in range(8)]


def test_a_pod_narrowed_question_never_returns_another_pods_gpus(
    prometheus: PrometheusServer, dcgm_exporter: Any
) -> None:
    exporter = dcgm_exporter
    exporter.assign(HOST_1, 0, namespace="tau-alpha", pod="run-a", container="trainer")
    exporter.assign(HOST_1, 1, namespace="tau-alpha", pod="run-a", container="trainer")
    exporter.assign(HOST_2, 3, namespace="tau-alpha", pod="run-b")
    exporter.assign(HOST_2, 4, namespace="tau-beta", pod="run-a")  # same name, another tenant
    exporter.assign(HOST_2, 5, namespace="tau-alpha", pod="runxa")  # what "run.a" unescaped hits
    exporter.assign(HOST_2, 6, namespace="tau-alpha", pod="run.a")
    exporter.frame = 12
    prometheus.wait_for('count(DCGM_FI_DEV_GPU_UTIL{pod!=""})', count_is(6))
    prometheus.wait_for('count(DCGM_FI_PROF_DRAM_ACTIVE{pod!=""})', count_is(6))
    prometheus.wait_until_served()
    telemetry = prometheus.telemetry()

    run_a = telemetry.current(namespace="tau-alpha", pods=["run-a"])
    assert run_a == [expected(exporter, HOST_1, 0), expected(exporter, HOST_1, 1)]
    assert {(s.namespace, s.pod, s.container) for s in run_a} == {("tau-alpha", "run-a", "trainer")}
    assert gpus_of(telemetry.current(namespace="tau-alpha", pods=["run.a"])) == {(HOST_2, 6)}
    assert gpus_of(telemetry.current(namespace="tau-alpha", pods=["run-a", "run-b"])) == {
        (HOST_1, 0),
        (HOST_1, 1),
        (HOST_2, 3),
    }
    assert gpus_of(telemetry.current(namespace="tau-alpha")) == {
        (HOST_1, 0),
        (HOST_1, 1),
        (HOST_2, 3),
        (HOST_2, 5),
        (HOST_2, 6),
    }
    assert telemetry.current(namespace="tau-beta") == [expected(exporter, HOST_2, 4)]
    assert telemetry.current(namespace="tau-beta", pods=["run-b"]) == []
    assert telemetry.current(namespace="tau-gamma") == []

    end = now()
    start = end - timedelta(seconds=20)
    history = telemetry.history("power_w", start, end, namespace="tau-beta", pods=["run-a"])
    assert set(history) == {(HOST_2, 4, exporter.uuid(HOST_2, 4))}
    assert (
        history[(HOST_2, 4, exporter.uuid(HOST_2, 4))][-1][1]
        == exporter.served(HOST_2, 4)["power_w"]
    )
    held = telemetry.pod_history("utilization", start, end, namespace="tau-alpha", how="count")
    assert {pod: points[-1][1] for pod, points in held.items()} == {
        "run-a": 2,
        "run-b": 1,
        "runxa": 1,
        "run.a": 1,
    }
    mean = telemetry.pod_history("power_w", start, end, namespace="tau-alpha", pods=["run-a"])
    assert set(mean) == {"run-a"}
    served = [exporter.served(HOST_1, gpu)["power_w"] for gpu in (0, 1)]
    assert mean["run-a"][-1][1] == pytest.approx(sum(served) / 2)


def test_history_moves_with_the_frames_at_the_fitted_step(
    prometheus: PrometheusServer, dcgm_exporter: Any
) -> None:
    # Scraping already (a Prometheus just started, or started again by an earlier test,
    # scrapes a second or more later): the window below is all scraped.
    prometheus.wait_for("DCGM_FI_DEV_POWER_USAGE", lambda samples: len(samples) == 16, timeout=30)
    start = now()
    time.sleep(12.5)  # a dozen scrapes of moving frames
    end = now()
    telemetry = prometheus.telemetry()

    power = telemetry.history("power_w", start, end)
    assert set(power) == {(h, g, dcgm_exporter.uuid(h, g)) for h, g in every_gpu(dcgm_exporter)}
    recording = dcgm_exporter.recordings["training"]
    for (host, gpu, _uuid), points in power.items():
        moments = [moment for moment, _value in points]
        assert len(points) >= 11
        # fit_step for 12 s at a 1 s scrape: 1 s apart, aligned on the start.
        assert spacing(moments) == {1.0}
        values = [value for _moment, value in points]
        assert len(set(values)) >= 5, f"{host}/{gpu} did not move: {values}"
        # Every value is one the recording holds for this GPU (none made up or mixed up).
        recorded = {frame[gpu]["power_w"] for frame in recording.frames}
        assert set(values) <= recorded

    # A 10-minute window: fit_step gives 2.5 s, rounded up to 5 s.
    wide = telemetry.history("utilization", end - timedelta(minutes=10), end, hosts=[HOST_1])
    assert {key[0] for key in wide} == {HOST_1}
    for points in wide.values():
        moments = [moment for moment, _value in points]
        assert len(moments) >= 2
        assert spacing(moments) == {5.0}
    # An explicit step wins over the fitted one.
    explicit = telemetry.history("utilization", start, end, step=4, hosts=[HOST_2])
    for points in explicit.values():
        moments = [moment for moment, _value in points]
        assert spacing(moments) == {4.0}

    per_host = telemetry.host_history("utilization", start, end, how="count")
    assert set(per_host) == set(HOSTS)
    assert {points[-1][1] for points in per_host.values()} == {8}


def test_window_stats_show_an_idle_gpu_among_busy_ones(
    prometheus: PrometheusServer, dcgm_exporter: Any
) -> None:
    dcgm_exporter.frame = 20
    dcgm_exporter.set_value(HOST_1, 2, "utilization", 3)  # a run holding a GPU it barely uses
    dcgm_exporter.assign(HOST_1, 2, namespace="tau-alpha", pod="idle-run")
    dcgm_exporter.assign(HOST_2, 2, namespace="tau-beta", pod="idle-run")
    prometheus.wait_until_served()
    time.sleep(4.5)  # the 3 s window below then holds pinned values only
    end = now()
    telemetry = prometheus.telemetry()
    stats = telemetry.window_stats("utilization", end - timedelta(seconds=3), end, hosts=[HOST_1])

    assert {key[:2] for key in stats} == {(HOST_1, gpu) for gpu in range(8)}
    for (host, gpu, _uuid), seen in stats.items():
        served = dcgm_exporter.served(host, gpu)["utilization"]
        assert seen.mean == served
        assert seen.peak == served
        assert 2.0 <= seen.seconds_seen <= 4.0
    idle = stats[(HOST_1, 2, dcgm_exporter.uuid(HOST_1, 2))]
    assert (idle.mean, idle.peak) == (3.0, 3.0)
    assert min(s.mean for key, s in stats.items() if key[1] != 2) >= 85
    # The run's own GPUs only: the same pod name in another namespace is not in it.
    run = telemetry.window_stats(
        "utilization", end - timedelta(seconds=3), end, namespace="tau-alpha", pods=["idle-run"]
    )
    assert run == {(HOST_1, 2, dcgm_exporter.uuid(HOST_1, 2)): idle}
    peak_memory = telemetry.window_stats(
        "memory_used_mib", end - timedelta(seconds=3), end, namespace="tau-beta"
    )
    assert {key[:2] for key in peak_memory} == {(HOST_2, 2)}
    assert [s.peak for s in peak_memory.values()] == [
        dcgm_exporter.served(HOST_2, 2)["memory_used_mib"]
    ]


def test_step_stats_average_and_peak_each_step_of_a_runs_pods_only(
    prometheus: PrometheusServer, dcgm_exporter: Any
) -> None:
    """A run's GPUs by its pods' name prefix, in its namespace only: per step, the average
    and the peak of the samples in it."""
    dcgm_exporter.frame = 20
    for gpu, value in ((0, 80), (1, 60)):
        dcgm_exporter.set_value(HOST_1, gpu, "utilization", value)
        dcgm_exporter.assign(HOST_1, gpu, namespace="tau-alpha", pod=f"run-a1-a1-{gpu}-xyz")
    # The same prefix in another namespace, and a neighbour whose name only looks alike.
    dcgm_exporter.assign(HOST_2, 0, namespace="tau-beta", pod="run-a1-a1-0-zzz")
    dcgm_exporter.assign(HOST_2, 1, namespace="tau-alpha", pod="run-a10-a1-0-www")
    dcgm_exporter.set_value(HOST_2, 1, "utilization", 5)
    prometheus.wait_until_served()
    time.sleep(4.5)
    end = now()
    telemetry = prometheus.telemetry()
    start = end - timedelta(seconds=4)

    def stats(over: Any, prefixes: list[str]) -> dict[Any, Any]:
        return telemetry.step_stats(
            "utilization",
            start,
            end,
            step=2.0,
            over=over,
            namespace="tau-alpha",
            pod_prefixes=prefixes,
        )

    average, peak = stats("avg", ["run-a1-a1-"]), stats("max", ["run-a1-a1-"])
    expected = {(HOST_1, gpu, dcgm_exporter.uuid(HOST_1, gpu)) for gpu in (0, 1)}
    assert set(average) == set(peak) == expected
    for (_host, gpu, _uuid), points in average.items():
        assert len(points) == 3  # a point every 2 s, both ends included
        assert {value for _moment, value in points} == {80.0 if gpu == 0 else 60.0}
    assert stats("avg", []) == {}
    with pytest.raises(ValueError, match="over must be avg or max"):
        stats("sum", ["run-a1-a1-"])


def test_unsupported_values_and_missing_metrics_are_none_and_an_xid_shows(
    prometheus: PrometheusServer, dcgm_exporter: Any
) -> None:
    exporter = dcgm_exporter
    exporter.frame = 30
    exporter.set_value(HOST_2, 7, "xid", 79)  # GPU has fallen off the bus
    exporter.set_value(HOST_2, 6, "tensor_active", None)  # the exporter does not offer it
    exporter.set_value(HOST_2, 5, "dram_active", 9223372036854775794)  # DCGM_INT64_NOT_SUPPORTED
    exporter.set_value(HOST_2, 4, "power_w", BLANK)  # DCGM_INT32_BLANK
    exporter.set_value(HOST_2, 3, "sm_clock_mhz", 140737488355328.0)  # DCGM_FP64_BLANK
    prometheus.wait_for("DCGM_FI_DEV_XID_ERRORS == 79", lambda found: len(found) == 1)
    prometheus.wait_for(
        f'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{gpu="6",Hostname="{HOST_2}"}}', lambda found: not found
    )
    prometheus.wait_until_served()

    samples = {(s.host, s.index): s for s in prometheus.telemetry().current()}

    assert samples == {key: expected(exporter, *key) for key in every_gpu(exporter)}
    assert samples[(HOST_2, 7)].xid == 79
    assert {s.xid for key, s in samples.items() if key != (HOST_2, 7)} == {0}
    assert samples[(HOST_2, 6)].tensor_active is None
    assert samples[(HOST_2, 6)].utilization is not None
    assert samples[(HOST_2, 5)].dram_active is None
    assert samples[(HOST_2, 4)].power_w is None
    assert samples[(HOST_2, 3)].sm_clock_mhz is None
    assert all(s.tensor_active is not None for key, s in samples.items() if key != (HOST_2, 6))
    # No blank reaches an aggregate Prometheus computes either.
    end = now()
    per_host = prometheus.telemetry().host_history(
        "power_w", end - timedelta(seconds=2), end, how="max", hosts=[HOST_2]
    )
    assert max(value for _moment, value in per_host[HOST_2]) <= 700


def test_a_stopped_prometheus_is_unavailable_within_the_timeout_and_comes_back(
    prometheus: PrometheusServer, dcgm_exporter: Any
) -> None:
    telemetry = prometheus.telemetry(timeout=1.0)
    dcgm_exporter.frame = 90
    prometheus.wait_until_served()
    time.sleep(2)  # a few scrapes that must survive the restart
    before_stop = now()
    prometheus.stop()
    try:
        started = time.monotonic()
        with pytest.raises(TelemetryUnavailable) as raised:
            telemetry.current()
        assert time.monotonic() - started < 1.0
        assert f"Prometheus at {prometheus.url} cannot be reached" in str(raised.value)
        with pytest.raises(TelemetryUnavailable):
            telemetry.history("utilization", before_stop - timedelta(minutes=5), now())
    finally:
        prometheus.start()
    # The same address, the data kept: what was scraped before the stop is still there.
    assert telemetry.client.url == prometheus.url
    prometheus.wait_until_served()
    assert gpus_of(telemetry.current()) == set(every_gpu(dcgm_exporter))
    history = telemetry.history("utilization", before_stop - timedelta(seconds=30), now())
    assert any(points[0][0] <= before_stop for points in history.values())


def test_names_are_configurable_and_a_bad_one_is_refused(
    prometheus: PrometheusServer, dcgm_exporter: Any
) -> None:
    with pytest.raises(ValueError, match=r"unknown key 'gpu_util'.*utilization"):
        MetricNames.from_overrides('{"gpu_util": "DCGM_FI_DEV_GPU_UTIL"}', "")
    with pytest.raises(ValueError, match="not a valid Prometheus name"):
        MetricNames.from_overrides('{"utilization": "DCGM_FI_DEV_GPU_UTIL{"}', "")
    dcgm_exporter.frame = 60
    prometheus.wait_until_served()

    # Another metric under a field, and a metric nobody serves: read, and None.
    names = MetricNames.from_overrides(
        '{"utilization": "DCGM_FI_DEV_GPU_TEMP", "tensor_active": "no_such_metric"}', ""
    )
    samples = prometheus.telemetry(names).current(hosts=[HOST_1])
    assert len(samples) == 8
    for sample in samples:
        served = dcgm_exporter.served(HOST_1, sample.index)
        assert sample.utilization == served["temperature_c"]
        assert sample.tensor_active is None
        assert sample.power_w == served["power_w"]

    # A label nobody serves: no series says which GPU it is about, so none is shown.
    nowhere = MetricNames.from_overrides("", '{"host": "kubernetes_node"}')
    assert prometheus.telemetry(nowhere).current() == []

    # A query Prometheus refuses is a query error, with Prometheus' own words.
    with (
        prometheus.client() as client,
        pytest.raises(TelemetryQueryError, match=r"bad_data.*parse error"),
    ):
        client.query("DCGM_FI_DEV_GPU_UTIL{")


def test_hostname_and_Hostname_both_name_the_host(
    prometheus: PrometheusServer, dcgm_exporter: Any
) -> None:
    telemetry = prometheus.telemetry()
    only_lower = DcgmTelemetry(
        telemetry.client, MetricNames.from_overrides("", '{"host": "hostname"}'), scrape_interval=1
    )
    for label, other in (("hostname", "Hostname"), ("Hostname", "hostname")):
        dcgm_exporter.host_label = label
        dcgm_exporter.frame = 70
        prometheus.wait_for(f'count(DCGM_FI_DEV_GPU_UTIL{{{label}!=""}})', count_is(16))
        prometheus.wait_for(f'count(DCGM_FI_DEV_GPU_UTIL{{{other}!=""}})', count_is(0))
        prometheus.wait_until_served()

        assert telemetry.current() == [
            expected(dcgm_exporter, host, gpu) for host, gpu in every_gpu(dcgm_exporter)
        ]
        assert telemetry.current(hosts=[HOST_2]) == [
            expected(dcgm_exporter, HOST_2, gpu) for gpu in range(8)
        ]
        end = now()
        history = telemetry.history(
            "temperature_c", end - timedelta(seconds=3), end, hosts=[HOST_2]
        )
        assert {key[:2] for key in history} == {(HOST_2, gpu) for gpu in range(8)}
        per_host = telemetry.host_history("temperature_c", end - timedelta(seconds=3), end)
        assert set(per_host) == set(HOSTS)
        # An override naming only one spelling sees the GPUs only while it is served.
        lower = only_lower.current()
        assert len(lower) == (16 if label == "hostname" else 0)
