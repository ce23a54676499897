"""The replayed exporter's inputs and output: the committed frames are exactly what their
documented generator writes and say they are synthesised, the exporter's text parses as
Prometheus exposition with dcgm-exporter's names and labels, the hand-run script and the demo
scrape config work, and the recorder writes frames the replay reads."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.scripts import load_script
from tests.telemetry.plugin import free_port, load_replay

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"
GENERATOR = DATA / "generate_frames.py"
REPLAY = REPO / "deploy" / "dev" / "dcgm_replay.py"
RECORDER = REPO / "deploy" / "dev" / "record_dcgm.py"
DEMO_CONFIG = REPO / "deploy" / "dev" / "prometheus-demo.yml"


def test_the_committed_frames_are_exactly_what_the_seeded_generator_writes(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "wrote" in done.stderr
    written = sorted(path.name for path in tmp_path.glob("*.jsonl"))
    assert written == sorted(path.name for path in DATA.glob("*.jsonl"))
    for name in written:
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name
    total = sum((DATA / name).stat().st_size for name in written)
    assert total < 300 * 1024


def test_the_frames_say_they_are_synthesised_and_the_readme_says_so_too() -> None:
    replay = load_replay()
    recordings = replay.load_recordings(DATA)
    assert set(recordings) == {"training", "idle", "held-idle"}
    for recording in recordings.values():
        header = json.loads(recording.path.read_text(encoding="utf-8").splitlines()[0])
        assert header["synthesised"] is True
        assert recording.source.startswith("SYNTHESISED, NOT RECORDED")
        assert "generate_frames.py" in recording.source
    readme = (DATA / "README.md").read_text(encoding="utf-8")
    assert "synthesised" in readme.lower()
    assert "record_dcgm.py" in readme


def test_the_training_frames_stay_in_the_modelled_ranges() -> None:
    training = load_replay().load_recordings(DATA)["training"]
    assert len(training.frames) == 240
    steady = [
        gpu
        for number, frame in enumerate(training.frames)
        if not 45 <= number % 60 < 50  # the checkpoints
        for gpu in frame
    ]
    assert len(steady) == 8 * 220  # 240 frames, 4 checkpoints of 5

    for field, low, high in (
        ("utilization", 85, 99),
        ("memory_used_mib", 62 * 1024, 71 * 1024),
        ("temperature_c", 55, 75),
        ("power_w", 350, 690),
        ("sm_clock_mhz", 1755, 1980),
        ("tensor_active", 0.35, 0.6),
        ("dram_active", 0.25, 0.45),
    ):
        values = [gpu[field] for gpu in steady]
        assert low <= min(values), field
        assert max(values) <= high, field
    assert all(gpu["memory_used_mib"] + gpu["memory_free_mib"] == 81029 for gpu in steady)
    # The dips: every checkpoint drags every GPU down at once.
    dips = [training.frames[number] for number in range(240) if 45 <= number % 60 < 50]
    assert max(gpu["utilization"] for frame in dips for gpu in frame) <= 30


def test_the_exporter_text_is_dcgm_exporters_format() -> None:
    replay = load_replay()
    exporter = replay.DcgmReplay(replay.load_recordings(DATA))
    exporter.set_hosts(["gpu-h100-1", "gpu-h100-2"], gpus=2)
    exporter.frame = 3
    exporter.assign("gpu-h100-2", 1, namespace="tau-alpha", pod="run-7", container="trainer")
    exporter.set_value("gpu-h100-1", 0, "xid", 79)
    exporter.set_value("gpu-h100-1", 1, "dram_active", None)
    exporter.set_value("gpu-h100-2", 0, "tensor_active", 9223372036854775794)
    exporter.set_pattern("gpu-h100-2", "idle", gpus=[0])
    text = exporter.render()

    assert text.startswith("# TauGrid's dcgm-exporter replay")
    assert "SYNTHESISED, NOT RECORDED" in text.splitlines()[0]
    assert "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %)." in text
    assert "# TYPE DCGM_FI_DEV_FB_USED gauge" in text
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{" in text
    assert "} 9223372036854775794\n" in text  # written as dcgm-exporter writes an int64
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert set(families) == {metric for metric, _help in replay.METRICS.values()}
    by_gpu: dict[tuple[str, str, str], Any] = {}
    for family in families.values():
        assert family.type == "gauge"
        for sample in family.samples:
            by_gpu[(sample.labels["Hostname"], sample.labels["gpu"], family.name)] = sample
    util = by_gpu[("gpu-h100-2", "1", "DCGM_FI_DEV_GPU_UTIL")]
    assert util.labels == {
        "gpu": "1",
        "UUID": exporter.uuid("gpu-h100-2", 1),
        "pci_bus_id": "00000000:2A:00.0",
        "device": "nvidia1",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "gpu-h100-2",
        "DCGM_FI_DRIVER_VERSION": "550.54.15",
        "container": "trainer",
        "namespace": "tau-alpha",
        "pod": "run-7",
    }
    assert util.value == exporter.served("gpu-h100-2", 1)["utilization"]
    xid = by_gpu[("gpu-h100-1", "0", "DCGM_FI_DEV_XID_ERRORS")]
    assert xid.value == 79
    assert (xid.labels["err_code"], xid.labels["err_msg"]) == ("79", "GPU has fallen off the bus")
    assert "pod" not in by_gpu[("gpu-h100-1", "0", "DCGM_FI_DEV_GPU_UTIL")].labels
    assert ("gpu-h100-1", "1", "DCGM_FI_PROF_DRAM_ACTIVE") not in by_gpu
    idle = exporter.served("gpu-h100-2", 0)
    assert (idle["utilization"], idle["sm_clock_mhz"], idle["memory_used_mib"]) == (0, 345, 0)
    # Hosts replay different frames; the frame moves once unpinned.
    assert exporter.served("gpu-h100-1", 1) != exporter.served("gpu-h100-2", 1)
    exporter.frame = None
    exporter.clear_override("gpu-h100-1", 0)
    assert exporter.served("gpu-h100-1", 0)["xid"] == 0


def test_the_exporter_refuses_what_it_does_not_serve() -> None:
    replay = load_replay()
    exporter = replay.DcgmReplay(replay.load_recordings(DATA))
    exporter.set_hosts(["gpu-h100-1"], gpus=8)
    with pytest.raises(ValueError, match="not served"):
        exporter.assign("gpu-h100-9", 0, namespace="a", pod="b")
    with pytest.raises(ValueError, match="GPUs 0-7"):
        exporter.set_value("gpu-h100-1", 8, "utilization", 1)
    with pytest.raises(ValueError, match="unknown field 'util'"):
        exporter.set_value("gpu-h100-1", 0, "util", 1)
    with pytest.raises(ValueError, match="no recording of pattern 'busy'"):
        exporter.set_pattern("gpu-h100-1", "busy")


def test_a_frame_file_that_does_not_parse_is_refused_with_its_line(tmp_path: Path) -> None:
    replay = load_replay()
    lines = (DATA / "h100x8-idle.jsonl").read_text(encoding="utf-8").splitlines()
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join([lines[0], lines[1], '{"t": 1, "gpus": [[1, 2]]}']) + "\n")
    with pytest.raises(ValueError, match=r"broken.jsonl:3: expected 8 GPUs of 9 values"):
        replay.load_recording(broken)
    not_frames = tmp_path / "other.jsonl"
    not_frames.write_text('{"format": "something-else"}\n')
    with pytest.raises(ValueError, match="not a taugrid-dcgm-frames/1 header"):
        replay.load_recording(not_frames)


def test_the_hand_run_script_serves_the_hosts_and_pods_it_is_given() -> None:
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            str(REPLAY),
            "--hosts",
            "gpu-h100-1,gpu-h100-2",
            "--port",
            str(port),
            "--gpus",
            "4",
            "--host-label",
            "hostname",
            "--assign",
            "gpu-h100-2:3=tau-alpha/run-9",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", trust_env=False).text
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.2)
    finally:
        process.terminate()
        _out, stderr = process.communicate(timeout=10)
    assert process.returncode == 0, stderr
    assert "SYNTHESISED, NOT RECORDED" in stderr
    samples = [
        sample
        for family in text_string_to_metric_families(text)
        if family.name == "DCGM_FI_DEV_GPU_UTIL"
        for sample in family.samples
    ]
    assert sorted((s.labels["hostname"], s.labels["gpu"]) for s in samples) == [
        (host, str(gpu)) for host in ("gpu-h100-1", "gpu-h100-2") for gpu in range(4)
    ]
    assert [s.labels.get("pod") for s in samples if s.labels.get("namespace")] == ["run-9"]
    assert all("Hostname" not in s.labels for s in samples)


def test_the_hand_run_script_explains_a_bad_assignment() -> None:
    done = subprocess.run(
        [sys.executable, str(REPLAY), "--assign", "gpu-h100-1=run-1"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert done.returncode == 2
    assert "host:gpu=namespace/pod" in done.stderr


def test_the_demo_scrape_config_is_valid_prometheus_config() -> None:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool comes with Debian's prometheus (test_tools.py)"
    done = subprocess.run(
        [promtool, "check", "config", str(DEMO_CONFIG)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "127.0.0.1:9400" in DEMO_CONFIG.read_text(encoding="utf-8")


class FakeNvml:
    """Just enough of pynvml's surface, for the recorder's units and format only: no NVML
    is on this machine (tests/telemetry/data/README.md)."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    nvmlEventTypeXidCriticalError = 8
    nvmlMemory_v2 = 0x02000028

    class NVMLError(Exception):
        pass

    def __init__(self) -> None:
        self.calls = 0
        self.shut_down = False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"570.86.15"

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "NVIDIA H200"

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-0000000{handle}-real"

    def nvmlDeviceGetPciInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(busId=f"00000000:{0x18 + handle:02X}:00.0")

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int | None = None) -> SimpleNamespace:
        mib = 1024 * 1024
        return SimpleNamespace(total=143771 * mib, used=(1000 + handle) * mib, free=142000 * mib)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        self.calls += 1
        return SimpleNamespace(gpu=(40 + handle + self.calls) % 100)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return 41

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return 123456  # milliwatts

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:
        if handle == 1:
            raise self.NVMLError("Not Supported")
        return 1980

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceRegisterEvents(self, handle: int, events: int, event_set: object) -> None:
        if handle == 1:
            raise self.NVMLError("Not Supported")

    def nvmlEventSetWait(self, event_set: object, milliseconds: int) -> SimpleNamespace:
        if self.calls == 2:  # an XID arrives on GPU 0 between the first and second sample
            self.calls += 100
            return SimpleNamespace(device=0, eventData=79)
        time.sleep(milliseconds / 1000)
        raise self.NVMLError("Timeout")

    def nvmlEventSetFree(self, event_set: object) -> None:
        pass


def test_the_recorder_writes_frames_the_replay_serves(tmp_path: Path) -> None:
    recorder = load_script(RECORDER, "taugrid_record_dcgm")
    nvml = FakeNvml()
    text = recorder.record(nvml, pattern="h200-idle", interval=0.05, samples=3, note="idle box")
    assert nvml.shut_down
    path = tmp_path / "h200-idle.jsonl"
    path.write_text(text, encoding="utf-8")

    recording = load_replay().load_recording(path)
    assert recording.pattern == "h200-idle"
    assert not recording.synthesised
    assert recording.source.startswith("RECORDED through NVML")
    assert "2 x NVIDIA H200, driver 570.86.15" in recording.source
    assert recording.source.endswith(": idle box")
    assert recording.gpus[1]["pci_bus_id"] == "00000000:19:00.0"
    assert recording.gpus[0]["memory_total_mib"] == 143771
    first, _second, third = recording.frames
    assert first[0]["power_w"] == 123.456  # milliwatts to watts
    assert first[1]["memory_used_mib"] == 1001  # bytes to MiB
    assert first[0]["sm_clock_mhz"] == 1980
    assert first[1]["sm_clock_mhz"] is None  # NVML said NotSupported: no value, not a guess
    assert first[0]["xid"] == 0
    assert third[0]["xid"] == 79  # the XID event stays as "the last XID"
    assert first[1]["xid"] is None  # no XID events from this GPU
    assert first[0]["tensor_active"] is None  # DCGM profiling counters: not through NVML
    assert first[0]["utilization"] != third[0]["utilization"]
