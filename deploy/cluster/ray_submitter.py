#!/usr/bin/env python3
"""The test cluster's Ray: a real Ray head on loopback, and a stand-in for the submitter pods
of KubeRay that KWOK's fake nodes cannot run, so that a RayJob ends there the way it ends on
a real cluster: KubeRay reads the Ray job's end from a real Ray dashboard.

    python deploy/cluster/ray_submitter.py STATE_DIR      # controlplane.py up starts it

Why: in K8sJobMode (TauGrid's) a RayJob's submitter pod runs ``ray job submit --submission-id
<status.jobId> -- <entrypoint>`` against its Ray cluster's dashboard, and the KubeRay operator
ends the RayJob only once that dashboard reports the Ray job ``SUCCEEDED`` or ``FAILED``. On
the test cluster no container runs and no pod has a dashboard: every RayJob failed after about
a minute, "the ray job did not reach terminal state" (KubeRay's grace period). This process
plays the submitter's part for every RayJob, with the Ray head deploy/dev/ray_head.py starts
(the one the tests use; ``ray[default,serve,tune]`` pinned there, installed once into its own venv):

1. it starts the head (its dashboard on a loopback address of its own, port 8265) and records
   it in ``<state>/ray/ray-head.json``, and the head's ``ray start`` process in
   ``<state>/pids/ray-head.pid`` so that ``controlplane.py down`` stops it too;
2. every :data:`POLL_SECONDS` it lists TauGrid's RayJobs (label
   ``app.kubernetes.io/managed-by=taugrid``) of every namespace; for each one that
   KubeRay has let run (not suspended, ``jobDeploymentStatus`` ``Initializing`` or
   ``Running``) and given a ``jobId`` and a Ray cluster, it maps the cluster's head Service
   name to the dashboard in the KubeRay operator's own hosts file (deploy/cluster/README.md,
   "The KubeRay operator's hosts file") and submits a Ray job with that id;
3. what the Ray job runs: no container runs here, so by default a **stand-in** that says so,
   naming the entry point it stands for, waits as long as the pods do (``TAUGRID_TEST_DURATION``
   in tau.yaml ``runtime.env``, or the ``taugrid.io/test-duration`` annotation, as KWOK's
   Stages read them; default 2 s) and exits 0, or with ``TAUGRID_TEST_EXIT_CODE``. With
   ``TAUGRID_TEST_RAY=entrypoint`` it runs the entry point itself on the head, the words
   split and joined as the real submitter does (bash, then ``ray job submit`` joining with
   ``subprocess.list2cmdline``), without the project's files: what the tests use to run a
   command for real;
4. the Ray job's log becomes the submitter pod's log, as the real submitter tails it: a KWOK
   ``Logs`` object per submitter pod names a file (CRI format) this process keeps up to date
   until the Ray job has ended, so the run page shows the driver's log;
5. once the Ray job has ended and its whole log is in that file, each submitter pod is
   annotated ``taugrid.io/test-ray-ended: "true"``, and KWOK ends it (stage
   ``pod-complete-ray-submitter``, deploy/cluster/kwok/stages.yaml), as ``ray job submit``
   exits when its job has: KubeRay, which waits for the submitter Job, cannot end the RayJob
   (and TauGrid keep its log) before the log is whole.

Standard library only, besides deploy/cluster/controlplane.py's API client and
deploy/dev/ray_head.py. SIGTERM stops the head and then this process.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Final

HERE = Path(__file__).resolve().parent


def _load(path: Path, name: str) -> Any:
    """A script of deploy/ by path (deploy/ is not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


controlplane = _load(HERE / "controlplane.py", "taugrid_controlplane")
ray_head = controlplane.load_ray_head()

POLL_SECONDS: Final = 1.0
#: The stand-in's duration when nothing says otherwise: KWOK's for a Job's pod.
DEFAULT_DURATION_SECONDS: Final = 2.0
#: The longest stand-in (a duration past it is cut to it).
MAX_STAND_IN_SECONDS: Final = 3600.0
TEST_DURATION_ANNOTATION: Final = "taugrid.io/test-duration"
TEST_DURATION_ENV: Final = "TAUGRID_TEST_DURATION"
TEST_EXIT_CODE_ENV: Final = "TAUGRID_TEST_EXIT_CODE"
TEST_RAY_ENV: Final = "TAUGRID_TEST_RAY"
SUBMITTER_CONTAINER: Final = "ray-job-submitter"
#: Only TauGrid's RayJobs: one made by hand (or by a test of the control plane itself) is left
#: to KubeRay alone, as on a cluster without this stand-in.
TAUGRID_RAYJOBS: Final = "app.kubernetes.io/managed-by=taugrid"
KWOK_API: Final = "kwok.x-k8s.io/v1alpha1"
#: What lets KWOK end a submitter pod (deploy/cluster/kwok/stages.yaml).
RAY_ENDED_ANNOTATION: Final = "taugrid.io/test-ray-ended"
READY_FILE: Final = "ready"
TERMINAL: Final = ray_head.TERMINAL_STATUSES
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)$")
_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def log(message: str) -> None:
    moment = dt.datetime.now(dt.UTC).strftime("%H:%M:%S")
    print(f"[ray-submitter {moment}] {message}", flush=True)


def ray_dir(state: Path) -> Path:
    return state / "ray"


def head_of(state: Path) -> Any:
    """The cluster's Ray head, as this process recorded it (None: none started)."""
    try:
        recorded = json.loads((ray_dir(state) / ray_head.STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return ray_head.RayHead(**recorded)


def seconds_of(duration: str) -> float | None:
    """A Go duration as KWOK's Stages read them ("2s", "500ms", "1m"); None if not one."""
    found = _DURATION.match(duration.strip())
    if found is None:
        return None
    return float(found[1]) * _UNITS[found[2]]


def _env_of(template: Mapping[str, Any]) -> dict[str, str]:
    values: dict[str, str] = {}
    for container in (template.get("spec") or {}).get("containers") or []:
        for variable in container.get("env") or []:
            if "value" in variable:
                values.setdefault(str(variable.get("name")), str(variable["value"]))
    return values


@dataclass(frozen=True)
class Plan:
    """What the Ray job of one RayJob runs."""

    command: str
    stand_in: bool


def plan_for(rayjob: Mapping[str, Any]) -> Plan:
    """The command submitted for ``rayjob`` (module docstring, step 3)."""
    spec = rayjob.get("spec") or {}
    entrypoint = str(spec.get("entrypoint") or "")
    template = spec.get("submitterPodTemplate") or {}
    env = _env_of(template)
    if env.get(TEST_RAY_ENV) == "entrypoint":
        return Plan(subprocess.list2cmdline(shlex.split(entrypoint)), stand_in=False)
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    said = annotations.get(TEST_DURATION_ANNOTATION) or env.get(TEST_DURATION_ENV) or ""
    seconds = seconds_of(said) if said else None
    seconds = DEFAULT_DURATION_SECONDS if seconds is None else min(seconds, MAX_STAND_IN_SECONDS)
    try:
        code = int(env.get(TEST_EXIT_CODE_ENV) or 0)
    except ValueError:
        code = 1
    lines = [
        "[TauGrid test cluster] No container runs on the fake (KWOK) nodes of this cluster, so "
        "this Ray job, on its real Ray head, stands in for the entry point of the RayJob:",
        f"[TauGrid test cluster]   {entrypoint}",
        f"[TauGrid test cluster] It ends after {seconds:g} s with exit code {code} "
        f"(tau.yaml runtime.env: {TEST_DURATION_ENV}, {TEST_EXIT_CODE_ENV}).",
    ]
    script = "; ".join(
        [*(f"echo {shlex.quote(line)}" for line in lines), f"sleep {seconds:g}", f"exit {code}"]
    )
    return Plan(f"sh -c {shlex.quote(script)}", stand_in=True)


@dataclass
class Submitted:
    namespace: str
    rayjob: str
    job_id: str
    plan: Plan
    log_file: Path
    pods: set[str] = field(default_factory=set)  # those with a Logs object
    released: set[str] = field(default_factory=set)  # those told the Ray job has ended
    ended_at: float | None = None  # when its Ray job was first seen ended (monotonic)
    finished: bool = False


class Submitter:
    """Step 2 to 4 of the module docstring, one :meth:`step` at a time."""

    def __init__(self, state: Path, kube: Any, head: Any) -> None:
        self.state = state
        self.kube = kube
        self.head = head
        self.hosts_file = controlplane.operator_hosts_file(state)
        self.logs = ray_dir(state) / "pod-logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.mapped: set[str] = set()
        self.submitted: dict[str, Submitted] = {}  # by RayJob uid + job id

    def step(self) -> None:
        selector = urllib.parse.quote(TAUGRID_RAYJOBS)
        status, listed = self.kube.request(
            "GET", f"/apis/ray.io/v1/rayjobs?labelSelector={selector}", timeout=10
        )
        if status != 200 or not isinstance(listed, dict):
            return
        for rayjob in listed.get("items") or []:
            self._consider(rayjob)
        for submitted in self.submitted.values():
            if not submitted.finished:
                self._follow(submitted)

    def _consider(self, rayjob: Mapping[str, Any]) -> None:
        meta = rayjob.get("metadata") or {}
        spec = rayjob.get("spec") or {}
        status = rayjob.get("status") or {}
        job_id = str(status.get("jobId") or "")
        cluster = str(status.get("rayClusterName") or "")
        if spec.get("suspend") or not job_id or not cluster:
            return
        if status.get("jobDeploymentStatus") not in {"Initializing", "Running"}:
            return
        key = f"{meta.get('uid')}/{job_id}"
        if key in self.submitted:
            return
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        self._map(f"{cluster}-head-svc.{namespace}.svc.cluster.local")
        plan = plan_for(rayjob)
        try:
            ray_head.submit_job(self.head, plan.command, job_id)
        except ray_head.RayHeadError as error:
            if "already exists" not in str(error):
                log(f"{namespace}/{name}: Ray refused job {job_id}; trying again: {error}")
                return
        except OSError as error:
            log(f"{namespace}/{name}: the Ray head did not answer; trying again: {error}")
            return
        log(
            f"{namespace}/{name}: submitted Ray job {job_id} "
            f"({'a stand-in' if plan.stand_in else 'its entry point'}: {plan.command[:120]})"
        )
        self.submitted[key] = Submitted(
            namespace, name, job_id, plan, self.logs / namespace / f"{name}-{job_id}.log"
        )

    def _map(self, service: str) -> None:
        if service in self.mapped:
            return
        with self.hosts_file.open("a") as hosts:  # in place: the bind mount holds the inode
            hosts.write(f"{self.head.dashboard_host} {service}\n")
        self.mapped.add(service)

    def _follow(self, submitted: Submitted) -> None:
        """The Ray job's log into the submitter pods' log file (KWOK serves it)."""
        try:
            info = ray_head.job_info(self.head, submitted.job_id)
            _, answer = ray_head.request_json(
                f"{self.head.dashboard_url}/api/jobs/{submitted.job_id}/logs"
            )
        except (OSError, ray_head.RayHeadError):
            return
        text = str(answer.get("logs") or "") if isinstance(answer, dict) else ""
        moment = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")
        submitted.log_file.parent.mkdir(parents=True, exist_ok=True)
        partial = submitted.log_file.with_suffix(".partial")
        partial.write_text("".join(f"{moment} stdout F {line}\n" for line in text.splitlines()))
        partial.replace(submitted.log_file)
        self._logs_objects(submitted)
        if info is not None and info.get("status") in TERMINAL:
            # The log just written was read after Ray said the job had ended: it is whole.
            now = time.monotonic()
            submitted.ended_at = submitted.ended_at or now
            self._release(submitted)
            # Done once its pods have the log and were let go, or a minute on if none came.
            released = bool(submitted.pods) and submitted.released >= submitted.pods
            submitted.finished = released or now - submitted.ended_at > 60

    def _logs_objects(self, submitted: Submitted) -> None:
        """A KWOK ``Logs`` object for each submitter pod (the Job KubeRay names like the
        RayJob), naming the log file."""
        selector = urllib.parse.quote(f"job-name={submitted.rayjob}")
        status, pods = self.kube.request(
            "GET",
            f"/api/v1/namespaces/{submitted.namespace}/pods?labelSelector={selector}",
            timeout=10,
        )
        if status != 200 or not isinstance(pods, dict):
            return
        for pod in pods.get("items") or []:
            name = str(pod["metadata"]["name"])
            if name in submitted.pods:
                continue
            body = {
                "apiVersion": KWOK_API,
                "kind": "Logs",
                "metadata": {"name": name, "namespace": submitted.namespace},
                "spec": {
                    "logs": [
                        {
                            "containers": [SUBMITTER_CONTAINER],
                            "logsFile": str(submitted.log_file),
                        }
                    ]
                },
            }
            created, _ = self.kube.request(
                "POST",
                f"/apis/kwok.x-k8s.io/v1alpha1/namespaces/{submitted.namespace}/logs",
                body,
                timeout=10,
            )
            if created in {200, 201, 409}:
                submitted.pods.add(name)

    def _release(self, submitted: Submitted) -> None:
        """Step 5 of the module docstring: let KWOK end the submitter pods."""
        for name in sorted(submitted.pods - submitted.released):
            status, _ = self.kube.request(
                "PATCH",
                f"/api/v1/namespaces/{submitted.namespace}/pods/{name}",
                {"metadata": {"annotations": {RAY_ENDED_ANNOTATION: "true"}}},
                content_type="application/merge-patch+json",
                timeout=10,
            )
            if status in {200, 404}:  # a pod that is gone needs nothing more
                submitted.released.add(name)


def record_head_pid(state: Path, head: Any) -> None:
    """``ray start``'s pid in the control plane's pid files (``down`` stops it there too)."""
    started = controlplane._proc_start_time(head.pid)
    (state / "pids").mkdir(exist_ok=True)
    (state / "pids" / "ray-head.pid").write_text(f"{head.pid} {started}\n")


def serve(state: Path) -> int:
    record = controlplane.load_state(state)
    if record is None:
        log(f"no control plane recorded in {state}")
        return 1
    kube = controlplane.Kube(int(record["ports"]["apiserver"]), state / "pki")
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    (ray_dir(state) / READY_FILE).unlink(missing_ok=True)
    head = ray_head.start_head(ray_dir(state))
    record_head_pid(state, head)
    (ray_dir(state) / READY_FILE).write_text(head.dashboard_url + "\n")
    log(f"the Ray head answers at {head.dashboard_url}; following RayJobs")
    submitter = Submitter(state, kube, head)
    try:
        while not stopping:
            try:
                submitter.step()
            except (OSError, controlplane.ControlPlaneError) as error:
                log(f"the API server did not answer ({error}); trying again")
            time.sleep(POLL_SECONDS)
    finally:
        log("stopping the Ray head")
        ray_head.stop_head(head)
        with contextlib.suppress(OSError):
            (state / "pids" / "ray-head.pid").unlink()
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    return serve(Path(argv[0]))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
