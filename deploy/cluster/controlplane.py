#!/usr/bin/env python3
"""A real Kubernetes control plane on loopback, for TauGrid's test suite.

Why this exists: TauGrid's promise is that a run becomes a Kueue-admitted KubeRay RayJob. A
fake API cannot show that our objects pass the real CRD schemas, that Kueue's real webhooks
suspend them and that Kueue's real scheduler admits them from real ClusterQueue quota, or that
the real KubeRay operator reacts. No registry ships these binaries and release downloads are
blocked, but every component builds from the Go module proxy. This tool:

* ``build``: builds kine (etcd API on SQLite), kube-apiserver, kube-controller-manager and
  kube-scheduler (through a wrapper module pinning k8s.io/kubernetes and its staging modules),
  the Kueue manager, the KubeRay operator and KWOK, once, into
  ``~/.cache/taugrid/<component>-<version>/`` (``TAUGRID_CACHE_DIR`` overrides). Versions come
  from ``versions.env`` beside this file.
* ``up``: starts them detached on 127.0.0.1 with certificates made at start, installs the
  Kueue, KubeRay and KWOK CRDs from the downloaded modules (server-side apply), points Kueue's
  webhooks and CRD conversion at the local Kueue, registers Kueue's visibility API with the
  aggregator, creates the fake GPU and CPU nodes of ``nodes/*.yaml`` and hands them to KWOK
  (Stages in ``kwok/stages.yaml``), and returns only when every component answers (a Kueue
  webhook must really mutate a dry-run Job; every node must be Ready and schedulable).
  Idempotent: a healthy cluster is reused.
* ``down``: stops every process group it started (SIGTERM, then SIGKILL), checks that no
  process and no listening port is left, and removes the state directory.
* ``status`` and ``kubeconfig``: report on a running cluster.

Pods really get scheduled: kube-scheduler binds them to the fake nodes, and KWOK, standing in
for the kubelet of every fake node, plays its Stages (Running and Ready; a Job's pod succeeds
after a short, annotatable delay; annotated pods fail with an exit code or as OOMKilled;
deleted pods go away) and serves their logs from files through the apiserver's pods/log. No
container ever runs and there is no kube-proxy (pod and Service IPs route nowhere).

Only the standard library, ``cryptography`` and ``PyYAML`` are used, so the tool runs before the
project's own dependencies are installed.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import contextlib
import dataclasses
import datetime as dt
import fcntl
import http.client
import importlib.util
import ipaddress
import json
import os
import random
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

HERE = Path(__file__).resolve().parent
VERSIONS_FILE = HERE / "versions.env"
APISERVER_GOMOD_TEMPLATE = HERE / "kube-apiserver" / "go.mod.in"
DEX_GOMOD_TEMPLATE = HERE / "dex" / "go.mod.in"
SEAWEEDFS_GOMOD_TEMPLATE = HERE / "seaweedfs" / "go.mod.in"
NODES_DIR = HERE / "nodes"  # the fake nodes, one YAML file per pool
KWOK_STAGES = HERE / "kwok" / "stages.yaml"  # what KWOK does to nodes and pods

LOOPBACK = "127.0.0.1"
FIELD_MANAGER = "taugrid-controlplane"
KUEUE_NAMESPACE = "kueue-system"
KUEUE_PREFIX = "kueue-"  # the namePrefix of Kueue's release kustomization
SERVICE_CIDR = "10.96.0.0/16"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
READINESS_PROBE_QUEUE = "taugrid-readiness-probe"
POD_CIDR = "10.244.0.0/16"  # pod IPs KWOK hands out (nothing routes them)
# KWOK manages the Nodes carrying this annotation (those in deploy/cluster/nodes/ do).
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
# KWOK renews each fake node's Lease; the node-lifecycle controller reads it as the heartbeat.
NODE_LEASE_SECONDS = 40
NOT_READY_TAINT = "node.kubernetes.io/not-ready"

# Process start order; `down` stops them in reverse.
PROCESSES = (
    "kine",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kueue",
    "kuberay-operator",
    "kwok",
)

# With `up --ray`: deploy/cluster/ray_submitter.py, which starts a real Ray head (recorded as
# ray-head) and plays the part of KubeRay's submitter pods for every RayJob. Stopped first.
RAY_PROCESSES = ("ray-head", "ray-submitter")
RAY_SUBMITTER = HERE / "ray_submitter.py"
RAY_HEAD_SCRIPT = HERE.parent / "dev" / "ray_head.py"

# How the components are started (their flags, mounts, files), recorded in state.json: `up`
# restarts a running control plane of another revision instead of reusing it. Bump it with
# every such change. 2: the KubeRay operator's own hosts file; the API server enforces
# owner-reference permissions (OwnerReferencesPermissionEnforcement), as OpenShift does.
LAUNCH_REVISION: Final = 2

# Port names recorded in state.json. Every one of them is bound on 127.0.0.1 only.
PORT_NAMES = (
    "kine",
    "kine_metrics",
    "apiserver",
    "controller_manager",
    "scheduler",
    "kueue_webhook",
    "kueue_metrics",
    "kueue_health",
    "kueue_visibility",
    "kuberay_metrics",
    "kuberay_health",
    "kwok",  # KWOK's kubelet-style server (pods/log), every fake node's kubelet endpoint
)

T = TypeVar("T")


class ControlPlaneError(RuntimeError):
    """A component could not be built, started or reached; the message says which and why."""


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------

_T0 = time.monotonic()


def log(message: str) -> None:
    """Progress goes to stderr so that stdout stays machine-readable (kubeconfig, JSON)."""
    elapsed = time.monotonic() - _T0
    print(f"[controlplane {elapsed:6.1f}s] {message}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    return Path(os.environ.get("TAUGRID_CACHE_DIR") or Path.home() / ".cache" / "taugrid")


def state_dir() -> Path:
    return Path(os.environ.get("TAUGRID_CLUSTER_DIR") or cache_dir() / "run").absolute()


def read_versions(path: Path = VERSIONS_FILE) -> dict[str, str]:
    """Parse versions.env: KEY=VALUE lines, '#' comments, no shell expansion."""
    versions: dict[str, str] = {}
    for lineno, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ControlPlaneError(f"{path}:{lineno}: expected KEY=VALUE, got {raw!r}")
        versions[key.strip()] = value.strip()
    required_keys = (
        "KINE_VERSION",
        "KUBERNETES_VERSION",
        "KUEUE_VERSION",
        "KUBERAY_VERSION",
        "KWOK_VERSION",
        "HELM_VERSION",
        "DEX_VERSION",
        "DEX_API_VERSION",
    )
    for required in required_keys:
        if required not in versions:
            raise ControlPlaneError(f"{path}: {required} is missing")
    return versions


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    timeout: float,
    *,
    interval: float = 0.5,
    log_file: Path | None = None,
    alive: Callable[[], bool] | None = None,
) -> T:
    """Poll `probe` until it returns something other than None, or fail with a clear message."""
    deadline = time.monotonic() + timeout
    last_error = ""
    while True:
        try:
            result = probe()
            if result is not None:
                return result
        except (OSError, ControlPlaneError, ssl.SSLError, http.client.HTTPException) as exc:
            last_error = f"{type(exc).__name__}: {exc}"
        if alive is not None and not alive():
            detail = f"; last log lines:\n{tail(log_file)}" if log_file else ""
            raise ControlPlaneError(f"gave up waiting for {what}: the process exited{detail}")
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            if log_file is not None:
                detail += f"; last log lines of {log_file}:\n{tail(log_file)}"
            raise ControlPlaneError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(interval)


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports free to listen on, for servers started later.

    Taken between 20000 and the start of the kernel's ephemeral range
    (``net.ipv4.ip_local_port_range``, 32768 by default): a port the kernel may hand out, to
    another process's ``bind(0)`` or outgoing connection, can be taken between the choice and
    the server's own bind, which may come many seconds later on a busy machine (seen: a port
    gone in the 34 s of a CRD install before the KubeRay operator bound it). Ray's worker
    ports (10002-19999 by default) stay below. Each port is checked free by binding it, all
    held together while chosen; the kernel's own choice is the fallback when the range is too
    small.
    """
    chooser = random.SystemRandom()
    low = _ephemeral_low()
    candidates = list(range(_LISTEN_FLOOR, low)) if low - _LISTEN_FLOOR >= 1000 else []
    chooser.shuffle(candidates)
    sockets: list[socket.socket] = []
    try:
        for port in [*candidates, *[0] * count]:
            if len(sockets) == count:
                break
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind((LOOPBACK, port))
            except OSError:
                sock.close()
                continue
            sockets.append(sock)
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


_LISTEN_FLOOR = 20000


def _ephemeral_low(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    """The first port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_open(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Serialise builds and up/down between concurrent callers (two pytest runs, make + pytest)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------
# Building from the Go module proxy
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Component:
    """One cached build: `<cache>/<name>-<version>/bin/<binaries>` plus a build.json stamp."""

    name: str
    version_key: str
    binaries: tuple[str, ...]
    package: str  # `go install` path, or "" for the kube-apiserver wrapper module
    version_package: str = ""  # Go package whose GitVersion/GitCommit/BuildDate we set
    ldflags: str = ""  # or the -X flags a project's own Makefile sets, "{version}" filled in
    # A wrapper go.mod (its @KEY@ placeholders filled from versions.env) for a module that
    # cannot be `go install`ed; `package` is then built inside it.
    wrapper: Path | None = None

    def version(self, versions: Mapping[str, str]) -> str:
        return versions[self.version_key]

    def directory(self, versions: Mapping[str, str]) -> Path:
        return cache_dir() / f"{self.name}-{self.version(versions)}"

    def binary(self, versions: Mapping[str, str], name: str | None = None) -> Path:
        return self.directory(versions) / "bin" / (name or self.binaries[0])

    def is_built(self, versions: Mapping[str, str]) -> bool:
        directory = self.directory(versions)
        return (directory / "build.json").is_file() and all(
            os.access(directory / "bin" / b, os.X_OK) for b in self.binaries
        )


KINE = Component("kine", "KINE_VERSION", ("kine",), "github.com/k3s-io/kine")
KUBERNETES = Component(
    "kubernetes", "KUBERNETES_VERSION", ("kube-apiserver", "kube-controller-manager"), ""
)
KUEUE = Component(
    "kueue",
    "KUEUE_VERSION",
    ("kueue",),
    "sigs.k8s.io/kueue/cmd/kueue",
    "sigs.k8s.io/kueue/pkg/version",
)
KUBERAY = Component(
    "ray-operator",
    "KUBERAY_VERSION",
    ("ray-operator",),
    "github.com/ray-project/kuberay/ray-operator",
)
# Same wrapper module and release as kube-apiserver, cached on its own: adding it did not
# invalidate the cached apiserver and controller-manager.
KUBE_SCHEDULER = Component("kube-scheduler", "KUBERNETES_VERSION", ("kube-scheduler",), "")
# KWOK: the kubelet of fake nodes (node heartbeats, pod lifecycle from Stages, pods/log).
KWOK = Component("kwok", "KWOK_VERSION", ("kwok",), "sigs.k8s.io/kwok/cmd/kwok")
# Helm: not part of the control plane, but built and cached the same way, for the chart's
# lint, template and dry-run tests (deploy/helm/taugrid).
# The -X flags are those of Helm's Makefile: its version, and the Kubernetes version it
# assumes without a cluster (1.37, from the k8s.io/client-go v0.37 it is built with;
# without them `helm template` assumes 1.20).
HELM = Component(
    "helm",
    "HELM_VERSION",
    ("helm",),
    "helm.sh/helm/v3/cmd/helm",
    ldflags=" ".join(
        (
            "-X helm.sh/helm/v3/internal/version.version={version}",
            "-X helm.sh/helm/v3/internal/version.gitTreeState=clean",
            *(
                f"-X helm.sh/helm/v3/pkg/{pkg}.k8sVersion{part}={number}"
                for pkg in ("lint/rules", "chartutil")
                for part, number in (("Major", 1), ("Minor", 37))
            ),
        )
    ),
)
# Dex: the second real OpenID provider of the login tests (tests/identity/dex.py); like Helm
# not part of the control plane. Its go.mod replaces api/v2 locally, hence the wrapper; the -X
# flag is that of Dex's Makefile.
DEX = Component(
    "dex",
    "DEX_VERSION",
    ("dex",),
    "github.com/dexidp/dex/cmd/dex",
    ldflags="-w -X main.version={version}",
    wrapper=DEX_GOMOD_TEMPLATE,
)
# SeaweedFS: the S3-compatible store of the catalog's S3 tests and benchmark
# (deploy/dev/test_services.py starts `weed` on 127.0.0.1); like Helm not part of the control
# plane. Its go.mod has a replace directive, hence the wrapper; `-s -w` as its Makefile builds
# it, and the version's COMMIT (which `weed version` prints) is the pseudo-version.
WEED = Component(
    "weed",
    "SEAWEEDFS_VERSION",
    ("weed",),
    "github.com/seaweedfs/seaweedfs/weed",
    ldflags="-s -w -X github.com/seaweedfs/seaweedfs/weed/util/version.COMMIT={version}",
    wrapper=SEAWEEDFS_GOMOD_TEMPLATE,
)
COMPONENTS = (KINE, KUBERNETES, KUBE_SCHEDULER, KUEUE, KUBERAY, KWOK, HELM, DEX, WEED)


def go_binary() -> str | None:
    """`go` from PATH, else from GOROOT or the usual /usr/local/go (PATH may lack it)."""
    candidates = [shutil.which("go")]
    candidates += [str(Path(root) / "bin" / "go") for root in (os.environ.get("GOROOT"),) if root]
    candidates.append("/usr/local/go/bin/go")
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def require_go() -> str:
    go = go_binary()
    if go is None:
        raise ControlPlaneError(
            "`go` is not on PATH: the control plane is built from the Go module proxy "
            "(Go >= 1.26 needed, for KWOK v0.8.0; Debian: apt-get install golang-1.26 or newer)"
        )
    return go


def go_env(go: str) -> dict[str, str]:
    env = dict(os.environ)
    jobs = max(1, min(2, os.cpu_count() or 1))
    flags = env.get("GOFLAGS", "").split()
    flags = [f for f in flags if not f.startswith(("-p=", "-trimpath", "-buildvcs", "-mod="))]
    env["GOFLAGS"] = " ".join([*flags, f"-p={jobs}", "-trimpath", "-buildvcs=false"])
    return env


def run_logged(
    args: Sequence[str], *, cwd: Path, env: Mapping[str, str], log_path: Path, what: str
) -> None:
    """Run a (long) Go command at low priority, echoing progress and heartbeats to stderr."""
    nice = shutil.which("nice")
    command = [nice, "-n", "10", *args] if nice else list(args)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    downloads = 0
    with log_path.open("w") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        proc = subprocess.Popen(  # noqa: S603 - our own argv: go + fixed arguments
            command,
            cwd=cwd,
            env=dict(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    last_beat = started
    position = 0
    compiled = 0
    while True:
        code = proc.poll()
        with log_path.open(errors="replace") as handle:
            handle.seek(position)
            chunk = handle.read()
            position = handle.tell()
        for line in chunk.splitlines():
            if line.startswith("go: downloading"):
                downloads += 1
            elif line and not line.startswith(("$ ", "go: ", "#", " ", "\t")):
                compiled += 1  # `-v` prints each package as it is compiled
        now = time.monotonic()
        if code is not None:
            break
        if now - last_beat >= 30:
            log(
                f"  {what}: {now - started:.0f}s, {downloads} modules downloaded, "
                f"{compiled} packages compiled"
            )
            last_beat = now
        time.sleep(1)
    if code != 0:
        raise ControlPlaneError(
            f"{what} failed (exit {code}) after {time.monotonic() - started:.0f}s; "
            f"last lines of {log_path}:\n{tail(log_path, 40)}"
        )
    log(
        f"  {what}: done in {time.monotonic() - started:.0f}s "
        f"({downloads} modules downloaded, {compiled} packages compiled)"
    )


def module_info(module: str, version: str) -> dict[str, Any]:
    """`go mod download -json` through the module proxy; its Dir holds the module's files."""
    go = require_go()
    with tempfile.TemporaryDirectory(prefix="taugrid-gomod-") as tmp:
        proc = subprocess.run(  # noqa: S603 - go with fixed arguments
            [go, "mod", "download", "-json", f"{module}@{version}"],
            cwd=tmp,
            env=go_env(go),
            capture_output=True,
            text=True,
            check=False,
        )
    try:
        info: dict[str, Any] = json.loads(proc.stdout) if proc.stdout.strip() else {}
    except json.JSONDecodeError:
        info = {}
    if proc.returncode != 0 or "Error" in info or not info.get("Dir"):
        detail = info.get("Error") or proc.stderr.strip() or proc.stdout.strip()
        raise ControlPlaneError(f"go mod download {module}@{version} failed: {detail}")
    return info


def release_time(module: str, version: str) -> str:
    """The release time the module proxy records (its .info file), e.g. 2026-04-15T18:01:22Z."""
    info_file = module_info(module, version).get("Info")
    try:
        return str(json.loads(Path(str(info_file)).read_text()).get("Time", ""))
    except (OSError, ValueError):
        return ""


def module_dir(module: str, version: str) -> Path:
    return Path(module_info(module, version)["Dir"])


def _write_stamp(directory: Path, versions: Mapping[str, str], component: Component) -> None:
    go = require_go()
    go_version = subprocess.run(  # noqa: S603 - go with fixed arguments
        [go, "version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    stamp = {
        "component": component.name,
        "version": component.version(versions),
        "binaries": list(component.binaries),
        "go": go_version,
        "built_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    (directory / "build.json").write_text(json.dumps(stamp, indent=2) + "\n")


def _build_go_install(component: Component, versions: Mapping[str, str], staging: Path) -> None:
    go = require_go()
    version = component.version(versions)
    directory = component.directory(versions)
    env = go_env(go)
    env["GOBIN"] = str(staging)
    args = [go, "install", "-v"]
    if component.version_package:
        # The proxy has no commit hash; the release time stands in for the build date.
        released = release_time(component.package.split("/cmd/")[0], version)
        pkg = component.version_package
        args += [
            "-ldflags",
            f"-X {pkg}.GitVersion={version} -X {pkg}.GitCommit= -X {pkg}.BuildDate={released}",
        ]
    elif component.ldflags:
        args += ["-ldflags", component.ldflags.format(version=version)]
    args.append(f"{component.package}@{version}")
    run_logged(
        args,
        cwd=directory,
        env=env,
        log_path=directory / "build.log",
        what=f"go install {component.package}@{version}",
    )


def render_wrapper_gomod(template: Path, versions: Mapping[str, str]) -> str:
    """A wrapper go.mod with every @KEY@ replaced by that key of versions.env."""

    def fill(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in versions:
            raise ControlPlaneError(f"{template}: @{key}@ is not in versions.env")
        return versions[key]

    return re.sub(r"@([A-Z][A-Z0-9_]*)@", fill, template.read_text())


def _tidy_wrapper(
    component: Component, versions: Mapping[str, str], gomod: str, what: str
) -> tuple[str, dict[str, str], Path]:
    """A fresh ``src/`` build directory holding ``gomod``, tidied; (go, its env, src)."""
    go = require_go()
    directory = component.directory(versions)
    src = directory / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    (src / "go.mod").write_text(gomod)
    env = go_env(go)
    run_logged(
        [go, "mod", "tidy"],
        cwd=src,
        env=env,
        log_path=directory / "tidy.log",
        what=f"go mod tidy ({what} wrapper)",
    )
    return go, env, src


def _build_wrapper(component: Component, versions: Mapping[str, str], staging: Path) -> None:
    assert component.wrapper is not None
    version = component.version(versions)
    directory = component.directory(versions)
    gomod = render_wrapper_gomod(component.wrapper, versions)
    go, env, src = _tidy_wrapper(component, versions, gomod, f"{component.name} {version}")
    run_logged(
        [
            go,
            "build",
            "-v",
            "-ldflags",
            component.ldflags.format(version=version),
            "-o",
            str(staging) + "/",
            component.package,
        ],
        cwd=src,
        env=env,
        log_path=directory / "build.log",
        what=f"go build {component.package} {version}",
    )


def render_apiserver_gomod(version: str) -> str:
    """Fill the wrapper go.mod: k8s.io/kubernetes at `version`, staging modules at v0.Y.Z."""
    match = re.fullmatch(r"v1\.(\d+)\.(\d+)", version)
    if not match:
        raise ControlPlaneError(f"KUBERNETES_VERSION must look like v1.Y.Z, got {version!r}")
    staging_version = f"v0.{match.group(1)}.{match.group(2)}"
    gomod = Path(module_info("k8s.io/kubernetes", version)["GoMod"]).read_text()
    block = re.search(r"^replace \((.*?)^\)", gomod, re.S | re.M)
    if block is None:
        raise ControlPlaneError(f"k8s.io/kubernetes@{version}: go.mod has no replace block")
    staged = [
        line.split("=>")[0].strip()
        for line in block.group(1).splitlines()
        if "=>" in line and "./staging/" in line
    ]
    if not staged:
        raise ControlPlaneError(f"k8s.io/kubernetes@{version}: no staging modules found")
    replaces = "\n".join(f"\t{mod} => {mod} {staging_version}" for mod in staged)
    template = APISERVER_GOMOD_TEMPLATE.read_text()
    return template.replace("@KUBERNETES_VERSION@", version).replace("@STAGING_REPLACES@", replaces)


def _build_kubernetes(component: Component, versions: Mapping[str, str], staging: Path) -> None:
    version = component.version(versions)
    directory = component.directory(versions)
    gomod = render_apiserver_gomod(version)
    go, env, src = _tidy_wrapper(component, versions, gomod, f"k8s.io/kubernetes {version}")
    # What hack/lib/version.sh would stamp. The proxy has no commit hash (left empty); the
    # release time stands in for the build date, so rebuilds are reproducible.
    released = release_time("k8s.io/kubernetes", version)
    major, minor = version[1:].split(".")[:2]
    ldflags: list[str] = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        ldflags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.gitCommit=",
            f"-X {pkg}.buildDate={released}",
        ]
    packages = [f"k8s.io/kubernetes/cmd/{name}" for name in component.binaries]
    run_logged(
        [go, "build", "-v", "-ldflags", " ".join(ldflags), "-o", str(staging) + "/", *packages],
        cwd=src,
        env=env,
        log_path=directory / "build.log",
        what=f"go build {' + '.join(component.binaries)} {version}",
    )


def build(versions: Mapping[str, str], only: Sequence[str] = ()) -> None:
    """Build every missing component into the cache (safe to run concurrently: file lock)."""
    wanted = [c for c in COMPONENTS if not only or c.name in only]
    with file_lock(cache_dir() / ".build.lock"):
        for component in wanted:
            version = component.version(versions)
            if component.is_built(versions):
                log(f"{component.name} {version}: cached in {component.directory(versions)}")
                continue
            log(
                f"{component.name} {version}: building into {component.directory(versions)} "
                "(cold builds take minutes on 2 cores)"
            )
            if component is KINE and shutil.which("cc") is None:
                raise ControlPlaneError("kine's SQLite driver needs cgo: no C compiler (cc)")
            directory = component.directory(versions)
            # Binaries land in bin/ only once complete: an interrupted build leaves no half.
            staging = directory / "bin.partial"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            # No `go install` path: a k8s.io/kubernetes command, built in the wrapper module.
            if component.wrapper is not None:
                builder = _build_wrapper
            elif component.package:
                builder = _build_go_install
            else:
                builder = _build_kubernetes
            builder(component, versions, staging)
            shutil.rmtree(directory / "bin", ignore_errors=True)
            staging.rename(directory / "bin")
            _write_stamp(component.directory(versions), versions, component)
        if not only and versions.get("GATEWAY_API_VERSION"):
            # Source only (the HTTPRoute CRD of an endpoint test): fetched now, not in a test.
            gateway_api_dir(versions)


GATEWAY_API_MODULE = "sigs.k8s.io/gateway-api"


def gateway_api_dir(versions: Mapping[str, str]) -> Path:
    """The Gateway API module's files (``go mod download``: cached in Go's module cache)."""
    return module_dir(GATEWAY_API_MODULE, versions["GATEWAY_API_VERSION"])


def gateway_api_crd(versions: Mapping[str, str], kind: str) -> dict[str, Any]:
    """One CRD of the Gateway API's standard channel, e.g. ``httproutes``."""
    path = (
        gateway_api_dir(versions)
        / "config"
        / "crd"
        / "standard"
        / f"gateway.networking.k8s.io_{kind}.yaml"
    )
    (doc,) = [doc for doc in _load_yaml_docs(path) if doc]
    return doc


# --------------------------------------------------------------------------------------------
# Certificates
# --------------------------------------------------------------------------------------------


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@dataclasses.dataclass
class Issuer:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey


def _make_cert(
    common_name: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: Issuer | None,
    *,
    organization: str | None = None,
    is_ca: bool = False,
    dns: Sequence[str] = (),
    ips: Sequence[str] = (),
    server: bool = False,
    client: bool = False,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    subject = x509.Name(attributes)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.cert.subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=3650 if is_ca else 365))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if is_ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=True,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if issuer is not None:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.key.public_key()),
            critical=False,
        )
    names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    signing_key = issuer.key if issuer else key
    return builder.sign(signing_key, hashes.SHA256())


def _write_pair(
    directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{stem}.crt").write_bytes(_pem_cert(cert))
    key_path = directory / f"{stem}.key"
    key_path.write_bytes(_pem_key(key))
    key_path.chmod(0o600)


def generate_pki(pki: Path) -> None:
    """Everything TLS in the cluster, made fresh at each `up`; nothing is reused between runs."""
    ca_key = _new_key()
    ca = Issuer(_make_cert("taugrid-test-cluster-ca", ca_key, None, is_ca=True), ca_key)
    _write_pair(pki, "ca", ca.cert, ca.key)

    fp_key = _new_key()
    front_proxy = Issuer(_make_cert("taugrid-front-proxy-ca", fp_key, None, is_ca=True), fp_key)
    _write_pair(pki, "front-proxy-ca", front_proxy.cert, front_proxy.key)

    def leaf(stem: str, cn: str, issuer: Issuer, **kwargs: Any) -> None:
        key = _new_key()
        _write_pair(pki, stem, _make_cert(cn, key, issuer, **kwargs), key)

    leaf(
        "apiserver",
        "kube-apiserver",
        ca,
        server=True,
        dns=[
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ],
        ips=[LOOPBACK, str(ipaddress.ip_network(SERVICE_CIDR)[1])],
    )
    leaf("front-proxy-client", "front-proxy-client", front_proxy, client=True)
    leaf("admin", "taugrid-admin", ca, organization="system:masters", client=True)
    leaf("controller-manager", "system:kube-controller-manager", ca, client=True)
    leaf(
        "controller-manager-serving",
        "kube-controller-manager",
        ca,
        server=True,
        dns=["localhost"],
        ips=[LOOPBACK],
    )
    leaf("scheduler", "system:kube-scheduler", ca, client=True)
    leaf("scheduler-serving", "kube-scheduler", ca, server=True, dns=["localhost"], ips=[LOOPBACK])
    # The apiserver's client certificate towards kubelets (here KWOK's server), which presents
    # kwok-serving: the apiserver verifies it (--kubelet-certificate-authority) at 127.0.0.1.
    leaf(
        "apiserver-kubelet-client",
        "kube-apiserver-kubelet-client",
        ca,
        organization="system:masters",
        client=True,
    )
    leaf("kwok-serving", "kwok", ca, server=True, dns=["localhost"], ips=[LOOPBACK])
    leaf(
        "kueue-webhook",
        "kueue-webhook",
        ca,
        server=True,
        dns=["localhost", f"{KUEUE_PREFIX}webhook-service.{KUEUE_NAMESPACE}.svc"],
        ips=[LOOPBACK],
    )
    leaf("kueue-metrics", "kueue-metrics", ca, server=True, dns=["localhost"], ips=[LOOPBACK])
    leaf(
        "kueue-visibility",
        "kueue-visibility",
        ca,
        server=True,
        dns=["localhost", f"{KUEUE_PREFIX}visibility-server.{KUEUE_NAMESPACE}.svc"],
        ips=[LOOPBACK],
    )

    sa_key = _new_key()
    (pki / "sa.key").write_bytes(_pem_key(sa_key))
    (pki / "sa.key").chmod(0o600)
    (pki / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def write_kubeconfig(path: Path, server: str, pki: Path, user: str) -> None:
    """A self-contained kubeconfig (certificates embedded), usable from any directory."""

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "taugrid-test",
                "cluster": {"server": server, "certificate-authority-data": b64(pki / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": b64(pki / f"{user}.crt"),
                    "client-key-data": b64(pki / f"{user}.key"),
                },
            }
        ],
        "contexts": [
            {"name": "taugrid-test", "context": {"cluster": "taugrid-test", "user": user}}
        ],
        "current-context": "taugrid-test",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)


# --------------------------------------------------------------------------------------------
# A minimal Kubernetes REST client (stdlib only)
# --------------------------------------------------------------------------------------------


class Kube:
    """Just enough of the Kubernetes API for bootstrapping: apply, create, get, patch status."""

    def __init__(self, port: int, pki: Path, user: str = "admin") -> None:
        self.port = port
        self.context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self.context.load_cert_chain(str(pki / f"{user}.crt"), str(pki / f"{user}.key"))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        timeout: float = 30,
    ) -> tuple[int, Any]:
        conn = http.client.HTTPSConnection(
            LOOPBACK, self.port, context=self.context, timeout=timeout
        )
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = {"Accept": "application/json"}
            if payload is not None:
                headers["Content-Type"] = content_type
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        try:
            data: Any = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            data = raw.decode(errors="replace")
        return response.status, data

    def checked(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        status, data = self.request(method, path, body, **kwargs)
        if status >= 300:
            message = data.get("message") if isinstance(data, dict) else data
            raise ControlPlaneError(f"{method} {path}: HTTP {status}: {message}")
        return data

    def apply(self, path: str, obj: Mapping[str, Any]) -> Any:
        """Server-side apply (no size limit from a last-applied annotation; CRDs are > 1 MB)."""
        query = urllib.parse.urlencode({"fieldManager": FIELD_MANAGER, "force": "true"})
        return self.checked(
            "PATCH",
            f"{path}?{query}",
            obj,
            content_type="application/apply-patch+yaml",
            timeout=120,
        )

    def text(self, path: str) -> tuple[int, str]:
        status, data = self.request("GET", path)
        return status, data if isinstance(data, str) else json.dumps(data)


def resource_path(obj: Mapping[str, Any]) -> str:
    """The REST path of the few kinds this tool creates."""
    admission = "/apis/admissionregistration.k8s.io/v1"
    kinds = {
        "CustomResourceDefinition": "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        "MutatingWebhookConfiguration": f"{admission}/mutatingwebhookconfigurations",
        "ValidatingWebhookConfiguration": f"{admission}/validatingwebhookconfigurations",
        "APIService": "/apis/apiregistration.k8s.io/v1/apiservices",
        "Namespace": "/api/v1/namespaces",
        "Node": "/api/v1/nodes",
    }
    name = obj["metadata"]["name"]
    if obj["kind"] in kinds:
        return f"{kinds[obj['kind']]}/{name}"
    if obj["kind"] == "Service":
        return f"/api/v1/namespaces/{obj['metadata']['namespace']}/services/{name}"
    raise ControlPlaneError(f"no REST path known for kind {obj['kind']}")


# --------------------------------------------------------------------------------------------
# Manifests taken from the downloaded Kueue / KubeRay modules
# --------------------------------------------------------------------------------------------


def _load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _kustomize_resources(directory: Path) -> list[Path]:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text()) or {}
    return [directory / item for item in kustomization.get("resources", [])]


def kueue_crds(kueue_dir: Path, webhook_url: str, ca_bundle: str) -> list[dict[str, Any]]:
    """Kueue's CRDs with the conversion-webhook patches its kustomization enables."""
    crd_dir = kueue_dir / "config" / "components" / "crd"
    crds = {
        doc["metadata"]["name"]: doc
        for path in _kustomize_resources(crd_dir)
        for doc in _load_yaml_docs(path)
    }
    kustomization = yaml.safe_load((crd_dir / "kustomization.yaml").read_text()) or {}
    for patch in kustomization.get("patches", []):
        for doc in _load_yaml_docs(crd_dir / patch["path"]):
            conversion = (doc.get("spec") or {}).get("conversion")
            name = doc["metadata"]["name"]
            if conversion is None or name not in crds:
                continue
            conversion = json.loads(json.dumps(conversion))
            webhook = conversion.setdefault("webhook", {})
            webhook["clientConfig"] = {"url": f"{webhook_url}/convert", "caBundle": ca_bundle}
            crds[name]["spec"]["conversion"] = conversion
    return list(crds.values())


def kuberay_crds(kuberay_dir: Path) -> list[dict[str, Any]]:
    crd_dir = kuberay_dir / "config" / "crd"
    return [doc for path in _kustomize_resources(crd_dir) for doc in _load_yaml_docs(path)]


# KWOK's CRDs this cluster serves: what a test writes to give a fake pod its log (KWOK's server
# watches them, --enable-crds). Its Stages are not CRDs here: they come from kwok/stages.yaml.
KWOK_CRDS = {"Logs": "logs", "ClusterLogs": "clusterlogs"}


def kwok_crds(kwok_dir: Path) -> list[dict[str, Any]]:
    bases = kwok_dir / "kustomize" / "crd" / "bases"
    return [
        doc
        for plural in KWOK_CRDS.values()
        for doc in _load_yaml_docs(bases / f"kwok.x-k8s.io_{plural}.yaml")
    ]


def kueue_webhook_configurations(
    kueue_dir: Path, webhook_url: str, ca_bundle: str
) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, re-pointed from its Service to the local process."""
    webhook_dir = kueue_dir / "config" / "components" / "webhook"
    configs = [
        doc
        for doc in _load_yaml_docs(webhook_dir / "manifests.yaml")
        if doc.get("kind", "").endswith("WebhookConfiguration")
    ]
    kustomization = yaml.safe_load((webhook_dir / "kustomization.yaml").read_text()) or {}
    overrides: dict[tuple[str, str], dict[str, Any]] = {}
    for patch in kustomization.get("patches", []):
        doc = yaml.safe_load(patch.get("patch", "")) if isinstance(patch, dict) else None
        if not doc:
            continue
        for hook in doc.get("webhooks", []):
            overrides[(doc["kind"], hook["name"])] = hook
    for config in configs:
        config["metadata"] = {"name": KUEUE_PREFIX + config["metadata"]["name"]}
        for hook in config["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"{webhook_url}{path}", "caBundle": ca_bundle}
            for key, value in overrides.get((config["kind"], hook["name"]), {}).items():
                if key != "name":
                    hook[key] = value
    return configs


def kueue_visibility_objects(kueue_dir: Path, port: int, ca_bundle: str) -> list[dict[str, Any]]:
    """The visibility APIServices, reached through an ExternalName Service on 127.0.0.1.

    The aggregator resolves an ExternalName Service to its name and port, so no kube-proxy and
    no (loopback-forbidden) Endpoints are needed. TLS is verified against our CA (upstream
    skips verification) for the Service's DNS name, which the visibility certificate carries.
    """
    vis_dir = kueue_dir / "config" / "components" / "visibility"
    service_name = f"{KUEUE_PREFIX}visibility-server"
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": service_name, "namespace": KUEUE_NAMESPACE},
            "spec": {
                "type": "ExternalName",
                "externalName": LOOPBACK,
                "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
            },
        }
    ]
    for path in sorted(vis_dir.glob("apiservice_*.yaml")):
        for doc in _load_yaml_docs(path):
            spec = doc["spec"]
            spec.pop("insecureSkipTLSVerify", None)
            spec["caBundle"] = ca_bundle
            spec["service"] = {"name": service_name, "namespace": KUEUE_NAMESPACE, "port": port}
            objects.append(doc)
    return objects


def kueue_config(state: Path, ports: Mapping[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"{LOOPBACK}:{ports['kueue_health']}"},
        "metrics": {"bindAddress": f"{LOOPBACK}:{ports['kueue_metrics']}"},
        "webhook": {
            "port": ports["kueue_webhook"],
            "host": LOOPBACK,
            "certDir": str(state / "kueue" / "webhook-certs"),
        },
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "clientConnection": {"qps": 50, "burst": 100},
        "visibilityServer": {"bindAddress": LOOPBACK, "bindPort": ports["kueue_visibility"]},
        # ray.io/raycluster: an endpoint's RayService is admitted through the Ray cluster KubeRay
        # makes for it (Kueue skips the Ray clusters of RayJobs: those are admitted with the job).
        "integrations": {"frameworks": ["batch/job", "ray.io/rayjob", "ray.io/raycluster"]},
    }


# Kueue v0.17 reads two certificate paths that are not configurable when its internal cert
# management is off: /etc/kueue/metrics/certs and /visibility. Rather than writing into the
# host's / (root only, shared by every cluster), Kueue runs in a private mount namespace whose
# root is a tmpfs with the host's top-level directories bind-mounted in, /etc overlaid, and
# those two paths filled with this cluster's certificates. Nothing on the host changes and the
# mounts vanish with the process. Without root it uses a user namespace (unshare -Ur).
KUEUE_LAUNCHER = r"""#!/bin/sh
# Generated by deploy/cluster/controlplane.py: runs Kueue with its fixed certificate paths
# provided inside a private mount namespace (see the comment in controlplane.py).
set -eu
state="$1"; shift
root="$state/kueue/rootfs"
mkdir -p "$root"
mount -t tmpfs -o mode=0755 taugrid-kueue "$root"
mkdir -p "$root/.overlay/upper/kueue/metrics/certs" "$root/.overlay/work" "$root/visibility"
cp "$state/pki/kueue-metrics.crt" "$root/.overlay/upper/kueue/metrics/certs/tls.crt"
cp "$state/pki/kueue-metrics.key" "$root/.overlay/upper/kueue/metrics/certs/tls.key"
cp "$state/pki/kueue-visibility.crt" "$root/visibility/tls.crt"
cp "$state/pki/kueue-visibility.key" "$root/visibility/tls.key"
for entry in /*; do
  name="${entry#/}"
  if [ -L "$entry" ]; then cp -P "$entry" "$root/$name"
  elif [ -d "$entry" ] && [ "$name" != etc ]; then
    mkdir -p "$root/$name"; mount --rbind "$entry" "$root/$name"
  fi
done
mkdir -p "$root/etc"
mount -t overlay taugrid-kueue-etc \
  -o "lowerdir=/etc,upperdir=$root/.overlay/upper,workdir=$root/.overlay/work" "$root/etc"
exec chroot "$root" /usr/bin/env -C "$state/kueue" "$@"
"""


def mount_namespace_prefix() -> list[str]:
    """`unshare` arguments for a private mount namespace (a user namespace too when not root),
    checked by running `true` in one, so that `up` fails before starting anything."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise ControlPlaneError("`unshare` (util-linux) is needed to give Kueue its cert paths")
    flags = ["--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        flags = ["--user", "--map-root-user", *flags]
    probe = subprocess.run(  # noqa: S603 - unshare with fixed arguments
        [unshare, *flags, "/bin/sh", "-c", "mount -t tmpfs taugrid-probe /mnt"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        raise ControlPlaneError(
            "Kueue needs a private mount namespace (see README: 'Kueue outside a cluster'), "
            f"but `unshare {' '.join(flags)}` failed: {probe.stderr.strip()}"
        )
    return [unshare, *flags]


def kueue_command(state: Path, kueue_binary: Path, kubeconfig: Path, config: Path) -> list[str]:
    launcher = state / "kueue" / "launch.sh"
    launcher.write_text(KUEUE_LAUNCHER)
    launcher.chmod(0o755)
    return [
        *mount_namespace_prefix(),
        "/bin/sh",
        str(launcher),
        str(state),
        str(kueue_binary),
        f"--config={config}",
        f"--kubeconfig={kubeconfig}",
        "--zap-log-level=info",
    ]


# The KubeRay operator reads a RayJob's status from its Ray dashboard, which it dials by the
# head Service's DNS name, http://<head-svc>.<ns>.svc.cluster.local:8265 (no cluster DNS or
# kube-proxy here; --use-kubernetes-proxy would go through the apiserver's service proxy, which
# refuses loopback endpoints). So the operator runs in a private mount namespace of its own
# where /etc/hosts is a bind mount of <state>/kuberay-operator/hosts, a copy of the host's file:
# a test that runs a real Ray head on a loopback address appends "<address> <name>" to it, in
# place (the bind mount holds the inode: never replace the file), and the operator's next
# lookup finds it (Go re-reads /etc/hosts when its mtime or size changed, at most every 5 s).
# Names not in it resolve as on the host. Nothing on the host changes.
KUBERAY_LAUNCHER = r"""#!/bin/sh
# Generated by deploy/cluster/controlplane.py: runs the KubeRay operator with the cluster's own
# hosts file as /etc/hosts, in a private mount namespace (see the comment in controlplane.py).
set -eu
hosts="$1"; shift
mount --bind "$hosts" /etc/hosts
exec "$@"
"""


def operator_hosts_file(state: Path) -> Path:
    """The KubeRay operator's /etc/hosts (append to it in place; see KUBERAY_LAUNCHER)."""
    return state / "kuberay-operator" / "hosts"


def kuberay_command(state: Path, binary: Path, arguments: Sequence[str]) -> list[str]:
    directory = state / "kuberay-operator"
    directory.mkdir(parents=True, exist_ok=True)
    hosts = operator_hosts_file(state)
    host_entries = Path("/etc/hosts").read_text() if Path("/etc/hosts").exists() else ""
    hosts.write_text(
        "# The KubeRay operator's /etc/hosts (deploy/cluster/controlplane.py): the host's, then\n"
        "# lines tests append for the Ray dashboards they run (append in place).\n"
        + host_entries
        + ("" if host_entries.endswith("\n") or not host_entries else "\n")
    )
    launcher = directory / "launch.sh"
    launcher.write_text(KUBERAY_LAUNCHER)
    launcher.chmod(0o755)
    return [
        *mount_namespace_prefix(),
        "/bin/sh",
        str(launcher),
        str(hosts),
        str(binary),
        *arguments,
    ]


# --------------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------------


def _proc_stat(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/<pid>/stat (state first), or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def _proc_state(pid: int) -> str | None:
    fields = _proc_stat(pid)
    return fields[0] if fields else None


def _proc_start_time(pid: int) -> str | None:
    """Start time in clock ticks since boot: with the pid, identifies one process for good."""
    fields = _proc_stat(pid)
    return fields[19] if fields and len(fields) > 19 else None


def pid_alive(pid: int) -> bool:
    state = _proc_state(pid)
    if state is None:
        return False
    if state == "Z":  # a zombie child of ours: reap it
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return True


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def names_folder(cmdline: str, folder: Path) -> bool:
    """Whether a command line names ``folder`` or a path inside it: the folder's path as a
    whole, never as the start of a longer name (``~/.cache/taugrid/run`` is not in
    ``~/.cache/taugrid/run-venvs/…``, the local executor's environments in the tests, whose
    sandboxes a `down` once stopped)."""
    return re.search(re.escape(str(folder)) + r"(?![\w.-])", cmdline) is not None


def owned_pids(state: Path) -> list[int]:
    """Processes whose command line names this state directory: ours, even without pidfiles."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            pid = int(entry.name)
            if names_folder(_cmdline(pid), state) and pid_alive(pid):
                found.append(pid)
    return found


def _socket_inodes(pid: int) -> set[str]:
    inodes: set[str] = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    return inodes


def _decode_address(hex_address: str) -> tuple[str, int]:
    host_hex, port_hex = hex_address.split(":")
    raw = bytes.fromhex(host_hex)
    if len(raw) == 4:
        host = str(ipaddress.IPv4Address(raw[::-1]))
    else:  # /proc/net/tcp6 stores four little-endian 32-bit words
        words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
        address = ipaddress.IPv6Address(words)
        host = str(address.ipv4_mapped or address)
    return host, int(port_hex, 16)


def listening_sockets(pids: Sequence[int] | None) -> list[tuple[str, int]]:
    """(host, port) of TCP sockets in LISTEN state, only those of `pids` unless None."""
    wanted: set[str] | None = None
    if pids is not None:
        wanted = set()
        for pid in pids:
            wanted |= _socket_inodes(pid)
    found: list[tuple[str, int]] = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if (
                    len(fields) > 9
                    and fields[3] == "0A"
                    and (wanted is None or fields[9] in wanted)
                ):
                    found.append(_decode_address(fields[1]))
    return sorted(set(found))


def start_process(
    state: Path,
    name: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> int:
    """Start a detached process (own session and process group) logging to logs/<name>.log."""
    logs = state / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    workdir = cwd or state / name
    workdir.mkdir(parents=True, exist_ok=True)
    with (logs / f"{name}.log").open("ab") as out:
        out.write(f"$ {' '.join(args)}\n".encode())
        out.flush()
        proc = subprocess.Popen(  # noqa: S603 - binaries we built, with arguments we made
            list(args),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=workdir,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
    (state / "pids").mkdir(exist_ok=True)
    # The start time guards against pid reuse; a command line may not be readable yet
    # (mid-exec), so it cannot serve as the proof of ownership.
    (state / "pids" / f"{name}.pid").write_text(f"{proc.pid} {_proc_start_time(proc.pid)}\n")
    return proc.pid


def read_pid(state: Path, name: str) -> int | None:
    """The pid in pids/<name>.pid if that very process still exists (else None)."""
    try:
        pid_text, _, started = (state / "pids" / f"{name}.pid").read_text().strip().partition(" ")
        pid = int(pid_text)
    except (OSError, ValueError):
        return None
    return pid if _proc_start_time(pid) == started else None


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # each process leads its own group (start_new_session)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def stop_pids(
    pids: Sequence[int], grace: float = 10.0, names: Mapping[int, str] | None = None
) -> list[int]:
    """Stop processes one by one, in the given order (clients before the API server before
    its storage, so none hangs on a vanished dependency): SIGTERM to the process group, then
    SIGKILL after `grace` seconds. Returns the pids that survived."""

    def label(pid: int) -> str:
        return f"{(names or {}).get(pid, 'process')} (pid {pid})"

    for pid in pids:
        if not pid_alive(pid):
            continue
        started = time.monotonic()
        _signal_group(pid, signal.SIGTERM)
        if not _wait_gone(pid, grace):
            log(f"{label(pid)} ignored SIGTERM for {grace:.0f}s: SIGKILL")
            _signal_group(pid, signal.SIGKILL)
            _wait_gone(pid, 5)
        else:
            log(f"stopped {label(pid)} in {time.monotonic() - started:.1f}s")
    return [p for p in pids if pid_alive(p)]


# --------------------------------------------------------------------------------------------
# up / down / status
# --------------------------------------------------------------------------------------------


def write_state(state: Path, record: Mapping[str, Any]) -> None:
    """``state.json``, replaced whole: written beside it, then renamed over it, so a reader
    (deploy/cluster/ray_submitter.py starts while `up` goes on recording) never sees it empty
    or half written."""
    staging = state / f".state.json.{os.getpid()}"
    staging.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(staging, state / "state.json")


def load_state(state: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((state / "state.json").read_text())
        return data
    except (OSError, json.JSONDecodeError):
        return None


def apiserver_ready(kube: Kube) -> bool:
    status, body = kube.text("/readyz")
    return status == 200 and body.strip().strip('"') == "ok"


def health_ok(port: int, path: str, *, tls: bool = False, pki: Path | None = None) -> bool:
    if tls:
        context = ssl.create_default_context(cafile=str(pki / "ca.crt")) if pki else None
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            LOOPBACK, port, context=context, timeout=3
        )
    else:
        conn = http.client.HTTPConnection(LOOPBACK, port, timeout=3)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    finally:
        conn.close()


def kueue_webhook_probe(kube: Kube) -> bool | None:
    """Dry-run a labelled Job: only Kueue's mutating webhook turns spec.suspend on."""
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "taugrid-readiness-probe",
            "namespace": "default",
            "labels": {"kueue.x-k8s.io/queue-name": READINESS_PROBE_QUEUE},
        },
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "probe", "image": "busybox", "command": ["true"]}],
                }
            }
        },
    }
    status, data = kube.request("POST", "/apis/batch/v1/namespaces/default/jobs?dryRun=All", job)
    if status == 201 and isinstance(data, dict) and data["spec"].get("suspend") is True:
        return True
    message = data.get("message") if isinstance(data, dict) else data
    raise ControlPlaneError(f"dry-run Job: HTTP {status}: {message or 'not suspended'}")


def wait_established(kube: Kube, names: Sequence[str], timeout: float) -> None:
    def probe() -> bool | None:
        for name in names:
            crd = kube.checked(
                "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
            )
            conditions = {
                c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []
            }
            if conditions.get("Established") != "True":
                return None
        return True

    wait_for(f"{len(names)} CRDs to be Established", probe, timeout)


def wait_apiservices(kube: Kube, names: Sequence[str], timeout: float, log_file: Path) -> None:
    def probe() -> bool | None:
        for name in names:
            svc = kube.checked("GET", f"/apis/apiregistration.k8s.io/v1/apiservices/{name}")
            conditions = {c["type"]: c for c in (svc.get("status") or {}).get("conditions") or []}
            available = conditions.get("Available", {})
            if available.get("status") != "True":
                raise ControlPlaneError(f"APIService {name}: {available.get('message')}")
        return True

    wait_for("Kueue visibility APIServices to become Available", probe, timeout, log_file=log_file)


def node_manifests(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """The Node objects in these YAML files (a directory: its *.yaml, sorted)."""
    files: list[Path] = []
    for path in paths:
        files += sorted(path.glob("*.yaml")) if path.is_dir() else [path]
    nodes = [doc for path in files for doc in _load_yaml_docs(path)]
    for node in nodes:
        if node.get("kind") != "Node":
            raise ControlPlaneError(f"only Nodes belong in the node files, not {node.get('kind')}")
    names = [n["metadata"]["name"] for n in nodes]
    if not names or len(set(names)) != len(names):
        raise ControlPlaneError(f"node files {[str(f) for f in files]}: no or duplicate Nodes")
    return nodes


def create_nodes(kube: Kube, nodes: Sequence[Mapping[str, Any]]) -> None:
    for node in nodes:
        name = node["metadata"]["name"]
        body = {k: v for k, v in node.items() if k != "status"}
        status, data = kube.request("POST", "/api/v1/nodes", body)
        if status not in (201, 409):
            raise ControlPlaneError(f"creating Node {name}: HTTP {status}: {data}")
        # Capacity and allocatable through the status subresource, as a kubelet reports them;
        # KWOK (started afterwards) adds conditions, addresses and the kubelet endpoint.
        kube.checked(
            "PATCH",
            f"/api/v1/nodes/{name}/status",
            {"status": node.get("status") or {}},
            content_type="application/merge-patch+json",
        )


def nodes_ready(kube: Kube, names: Sequence[str], kwok_port: int) -> bool | None:
    """True once every node is Ready (KWOK), reports KWOK's kubelet endpoint, and no longer
    carries the `not-ready` taint (lifted by the controller-manager's node-lifecycle
    controller): only then does the scheduler place pods on it."""
    for name in names:
        node = kube.checked("GET", f"/api/v1/nodes/{name}")
        status = node.get("status") or {}
        conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
        port = ((status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port")
        taints = [t["key"] for t in (node.get("spec") or {}).get("taints") or []]
        if conditions.get("Ready") != "True" or port != kwok_port or NOT_READY_TAINT in taints:
            return None
    return True


def kwok_config() -> dict[str, Any]:
    """KWOK's settings that have no flag (the rest are on its command line). A configuration
    given to KWOK is not defaulted, so every option is spelled out: KWOK v0.8.0's defaults,
    except that profiling is off (as for the other components)."""
    return {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "enableDebuggingHandlers": True,  # the kubelet API: pods/log
            "enableProfilingHandler": False,
            "enableContentionProfiling": False,
            "manageAllNodes": False,
            "podPlayStageParallelism": 4,
            "nodePlayStageParallelism": 4,
            "nodeLeaseParallelism": 4,
            "podsOnNodeSyncParallelism": 1,
            "enablePodsOnNodeSyncListPager": True,
            "enablePodsOnNodeSyncStreamWatch": False,
        },
    }


def process_names(record: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The processes of a cluster, in start order (the Ray ones when it was started with them)."""
    return PROCESSES + (RAY_PROCESSES if (record or {}).get("ray") else ())


def ray_ready_file(state: Path) -> Path:
    return state / "ray" / "ready"


def _ray_url(state: Path) -> str | None:
    """The Ray head's dashboard once it has run a job (its ready file), else None."""
    try:
        return ray_ready_file(state).read_text().strip() or None
    except OSError:
        return None


def cluster_status(state: Path) -> dict[str, Any]:
    """What is running, on which ports, and whether the API answers."""
    data = load_state(state)
    processes = {}
    for name in process_names(data):
        pid = read_pid(state, name)
        processes[name] = {"pid": pid, "alive": bool(pid and pid_alive(pid))}
    report: dict[str, Any] = {
        "state_dir": str(state),
        "kubeconfig": str(state / "kubeconfig") if (state / "kubeconfig").exists() else None,
        "processes": processes,
        "ports": (data or {}).get("ports", {}),
        "versions": (data or {}).get("versions", {}),
        "ray": _ray_url(state),
        "ready": False,
    }
    pids = [int(p["pid"]) for p in processes.values() if p["alive"] and p["pid"]]
    report["listening"] = [f"{host}:{port}" for host, port in listening_sockets(pids)]
    if data and all(p["alive"] for p in processes.values()):
        try:
            kube = Kube(data["ports"]["apiserver"], state / "pki")
            report["ready"] = bool(
                apiserver_ready(kube)
                and health_ok(data["ports"]["kueue_health"], "/readyz")
                and health_ok(data["ports"]["kuberay_health"], "/readyz")
                and health_ok(data["ports"]["scheduler"], "/healthz", tls=True, pki=state / "pki")
                and health_ok(data["ports"]["kwok"], "/healthz", tls=True, pki=state / "pki")
                and kueue_webhook_probe(kube)
                and (not data.get("ray") or report["ray"] is not None)
            )
        except (OSError, ControlPlaneError, ssl.SSLError, http.client.HTTPException) as exc:
            report["error"] = str(exc)
    return report


def up(
    versions: Mapping[str, str],
    *,
    build_missing: bool = True,
    timeout: float = 180,
    node_files: Sequence[Path] = (NODES_DIR,),
    ray: bool = False,
) -> dict[str, Any]:
    """Start the control plane (or reuse a healthy one) and return its status report; with
    ``ray``, also a real Ray head and the stand-in for KubeRay's submitter pods
    (deploy/cluster/ray_submitter.py), added to a running control plane that lacks them."""
    state = state_dir()
    with file_lock(state.parent / f".{state.name}.lock"):
        existing = cluster_status(state)
        revision = (load_state(state) or {}).get("launch_revision")
        if existing["ready"] and revision == LAUNCH_REVISION:
            log(f"already up (state in {state}); reusing it")
            if ray and existing["ray"] is None:
                ensure_ray()
                start_ray(state, timeout)
                return cluster_status(state)
            return existing
        if existing["ready"]:
            log(
                f"a running control plane was started another way (launch revision {revision}, "
                f"now {LAUNCH_REVISION}): restarting it"
            )
            _down(state)
        elif load_state(state) is not None or owned_pids(state):
            log("a previous control plane is incomplete or unhealthy: stopping it first")
            _down(state)

        missing = [c for c in COMPONENTS if not c.is_built(versions)]
        if missing and not build_missing:
            raise ControlPlaneError(
                "not built: "
                + ", ".join(f"{c.name} {c.version(versions)}" for c in missing)
                + " (run `make cluster-build`)"
            )
        build(versions)
        mount_namespace_prefix()  # fail now, not after four components have started
        node_manifests(node_files)  # likewise for a broken node file
        if ray:
            ensure_ray()  # installed once (minutes when cold), before anything starts
        started = time.monotonic()
        shutil.rmtree(state, ignore_errors=True)
        state.mkdir(parents=True)
        try:
            _start(state, versions, timeout=timeout, node_files=node_files, ray=ray)
        except BaseException:
            log(f"start failed: stopping what was started (logs kept in {state / 'logs'})")
            _stop_processes(state)
            raise
        log(
            f"control plane ready in {time.monotonic() - started:.1f}s; "
            f"kubeconfig: {state / 'kubeconfig'}"
        )
        return cluster_status(state)


def _start(
    state: Path,
    versions: Mapping[str, str],
    *,
    timeout: float,
    node_files: Sequence[Path],
    ray: bool = False,
) -> None:
    launch = Launch(state, versions, timeout, node_files)
    launch.prepare()
    launch.start_kine()
    launch.start_apiserver()
    launch.install_manifests()
    if ray:
        # Its Ray head takes a while to answer: it starts now, beside the rest.
        launch.record["ray"] = True
        launch.save_record()
        launch_ray(state)
    launch.start_controller_manager()
    launch.start_scheduler()
    launch.start_kueue()
    launch.start_kuberay()
    launch.create_nodes()
    launch.start_kwok()
    launch.await_ready()
    if ray:
        await_ray(state, timeout)


def load_ray_head() -> Any:
    """deploy/dev/ray_head.py, by path (deploy/ is not a package)."""
    name = "taugrid_ray_head"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, RAY_HEAD_SCRIPT)
    if spec is None or spec.loader is None:
        raise ControlPlaneError(f"cannot load {RAY_HEAD_SCRIPT}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def ensure_ray() -> None:
    """Ray from PyPI in its cached venv (deploy/dev/ray_head.py install): once, a minute."""
    ray_head = load_ray_head()
    if not ray_head.is_installed():
        log("installing Ray for the cluster's Ray head (once; about a minute)")
    try:
        ray_head.ensure_ray()
    except (subprocess.CalledProcessError, OSError) as error:
        raise ControlPlaneError(
            f"Ray could not be installed ({error}); see the output above"
        ) from None


def launch_ray(state: Path) -> None:
    """Start deploy/cluster/ray_submitter.py (it starts the Ray head itself)."""
    log("starting the Ray head and the stand-in for KubeRay's submitter pods")
    ray_ready_file(state).unlink(missing_ok=True)
    start_process(
        state,
        "ray-submitter",
        [sys.executable, str(RAY_SUBMITTER), str(state)],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def await_ray(state: Path, timeout: float) -> None:
    def alive() -> bool:
        pid = read_pid(state, "ray-submitter")
        return bool(pid and pid_alive(pid))

    wait_for(
        "the Ray head to run a job",
        lambda: True if ray_ready_file(state).exists() else None,
        max(timeout, 180),
        log_file=state / "logs" / "ray-submitter.log",
        alive=alive,
    )


def start_ray(state: Path, timeout: float) -> None:
    """Add the Ray head and the submitter stand-in to a running control plane."""
    record = load_state(state) or {}
    record["ray"] = True
    write_state(state, record)
    launch_ray(state)
    await_ray(state, timeout)


class Launch:
    """The steps of one `up`, in order; each waits for what the next one depends on."""

    def __init__(
        self,
        state: Path,
        versions: Mapping[str, str],
        timeout: float,
        node_files: Sequence[Path] = (NODES_DIR,),
    ) -> None:
        self.state = state
        self.node_files = list(node_files)
        self.node_names: list[str] = []
        self.versions = versions
        self.timeout = timeout
        self.pki = state / "pki"
        self.logs = state / "logs"
        self.kubeconfig = state / "kubeconfig"
        self.ports = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES)), strict=True))
        self.api_url = f"https://{LOOPBACK}:{self.ports['apiserver']}"
        self.webhook_url = f"https://{LOOPBACK}:{self.ports['kueue_webhook']}"
        self.record: dict[str, Any] = {
            "ports": self.ports,
            "versions": dict(versions),
            "launch_revision": LAUNCH_REVISION,
            "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        }
        self.visibility_apiservices: list[str] = []
        self._kube: Kube | None = None

    @property
    def kube(self) -> Kube:
        if self._kube is None:
            self._kube = Kube(self.ports["apiserver"], self.pki)
        return self._kube

    @property
    def ca_bundle(self) -> str:
        return base64.b64encode((self.pki / "ca.crt").read_bytes()).decode()

    def save_record(self) -> None:
        write_state(self.state, self.record)

    def wait_process(self, name: str, what: str, probe: Callable[[], T | None]) -> T:
        """Wait for `probe`, failing early (with its log) if process `name` dies meanwhile."""

        def alive() -> bool:
            pid = read_pid(self.state, name)
            return bool(pid and pid_alive(pid))

        return wait_for(what, probe, self.timeout, log_file=self.logs / f"{name}.log", alive=alive)

    def prepare(self) -> None:
        log("generating certificates (CA, serving, client, front-proxy, service-account keys)")
        generate_pki(self.pki)
        write_kubeconfig(self.kubeconfig, self.api_url, self.pki, "admin")
        for user in ("controller-manager", "scheduler"):
            write_kubeconfig(self.state / f"{user}.kubeconfig", self.api_url, self.pki, user)
        self.save_record()

    def start_kine(self) -> None:
        """kine: the etcd v3 API on SQLite (its default listen address is all interfaces)."""
        port = self.ports["kine"]
        log(f"starting kine on {LOOPBACK}:{port}")
        database = self.state / "kine" / "state.db"
        start_process(
            self.state,
            "kine",
            [
                str(KINE.binary(self.versions)),
                f"--listen-address={LOOPBACK}:{port}",
                f"--metrics-bind-address={LOOPBACK}:{self.ports['kine_metrics']}",
                f"--endpoint=sqlite://{database}?_journal=WAL&cache=shared&_busy_timeout=30000",
            ],
        )
        self.wait_process("kine", "kine accepting connections", lambda: port_open(port) or None)

    def start_apiserver(self) -> None:
        log(f"starting kube-apiserver on {self.api_url}")
        pki = self.pki
        start_process(
            self.state,
            "kube-apiserver",
            [
                str(KUBERNETES.binary(self.versions, "kube-apiserver")),
                f"--etcd-servers=http://{LOOPBACK}:{self.ports['kine']}",
                f"--bind-address={LOOPBACK}",
                f"--advertise-address={LOOPBACK}",
                f"--secure-port={self.ports['apiserver']}",
                f"--cert-dir={self.state / 'kube-apiserver'}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--service-account-issuer={SA_ISSUER}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # The `kubernetes` Service's Endpoints may not point at a loopback address.
                "--endpoint-reconciler-type=none",
                "--authorization-mode=Node,RBAC",
                # Setting blockOwnerDeletion needs `update` on the owner's finalizers (the run's
                # Secret owned by its Job or RayJob): on here so the shipped role is tested for
                # it, as some distributions (OpenShift) enforce it.
                "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
                "--allow-privileged=true",
                # Front proxy: lets the aggregator reach Kueue's visibility API server.
                f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
                # pods/log, exec, port-forward: to the node's InternalIP (127.0.0.1) and the
                # kubelet port it reports (KWOK's server), TLS verified with our CA.
                "--kubelet-preferred-address-types=InternalIP",
                f"--kubelet-certificate-authority={pki / 'ca.crt'}",
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                "--profiling=false",
            ],
        )
        self.wait_process(
            "kube-apiserver", "kube-apiserver /readyz", lambda: apiserver_ready(self.kube) or None
        )

    def install_manifests(self) -> None:
        """CRDs, Kueue's webhooks and its visibility APIServices, from the Go modules."""
        log("installing Kueue, KubeRay and KWOK CRDs from the Go modules (server-side apply)")
        kueue_dir = module_dir("sigs.k8s.io/kueue", self.versions["KUEUE_VERSION"])
        kuberay_dir = module_dir(
            "github.com/ray-project/kuberay/ray-operator", self.versions["KUBERAY_VERSION"]
        )
        kwok_dir = module_dir("sigs.k8s.io/kwok", self.versions["KWOK_VERSION"])
        crds = kueue_crds(kueue_dir, self.webhook_url, self.ca_bundle) + kuberay_crds(kuberay_dir)
        crds += kwok_crds(kwok_dir)
        # Concurrent applies: the apiserver spends its time on the big schemas.
        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda crd: self.kube.apply(resource_path(crd), crd), crds))
        wait_established(self.kube, [c["metadata"]["name"] for c in crds], self.timeout)

        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NAMESPACE}}
        objects = [namespace]
        objects += kueue_webhook_configurations(kueue_dir, self.webhook_url, self.ca_bundle)
        visibility = kueue_visibility_objects(
            kueue_dir, self.ports["kueue_visibility"], self.ca_bundle
        )
        objects += visibility
        for obj in objects:
            self.kube.apply(resource_path(obj), obj)
        self.visibility_apiservices = [
            o["metadata"]["name"] for o in visibility if o["kind"] == "APIService"
        ]

    def start_controller_manager(self) -> None:
        """Namespace deletion, garbage collection, ServiceAccounts, Job pods: a real cluster's
        housekeeping. Its node-lifecycle controller lifts the `not-ready` taint the apiserver
        puts on every new Node once KWOK reports it Ready, and watches the Leases KWOK renews.
        Taint-based eviction is off: a node that misses a heartbeat on a loaded machine gets
        tainted, but its pods are not evicted."""
        port = self.ports["controller_manager"]
        log(f"starting kube-controller-manager on {LOOPBACK}:{port}")
        pki = self.pki
        cm_kubeconfig = self.state / "controller-manager.kubeconfig"
        start_process(
            self.state,
            "kube-controller-manager",
            [
                str(KUBERNETES.binary(self.versions, "kube-controller-manager")),
                f"--kubeconfig={cm_kubeconfig}",
                f"--authentication-kubeconfig={cm_kubeconfig}",
                f"--authorization-kubeconfig={cm_kubeconfig}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={port}",
                f"--tls-cert-file={pki / 'controller-manager-serving.crt'}",
                f"--tls-private-key-file={pki / 'controller-manager-serving.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
                "--leader-elect=false",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                "--use-service-account-credentials=true",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--controllers=*,-taint-eviction-controller",
                "--profiling=false",
            ],
        )

    def start_scheduler(self) -> None:
        """The default kube-scheduler: binds pods to the fake nodes (taints, tolerations, node
        selectors, resources from the Nodes' allocatable, as on a real cluster)."""
        port = self.ports["scheduler"]
        log(f"starting kube-scheduler on {LOOPBACK}:{port}")
        pki = self.pki
        kubeconfig = self.state / "scheduler.kubeconfig"
        start_process(
            self.state,
            "kube-scheduler",
            [
                str(KUBE_SCHEDULER.binary(self.versions)),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={port}",
                f"--tls-cert-file={pki / 'scheduler-serving.crt'}",
                f"--tls-private-key-file={pki / 'scheduler-serving.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
                "--leader-elect=false",
                "--profiling=false",
            ],
        )

    def create_nodes(self) -> None:
        """The fake nodes from deploy/cluster/nodes/, before KWOK starts managing them."""
        nodes = node_manifests(self.node_files)
        pools: dict[str, int] = {}
        for node in nodes:
            pool = node["metadata"].get("labels", {}).get("taugrid.io/node-pool", "?")
            pools[pool] = pools.get(pool, 0) + 1
        log("creating Nodes: " + ", ".join(f"{pool} x{count}" for pool, count in pools.items()))
        create_nodes(self.kube, nodes)
        self.node_names = [n["metadata"]["name"] for n in nodes]
        self.record["nodes"] = self.node_names
        self.save_record()

    def start_kwok(self) -> None:
        """KWOK: the kubelet of every fake node. Makes them Ready, renews their Leases, plays
        the pod Stages of kwok/stages.yaml, and serves the kubelet API (pods/log) on 127.0.0.1
        with a certificate of our CA; every node reports that address and port."""
        port = self.ports["kwok"]
        log(f"starting KWOK (kubelet API of the fake nodes on {LOOPBACK}:{port})")
        kwok_state = self.state / "kwok"
        kwok_state.mkdir(parents=True, exist_ok=True)
        config_path = kwok_state / "kwok.yaml"
        config_path.write_text(yaml.safe_dump(kwok_config(), sort_keys=False))
        key, value = KWOK_NODE_ANNOTATION
        start_process(
            self.state,
            "kwok",
            [
                str(KWOK.binary(self.versions)),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={config_path}",
                f"--config={KWOK_STAGES}",
                f"--manage-nodes-with-annotation-selector={key}={value}",
                f"--node-ip={LOOPBACK}",
                f"--node-port={port}",
                f"--server-address={LOOPBACK}:{port}",
                f"--tls-cert-file={self.pki / 'kwok-serving.crt'}",
                f"--tls-private-key-file={self.pki / 'kwok-serving.key'}",
                f"--cidr={POD_CIDR}",
                f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
                "--enable-crds=" + ",".join(KWOK_CRDS),
            ],
            cwd=kwok_state,
            # KWOK also reads $KWOK_WORKDIR/kwok.yaml (default ~/.kwok): keep the user's out.
            env=dict(os.environ, KWOK_WORKDIR=str(kwok_state)),
        )

    def start_kueue(self) -> None:
        log(f"starting Kueue (webhooks on {self.webhook_url})")
        kueue_state = self.state / "kueue"
        certs = kueue_state / "webhook-certs"
        certs.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.pki / "kueue-webhook.crt", certs / "tls.crt")
        shutil.copy(self.pki / "kueue-webhook.key", certs / "tls.key")
        config_path = kueue_state / "config.yaml"
        config_path.write_text(
            yaml.safe_dump(kueue_config(self.state, self.ports), sort_keys=False)
        )
        command = kueue_command(
            self.state, KUEUE.binary(self.versions), self.kubeconfig, config_path
        )
        start_process(self.state, "kueue", command, cwd=kueue_state)

    def start_kuberay(self) -> None:
        log("starting the KubeRay operator")
        command = kuberay_command(
            self.state,
            KUBERAY.binary(self.versions),
            [
                f"--kubeconfig={self.kubeconfig}",
                f"--metrics-addr={LOOPBACK}:{self.ports['kuberay_metrics']}",
                f"--health-probe-bind-address={LOOPBACK}:{self.ports['kuberay_health']}",
                "--enable-leader-election=false",
                "--log-stdout-encoder=console",
            ],
        )
        start_process(
            self.state,
            "kuberay-operator",
            command,
            env=dict(os.environ, KUBECONFIG=str(self.kubeconfig)),
        )

    def await_ready(self) -> None:
        """Ready means every component answers, not merely that its process exists."""
        log("waiting for every component to answer")
        ports, kube = self.ports, self.kube
        self.wait_process(
            "kube-controller-manager",
            "kube-controller-manager /healthz",
            lambda: (
                health_ok(ports["controller_manager"], "/healthz", tls=True, pki=self.pki) or None
            ),
        )
        self.wait_process(
            "kube-controller-manager",
            "the controller-manager to create the `default` ServiceAccount",
            lambda: (
                kube.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200
                or None
            ),
        )
        self.wait_process(
            "kueue", "Kueue /readyz", lambda: health_ok(ports["kueue_health"], "/readyz") or None
        )
        self.wait_process(
            "kueue",
            "Kueue's mutating webhook to suspend a dry-run labelled Job",
            lambda: kueue_webhook_probe(kube),
        )
        wait_apiservices(kube, self.visibility_apiservices, self.timeout, self.logs / "kueue.log")
        self.wait_process(
            "kuberay-operator",
            "KubeRay operator /readyz",
            lambda: health_ok(ports["kuberay_health"], "/readyz") or None,
        )
        self.wait_process(
            "kube-scheduler",
            "kube-scheduler /healthz",
            lambda: health_ok(ports["scheduler"], "/healthz", tls=True, pki=self.pki) or None,
        )
        self.wait_process(
            "kwok",
            "KWOK's server /healthz",
            lambda: health_ok(ports["kwok"], "/healthz", tls=True, pki=self.pki) or None,
        )
        self.wait_process(
            "kwok",
            f"the {len(self.node_names)} fake nodes to be Ready (KWOK) and schedulable "
            "(the node-lifecycle controller lifts the not-ready taint)",
            lambda: nodes_ready(kube, self.node_names, ports["kwok"]),
        )
        pids = [pid for name in PROCESSES if (pid := read_pid(self.state, name)) is not None]
        exposed = [(h, p) for h, p in listening_sockets(pids) if h != LOOPBACK]
        if exposed:
            raise ControlPlaneError(f"listening on a non-loopback address: {exposed}")
        self.record["ready_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        self.save_record()


def _stop_processes(state: Path) -> tuple[list[int], list[int]]:
    """Stop every process of this state directory; returns (survivors, ports they held)."""
    names = {
        pid: name
        for name in reversed(PROCESSES + RAY_PROCESSES)
        if (pid := read_pid(state, name)) is not None
    }
    pids = list(names)
    # Anything else still naming this state directory (a lost pidfile, a crashed `up`).
    pids += [pid for pid in owned_pids(state) if pid not in names]
    held = sorted({port for _, port in listening_sockets(pids)})
    return stop_pids(pids, names=names), held


def _down(state: Path) -> None:
    survivors, held = _stop_processes(state)
    if survivors:
        raise ControlPlaneError(f"processes survived SIGKILL: {survivors}")
    # Only the ports our processes held: a recorded port of a long-dead cluster may by now
    # belong to somebody else.
    wait_for(
        "the control plane's ports to be free",
        lambda: True if not any(port_open(p) for p in held) else None,
        15,
    )
    shutil.rmtree(state, ignore_errors=True)


def down() -> None:
    state = state_dir()
    with file_lock(state.parent / f".{state.name}.lock"):
        if not state.exists() and not owned_pids(state):
            log(f"nothing to stop ({state} does not exist)")
            return
        _down(state)
        log(f"stopped; removed {state}")


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    p_build = sub.add_parser("build", help="build missing components into the cache")
    p_build.add_argument(
        "components",
        nargs="*",
        default=[],
        help="only these ({})".format(", ".join(c.name for c in COMPONENTS)),
    )
    p_up = sub.add_parser("up", help="start (or reuse) the control plane; prints the kubeconfig")
    p_up.add_argument("--no-build", action="store_true", help="fail instead of building")
    p_up.add_argument(
        "--timeout",
        type=float,
        default=180,
        help="seconds each component may take to become ready (default 180)",
    )
    p_up.add_argument(
        "--ray",
        action="store_true",
        help="also a real Ray head and a stand-in for KubeRay's submitter pods, so that "
        "RayJobs end (make cluster-up; added to a running control plane that lacks them)",
    )
    p_up.add_argument(
        "--nodes",
        type=Path,
        action="append",
        help="Node YAML file or directory of them (repeatable; default deploy/cluster/nodes/)",
    )
    sub.add_parser("down", help="stop everything and remove the state directory")
    p_status = sub.add_parser("status", help="report processes, ports and readiness")
    p_status.add_argument("--json", action="store_true")
    sub.add_parser("kubeconfig", help="print the admin kubeconfig path")
    args = parser.parse_args(argv)

    try:
        versions = read_versions()
        if args.command == "build":
            unknown = set(args.components) - {c.name for c in COMPONENTS}
            if unknown:
                raise ControlPlaneError(f"unknown components: {sorted(unknown)}")
            build(versions, args.components)
        elif args.command == "up":
            up(
                versions,
                build_missing=not args.no_build,
                timeout=args.timeout,
                node_files=args.nodes or (NODES_DIR,),
                ray=args.ray,
            )
            print(state_dir() / "kubeconfig")
        elif args.command == "down":
            down()
        elif args.command == "status":
            report = cluster_status(state_dir())
            if args.json:
                print(json.dumps(report, indent=2))
            else:
                print(f"state dir:  {report['state_dir']}")
                print(f"kubeconfig: {report['kubeconfig']}")
                for name, proc in report["processes"].items():
                    print(f"  {name:24} pid={proc['pid']} alive={proc['alive']}")
                for name, port in report["ports"].items():
                    print(f"  port {name:20} {LOOPBACK}:{port}")
                print(f"listening:  {', '.join(report['listening']) or '-'}")
                print(f"Ray head:   {report['ray'] or '- (up --ray starts one)'}")
                print(
                    f"ready: {report['ready']}"
                    + (f" ({report['error']})" if report.get("error") else "")
                )
            return 0 if report["ready"] else 1
        elif args.command == "kubeconfig":
            path = state_dir() / "kubeconfig"
            if not path.exists():
                raise ControlPlaneError(f"no kubeconfig at {path}: run `make cluster-up`")
            print(path)
    except ControlPlaneError as exc:
        print(f"controlplane: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"controlplane: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
