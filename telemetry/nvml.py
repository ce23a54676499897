"""The GPUs of this machine, through NVIDIA's management library (NVML, the library behind
``nvidia-smi``), for the embedded default: ``make run`` on a workstation with GPUs and no
cluster shows this machine as the one node of its fleet, with live telemetry.

NVML comes with the driver (``libnvidia-ml.so.1``); the Python bindings are PyPI's
``nvidia-ml-py`` (module ``pynvml``, NVIDIA's own). On a machine without the driver, the
usual case for a laptop or a CI runner, the library does not load: that is an answer ("no
NVIDIA driver on this machine"), not a failure, so nothing here raises. Every field is read
on its own, because GPUs differ in what they report (power is not supported on some boards, a
GPU that fell off the bus answers nothing at all): what a GPU does not say is ``None``.

NVML is initialised and shut down around each read. Its initialisation is reference-counted
and cheap once the library is loaded, and holding it open would keep a handle on every GPU in
a long-lived web or Celery process for nothing between reads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from telemetry.samples import GpuSample

__all__ = ["LocalGpus", "local_gpus", "probe_local_gpus"]

logger = logging.getLogger(__name__)

MIB = 1024 * 1024

T = TypeVar("T")


@dataclass(frozen=True)
class LocalGpus:
    """What NVML said about this machine: ``gpus`` is None when NVML could not be loaded
    (no driver, or ``nvidia-ml-py`` missing) and ``reason`` says why in a sentence a page can
    show; an empty list when NVML works and finds no GPU (``reason`` says that too)."""

    gpus: list[GpuSample] | None
    reason: str = ""
    driver_version: str = ""


def local_gpus(host: str) -> list[GpuSample] | None:
    """This machine's GPUs as samples named ``host``; None when NVML cannot load (no NVIDIA
    driver here), [] when it loads and finds none. Never raises."""
    return probe_local_gpus(host).gpus


def probe_local_gpus(host: str) -> LocalGpus:
    """:func:`local_gpus`, with the reason when there are none."""
    try:
        import pynvml
    except ImportError as error:
        return LocalGpus(
            None,
            f"the NVML bindings are not installed (nvidia-ml-py, in the server extra: {error})",
        )
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return LocalGpus(None, f"no NVIDIA driver on this machine (NVML: {_said(error)})")
    except OSError as error:  # a library that is there but cannot be loaded
        return LocalGpus(None, f"no NVIDIA driver on this machine (NVML: {error})")
    try:
        return _read(pynvml, host)
    except pynvml.NVMLError as error:
        # Loaded, then failed as a whole (the driver is being reloaded, say).
        return LocalGpus(None, f"NVML could not list this machine's GPUs: {_said(error)}")
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as error:
            logger.debug("nvmlShutdown: %s", _said(error))


def _read(nvml: Any, host: str) -> LocalGpus:
    driver = _text(_field(nvml, nvml.nvmlSystemGetDriverVersion)) or ""
    count = int(nvml.nvmlDeviceGetCount())
    if count == 0:
        where = f" (driver {driver})" if driver else ""
        return LocalGpus([], f"NVML found no NVIDIA GPU on this machine{where}", driver)
    return LocalGpus([_sample(nvml, host, index) for index in range(count)], "", driver)


def _sample(nvml: Any, host: str, index: int) -> GpuSample:
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except nvml.NVMLError as error:
        # A GPU that fell off the bus is still one of this machine's: counted, with nothing
        # known about it.
        logger.warning("NVML cannot open GPU %d: %s", index, _said(error))
        return GpuSample(host=host, index=index, uuid="", model="")
    utilization = _field(nvml, nvml.nvmlDeviceGetUtilizationRates, handle)
    memory = _field(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
    temperature = _field(nvml, nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
    power_mw = _field(nvml, nvml.nvmlDeviceGetPowerUsage, handle)
    sm_clock = _field(nvml, nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM)
    return GpuSample(
        host=host,
        index=index,
        uuid=_text(_field(nvml, nvml.nvmlDeviceGetUUID, handle)) or "",
        model=_text(_field(nvml, nvml.nvmlDeviceGetName, handle)) or "",
        utilization=float(utilization.gpu) if utilization is not None else None,
        memory_used_mib=memory.used / MIB if memory is not None else None,
        memory_free_mib=memory.free / MIB if memory is not None else None,
        temperature_c=float(temperature) if temperature is not None else None,
        power_w=power_mw / 1000 if power_mw is not None else None,
        sm_clock_mhz=float(sm_clock) if sm_clock is not None else None,
    )


def _field(nvml: Any, read: Callable[..., T], *args: Any) -> T | None:
    """One reading, or None when this GPU does not support it or cannot answer."""
    try:
        return read(*args)
    except nvml.NVMLError as error:
        logger.debug("NVML %s: %s", getattr(read, "__name__", read), _said(error))
        return None


def _text(value: object) -> str | None:
    """Strings from NVML: ``bytes`` from older bindings, ``str`` from current ones."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _said(error: BaseException) -> str:
    return str(error) or type(error).__name__
