#!/usr/bin/env python3
"""A stand-in for NVIDIA's dcgm-exporter: serves ``/metrics`` in its text format, replaying
frames of GPU readings so the values move over time.

    python deploy/dev/dcgm_replay.py --hosts gpu-h100-1,gpu-h100-2 --port 9400
    python deploy/dev/dcgm_replay.py --hosts gpu-h100-1 --assign gpu-h100-1:0=tau-alpha/run-1

Why: the GPU pages, the fleet sync and the per-run efficiency read telemetry from Prometheus
scraping dcgm-exporter, and neither CI nor a laptop has GPUs. A real Prometheus scraping this
is the same path as production minus the GPUs (tests/telemetry/plugin.py runs it for the
suite; docs/gpus.md, "Telemetry and the demo Prometheus", for a hand-run demo with
deploy/dev/prometheus-demo.yml).

What it serves
==============

One exporter for every host it is given (a real cluster runs one per node; one target is
simpler here and Prometheus cannot tell), each host with ``--gpus`` GPUs. Per GPU, the nine
gauges TauGrid reads, with dcgm-exporter's names, HELP texts and labels: ``gpu``, ``UUID``,
``pci_bus_id``, ``device``, ``modelName``, the host label (``Hostname``, or ``hostname`` as
dcgm-exporter writes it since 2026: ``--host-label``), ``DCGM_FI_DRIVER_VERSION``, then
``container``/``namespace``/``pod`` on a GPU assigned to a pod (dcgm-exporter's pod mapping),
and ``err_code``/``err_msg`` on ``DCGM_FI_DEV_XID_ERRORS``. UUIDs are derived from the host
name and index (``GPU-`` + a UUID5), so every host's GPUs are distinct and stable.

Frames
======

A frame file (``*.jsonl``) is one recording of one node: a header line, then one line per
frame::

    {"format": "taugrid-dcgm-frames/1", "pattern": "training", "synthesised": true,
     "source": "where the values came from, in a sentence", "interval_seconds": 1.0,
     "driver_version": "550.54.15", "fields": ["utilization", ...],
     "gpus": [{"gpu": 0, "model": "...", "pci_bus_id": "...", "device": "nvidia0"}, ...]}
    {"t": 0.0, "gpus": [[97, 66123, 14906, 63, 612.4, 1980, 0, 0.512, 0.331], ...]}

``fields`` names the columns (TauGrid's GpuSample fields, in dcgm-exporter's units: percent,
MiB, C, W, MHz, the last XID, ratios 0-1); ``null`` is a field the GPU did not report (not
served). tests/telemetry/data/ holds the committed ones and says where they came from;
deploy/dev/record_dcgm.py records new ones from real GPUs.

Every host replays a pattern (``training`` by default; a GPU can replay another), one frame
per ``--frame-seconds`` of wall time, wrapping around; each host starts at a different offset
so hosts do not show the same numbers. A pinned ``frame`` stops the clock (tests pin it to
compare exact numbers); ``set_value`` pins one field of one GPU (an XID 79, 3 % utilisation).

Standard library only: it runs before (and without) the project's virtual environment.
Listens on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FRAMES_DIR = REPO / "tests" / "telemetry" / "data"
FORMAT = "taugrid-dcgm-frames/1"
LISTEN_HOST = "127.0.0.1"
DEFAULT_PATTERN = "training"
# Hosts start this many frames apart (a prime: offsets do not line up with checkpoint cycles).
HOST_OFFSET_FRAMES = 37
UUID_NAMESPACE = uuid.UUID("6f1f7f2e-7d7b-4d0e-9a55-2c1d0a7e1a17")

#: TauGrid's field -> (dcgm-exporter metric, its HELP text from etc/default-counters.csv and
#: dcp-metrics-included.csv), in the order served.
METRICS: dict[str, tuple[str, str]] = {
    "utilization": ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    "memory_used_mib": ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
    "memory_free_mib": ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
    "temperature_c": ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
    "power_w": ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
    "sm_clock_mhz": ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)."),
    "xid": ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered."),
    "tensor_active": (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
    ),
    "dram_active": (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
}
FIELDS = tuple(METRICS)
# err_msg of the XIDs a demo or test is likely to pin (dcgm-exporter writes NVIDIA's text).
XID_MESSAGES = {
    0: "No Error",
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    48: "Double Bit ECC Error",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
}

Value = float | int | None


@dataclass(frozen=True)
class Recording:
    """One frame file: its header and its frames (frame -> GPU -> one value per field)."""

    pattern: str
    source: str
    driver_version: str
    gpus: list[dict[str, Any]]
    frames: list[list[dict[str, Value]]]
    path: Path

    @property
    def synthesised(self) -> bool:
        return "NOT RECORDED" in self.source.upper() or "SYNTHESISED" in self.source.upper()


def load_recording(path: Path) -> Recording:
    """Read a frame file; a ValueError says what is wrong with it and where."""
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines:
        raise ValueError(f"{path} is empty")
    try:
        header = json.loads(lines[0])
    except ValueError as error:
        raise ValueError(f"{path}:1: the header is not JSON ({error})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(f"{path}:1: not a {FORMAT} header")
    fields = header.get("fields")
    if not isinstance(fields, list) or not set(fields) <= set(FIELDS):
        raise ValueError(f"{path}:1: fields must be a list of {', '.join(FIELDS)}")
    gpus = header.get("gpus")
    if not isinstance(gpus, list) or not gpus:
        raise ValueError(f"{path}:1: the header lists no GPUs")
    frames: list[list[dict[str, Value]]] = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            rows = json.loads(line)["gpus"]
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{path}:{number}: not a frame ({error})") from None
        if len(rows) != len(gpus) or any(len(row) != len(fields) for row in rows):
            raise ValueError(
                f"{path}:{number}: expected {len(gpus)} GPUs of {len(fields)} values each"
            )
        frames.append([dict(zip(fields, row, strict=True)) for row in rows])
    if not frames:
        raise ValueError(f"{path} has a header but no frames")
    return Recording(
        pattern=str(header.get("pattern") or path.stem),
        source=str(header.get("source") or "(the file does not say)"),
        driver_version=str(header.get("driver_version") or ""),
        gpus=gpus,
        frames=frames,
        path=path,
    )


def load_recordings(directory: Path = FRAMES_DIR) -> dict[str, Recording]:
    """Every ``*.jsonl`` frame file in ``directory``, by pattern name."""
    found: dict[str, Recording] = {}
    for path in sorted(directory.glob("*.jsonl")):
        recording = load_recording(path)
        if recording.pattern in found:
            raise ValueError(
                f"pattern {recording.pattern!r} is in both {found[recording.pattern].path} "
                f"and {path}"
            )
        found[recording.pattern] = recording
    if not found:
        raise ValueError(f"no frame files (*.jsonl) in {directory}")
    return found


def gpu_uuid(host: str, gpu: int) -> str:
    """The UUID a host's GPU is served with: stable, and distinct across hosts."""
    return f"GPU-{uuid.uuid5(UUID_NAMESPACE, f'{host}/{gpu}')}"


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_value(value: float | int) -> str:
    """Integers as integers (dcgm-exporter writes int64 fields so, the sentinel included),
    the rest as Python's shortest round-tripping float."""
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


@dataclass
class Assignment:
    namespace: str
    pod: str
    container: str


class DcgmReplay:
    """The replaying exporter: its state (hosts, pods, pinned values, the frame) and, once
    :meth:`start` ed, an HTTP server on 127.0.0.1 in a background thread. Every method is
    safe to call from any thread while it serves."""

    def __init__(
        self,
        recordings: Mapping[str, Recording] | None = None,
        *,
        frame_seconds: float = 1.0,
        host_label: str = "Hostname",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if frame_seconds <= 0:
            raise ValueError("frame_seconds must be positive")
        self.recordings = dict(recordings) if recordings is not None else load_recordings()
        if DEFAULT_PATTERN not in self.recordings:
            raise ValueError(f"no {DEFAULT_PATTERN!r} recording among {sorted(self.recordings)}")
        self.frame_seconds = frame_seconds
        self._clock = clock
        self._lock = threading.RLock()
        self._started_at = clock()
        self._pinned_frame: int | None = None
        self._host_label = host_label
        self._hosts: list[str] = []
        self._gpus: dict[str, int] = {}
        self._patterns: dict[tuple[str, int], str] = {}
        self._assignments: dict[tuple[str, int], Assignment] = {}
        self._overrides: dict[tuple[str, int, str], Value] = {}
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.scrapes = 0

    # --- what is served -----------------------------------------------------------------

    def set_hosts(
        self, hosts: Iterable[str], *, gpus: int = 8, pattern: str = DEFAULT_PATTERN
    ) -> None:
        """Serve exactly these hosts, each with ``gpus`` GPUs replaying ``pattern``. Pod
        assignments and pinned values of hosts that stay are kept."""
        names = list(dict.fromkeys(hosts))
        if any(not name for name in names):
            raise ValueError("a host needs a name")
        if gpus < 1:
            raise ValueError("a host needs at least one GPU")
        self._recording(pattern)
        with self._lock:
            self._hosts = names
            self._gpus = dict.fromkeys(names, gpus)
            self._patterns = {(name, gpu): pattern for name in names for gpu in range(gpus)}
            kept = set(self._patterns)
            self._assignments = {k: v for k, v in self._assignments.items() if k in kept}
            self._overrides = {k: v for k, v in self._overrides.items() if k[:2] in kept}

    @property
    def hosts(self) -> list[str]:
        with self._lock:
            return list(self._hosts)

    def gpus(self, host: str) -> int:
        with self._lock:
            self._check(host, 0)
            return self._gpus[host]

    def set_pattern(self, host: str, pattern: str, gpus: Iterable[int] | None = None) -> None:
        """Replay ``pattern`` (a recording's name: training, idle, held-idle) on the host's
        GPUs (all, or those listed)."""
        self._recording(pattern)
        with self._lock:
            indexes = list(range(self._gpus.get(host, 0))) if gpus is None else list(gpus)
            for gpu in indexes:
                self._check(host, gpu)
                self._patterns[(host, gpu)] = pattern

    def assign(
        self, host: str, gpu: int, *, namespace: str, pod: str, container: str = "main"
    ) -> None:
        """Serve the GPU with the pod labels, as dcgm-exporter's pod mapping does while a pod
        holds it."""
        if not namespace or not pod:
            raise ValueError("a pod assignment needs a namespace and a pod name")
        with self._lock:
            self._check(host, gpu)
            self._assignments[(host, gpu)] = Assignment(namespace, pod, container)

    def unassign(self, host: str, gpu: int | None = None) -> None:
        """Drop the pod labels of one GPU, or of every GPU of the host."""
        with self._lock:
            for key in list(self._assignments):
                if key[0] == host and (gpu is None or key[1] == gpu):
                    del self._assignments[key]

    def set_value(self, host: str, gpu: int, field: str, value: Value) -> None:
        """Serve ``value`` for this field of this GPU whatever the frame says (``None``: do
        not serve the field, like a GPU that does not support it)."""
        if field not in METRICS:
            raise ValueError(f"unknown field {field!r}; the fields are {', '.join(FIELDS)}")
        with self._lock:
            self._check(host, gpu)
            self._overrides[(host, gpu, field)] = value

    def clear_override(self, host: str, gpu: int, field: str | None = None) -> None:
        """Back to the frames for one field of the GPU, or all of its fields."""
        with self._lock:
            for key in list(self._overrides):
                if key[:2] == (host, gpu) and (field is None or key[2] == field):
                    del self._overrides[key]

    @property
    def host_label(self) -> str:
        return self._host_label

    @host_label.setter
    def host_label(self, name: str) -> None:
        """``Hostname`` (dcgm-exporter until 2026) or ``hostname`` (since)."""
        if not name:
            raise ValueError("the host label needs a name")
        with self._lock:
            self._host_label = name

    @property
    def frame(self) -> int:
        """The frame served now (before each host's offset)."""
        with self._lock:
            if self._pinned_frame is not None:
                return self._pinned_frame
            return int((self._clock() - self._started_at) / self.frame_seconds)

    @frame.setter
    def frame(self, value: int | None) -> None:
        """Pin the frame (an int), or let it move with the clock again (None) from where it
        is."""
        with self._lock:
            if value is None:
                if self._pinned_frame is not None:
                    self._started_at = self._clock() - self._pinned_frame * self.frame_seconds
                self._pinned_frame = None
            else:
                if value < 0:
                    raise ValueError("frames count from 0")
                self._pinned_frame = int(value)

    @property
    def frame_pinned(self) -> bool:
        """Whether the frame is pinned (it does not move with the clock)."""
        with self._lock:
            return self._pinned_frame is not None

    def reset(self, hosts: Iterable[str] = (), *, gpus: int = 8) -> None:
        """Back to the start: these hosts on the default pattern, no pods, no pinned values,
        the frame moving, the ``Hostname`` label."""
        with self._lock:
            self._assignments.clear()
            self._overrides.clear()
            self._host_label = "Hostname"
            self.frame = None
            self.set_hosts(hosts, gpus=gpus)

    def uuid(self, host: str, gpu: int) -> str:
        return gpu_uuid(host, gpu)

    def model(self, host: str, gpu: int) -> str:
        with self._lock:
            self._check(host, gpu)
            recording = self.recordings[self._patterns[(host, gpu)]]
            return str(recording.gpus[gpu % len(recording.gpus)].get("model", ""))

    def served(self, host: str, gpu: int, frame: int | None = None) -> dict[str, Value]:
        """The values this GPU is served with at ``frame`` (now when None), overrides
        applied: what a scrape sees, for tests to compare against."""
        with self._lock:
            self._check(host, gpu)
            now = self.frame if frame is None else frame
            recording = self.recordings[self._patterns[(host, gpu)]]
            offset = self._hosts.index(host) * HOST_OFFSET_FRAMES
            row = recording.frames[(now + offset) % len(recording.frames)]
            values = dict(row[gpu % len(row)])
            for field in FIELDS:
                values.setdefault(field, None)
                if (host, gpu, field) in self._overrides:
                    values[field] = self._overrides[(host, gpu, field)]
            return values

    def assignment(self, host: str, gpu: int) -> Assignment | None:
        with self._lock:
            return self._assignments.get((host, gpu))

    def render(self) -> str:
        """The ``/metrics`` text, as dcgm-exporter writes it."""
        with self._lock:
            frame = self.frame
            gpus = [(host, gpu) for host in self._hosts for gpu in range(self._gpus[host])]
            labels = {key: self._labels(*key) for key in gpus}
            values = {key: self.served(*key, frame=frame) for key in gpus}
            sources = sorted({self.recordings[self._patterns[key]].source for key in gpus})
        out = [
            "# TauGrid's dcgm-exporter replay (deploy/dev/dcgm_replay.py), frame "
            f"{frame}; values from: {' | '.join(sources) or '(no hosts)'}"
        ]
        for field, (metric, help_text) in METRICS.items():
            out.append(f"# HELP {metric} {help_text}")
            out.append(f"# TYPE {metric} gauge")
            for key in gpus:
                value = values[key][field]
                if value is None:
                    continue
                extra = ""
                if field == "xid":
                    code = int(value)
                    message = XID_MESSAGES.get(code, "Unknown Error")
                    extra = f',err_code="{code}",err_msg="{escape_label(message)}"'
                out.append(f"{metric}{{{labels[key]}{extra}}} {format_value(value)}")
        return "\n".join(out) + "\n"

    def _labels(self, host: str, gpu: int) -> str:
        recording = self.recordings[self._patterns[(host, gpu)]]
        meta = recording.gpus[gpu % len(recording.gpus)]
        pairs = [
            ("gpu", str(gpu)),
            ("UUID", gpu_uuid(host, gpu)),
            ("pci_bus_id", str(meta.get("pci_bus_id", ""))),
            ("device", str(meta.get("device", f"nvidia{gpu}"))),
            ("modelName", str(meta.get("model", ""))),
            (self._host_label, host),
            ("DCGM_FI_DRIVER_VERSION", recording.driver_version),
        ]
        assignment = self._assignments.get((host, gpu))
        if assignment is not None:
            pairs += [
                ("container", assignment.container),
                ("namespace", assignment.namespace),
                ("pod", assignment.pod),
            ]
        return ",".join(f'{name}="{escape_label(value)}"' for name, value in pairs)

    def _recording(self, pattern: str) -> Recording:
        try:
            return self.recordings[pattern]
        except KeyError:
            known = ", ".join(sorted(self.recordings))
            raise ValueError(f"no recording of pattern {pattern!r}; there are {known}") from None

    def _check(self, host: str, gpu: int) -> None:
        if host not in self._gpus:
            raise ValueError(f"{host!r} is not served; the hosts are {', '.join(self._hosts)}")
        if not 0 <= gpu < self._gpus[host]:
            raise ValueError(f"{host} has GPUs 0-{self._gpus[host] - 1}, not {gpu}")

    # --- the HTTP server ----------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the exporter is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """Its ``/metrics`` address."""
        return f"http://{LISTEN_HOST}:{self.port}/metrics"

    def start(self, port: int = 0) -> None:
        """Serve on 127.0.0.1:``port`` (0: a free one) from a background thread."""
        if self._server is not None:
            return
        replay = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] == "/metrics":
                    body = replay.render().encode("utf-8")
                    with replay._lock:
                        replay.scrapes += 1
                    content_type = "text/plain; version=0.0.4; charset=utf-8"
                    status = 200
                elif self.path == "/":
                    body = b"dcgm-exporter replay: see /metrics\n"
                    content_type, status = "text/plain; charset=utf-8", 200
                else:
                    body, content_type, status = b"not found\n", "text/plain", 404
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the scraper gave up waiting (its timeout): nothing to tell anyone

            def log_message(self, format: str, *args: Any) -> None:
                pass  # a scrape a second would drown everything else

        server = ThreadingHTTPServer((LISTEN_HOST, port), Handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="dcgm-replay", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None


def parse_assignment(text: str) -> tuple[str, int, str, str, str]:
    """``host:gpu=namespace/pod[/container]``."""
    try:
        where, who = text.split("=", 1)
        host, gpu = where.rsplit(":", 1)
        parts = who.split("/")
        namespace, pod = parts[0], parts[1]
        container = parts[2] if len(parts) > 2 else "main"
        return host, int(gpu), namespace, pod, container
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(
            f"{text!r}: write host:gpu=namespace/pod[/container], e.g. gpu-h100-1:0=tau-alpha/run-7"
        ) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Serve replayed dcgm-exporter metrics on 127.0.0.1 (Ctrl-C stops)."
    )
    parser.add_argument("--hosts", default="gpu-h100-1,gpu-h100-2", help="comma-separated")
    parser.add_argument("--port", type=int, default=9400, help="dcgm-exporter's is 9400")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per host")
    parser.add_argument("--pattern", default=DEFAULT_PATTERN, help="training, idle, held-idle")
    parser.add_argument("--host-label", default="Hostname", help="Hostname or hostname")
    parser.add_argument("--frames-dir", type=Path, default=FRAMES_DIR)
    parser.add_argument("--frame-seconds", type=float, default=1.0)
    parser.add_argument(
        "--assign",
        type=parse_assignment,
        action="append",
        default=[],
        metavar="HOST:GPU=NS/POD[/CONTAINER]",
        help="put a GPU under a pod (repeatable)",
    )
    args = parser.parse_args(argv)
    try:
        replay = DcgmReplay(
            load_recordings(args.frames_dir),
            frame_seconds=args.frame_seconds,
            host_label=args.host_label,
        )
        replay.set_hosts(
            [h.strip() for h in args.hosts.split(",") if h.strip()],
            gpus=args.gpus,
            pattern=args.pattern,
        )
        for host, gpu, namespace, pod, container in args.assign:
            replay.assign(host, gpu, namespace=namespace, pod=pod, container=container)
        replay.start(args.port)
    except (ValueError, OSError) as error:
        print(f"dcgm_replay: {error}", file=sys.stderr)
        return 2
    for recording in sorted({r.source for r in replay.recordings.values()}):
        print(f"dcgm_replay: frames: {recording}", file=sys.stderr)
    print(
        f"dcgm_replay: serving {len(replay.hosts)} host(s) x {args.gpus} GPUs on {replay.url}",
        file=sys.stderr,
    )
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    # Wake up now and then: a signal may be delivered to the server's thread, and Python
    # runs its handler only when the main thread next runs (an endless wait() never would).
    with contextlib.suppress(KeyboardInterrupt):
        while not stopped.wait(0.5):
            pass
    replay.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
