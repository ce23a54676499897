#!/usr/bin/env python3
"""Record real GPU readings as frames deploy/dev/dcgm_replay.py can serve.

    pip install nvidia-ml-py
    python deploy/dev/record_dcgm.py --pattern training --interval 1 --samples 240 \\
        --note "8 x H100 SXM, Llama 8B FSDP, step time 1.1 s" \\
        --out tests/telemetry/data/h100x8-training.jsonl

Why: the frames committed in tests/telemetry/data/ are synthesised (no GPU was available when
they were made). On a machine with NVIDIA GPUs, run this while the workload of interest runs
(a training job for ``training``; nothing for ``idle``; a process holding memory and doing
nothing for ``held-idle``), replace the file, and update tests/telemetry/data/README.md to say
what was recorded, where and when.

Every ``--interval`` seconds, for ``--samples`` samples, every GPU is read through NVML (the
``pynvml`` module of ``nvidia-ml-py``), in dcgm-exporter's units:

- ``utilization``: nvmlDeviceGetUtilizationRates().gpu, percent (DCGM_FI_DEV_GPU_UTIL);
- ``memory_used_mib``/``memory_free_mib``: nvmlDeviceGetMemoryInfo (version 2 where the
  driver has it, whose ``used`` leaves out the driver's reservation, as DCGM's FB_USED does),
  MiB (DCGM_FI_DEV_FB_USED/_FREE);
- ``temperature_c``: nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU), C (DCGM_FI_DEV_GPU_TEMP);
- ``power_w``: nvmlDeviceGetPowerUsage, milliwatts / 1000 (DCGM_FI_DEV_POWER_USAGE);
- ``sm_clock_mhz``: nvmlDeviceGetClockInfo(NVML_CLOCK_SM), MHz (DCGM_FI_DEV_SM_CLOCK);
- ``xid``: the last XID seen since the recording started, from an NVML event set registered
  for critical XID events (DCGM_FI_DEV_XID_ERRORS is also the last XID); 0 until one comes;
  ``null`` where the GPU cannot deliver XID events;
- ``tensor_active``/``dram_active``: ``null``. DCGM computes them from its profiling
  counters, which NVML does not expose in the same form; the replay then does not serve
  them, as dcgm-exporter does not on a GPU without profiling metrics.

A reading NVML refuses (NotSupported, NoPermission) is ``null`` for that sample. Standard
library plus ``pynvml``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

FORMAT = "taugrid-dcgm-frames/1"
FIELDS = (
    "utilization",
    "memory_used_mib",
    "memory_free_mib",
    "temperature_c",
    "power_w",
    "sm_clock_mhz",
    "xid",
    "tensor_active",
    "dram_active",
)
MIB = 1024 * 1024


def text(value: Any) -> str:
    """NVML strings: bytes in old bindings, str in new ones."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class Reader:
    """Reads the fields of every GPU through an NVML binding (the ``pynvml`` module)."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        nvml.nvmlInit()
        count = nvml.nvmlDeviceGetCount()
        if count == 0:
            raise SystemExit("NVML sees no GPU on this machine: nothing to record")
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(index) for index in range(count)]
        self.uuids = [text(nvml.nvmlDeviceGetUUID(handle)) for handle in self.handles]
        self.last_xid: list[int | None] = [None] * count
        self.events: Any = None
        try:
            self.events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError:
            self.events = None
        for index, handle in enumerate(self.handles):
            if self.events is None:
                break
            try:
                nvml.nvmlDeviceRegisterEvents(
                    handle, nvml.nvmlEventTypeXidCriticalError, self.events
                )
                self.last_xid[index] = 0
            except nvml.NVMLError:
                pass  # this GPU cannot report XIDs: null, not a made-up 0

    def close(self) -> None:
        if self.events is not None:
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlEventSetFree(self.events)
        self.nvml.nvmlShutdown()

    def describe(self) -> tuple[str, list[dict[str, Any]]]:
        nvml = self.nvml
        gpus = []
        for index, handle in enumerate(self.handles):
            memory = self._memory(handle)
            gpus.append(
                {
                    "gpu": index,
                    "model": text(nvml.nvmlDeviceGetName(handle)),
                    "pci_bus_id": text(nvml.nvmlDeviceGetPciInfo(handle).busId),
                    "device": f"nvidia{index}",
                    "memory_total_mib": None if memory is None else int(memory.total // MIB),
                    "recorded_uuid": self.uuids[index],
                }
            )
        return text(nvml.nvmlSystemGetDriverVersion()), gpus

    def wait_for_xids(self, seconds: float) -> None:
        """Sleep ``seconds``, noting any XID event that arrives meanwhile."""
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self.events is None:
                time.sleep(left)
                return
            try:
                event = self.nvml.nvmlEventSetWait(self.events, max(1, int(left * 1000)))
            except self.nvml.NVMLError:
                continue  # the timeout is an NVMLError too: look at the clock again
            # Handles are ctypes pointers, which compare by identity: match by UUID.
            try:
                source = text(self.nvml.nvmlDeviceGetUUID(event.device))
            except self.nvml.NVMLError:
                continue
            if source in self.uuids:
                self.last_xid[self.uuids.index(source)] = int(event.eventData)

    def sample(self) -> list[list[float | int | None]]:
        rows = []
        for index, handle in enumerate(self.handles):
            memory = self._memory(handle)
            used = free = None
            if memory is not None:
                used, free = int(memory.used // MIB), int(memory.free // MIB)
            power = self._read(self.nvml.nvmlDeviceGetPowerUsage, handle)
            rows.append(
                [
                    self._read(lambda h: self.nvml.nvmlDeviceGetUtilizationRates(h).gpu, handle),
                    used,
                    free,
                    self._read(
                        lambda h: self.nvml.nvmlDeviceGetTemperature(
                            h, self.nvml.NVML_TEMPERATURE_GPU
                        ),
                        handle,
                    ),
                    None if power is None else round(power / 1000.0, 3),
                    self._read(
                        lambda h: self.nvml.nvmlDeviceGetClockInfo(h, self.nvml.NVML_CLOCK_SM),
                        handle,
                    ),
                    self.last_xid[index],
                    None,
                    None,
                ]
            )
        return rows

    def _memory(self, handle: Any) -> Any:
        nvml = self.nvml
        version = getattr(nvml, "nvmlMemory_v2", None)
        if version is not None:
            try:
                return nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            except (nvml.NVMLError, TypeError):
                pass
        try:
            return nvml.nvmlDeviceGetMemoryInfo(handle)
        except nvml.NVMLError:
            return None

    def _read(self, call: Callable[[Any], Any], handle: Any) -> int | None:
        try:
            return int(call(handle))
        except self.nvml.NVMLError:
            return None


def record(
    nvml: Any,
    *,
    pattern: str,
    interval: float,
    samples: int,
    note: str,
    progress: Callable[[str], None] = lambda _line: None,
) -> str:
    """The frame file's text: a header saying what was recorded where, then the samples."""
    reader = Reader(nvml)
    try:
        driver, gpus = reader.describe()
        started = datetime.now(tz=UTC)
        source = (
            f"RECORDED through NVML by deploy/dev/record_dcgm.py on {socket.gethostname()} "
            f"({len(gpus)} x {gpus[0]['model']}, driver {driver}) starting "
            f"{started.isoformat(timespec='seconds')}, every {interval:g} s"
            + (f": {note}" if note else "")
        )
        header = {
            "format": FORMAT,
            "pattern": pattern,
            "synthesised": False,
            "source": source,
            "interval_seconds": interval,
            "driver_version": driver,
            "fields": list(FIELDS),
            "gpus": gpus,
        }
        lines = [json.dumps(header, separators=(",", ":"))]
        begin = time.monotonic()
        for number in range(samples):
            if number:
                reader.wait_for_xids(begin + number * interval - time.monotonic())
            elapsed = round(time.monotonic() - begin, 3)
            lines.append(json.dumps({"t": elapsed, "gpus": reader.sample()}, separators=(",", ":")))
            progress(f"sample {number + 1}/{samples}")
        return "\n".join(lines) + "\n"
    finally:
        reader.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Record GPU readings through NVML as frames.")
    parser.add_argument("--pattern", required=True, help="training, idle, held-idle, ...")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--samples", type=int, default=240)
    parser.add_argument("--note", default="", help="what ran on the GPUs, for the header")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.interval <= 0 or args.samples < 1:
        parser.error("--interval must be positive and --samples at least 1")
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        print("record_dcgm: needs nvidia-ml-py (pip install nvidia-ml-py)", file=sys.stderr)
        return 2
    try:
        frames = record(
            pynvml,
            pattern=args.pattern,
            interval=args.interval,
            samples=args.samples,
            note=args.note,
            progress=lambda line: print(f"record_dcgm: {line}", file=sys.stderr),
        )
    except pynvml.NVMLError as error:
        print(f"record_dcgm: NVML failed: {error}", file=sys.stderr)
        return 1
    args.out.write_text(frames, encoding="utf-8")
    print(f"record_dcgm: wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
