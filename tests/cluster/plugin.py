"""pytest plugin: the ``kube_cluster`` session fixture for tests marked ``cluster``.

Why a plugin and not a conftest: tests anywhere in the suite (not only tests/cluster/) will want
the real control plane, and a session fixture must be defined once to be started once. Register
it from the root conftest with ``pytest_plugins = ["tests.cluster.plugin"]``.

The control plane is deploy/cluster/controlplane.py (kube-apiserver on kine, the
controller-manager, kube-scheduler, Kueue, the KubeRay operator and KWOK with fake GPU and CPU
nodes, built from Go modules, on 127.0.0.1; with ``--ray``, as here, a real Ray head and a
stand-in for KubeRay's submitter pods, deploy/cluster/ray_submitter.py). The fixture reuses
a running one (``make cluster-up``; one without the Ray head gets it) or starts one and stops
it at the end of the session (``TAUGRID_KEEP_CLUSTER=1`` keeps it for the next run). Without
``go`` (or the ``kubernetes`` package) the tests are skipped locally with the reason; with
``CI`` set that is a failure, so CI can never pass by skipping the only tests that talk to the
real thing. A control plane that fails to start is a failure everywhere, with the end of its
output in the message.

Fixtures: ``kube_cluster`` (session: ``.kubeconfig``, ``.api_client()``, ``.dynamic()``,
``.resource()``) and ``kube`` (per test: creates objects and deletes them afterwards).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from tests.scripts import load_script

if TYPE_CHECKING:
    from kubernetes.client import ApiClient
    from kubernetes.dynamic import DynamicClient
    from kubernetes.dynamic.resource import Resource

    from kube import KubeClient

REPO = Path(__file__).resolve().parents[2]
CONTROLPLANE = REPO / "deploy" / "cluster" / "controlplane.py"
RAY_SUBMITTER = CONTROLPLANE.parent / "ray_submitter.py"
# A cold build (Go module download + compile on 2 cores) plus start; CI's limit is 90 minutes.
UP_TIMEOUT_S = float(os.environ.get("TAUGRID_CLUSTER_UP_TIMEOUT", "3600"))

T = TypeVar("T")


def load_controlplane() -> ModuleType:
    """Import deploy/cluster/controlplane.py by path (deploy/ is not a Python package)."""
    return load_script(CONTROLPLANE, "taugrid_controlplane")


def pytest_configure(config: pytest.Config) -> None:
    if not any(str(line).startswith("cluster:") for line in config.getini("markers")):
        config.addinivalue_line(
            "markers",
            "cluster: needs the real Kubernetes control plane (kube-apiserver, Kueue, KubeRay, "
            "kube-scheduler, KWOK nodes) from deploy/cluster; skipped without `go`, a failure "
            "in CI",
        )


def wait_until(
    what: str,
    probe: Callable[[], T | None],
    timeout: float = 60,
    interval: float = 0.5,
    describe: Callable[[], str] | None = None,
) -> T:
    """Poll until `probe` returns a value that is not None; fail the test with context."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result is not None:
            return result
        if time.monotonic() > deadline:
            detail = f"\nlast seen: {describe()}" if describe else ""
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}{detail}", pytrace=False)
        time.sleep(interval)


def wait_for_access(
    client: KubeClient, verb: str, resource: str, *, allowed: bool = True, **where: Any
) -> None:
    """Wait until the API server's answer to ``client``'s "may I ``verb`` ``resource``?" is
    ``allowed``: RBAC changes take a moment to be in force."""
    wait_until(
        f"{verb} {resource} to be {'allowed' if allowed else 'refused'}",
        lambda: True if client.can_i(verb, resource, **where).allowed is allowed else None,
        timeout=30,
        interval=0.2,
    )


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr_tail: str


def run_controlplane(
    request: pytest.FixtureRequest,
    *args: str,
    timeout: float = UP_TIMEOUT_S,
) -> Outcome:
    """Run controlplane.py, showing its progress live (a cold build takes many minutes) and
    keeping the end of it for the failure message."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    context = capture.global_and_fixture_disabled() if capture else contextlib.nullcontext()
    tail: collections.deque[str] = collections.deque(maxlen=60)
    with (
        context,
        subprocess.Popen(
            [sys.executable, str(CONTROLPLANE), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as proc,
    ):
        watchdog = threading.Timer(timeout, proc.kill)
        watchdog.start()
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                sys.stderr.write(line)
                sys.stderr.flush()
                tail.append(line)
            stdout = proc.stdout.read() if proc.stdout else ""
            code = proc.wait()
        finally:
            watchdog.cancel()
    if code < 0:
        tail.append(f"(controlplane.py {' '.join(args)} killed after {timeout:.0f}s)\n")
    return Outcome(code, stdout, "".join(tail))


def cluster_report(request: pytest.FixtureRequest) -> dict[str, Any]:
    """`controlplane.py status --json`, or {} when there is nothing to report."""
    outcome = run_controlplane(request, "status", "--json", timeout=120)
    try:
        report: dict[str, Any] = json.loads(outcome.stdout)
    except ValueError:
        return {}
    return report


@dataclass
class KubeCluster:
    """A running control plane: its admin kubeconfig and clients for it."""

    kubeconfig: Path
    state_dir: Path
    ports: dict[str, int]
    started_here: bool
    _client: ApiClient | None = field(default=None, repr=False)
    _dynamic: DynamicClient | None = field(default=None, repr=False)

    def api_client(self) -> ApiClient:
        """A kubernetes ApiClient for the admin user (one shared instance)."""
        if self._client is None:
            from kubernetes import config

            new_client: Callable[..., ApiClient] = config.new_client_from_config
            self._client = new_client(config_file=str(self.kubeconfig))
        return self._client

    def dynamic(self) -> DynamicClient:
        """A DynamicClient: plain dicts for every kind, CRDs included."""
        if self._dynamic is None:
            from kubernetes.dynamic import DynamicClient

            make_dynamic: Callable[[ApiClient], DynamicClient] = DynamicClient
            self._dynamic = make_dynamic(self.api_client())
        return self._dynamic

    def resource(self, api_version: str, kind: str) -> Resource:
        found: Resource = self.dynamic().resources.get(api_version=api_version, kind=kind)
        return found

    def log_tail(self, component: str, mentioning: str = "", lines: int = 20) -> str:
        """The last ``lines`` lines of a component's log (those ``mentioning`` a word)."""
        path = self.state_dir / "logs" / f"{component}.log"
        try:
            text = path.read_text(errors="replace")
        except OSError as error:
            return f"(no log: {error})"
        kept = [line for line in text.splitlines() if mentioning in line]
        return "\n".join(kept[-lines:]) or f"(nothing mentioning {mentioning!r} in {path})"


@pytest.fixture(scope="session")
def kube_cluster(request: pytest.FixtureRequest) -> Iterator[KubeCluster]:
    """Start the real control plane once per session (or reuse a running one)."""
    in_ci = bool(os.environ.get("CI"))

    def unavailable(reason: str) -> None:
        if in_ci:
            pytest.fail(f"real Kubernetes control plane unavailable in CI: {reason}", pytrace=False)
        pytest.skip(reason)

    if load_controlplane().go_binary() is None:
        unavailable(
            "`go` is not on PATH: the control plane (kube-apiserver, Kueue, KubeRay) "
            "is built from Go modules; install Go >= 1.26 to run tests marked `cluster`"
        )
    try:
        import kubernetes  # noqa: F401
    except ImportError:
        unavailable("the `kubernetes` Python package is not installed")

    report = cluster_report(request)
    started_here = False
    if report.get("ready") and not report.get("ray"):
        # A running control plane without its Ray head (started without --ray): added to it.
        result = run_controlplane(request, "up", "--ray")
        if result.returncode != 0:
            pytest.fail(
                f"`controlplane.py up --ray` could not add the Ray head (exit "
                f"{result.returncode}):\n{result.stderr_tail}",
                pytrace=False,
            )
        report = cluster_report(request)
    if not report.get("ready"):
        # As `make cluster-up`: with the Ray head and the stand-in for KubeRay's submitter
        # pods (deploy/cluster/ray_submitter.py), which RayJobs need to end.
        result = run_controlplane(request, "up", "--ray")
        if result.returncode != 0:
            pytest.fail(
                f"`controlplane.py up` failed (exit {result.returncode}); the end of its "
                f"output (logs are kept in the state directory):\n{result.stderr_tail}",
                pytrace=False,
            )
        started_here = True
        report = cluster_report(request)
        if not report.get("ready"):
            pytest.fail(f"control plane started but is not ready: {report}", pytrace=False)

    cluster = KubeCluster(
        kubeconfig=Path(report["kubeconfig"]),
        state_dir=Path(report["state_dir"]),
        ports={k: int(v) for k, v in report["ports"].items()},
        started_here=started_here,
    )
    yield cluster
    if cluster._client is not None:
        with contextlib.suppress(Exception):
            close: Callable[[], None] = cluster._client.close
            close()
    if started_here and not os.environ.get("TAUGRID_KEEP_CLUSTER"):
        left = stop_and_check(request, cluster.state_dir)
        if left:
            pytest.fail("`controlplane.py down` left behind: " + "; ".join(left), pytrace=False)


def stop_and_check(request: pytest.FixtureRequest, state: Path) -> list[str]:
    """``controlplane.py down`` of the control plane in ``state``, and what it left behind:
    a process (of the control plane or its Ray head), a port they listened on, the state
    directory. Nothing, as it should be: an empty list (a failure at the session's end)."""
    controlplane = load_controlplane()
    head = load_script(RAY_SUBMITTER, "taugrid_ray_submitter").head_of(state)
    ray_pids = controlplane.load_ray_head().pids_naming(head.temp_dir) if head else []
    pids = controlplane.owned_pids(state) + ray_pids
    sockets = set(controlplane.listening_sockets(pids))
    stopped = run_controlplane(request, "down", timeout=120)
    left = []
    if stopped.returncode != 0:
        left.append(f"exit {stopped.returncode}: {stopped.stderr_tail}")
    if alive := [pid for pid in pids if controlplane.pid_alive(pid)]:
        left.append(f"processes {alive}")
    if head is not None and (ray := controlplane.load_ray_head().pids_naming(head.temp_dir)):
        left.append(f"the Ray head's processes {ray}")
    if owned := controlplane.owned_pids(state):
        left.append(f"processes it owns {owned}")
    if listening := sockets & set(controlplane.listening_sockets(None)):
        left.append(f"listening sockets {sorted(listening)}")
    if state.exists():
        left.append(f"its state directory {state}")
    return left


class Kube:
    """Per-test helper (fixture `kube`): dict-based get/list/create/delete on any kind,
    including CRDs; everything it created is deleted when the test ends."""

    def __init__(self, cluster: KubeCluster) -> None:
        self.cluster = cluster
        self._created: list[tuple[str, str, str, str | None]] = []

    def unique(self, prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:6]}"

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        resource = self.cluster.resource(body["apiVersion"], body["kind"])
        namespace = body["metadata"].get("namespace")
        created: dict[str, Any] = resource.create(body=body, namespace=namespace).to_dict()
        self._created.append(
            (body["apiVersion"], body["kind"], created["metadata"]["name"], namespace)
        )
        return created

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        from kubernetes.dynamic.exceptions import NotFoundError

        try:
            obj = self.cluster.resource(api_version, kind).get(name=name, namespace=namespace)
        except NotFoundError:
            return None
        return dict(obj.to_dict())

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        label_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        result = self.cluster.resource(api_version, kind).get(
            namespace=namespace, label_selector=label_selector
        )
        return [dict(item) for item in result.to_dict()["items"]]

    def raw_get(self, path: str) -> dict[str, Any]:
        """GET any API path (aggregated APIs too, e.g. Kueue's visibility API)."""
        result: dict[str, Any] = self.cluster.dynamic().request("GET", path).to_dict()
        return result

    def patch(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None,
        body: dict[str, Any],
    ) -> dict[str, Any]:
        """A JSON merge patch of one object."""
        return self._merge_patch(self.cluster.resource(api_version, kind), name, namespace, body)

    def patch_status(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None,
        status: dict[str, Any],
    ) -> dict[str, Any]:
        """A JSON merge patch of one object's status subresource (as a kubelet writes a pod's:
        lists in it, conditions among them, are replaced whole)."""
        resource = self.cluster.resource(api_version, kind).status
        return self._merge_patch(resource, name, namespace, {"status": status})

    @staticmethod
    def _merge_patch(
        resource: Any, name: str, namespace: str | None, body: dict[str, Any]
    ) -> dict[str, Any]:
        patched: dict[str, Any] = resource.patch(
            name=name,
            namespace=namespace,
            body=body,
            content_type="application/merge-patch+json",
        ).to_dict()
        return patched

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> None:
        from kubernetes.dynamic.exceptions import NotFoundError

        with contextlib.suppress(NotFoundError):
            self.cluster.resource(api_version, kind).delete(
                name=name, namespace=namespace, body={"propagationPolicy": "Background"}
            )

    def ray_cluster_of(self, rayjob: str, namespace: str, timeout: float = 120) -> dict[str, Any]:
        """The RayCluster KubeRay creates for an admitted (unsuspended) RayJob, once it exists.

        KubeRay first records the cluster's name in the RayJob's status and creates it on a
        later pass; a failed create is retried with the controller's growing backoff. On a
        timeout the message shows the RayJob's status, its events and KubeRay's log lines
        about it, so a slow or failing operator can be told apart."""

        def status() -> dict[str, Any]:
            found = self.get("ray.io/v1", "RayJob", rayjob, namespace) or {}
            current: dict[str, Any] = found.get("status") or {}
            assert current.get("jobDeploymentStatus") != "ValidationFailed", current.get("message")
            return current

        def cluster() -> dict[str, Any] | None:
            name = status().get("rayClusterName")
            return self.get("ray.io/v1", "RayCluster", name, namespace) if name else None

        def describe() -> str:
            events = [
                f"{event.get('reason')}: {event.get('message')}"
                for event in self.list("v1", "Event", namespace)
                if (event.get("involvedObject") or {}).get("name") == rayjob
            ]
            return (
                f"RayJob status {status()}; events {events}; KubeRay's log about it:\n"
                + self.cluster.log_tail("kuberay-operator", mentioning=rayjob)
            )

        what = f"KubeRay's RayCluster for RayJob {rayjob}"
        return wait_until(what, cluster, timeout, interval=1, describe=describe)

    def namespace(self, prefix: str) -> str:
        """A fresh namespace (the controller-manager gives it its `default` ServiceAccount)."""
        name = self.unique(prefix)
        self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        return name

    def cleanup(self) -> None:
        for api_version, kind, name, namespace in reversed(self._created):
            with contextlib.suppress(Exception):
                self.delete(api_version, kind, name, namespace)


@pytest.fixture
def kube(kube_cluster: KubeCluster) -> Iterator[Kube]:
    helper = Kube(kube_cluster)
    yield helper
    helper.cleanup()
