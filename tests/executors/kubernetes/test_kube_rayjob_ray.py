"""RayJobs rendered and delivered by TauGrid, brought to their end by the real KubeRay operator
polling a real Ray dashboard (issue 14), and followed by the real watcher to the run's end.

What is real: the runs are submitted (``runs.submission.submit``) and delivered by the
Kubernetes backend; Kueue admits the RayJobs; the KubeRay operator (v1.6.0) builds their Ray
clusters, whose pods KWOK runs on fake nodes, creates the submitter Jobs (K8sJobMode, as
TauGrid renders it), and reads each Ray job's status from a real Ray dashboard: the test
cluster's Ray head (``controlplane.py up --ray``, as ``make cluster-up`` starts it: a Ray from
PyPI, ``deploy/dev/ray_head.py``, ``ray[default,tune]`` pinned there, on a loopback address),
which the operator reaches through its own hosts file (deploy/cluster/README.md, "The KubeRay
operator's hosts file"). The watcher (``executors.kubernetes.watcher.KubeWatcher``, driven in this
process) maps what it sees with ``executors.kubernetes.status.observe``.

**The cluster plays the submitter's part.** KWOK's submitter pod runs nothing, so
``deploy/cluster/ray_submitter.py`` submits each RayJob's Ray job, with KubeRay's
``status.jobId`` as its submission id, and makes the Ray job's log the submitter pod's (a KWOK
``Logs`` object). These runs ask it (``TAUGRID_TEST_RAY=entrypoint`` in ``runtime.env``) for
their own ``spec.entrypoint``, parsed as the real submitter does (bash splits the words, ``ray
job submit`` joins them with ``subprocess.list2cmdline``, Ray runs the line with ``/bin/sh``).
Ray really runs it; the fake submitter pod completes after 2 s (KWOK), which K8sJobMode needs
before ``Complete``.

* ``echo …`` → Ray ``SUCCEEDED`` → RayJob ``Complete``/``SUCCEEDED`` → run ``succeeded``, the
  echo in its driver log;
* ``sh -c "exit 1"`` → Ray ``FAILED`` → RayJob ``Failed``/``AppFailed`` → run ``failed``,
  ``user_error``, with Ray's message;
* the docs' GPU example (``examples/gpu-quickstart``: a RayJob with one GPU worker) in the
  demo workspace as ``make run`` bootstraps it on the Kubernetes backend: the cluster's
  stand-in Ray job says what it stands for, and the run succeeds.

If the cluster has no Ray head, the tests fail with the reason (no skip).
"""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from django.contrib.auth import get_user_model
from django.core.management import call_command

import kube as adapter
from executors.kubernetes import render
from executors.kubernetes.backend import KubernetesBackend
from executors.kubernetes.tasks import sync_kueue
from executors.kubernetes.watcher import KubeWatcher
from runs import workload_sdk
from runs.delivery import deliver
from runs.models import FailureClass, MetricPoint, Run, RunEvent, RunState, RunTrial
from runs.submission import submit
from runs.trials import trials_table
from tau.spec import load_spec
from tests.cluster.kueue_objects import KUEUE
from tests.cluster.plugin import Kube, KubeCluster, wait_until
from tests.executors.kubernetes.render_cases import target_for
from tests.executors.kubernetes.test_kube_backend import (  # noqa: F401 (fixtures)
    RAY,
    Recorded,
    attempt_of,
    cluster_backend,
    fresh,
    make_place,
    uid,
)
from tests.runs.factories import ROOT, make_run, zip_directory
from tests.runs.test_api import run_token
from tests.scripts import load_script
from workspaces.models import KueueSync, Workspace

REPO = Path(__file__).resolve().parents[3]
RAY_HEAD_SCRIPT = REPO / "deploy" / "dev" / "ray_head.py"
RAY_SUBMITTER_SCRIPT = REPO / "deploy" / "cluster" / "ray_submitter.py"
pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]
#: Admission, the Ray cluster's pods, the submitter and the operator's polling (3 s requeues).
TIMEOUT = 120


def ray_spec(name: str, entrypoint: str) -> bytes:
    """A RayJob whose own entry point the cluster's submitter stand-in runs on its Ray head."""
    return (
        f"schema_version: 1\nname: {name}\n"
        f"run:\n  entrypoint: {entrypoint}\n  workload_kind: rayjob\n"
        "compute:\n  cpus: 1\n  memory: 1Gi\n"
        "runtime:\n  image: rayproject/ray:2.60.0\n  env: {TAUGRID_TEST_RAY: entrypoint}\n"
        "resilience:\n  max_retries: 0\n"
    ).encode()


def load_ray_head() -> ModuleType:
    """deploy/dev/ray_head.py by path (deploy/ is not a package)."""
    return load_script(RAY_HEAD_SCRIPT, "taugrid_ray_head")


def load_ray_submitter() -> ModuleType:
    return load_script(RAY_SUBMITTER_SCRIPT, "taugrid_ray_submitter")


@pytest.fixture(scope="session")
def ray_head(kube_cluster: KubeCluster) -> Any:
    """The test cluster's real Ray head (``controlplane.py up --ray``)."""
    head = load_ray_submitter().head_of(kube_cluster.state_dir)
    if head is None:
        pytest.fail(
            f"the test cluster in {kube_cluster.state_dir} has no Ray head: start it with "
            "`controlplane.py up --ray` (make cluster-up)",
            pytrace=False,
        )
    return head


@pytest.fixture
def watcher(kube_cluster: KubeCluster, cluster_backend: Recorded) -> Iterator[KubeWatcher]:  # noqa: F811
    client = adapter.KubeClient(adapter.new_api_client(kube_cluster.kubeconfig))
    made = KubeWatcher(client, resync_seconds=300)
    made.start()
    yield made
    made.stop()
    client.close()


def states(run: Run) -> list[str]:
    return list(
        RunEvent.objects.unscoped()
        .filter(run=run)
        .exclude(new_state="")
        .order_by("seq")
        .values_list("new_state", flat=True)
    )


def driver_log(run: Run) -> str:
    """The run's newest attempt's log as the run page and the API read it (the submitter
    pod's, for a RayJob; kept by the watcher once the attempt ended)."""
    attempt = attempt_of(fresh(run))
    chunk = KubernetesBackend().read_log(fresh(run), attempt, offset=0, tail_lines=None)
    return str(chunk.text)


def follow(
    watcher: KubeWatcher,
    what: str,
    probe: Callable[[], Any],
    describe: Callable[[], str],
    timeout: float = TIMEOUT,
) -> Any:
    """Let the watcher work until ``probe`` gives something."""
    deadline = time.monotonic() + timeout
    while True:
        watcher.step(0.2)
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(
                f"timed out after {timeout:.0f}s waiting for {what}\nlast seen: {describe()}",
                pytrace=False,
            )


def test_rayjobs_end_through_the_real_operator_polling_a_real_ray_dashboard(
    cluster_backend: Recorded,  # noqa: F811
    django_user_model: Any,
    uid: str,  # noqa: F811
    kube: Kube,
    ray_head: Any,
    watcher: KubeWatcher,
) -> None:
    ray = load_ray_head()
    place = make_place(cluster_backend, django_user_model, uid, prefix="kr")
    namespace = place.workspace.namespace
    runs = {
        "ok": place.submit(ray_spec("kr-ok", "echo trained on a real Ray")),
        "fails": place.submit(ray_spec("kr-fails", 'sh -c "exit 1"')),
    }
    place.deliver_all()
    names = {key: f"{run.name}-a1" for key, run in runs.items()}

    def seen() -> str:
        found = {key: kube.get(*RAY, name, namespace) for key, name in names.items()}
        return "; ".join(
            f"{key}: run {fresh(runs[key]).state} ({fresh(runs[key]).state_reason}), "
            f"RayJob status {(job or {}).get('status')}"
            for key, job in found.items()
        )

    def ended() -> bool:
        return all(
            fresh(run).state in {RunState.SUCCEEDED, RunState.FAILED} for run in runs.values()
        )

    follow(watcher, "both runs to end", ended, seen)

    # The success: Ray's verdict, read by the operator from the dashboard, and the run's.
    ok = kube.get(*RAY, names["ok"], namespace)
    assert ok is not None
    status = ok["status"]
    assert (status["jobDeploymentStatus"], status["jobStatus"]) == ("Complete", "SUCCEEDED")
    assert status["dashboardURL"] == (
        f"{status['rayClusterName']}-head-svc.{namespace}.svc.cluster.local:8265"
    )
    assert status["message"] == "Job finished successfully."
    info = ray.job_info(ray_head, status["jobId"])  # the job the cluster submitted, in Ray
    assert info is not None
    assert info["status"] == "SUCCEEDED"
    assert info["entrypoint"] == "echo trained on a real Ray"
    logs = ray.request_json(f"{ray_head.dashboard_url}/api/jobs/{status['jobId']}/logs")[1]
    assert "trained on a real Ray" in logs["logs"]
    run = fresh(runs["ok"])
    assert run.state == RunState.SUCCEEDED, run.state_reason
    assert states(run) == ["pending", "queued", "admitted", "running", "succeeded"]
    assert attempt_of(run).exit_code == 0
    # The submitter Job is KubeRay's, named like the RayJob; the fake one completed.
    submitter = kube.get("batch/v1", "Job", names["ok"], namespace)
    assert submitter is not None
    assert any(c["type"] == "Complete" for c in submitter["status"]["conditions"])
    # Its pod's log, the run's driver log, is the Ray job's.
    assert "trained on a real Ray" in driver_log(run)

    # The failure: the entry point exited 1 in Ray; KubeRay says AppFailed; the program's fault.
    # KubeRay records the Ray job's FAILED (which ends the run) one reconcile before it moves
    # the RayJob's own deployment status to Failed.
    failed = wait_until(
        "KubeRay to mark the failed RayJob Failed",
        lambda: (
            job
            if (job := kube.get(*RAY, names["fails"], namespace))
            and (job.get("status") or {}).get("jobDeploymentStatus") == "Failed"
            else None
        ),
        timeout=60,
    )
    status = failed["status"]
    assert (status["jobDeploymentStatus"], status["jobStatus"]) == ("Failed", "FAILED")
    assert status["reason"] == "AppFailed"
    info = ray.job_info(ray_head, status["jobId"])
    assert info is not None
    # The line the real submitter would give Ray (bash splits, list2cmdline joins) ran.
    submitted = subprocess.list2cmdline(shlex.split(failed["spec"]["entrypoint"]))
    assert (info["status"], info["entrypoint"]) == ("FAILED", submitted)
    run = fresh(runs["fails"])
    assert run.state == RunState.FAILED
    assert run.failure_class == FailureClass.USER_ERROR
    assert (
        "The Ray job failed. KubeRay says: Job entrypoint command failed with exit code 1"
        in run.state_reason
    ), run.state_reason


def test_the_readmes_gpu_example_succeeds_on_the_test_cluster(
    cluster_backend: Recorded,  # noqa: F811
    kube: Kube,
    ray_head: Any,
    watcher: KubeWatcher,
    settings: Any,
) -> None:
    """The flow of docs/kubernetes.md ("Trying it on the test cluster"): ``make cluster-up``
    (this cluster, with its Ray head), ``make run`` on the Kubernetes backend
    (``bootstrap_demo`` gives the demo workspace quota on the test cluster's fake H100 pool),
    and ``examples/gpu-quickstart`` submitted as the researcher:
    Kueue admits its RayJob onto a GPU node, the cluster's stand-in Ray job says what it
    stands for, and the run succeeds with that in its driver log (it used to fail after about
    a minute, "the ray job did not reach terminal state", classed infrastructure and retried)."""
    call_command("bootstrap_demo", verbosity=0)
    demo = Workspace.unscoped_objects.get(slug="demo")
    try:
        gpu_example_succeeds(demo, cluster_backend, kube, watcher)
    finally:  # the demo's queues and namespace are not the test's to keep
        kube.delete(KUEUE, "ClusterQueue", "tau-demo")
        kube.delete("v1", "Namespace", demo.namespace)


def gpu_example_succeeds(
    demo: Workspace,
    cluster_backend: Recorded,  # noqa: F811
    kube: Kube,
    watcher: KubeWatcher,
) -> None:
    while cluster_backend.syncs:
        sync_kueue(cluster_backend.syncs.pop(0))
    synced = [
        (sync.scope, sync.state, sync.last_error)
        for sync in KueueSync.objects.filter(state__in=["failed", "pending"])
    ]
    assert synced == []
    example = ROOT / "examples" / "gpu-quickstart"
    run = submit(
        workspace=demo,
        user=get_user_model().objects.get(username="researcher"),
        spec_source=(example / "tau.yaml").read_bytes(),
        bundle=io.BytesIO(zip_directory(example)),
    )
    while cluster_backend.deliveries:
        deliver(cluster_backend.deliveries.pop(0))

    def seen() -> str:
        now = fresh(run)
        job = kube.get(*RAY, f"{run.name}-a1", demo.namespace) or {}
        return f"run {now.state} ({now.state_reason}); RayJob status {job.get('status')}"

    follow(
        watcher,
        "the GPU example to end",
        lambda: fresh(run).state in {RunState.SUCCEEDED, RunState.FAILED},
        seen,
        timeout=180,
    )
    run = fresh(run)
    assert run.state == RunState.SUCCEEDED, run.state_reason
    assert states(run) == ["pending", "queued", "admitted", "running", "succeeded"]
    attempt = attempt_of(run)
    assert attempt.flavors.get("nvidia.com/gpu") == "h100"
    assert any(node.startswith("gpu-h100-") for node in attempt.node_names)
    said = driver_log(run)
    assert "stands in for the entry point of the RayJob" in said
    assert "python train.py" in said


def test_the_rendered_runtime_env_ships_the_code_and_the_sdk_to_a_real_ray(
    ray_head: Any, tmp_path: Path
) -> None:
    """What KubeRay's submitter does with a rendered RayJob, against the real Ray: ``ray job
    submit --runtime-env-json <runtimeEnvYAML as JSON> -- <entrypoint>``, with the two folders
    the fetcher fills (``/tau/code``, ``/tau/sdk``) made here and their paths swapped in. Ray
    uploads both; the driver runs in the code, and ``import tau`` finds the platform's SDK
    (from Ray's py_modules, not from an installed package: the Ray venv has none)."""
    ray = load_ray_head()
    spec = load_spec(ray_spec("kr-sdk", "python train.py"))
    rayjob = render.render_rayjob(spec, target_for(spec))
    runtime_env = yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])
    assert runtime_env == {"working_dir": render.CODE_DIR, "py_modules": [f"{render.SDK_DIR}/tau"]}

    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(
        "import tau\nprint('sdk at', tau.__file__, 'resume', tau.resume_from(), flush=True)\n"
    )
    sdk = workload_sdk.materialise(tmp_path / "sdk")
    local = {render.CODE_DIR: str(code), render.SDK_DIR: str(sdk)}
    runtime_env["working_dir"] = local[render.CODE_DIR]
    runtime_env["py_modules"] = [
        path.replace(render.SDK_DIR, local[render.SDK_DIR]) for path in runtime_env["py_modules"]
    ]
    submission = f"taugrid-sdk-{uuid.uuid4().hex[:8]}"
    submitted = subprocess.run(
        [
            str(ray.ray_executable()),
            *("job", "submit", "--address", ray_head.dashboard_url, "--no-wait"),
            *("--submission-id", submission, "--runtime-env-json", json.dumps(runtime_env)),
            "--",
            *shlex.split(rayjob["spec"]["entrypoint"]),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    deadline = time.monotonic() + TIMEOUT
    info = None
    while info is None and time.monotonic() < deadline:
        info = ray.finished_job(ray_head, submission)
        time.sleep(0.5)
    assert info is not None, f"the Ray job {submission} did not finish in {TIMEOUT}s"
    logs = ray.request_json(f"{ray_head.dashboard_url}/api/jobs/{submission}/logs")[1]["logs"]
    assert info["status"] == "SUCCEEDED", logs
    said = next(line for line in logs.splitlines() if line.startswith("sdk at"))
    where = said.split()[2]
    assert where.endswith("/tau/__init__.py"), said
    assert "site-packages" not in where, said  # Ray's copy of py_modules, not an install
    assert Path(where).read_bytes() == workload_sdk.sources()["tau/__init__.py"]
    assert said.endswith("resume None")


SWEEP_TRAIN_FUNC = """\
def train_func(config):
    import tau
    for step in (1, 2):
        tau.log_metrics(step, loss=1.0 / (config["x"] * step))
    return {"score": config["x"] * 10, "step": 3}
"""


def test_a_sweep_runs_on_a_real_ray_with_ray_tune_and_reports_to_the_portal(
    ray_head: Any, tmp_path: Path, world: Any, live_server: Any
) -> None:
    """A sweep's RayJob as KubeRay's submitter hands it to Ray: Ray Tune runs each trial,
    ``train_func`` gets the trial's values, and the portal gets the trials' states and their
    metrics (``trial-<n>/…``) through the run's token, as from a cluster."""
    ray = load_ray_head()
    source = (
        b"schema_version: 1\nname: tune-real\nrun: {entrypoint: train.py}\n"
        b"compute: {cpus: 1, memory: 1Gi}\nruntime: {image: rayproject/ray:2.60.0}\n"
        b"resilience: {max_retries: 0}\n"
        b"execution:\n  launcher: ray-tune\n  metric: score\n  mode: max\n"
        b"  configs: {x: [1, 2, 3]}\n"
    )
    run = make_run(world, spec=source, files={"train.py": SWEEP_TRAIN_FUNC})
    spec = load_spec(source)
    rayjob = render.render_rayjob(spec, target_for(spec))
    assert rayjob["spec"]["entrypoint"] == "python -m tau.ray_tune -- python train.py"
    runtime_env = yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])
    sweep = json.loads(runtime_env["env_vars"]["TAU_SWEEP"])
    assert sweep["trials"] == [{"x": 1}, {"x": 2}, {"x": 3}]
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(SWEEP_TRAIN_FUNC)
    sdk = workload_sdk.materialise(tmp_path / "sdk")
    runtime_env["working_dir"] = str(code)
    runtime_env["py_modules"] = [str(sdk / "tau")]
    # What the head and worker containers have in their environment on a cluster.
    runtime_env["env_vars"].update(
        {
            "TAU_API_URL": live_server.url,
            "TAU_RUN_TOKEN": run_token(world, run),
            "TAU_WORKSPACE": "alpha",
            "TAU_RUN_NAME": run.name,
        }
    )
    submission = f"taugrid-tune-{uuid.uuid4().hex[:8]}"
    submitted = subprocess.run(
        [
            str(ray.ray_executable()),
            *("job", "submit", "--address", ray_head.dashboard_url, "--no-wait"),
            *("--submission-id", submission, "--runtime-env-json", json.dumps(runtime_env)),
            "--",
            # The image's `python` has Ray; here that is the Ray head's own venv.
            str(ray.venv_dir() / "bin" / "python"),
            *shlex.split(rayjob["spec"]["entrypoint"])[1:],
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    deadline = time.monotonic() + 240
    info = None
    while info is None and time.monotonic() < deadline:
        info = ray.finished_job(ray_head, submission)
        time.sleep(0.5)
    assert info is not None, f"the Ray job {submission} did not finish"
    logs = ray.request_json(f"{ray_head.dashboard_url}/api/jobs/{submission}/logs")[1]["logs"]
    assert info["status"] == "SUCCEEDED", logs
    assert "[sweep] 3 trials on Ray Tune, at most 1 at once, compared by score (max)" in logs
    assert "[sweep] all 3 trials succeeded" in logs
    trials = list(RunTrial.objects.for_workspace(world.alpha).filter(run=run).order_by("number"))
    assert [(trial.number, trial.config, trial.state) for trial in trials] == [
        (1, {"x": 1}, "succeeded"),
        (2, {"x": 2}, "succeeded"),
        (3, {"x": 3}, "succeeded"),
    ]
    points = set(
        MetricPoint.objects.for_workspace(world.alpha)
        .filter(run=run)
        .values_list("key", "step", "value")
    )
    assert ("trial-2/score", 3, 20.0) in points
    assert ("trial-3/loss", 2, 1.0 / 6) in points
    assert len(points) == 9  # three trials, each two losses and a score
    _names, rows = trials_table(run, run.spec)
    assert [(row.number, row.best, row.is_best) for row in rows] == [
        (1, 10.0, False),
        (2, 20.0, False),
        (3, 30.0, True),
    ]
