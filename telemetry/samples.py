"""What the telemetry adapter hands the portal: plain, frozen values, no client objects."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one moment, as an exporter or NVML reported it. ``None``: not reported
    (the exporter does not offer the field, or gave its "unsupported" sentinel)."""

    host: str  # the node's name (dcgm-exporter's Hostname/hostname label; this machine's)
    index: int  # the GPU's index on its host (the ``gpu`` label)
    uuid: str
    model: str
    utilization: float | None = None  # percent, 0-100
    memory_used_mib: float | None = None
    memory_free_mib: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    xid: int | None = None  # the last XID error (0: none)
    tensor_active: float | None = None  # ratio, 0-1 (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)
    dram_active: float | None = None  # ratio, 0-1 (DCGM_FI_PROF_DRAM_ACTIVE)
    # With the exporter's pod mapping on: the pod holding this GPU.
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.host, self.index, self.uuid)
