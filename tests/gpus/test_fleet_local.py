"""The embedded default (``TAU_BACKEND=local``): the fleet is this machine, with the GPUs NVML
finds (telemetry/nvml.py, gpus/fleet.py ``local_fleet``).

The test machines have no NVIDIA GPU and no driver, so the real path here is the one they
take: NVML does not load, the fleet is empty and FleetSync says why. (On a machine with the
driver the same test checks the other answer: one node with as many GPUs as NVML counts.)

The GPU path itself is checked against a stand-in ``pynvml`` module: a unit test, because no
test machine has a GPU. The stand-in answers in NVML's units and types as NVIDIA's bindings
document them (bytes of memory, milliwatts, percent, ``bytes`` names from older bindings,
``NVMLError_NotSupported`` for a reading a board does not offer).
"""

from __future__ import annotations

import ctypes
import socket
import sys
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from gpus.fleet import sync_fleet
from gpus.models import FleetSync, GpuNode, NodeSource
from runs.models import RunState
from telemetry.nvml import local_gpus, probe_local_gpus
from telemetry.samples import GpuSample
from tests.runs.factories import make_run

MIB = 1024 * 1024


def driver_here() -> bool:
    """Whether this machine has NVML's library (an NVIDIA driver), asked without pynvml."""
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.mark.django_db
def test_the_local_fleet_of_this_machine(settings: Any) -> None:
    settings.TAU_BACKEND = "local"
    # A node left from a cluster this installation used before: not this machine's fleet.
    GpuNode.objects.create(name="gpu-old-1", source=NodeSource.KUBERNETES, gpus_total=8)

    result = sync_fleet()

    assert result.ok
    sync = FleetSync.objects.get(pk=1)
    assert sync.source == "local"
    assert sync.last_success_at == sync.last_attempt_at
    if not driver_here():
        assert local_gpus(socket.gethostname()) is None
        assert result.error.startswith("no NVIDIA driver on this machine (NVML: ")
        assert "Not Found" in result.error  # pynvml's NVMLError_LibraryNotFound, as it says it
        assert sync.last_error == result.error
        assert sync.node_count == 0
        assert list(GpuNode.objects.all()) == []
    else:
        gpus = local_gpus(socket.gethostname())
        assert gpus is not None
        names = list(GpuNode.objects.values_list("name", flat=True))
        assert names == ([socket.gethostname()] if gpus else [])
        if gpus:
            assert GpuNode.objects.get().gpus_total == len(gpus)


def fake_nvml(*, count: int = 2, init_error: str | None = None) -> ModuleType:
    """A stand-in for NVIDIA's ``pynvml`` (see the module docstring)."""
    nvml = ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        def __str__(self) -> str:
            return "Not Supported"

    class NVMLError_DriverNotLoaded(NVMLError):
        def __str__(self) -> str:
            return "Driver Not Loaded"

    calls: list[str] = []

    def init() -> None:
        calls.append("init")
        if init_error is not None:
            raise NVMLError_DriverNotLoaded()

    def power(handle: int) -> int:
        if handle == 1:
            raise NVMLError_NotSupported()
        return 312_500  # milliwatts

    def name(handle: int) -> str | bytes:
        return "NVIDIA H100 80GB HBM3" if handle == 0 else b"NVIDIA H100 80GB HBM3"

    attributes: dict[str, Any] = {
        "NVMLError": NVMLError,
        "NVMLError_NotSupported": NVMLError_NotSupported,
        "NVML_TEMPERATURE_GPU": 0,
        "NVML_CLOCK_SM": 1,
        "calls": calls,
        "nvmlInit": init,
        "nvmlShutdown": lambda: calls.append("shutdown"),
        "nvmlSystemGetDriverVersion": lambda: "570.86.15",
        "nvmlDeviceGetCount": lambda: count,
        "nvmlDeviceGetHandleByIndex": lambda index: index,
        "nvmlDeviceGetName": name,
        "nvmlDeviceGetUUID": lambda handle: (
            f"GPU-6a2c{handle}f1e-0000-4000-8000-00000000000{handle}"
        ),
        "nvmlDeviceGetUtilizationRates": lambda handle: SimpleNamespace(gpu=87 - handle, memory=40),
        "nvmlDeviceGetMemoryInfo": lambda handle: SimpleNamespace(
            total=81559 * MIB, used=40960 * MIB, free=40599 * MIB
        ),
        "nvmlDeviceGetTemperature": lambda handle, sensor: 61,
        "nvmlDeviceGetPowerUsage": power,
        "nvmlDeviceGetClockInfo": lambda handle, clock: 1980,
    }
    for key, value in attributes.items():
        setattr(nvml, key, value)
    return nvml


def test_nvml_samples_each_gpu_and_leaves_out_what_it_does_not_support(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nvml = fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    probe = probe_local_gpus("workstation")
    assert probe.reason == ""
    assert probe.driver_version == "570.86.15"
    assert probe.gpus == [
        GpuSample(
            host="workstation",
            index=0,
            uuid="GPU-6a2c0f1e-0000-4000-8000-000000000000",
            model="NVIDIA H100 80GB HBM3",
            utilization=87.0,
            memory_used_mib=40960.0,
            memory_free_mib=40599.0,
            temperature_c=61.0,
            power_w=312.5,
            sm_clock_mhz=1980.0,
        ),
        GpuSample(
            host="workstation",
            index=1,
            uuid="GPU-6a2c1f1e-0000-4000-8000-000000000001",
            model="NVIDIA H100 80GB HBM3",  # bytes from older bindings, decoded
            utilization=86.0,
            memory_used_mib=40960.0,
            memory_free_mib=40599.0,
            temperature_c=61.0,
            power_w=None,  # not supported on this board
            sm_clock_mhz=1980.0,
        ),
    ]
    assert nvml.calls == ["init", "shutdown"]


def test_nvml_without_gpus_and_without_a_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(count=0))
    empty = probe_local_gpus("workstation")
    assert empty.gpus == []
    assert empty.reason == "NVML found no NVIDIA GPU on this machine (driver 570.86.15)"

    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(init_error="driver"))
    missing = probe_local_gpus("workstation")
    assert missing.gpus is None
    assert missing.reason == "no NVIDIA driver on this machine (NVML: Driver Not Loaded)"
    assert local_gpus("workstation") is None


GPU_SPEC = b"""schema_version: 1
name: finetune
run:
  entrypoint: main.py
  workload_kind: job
compute:
  cpus: 1
  memory: 256Mi
  gpus: 1
"""


@pytest.mark.django_db
def test_the_local_node_with_gpus_and_the_local_runs_holding_them(
    monkeypatch: pytest.MonkeyPatch, settings: Any, world: Any
) -> None:
    settings.TAU_BACKEND = "local"
    settings.TAU_LOCAL_GPUS = 2
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    running = make_run(world, spec=GPU_SPEC, state=RunState.RUNNING)
    make_run(world, spec=GPU_SPEC, state=RunState.SUCCEEDED)  # finished: holds nothing
    make_run(world, state=RunState.RUNNING)  # CPU only

    result = sync_fleet()

    assert result.ok
    assert result.error == ""
    node = GpuNode.objects.get()
    assert node.name == socket.gethostname()
    assert node.source == "local"
    assert node.gpu_model == "NVIDIA H100 80GB HBM3"
    assert (node.gpus_total, node.gpus_allocatable, node.gpus_in_use) == (2, 2, 1)
    assert node.healthy
    assert node.runs == [
        {
            "workspace": "alpha",
            "run": running.name,
            "namespace": "",
            "pod": "",
            "gpus": 1,
        }
    ]
    assert FleetSync.objects.get(pk=1).last_error == ""

    # The GPUs gone (the driver unloaded): the fleet is empty again, and says why.
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(init_error="driver"))
    again = sync_fleet()
    assert again.deleted == 1
    assert not GpuNode.objects.exists()
    assert FleetSync.objects.get(pk=1).last_error == (
        "no NVIDIA driver on this machine (NVML: Driver Not Loaded)"
    )
