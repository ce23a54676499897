"""A run as Kubernetes objects: the KubeRay RayJob or batch Job that Kueue admits, and the
objects that go with it. Pure functions from plain inputs to plain dicts — no cluster
access, no database, no ``kubernetes`` package — so they are cheap, deterministic and
tested against golden files and the real API server (tests/executors/kubernetes/test_render*.py).

Inputs: the validated ``Spec`` (with workspace policy applied, so ``runtime.image`` is set)
and a :class:`RunTarget` naming the run, its attempt, its workspace's namespace and
LocalQueue, the flavor ``compute.gpu_type`` names, the portal URL, the bundle digest and the
attempt's run-token Secret. Label and annotation keys come from ``executors.kubernetes.labels``.

What gets rendered, and why
===========================

**Names.** Each attempt gets its own objects: the workload object is named after the run
and the attempt, ``<run name>-a<attempt>`` (:func:`workload_name`), a DNS-1035 label of at
most 47 characters (KubeRay's RayJob limit; checked here, not assumed), so it is
deterministic and findable from the run and the attempt number alone. A run name too long
for that (spec names may be 38 characters, run names 45) keeps its first characters and
ends with a hash of the whole run name before the attempt number, so names stay unique per
run and attempt; the labels (``taugrid.io/run``, ``run-id``, ``attempt``) always carry the
exact values. A retry or resume therefore never waits for the previous attempt's object to
disappear, and the previous attempt's objects (and logs) can be looked at while the next
one queues; the backend deletes them (with their dependents) when it hands over the next
attempt. Data on the storage (outputs, checkpoints) stays under the *run's* name.

**Kueue.** The workload carries ``kueue.x-k8s.io/queue-name`` (the workspace's LocalQueue),
``kueue.x-k8s.io/priority-class`` when the spec has a priority, and, with
``run.max_runtime``, ``kueue.x-k8s.io/max-exec-time-seconds``. ``spec.suspend`` is never
rendered: Kueue's mutating webhook (which fails closed) suspends the object on create and
Kueue alone flips it on admission; a field we render would be a field our server-side apply
owns and could fight Kueue over.

**Deadlines.** ``run.max_runtime`` becomes the object's own ``activeDeadlineSeconds`` (Job
and RayJob both restart that clock when they are unsuspended, so queueing time does not
count) and Kueue's max-exec-time label set ``MAX_EXEC_TIME_GRACE_SECONDS`` later. The
object's deadline therefore ends the run first, as a clean failure (``DeadlineExceeded``)
that keeps its pods and logs; Kueue's limit is the backstop that frees the quota if the
object did not stop (Kueue suspends rather than fails, which deletes the pods).

**Flavors.** ResourceFlavor ``nodeLabels`` and ``tolerations`` are injected into the pods by
Kueue on admission, so neither is copied here. The one exception is choice: when the spec
names ``compute.gpu_type``, the GPU pods get a ``nodeSelector`` equal to that flavor's node
labels, because Kueue only considers flavors whose labels match a pod's node selector —
that is how a workload asks for one flavor. CPU-only pods (Ray head, submitter) stay free.

**RayJob.** ``submissionMode: K8sJobMode``, ``shutdownAfterJobFinishes: true`` (Kueue
requires it), ``ttlSecondsAfterFinished: 60`` (Kueue releases the quota when the job
finishes, but the Ray cluster's pods hold their GPUs until KubeRay deletes them after the
TTL, so it stays short; the driver log is the submitter pod's log, which outlives it),
``backoffLimit: 0`` (TauGrid retries itself, as a new attempt). The head group is CPU-only:
``compute.head``, else ``HEAD_RESOURCES`` (2 CPUs, 8 GiB — room for the GCS, the dashboard
and the driver, which runs on the head), and ``num-cpus: 0`` so that Ray schedules no task or
actor there: all work lands on the worker group, which is exactly ``compute`` (``workers``
replicas, min = max = replicas; limits equal requests unless ``compute.limits`` says more;
``nvidia.com/gpu`` always equal). The submitter (KubeRay's default command) gets
``SUBMITTER_RESOURCES`` so Kueue counts what it really uses.

**Data volume.** ``storage.data_pvc`` is mounted at ``/data`` (read-only unless
``storage.data_access: read-write``) in the head, every worker and every Job pod, and
``TAU_DATA_DIR`` says where.

**Datasets** (``inputs.datasets``, pinned at submission: ``RunTarget.staged_data``). Every
pod that runs the researcher's code (a Job's pods; a RayJob's head, where the driver runs, and
each worker) gets an init container (:data:`STAGER`, after the bundle fetcher, the same image
and the same locked-down user) that downloads the pinned files into an ``emptyDir`` and checks
each SHA-256 before the file gets its name (:data:`STAGE_SCRIPT`); the volume is mounted
read-only at ``/tau/data`` in the main container, and ``TAU_DATA_DIR`` says so (a
``storage.data_pvc`` stays at ``/data``). The volume's ``sizeLimit`` comes from the manifest
(:func:`staged_volume_bytes`: the bytes, a block per file, some slack), so a node that lacks
the room evicts the pod instead of filling its disk; no ``ephemeral-storage`` is requested,
because Kueue would refuse to admit a resource its ClusterQueues do not name. An init
container rather than a CSI mount: it works with every store (a folder behind the portal, any
S3 API through presigned URLs, which the pod fetches directly, never through the portal),
needs no driver on the nodes, and the bytes are checked before the program can see them; a
mismatch fails the pod with the version and the file named, which the status reads as an
``infrastructure`` failure. The stager reports the files, bytes and seconds it took (the
run page shows them).

**Entry point.** ``spec.run.command()`` is the exact argument vector. For a Job it is the
container's ``command`` as is. A RayJob's ``entrypoint`` string passes through three parsers
before it runs: KubeRay pastes it into the submitter's ``bash -c`` line, ``ray job submit``
re-joins the words it gets with ``subprocess.list2cmdline`` (Windows quoting), and Ray runs
the result with ``/bin/sh``. :func:`ray_entrypoint` quotes for all three, so every argument
arrives unchanged (spaces, both quotes, ``$``, backslashes, newlines); only a TAB cannot be
carried, and is refused (:func:`kubernetes_problems` reports it at submission). Everything
Kubernetes puts in a container's command, args or env value is also ``$``-escaped (``$$``),
because the kubelet expands ``$(NAME)`` there.

**runtimeEnvYAML** holds ``pip`` and ``working_dir``. The spec's ``env`` is *not* put there
but on every container's ``env``: KubeRay passes the runtime env through the submitter's
bash inside double quotes, where ``$`` and backquotes would be expanded, while container
environment reaches the driver and every Ray worker exactly (Ray processes inherit it).

**Environment.** Every container gets ``TAU_RUN_ID``, ``TAU_RUN_NAME``, ``TAU_WORKSPACE``,
``TAU_ATTEMPT``, ``TAU_OUTPUT_DIR``, ``TAU_CHECKPOINT_DIR``, ``TAU_RESUME_FROM`` (only when
resuming), ``TAU_RETRY_REASON``, ``TAU_API_URL`` (the portal's base URL; the API is under
``/api/v1/``) and ``TAU_RUN_TOKEN`` (``secretKeyRef`` into the attempt's Secret); the
containers that run user code also get the spec's ``env`` and ``secrets`` (``secretKeyRef``).
A multi-worker Job adds torchrun's rendezvous settings (below). The GPU containers of a run
whose GPUs may talk to each other through NCCL (:func:`nccl_may_run`: a worker with several
GPUs, or GPU workers that train together — not a sweep's trials of one GPU each) get
:data:`NCCL_ENV`, ``NCCL_DEBUG=WARN``: NCCL says nothing by default, so a worker that fails
in a collective would log only PyTorch's "NCCL error … run with NCCL_DEBUG=INFO"; with WARN
the reason (a refused connection, a failed CUDA call) is in the log the run page shows, at
no cost while all goes well. Nothing else is set: which interface and transport NCCL uses
(``NCCL_SOCKET_IFNAME``, ``NCCL_IB_*``) depends on the cluster, and PyTorch (2.2 and later)
already tears a process down when a collective fails or times out
(``TORCH_NCCL_ASYNC_ERROR_HANDLING`` defaults to 3, and torchrun sets 1 for its workers).
As for the rendezvous table, a name the spec sets itself (``runtime.env`` or a secret) wins.

**Storage.** The data volume (``RunTarget.data_volume``; an ``emptyDir`` unless the backend
passes e.g. a ReadWriteMany PVC, which resuming across attempts and pods needs) is mounted
twice per user container: ``runs/<run>/outputs/attempt-<n>`` at ``/tau/outputs``
(``TAU_OUTPUT_DIR``, one per attempt, so metric offsets are per attempt too) and
``runs/<run>/checkpoints`` at ``/tau/checkpoints`` (``TAU_CHECKPOINT_DIR``, shared by all
attempts, so a ``TAU_RESUME_FROM`` path from one attempt is valid in the next). For a Job
with a bundle and ``resilience.checkpoint_dir``, the checkpoints are also mounted at that
path inside the project directory, which is what the field promises. In a RayJob the
project directory is wherever Ray unpacks ``working_dir``, so programs use the variable.

**Shared memory.** Every user container (Job pod, Ray head, Ray worker) gets ``/dev/shm`` as
an ``emptyDir`` with ``medium: Memory`` whose ``sizeLimit`` is that container's memory limit
(``compute.limits.memory``, else ``compute.memory``; the head's own for the head). NCCL (its
transport between the processes of one pod), PyTorch's data loader workers and Ray's object
store live there. Pages written there are charged to the container's memory, so its limit is
the most the volume can ever really hold. A larger tmpfs (without a ``sizeLimit`` the
kubelet picks one from the pod's limits or, on older kubelets, half the node's RAM) states
room that is not there, to programs that check (Ray compares its object store with the free
space of ``/dev/shm``); a smaller one would be a second, arbitrary limit inside the first,
failing a program that has the memory. It is also the local executor's rule (``/dev/shm`` a
tmpfs of at most the run's memory), so a run sees the same on both backends, whatever the
kubelet's version or the node's size.

**Code bundle.** The bundle never travels inside an object. An init container (image
``RunTarget.fetcher_image``, Python standard library only, :data:`FETCH_SCRIPT`) downloads
``GET <portal>/api/v1/workspaces/<ws>/runs/<run>/bundle/`` with the run token, streams it
to disk while hashing, refuses it unless its SHA-256 equals the digest rendered into its
arguments (the digest the run's evidence records), and only then unpacks it — re-checking
every path — into a shared ``emptyDir`` (the project directory at ``/tau/code``). The
URL, digest and paths are separate ``argv`` entries of ``python3 -I -c SCRIPT``: no shell
parses them. It runs as nobody with no capabilities on a read-only root file system,
retries only transient failures (5xx, 408, 429, network), and a failure fails the pod, so
the attempt ends as an infrastructure failure instead of running other code.
For a Job the fetcher sits in the workload's pod and the container starts in
``/tau/code``. For a RayJob it sits in the submitter pod: ``runtimeEnvYAML`` says
``working_dir: /tau/code``, so ``ray job submit`` uploads the verified tree to the Ray
cluster, which unpacks it for the driver and every worker. The submitter sets
``RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1`` and empties Ray's default excludes, so what Ray
ships is the whole bundle (a ``.rayignore`` inside it still applies: that is the user's).

**Multi-worker Job.** An Indexed Job (``completions = parallelism = workers``) whose pods set
``subdomain`` to a headless Service of the same name, so pod *i* resolves as
``<job>-<i>.<job>``; each pod gets the rendezvous table of ``tau/rendezvous.py`` (the same
names the local executor's workers get): ``MASTER_ADDR=<job>-0.<job>``, ``MASTER_PORT``
(``DEFAULT_PORT``, 29500), ``WORLD_SIZE``, ``RANK`` (its completion index), ``LOCAL_RANK=0``
(one process per pod) and the same as torchrun's ``PET_NNODES``, ``PET_NODE_RANK``,
``PET_MASTER_ADDR``, ``PET_MASTER_PORT`` — unless the spec sets one of those names itself.
``backoffLimit: 0``, ``restartPolicy: Never``: a failed pod fails the attempt and TauGrid
decides about a retry (no ``podFailurePolicy``: with no retries inside the Job there is
nothing for it to steer). ``ttlSecondsAfterFinished`` is a backstop against leaks; the
backend deletes the Job once it has recorded the outcome.

**Dependents and create order.** The attempt's Secret (``TAU_RUN_TOKEN``, named
:func:`run_token_secret_name`: each attempt has its own token) and, for a multi-worker Job,
the headless Service are owned by the workload object (an ``ownerReferences`` entry with
``blockOwnerDeletion``), so the garbage collector deletes them with it and a foreground
delete of the workload waits for them. An owner reference needs the owner's uid, which
exists only after the owner is created, so the order is:

1. create the workload (:func:`render_workload`); Kueue's webhook suspends it;
2. create :func:`render_dependents` with ``Owner.of(created_workload)``.

Nothing runs before admission, and a pod whose Secret is still missing waits: the kubelet
does not start a container whose ``secretKeyRef`` cannot be resolved, and retries. The
Kubernetes backend (``executors.kubernetes.backend``) makes both steps idempotent: an object
that already exists with this run's and this attempt's labels counts as created.
(``blockOwnerDeletion`` needs permission to update the owner's finalizers when the
OwnerReferencesPermissionEnforcement admission plugin is on: give the backend's service
account ``update`` on ``rayjobs/finalizers`` and ``jobs/finalizers``.)
"""

from __future__ import annotations

import base64
import hashlib
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import yaml

from executors.kubernetes import labels
from runs import workload_sdk
from runs.sweeps import sweep_environment
from tau import rendezvous
from tau.k8s_names import (
    GPU_RESOURCE,
    dns1035_label_problem,
    dns1123_label_problem,
    dns1123_subdomain_problem,
    label_key_problem,
    label_value_problem,
)
from tau.spec import RAYJOB_NAME_MAX_LENGTH, Spec, spec_hash
from tau.spec.model import HEAD_DEFAULT, Storage, project_name

Manifest = dict[str, Any]

#: The Ray head when ``compute.head`` is unset: CPU-only (``compute`` sizes the workers).
HEAD_RESOURCES: Final[Mapping[str, str]] = {
    "cpu": HEAD_DEFAULT.cpus,
    "memory": HEAD_DEFAULT.memory,
}
#: KubeRay's submitter pod (``ray job submit`` + ``ray job logs --follow``; it also zips and
#: uploads the bundle for ``working_dir``).
SUBMITTER_RESOURCES: Final[Mapping[str, str]] = {"cpu": "500m", "memory": "1Gi"}
#: The bundle fetcher (init container). Kueue counts an init container only where it is
#: bigger than the pod's containers together, so this stays small.
FETCHER_RESOURCES: Final[Mapping[str, str]] = {"cpu": "250m", "memory": "128Mi"}
DEFAULT_FETCHER_IMAGE: Final = "python:3.12-slim"

#: Seconds KubeRay keeps a finished RayJob's Ray cluster (its pods hold their GPUs meanwhile).
RAYJOB_TTL_SECONDS: Final = 60
#: Seconds a finished Job is kept if the backend has not deleted it by then.
JOB_TTL_SECONDS: Final = 7 * 24 * 3600
#: Kueue's max-exec-time is the object's own deadline plus this, so the object ends first.
MAX_EXEC_TIME_GRACE_SECONDS: Final = 120
#: Must match the limit the server enforces on uploads (``runs.bundles.MAX_BUNDLE_BYTES``;
#: a test keeps them equal — this module imports nothing from Django).
MAX_BUNDLE_BYTES: Final = 50 * 2**20

CODE_DIR: Final = "/tau/code"
FETCH_DIR: Final = "/tau/fetch"
#: The workload SDK (``runs.workload_sdk``), written by the fetcher, first on PYTHONPATH.
SDK_DIR: Final = "/tau/sdk"
OUTPUT_DIR: Final = "/tau/outputs"
CHECKPOINT_DIR: Final = "/tau/checkpoints"
#: Where ``storage.data_pvc`` is mounted (``TAU_DATA_DIR`` of a run that stages no datasets).
DATASET_DIR: Final = Storage.MOUNT_PATH
#: Where the stager puts ``inputs.datasets`` (``TAU_DATA_DIR`` of a run that reads some).
STAGED_DATA_DIR: Final = "/tau/data"
#: What an emptyDir holding staged files needs beyond their bytes: a block for each file's
#: last partial block (4 KiB file systems) and room for the listing and the folders.
STAGE_BYTES_PER_FILE: Final = 4096 + 512
STAGE_SLACK_BYTES: Final = 16 * 2**20
SHM_DIR: Final = "/dev/shm"  # noqa: S108 - the shared-memory mount point, not a temp file

#: Set in the GPU containers of a run whose GPUs may talk through NCCL (:func:`nccl_may_run`),
#: unless the spec sets the name itself: NCCL's warnings, the reason a collective failed, in
#: the worker's log.
NCCL_ENV: Final[tuple[tuple[str, str], ...]] = (("NCCL_DEBUG", "WARN"),)

#: The key of the run token in the run-token Secret.
RUN_TOKEN_KEY: Final = "token"  # noqa: S105 - a key name, not a secret
RAY_WORKER_GROUP: Final = "workers"

# Volume and container names.
_CODE_VOLUME = "tau-code"
_DATA_VOLUME = "tau-data"
#: The spec's own data volume (``storage.data_pvc``), at ``DATASET_DIR``.
_DATASET_VOLUME = "tau-dataset"
_SHM_VOLUME = "tau-shm"
_FETCHER = "tau-fetch-bundle"
_STAGED_VOLUME = "tau-datasets"
#: The init container that stages ``inputs.datasets`` (executors.kubernetes.status names it).
STAGER: Final = "tau-stage-data"

# The environment of TAU_YAML.md, set by the platform.
ENV_RUN_ID: Final = "TAU_RUN_ID"
ENV_RUN_NAME: Final = "TAU_RUN_NAME"
ENV_WORKSPACE: Final = "TAU_WORKSPACE"
ENV_ATTEMPT: Final = "TAU_ATTEMPT"
ENV_OUTPUT_DIR: Final = "TAU_OUTPUT_DIR"
ENV_CHECKPOINT_DIR: Final = "TAU_CHECKPOINT_DIR"
ENV_RESUME_FROM: Final = "TAU_RESUME_FROM"
ENV_RETRY_REASON: Final = "TAU_RETRY_REASON"
#: Where the data volume (``storage.data_pvc``) is, when the spec has one.
ENV_DATA_DIR: Final = "TAU_DATA_DIR"
ENV_API_URL: Final = "TAU_API_URL"
ENV_RUN_TOKEN: Final = "TAU_RUN_TOKEN"  # noqa: S105 - a variable name
PLATFORM_ENV: Final = (
    ENV_RUN_ID,
    ENV_RUN_NAME,
    ENV_WORKSPACE,
    ENV_ATTEMPT,
    ENV_OUTPUT_DIR,
    ENV_CHECKPOINT_DIR,
    ENV_RESUME_FROM,
    ENV_RETRY_REASON,
    ENV_API_URL,
    ENV_RUN_TOKEN,
)

#: Downloads, verifies and unpacks the bundle: ``python3 -I -c FETCH_SCRIPT URL SHA256 DIR
#: MAX_BYTES [SDK]`` with the run token in ``TAU_RUN_TOKEN``. Standard library only; the archive
#: goes to DIR/bundle.zip, the tree to DIR/code, and the workload SDK (``SDK``:
#: ``runs.workload_sdk.packed``) to DIR/sdk. It contains no ``$`` (the kubelet would
#: expand ``$(...)`` in args) and no value that comes from a user.
FETCH_SCRIPT: Final = """\
import hashlib, hmac, os, shutil, stat, sys, time, urllib.error, urllib.request, zipfile
url, digest, root, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
archive, code = os.path.join(root, "bundle.zip"), os.path.join(root, "code")
def fail(message):
    sys.exit("tau-fetch-bundle: " + message)
request = urllib.request.Request(url)
# Unredirected: a redirect never carries the run token to another host.
request.add_unredirected_header("Authorization", "Bearer " + os.environ["TAU_RUN_TOKEN"])
for attempt in range(1, 7):
    try:
        sha256, size = hashlib.sha256(), 0
        with urllib.request.urlopen(request, timeout=60) as response:
            with open(archive, "wb") as out:
                while True:
                    chunk = response.read(65536)
                    if not chunk:
                        break
                    size += len(chunk)
                    if size > limit:
                        fail("the bundle is larger than %d bytes" % limit)
                    sha256.update(chunk)
                    out.write(chunk)
        break
    except urllib.error.HTTPError as error:
        if error.code < 500 and error.code not in (408, 429):
            fail("%s answered %d %s" % (url, error.code, error.reason))
        problem = "%d %s" % (error.code, error.reason)
    except OSError as error:
        problem = str(error)
    print("tau-fetch-bundle: try %d failed (%s)" % (attempt, problem), file=sys.stderr)
    time.sleep(min(2**attempt, 30))
else:
    fail("could not download %s" % url)
if not hmac.compare_digest(sha256.hexdigest(), digest):
    fail("SHA-256 mismatch: expected %s, got %s" % (digest, sha256.hexdigest()))
os.mkdir(code)
base = os.path.realpath(code)
with zipfile.ZipFile(archive) as bundle:
    for info in bundle.infolist():
        mode = info.external_attr >> 16
        target = os.path.realpath(os.path.join(base, info.filename))
        inside = target == base or target.startswith(base + os.sep)
        if not inside or stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):
            fail("refusing bundle entry %r" % info.filename)
        if info.is_dir():
            os.makedirs(target, exist_ok=True)
            continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with bundle.open(info) as source, open(target, "xb") as sink:
            shutil.copyfileobj(source, sink)
        # Readable and writable by whatever user the workload's image runs as.
        os.chmod(target, 0o777 if mode & 0o111 else 0o666)
for folder, _, _ in os.walk(base):
    os.chmod(folder, 0o777)
os.unlink(archive)
print("tau-fetch-bundle: %s verified (%d bytes) and unpacked" % (digest, size))
if len(sys.argv) > 5:
    import base64, json, zlib
    sdk = os.path.join(root, "sdk")
    for name, text in json.loads(zlib.decompress(base64.b64decode(sys.argv[5]))).items():
        target = os.path.join(sdk, *name.split("/"))
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        with open(target, "x", encoding="utf-8") as sink:
            sink.write(text)
        os.chmod(target, 0o644)
    for folder, _, _ in os.walk(sdk):
        os.chmod(folder, 0o755)
    print("tau-fetch-bundle: the workload SDK is in %s" % sdk)
"""


#: Stages the run's pinned datasets: ``python3 -I -c STAGE_SCRIPT LISTING DIR MAX_BYTES REPORT``
#: with the run token in ``TAU_RUN_TOKEN``. Standard library only. LISTING
#: (``GET …/runs/<run>/data/``, catalog.api) is JSON lines: a head ``{"files", "bytes"}``, then
#: one line per file ``{"path", "ref", "file", "size", "sha256", "url"}`` — ``path`` under DIR,
#: ``url`` relative to LISTING (the portal's bytes, run token sent) or absolute (a presigned URL
#: of the store: nothing sent). Each file is written under a temporary name while hashed,
#: refused unless its size and SHA-256 are the manifest's, and only then renamed; a file kept
#: twice is linked. Transient failures (5xx, 408, 429, network, a short body) are retried; a
#: mismatch is not, and fails the pod with a message naming the version and the file (the
#: container's termination message: executors.kubernetes.status). Then every file and folder
#: is made read-only and REPORT (``…/report/data-staged/``) is told the files, bytes and
#: seconds. Presigned URLs never appear in its output (they are credentials while valid).
STAGE_SCRIPT: Final = """\
import hashlib, hmac, json, os, sys, time, urllib.error, urllib.parse, urllib.request
listing_url, root, limit, report = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
token = os.environ["TAU_RUN_TOKEN"]
base = os.path.realpath(root)
started = time.monotonic()
def fail(message):
    sys.exit("tau-stage-data: " + message)
class Transient(Exception):
    pass
def fetch(url, ours, what, sink, size=None):
    request = urllib.request.Request(url)
    if ours:
        # Unredirected: a redirect never carries the run token to another host.
        request.add_unredirected_header("Authorization", "Bearer " + token)
    for attempt in range(1, 7):
        try:
            sha256, got = hashlib.sha256(), 0
            with urllib.request.urlopen(request, timeout=60) as response, open(sink, "wb") as out:
                while True:
                    chunk = response.read(1048576)
                    if not chunk:
                        break
                    got += len(chunk)
                    if size is not None and got > size:
                        fail("%s: more than its %d bytes arrived" % (what, size))
                    sha256.update(chunk)
                    out.write(chunk)
            if size is not None and got < size:
                raise Transient("%d of %d bytes" % (got, size))
            return sha256.hexdigest()
        except urllib.error.HTTPError as error:
            if error.code < 500 and error.code not in (408, 429):
                fail("%s: the server answered %d %s" % (what, error.code, error.reason))
            problem = "%d %s" % (error.code, error.reason)
        except (OSError, Transient) as error:
            problem = str(error)
        print("tau-stage-data: %s: try %d failed (%s)" % (what, attempt, problem), file=sys.stderr)
        time.sleep(min(2**attempt, 30))
    fail("%s: could not be downloaded" % what)
os.makedirs(base, exist_ok=True)
listing = os.path.join(base, ".tau-listing")
fetch(listing_url, True, "the listing", listing)
kept, files, total = {}, 0, 0
with open(listing, encoding="utf-8") as lines:
    head = json.loads(next(lines))
    if head["bytes"] > limit:
        fail("the datasets hold %d bytes, more than the %d this volume was sized for"
             % (head["bytes"], limit))
    for line in lines:
        item = json.loads(line)
        what = "%s file %s" % (item["ref"], item["file"])
        target = os.path.realpath(os.path.join(base, item["path"]))
        if not target.startswith(base + os.sep) or os.path.lexists(target):
            fail("%s: refusing the path %r" % (what, item["path"]))
        total += item["size"]
        if total > limit:
            fail("the files listed hold more than the %d bytes announced" % limit)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if item["sha256"] in kept:
            os.link(kept[item["sha256"]], target)
        else:
            url = urllib.parse.urljoin(listing_url, item["url"])
            partial = target + ".tau-partial"
            got = fetch(url, url.startswith(listing_url), what, partial, item["size"])
            if not hmac.compare_digest(got, item["sha256"]):
                fail("%s: SHA-256 mismatch (the manifest says %s, the store gave %s)"
                     % (what, item["sha256"], got))
            os.chmod(partial, 0o444)
            os.rename(partial, target)
            kept[item["sha256"]] = target
        files += 1
os.unlink(listing)
if files != head["files"]:
    fail("the listing ended after %d of %d files" % (files, head["files"]))
for folder, _, _ in os.walk(base, topdown=False):
    if folder != base:  # the volume's own folder is not ours to change
        os.chmod(folder, 0o555)
seconds = time.monotonic() - started
print("tau-stage-data: %d files, %d bytes verified in %.1f s" % (files, total, seconds))
body = json.dumps({"files": files, "bytes": total, "seconds": round(seconds, 3)}).encode()
request = urllib.request.Request(report, data=body, method="POST")
request.add_header("Content-Type", "application/json")
request.add_unredirected_header("Authorization", "Bearer " + token)
try:
    urllib.request.urlopen(request, timeout=30).close()
except OSError as error:
    print("tau-stage-data: could not report the staging (%s)" % error, file=sys.stderr)
"""


class RenderError(ValueError):
    """The inputs cannot be rendered into valid objects; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Flavor:
    """The ResourceFlavor that ``compute.gpu_type`` names."""

    name: str
    #: The flavor's ``nodeLabels`` (what selects its nodes).
    node_labels: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class RunTarget:
    """Everything about one attempt of a run that is not in its spec."""

    run_id: int
    #: The run's name (its objects are named after it and the attempt: :func:`workload_name`).
    run_name: str
    #: The workspace's slug.
    workspace: str
    namespace: str
    local_queue: str
    #: 1 for the first try.
    attempt: int
    #: The portal as workloads reach it, e.g. ``https://taugrid.example.org``.
    portal_url: str
    #: Name of the attempt's Secret holding the run token (see :func:`run_token_secret_name`).
    token_secret: str
    #: SHA-256 of the run's code bundle; None = no bundle (the code is in the image).
    bundle_sha256: str | None = None
    #: Required when the spec sets ``compute.gpu_type`` (and only then).
    flavor: Flavor | None = None
    #: Checkpoint path handed to this attempt (``TAU_RESUME_FROM``), if resuming.
    resume_from: str | None = None
    #: Why this attempt exists (``TAU_RETRY_REASON``): a failure class, ``resume`` or empty.
    retry_reason: str = ""
    #: A Kubernetes volume source for outputs and checkpoints, e.g.
    #: ``{"persistentVolumeClaim": {"claimName": "tau-data"}}``; None = ``emptyDir``.
    data_volume: Mapping[str, Any] | None = None
    fetcher_image: str = DEFAULT_FETCHER_IMAGE
    #: The pinned ``inputs.datasets`` to stage: (files, bytes) of them all; None = none.
    staged_data: tuple[int, int] | None = None

    @property
    def workload_name(self) -> str:
        """The name of this attempt's RayJob or Job (and of its rendezvous Service)."""
        return workload_name(self.run_name, self.attempt)


@dataclass(frozen=True, slots=True)
class Owner:
    """A created object that dependents point to (its uid exists only after creation)."""

    api_version: str
    kind: str
    name: str
    uid: str

    @classmethod
    def of(cls, created: Mapping[str, Any]) -> Owner:
        """The owner from an object as the API server returned it."""
        metadata = created["metadata"]
        return cls(
            api_version=str(created["apiVersion"]),
            kind=str(created["kind"]),
            name=str(metadata["name"]),
            uid=str(metadata["uid"]),
        )

    def reference(self) -> Manifest:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "blockOwnerDeletion": True,
        }


# ---------------------------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------------------------


#: ``<run name>-a<attempt>``: what follows the run's name in its objects' names.
ATTEMPT_NAME_INFIX: Final = "-a"
#: Hex digits of the run name's hash in a shortened workload name.
_NAME_HASH_LENGTH = 6
#: Attempt numbers a name can carry (far more than any run makes).
MAX_ATTEMPT: Final = 10**9


def workload_name(run_name: str, attempt: int) -> str:
    """The name of attempt ``attempt``'s RayJob or Job: ``<run name>-a<attempt>``, or, when
    that is longer than KubeRay's 47 characters, the run name's first characters, ``-``, six
    hex digits of its SHA-256 and ``-a<attempt>`` (deterministic, and unique per run name and
    attempt). The run name itself must be a DNS-1035 label of at most 47 characters."""
    problem = dns1035_label_problem(run_name, max_length=RAYJOB_NAME_MAX_LENGTH)
    if problem:
        raise RenderError(f"run name {run_name!r} cannot name a workload: it {problem}")
    if not 1 <= attempt <= MAX_ATTEMPT:
        raise RenderError(f"attempt {attempt} is not between 1 and {MAX_ATTEMPT}")
    tail = f"{ATTEMPT_NAME_INFIX}{attempt}"
    if len(run_name) + len(tail) <= RAYJOB_NAME_MAX_LENGTH:
        return f"{run_name}{tail}"
    digest = hashlib.sha256(run_name.encode("utf-8")).hexdigest()[:_NAME_HASH_LENGTH]
    keep = RAYJOB_NAME_MAX_LENGTH - len(tail) - 1 - _NAME_HASH_LENGTH
    return f"{run_name[:keep].rstrip('-')}-{digest}{tail}"


def run_token_secret_name(run_name: str, attempt: int) -> str:
    """The conventional name of an attempt's run-token Secret."""
    return f"{workload_name(run_name, attempt)}-run-token"


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------

# Characters that mean nothing to bash, list2cmdline and sh alike.
_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_@%+=:,./-")


def _sh_tokens(argument: str) -> list[str]:
    """``argument`` as sh source split into space-free tokens that ``list2cmdline`` passes
    through unchanged, and whose re-joining with single spaces sh reads back as exactly
    ``argument``.

    Three rules make that hold. Spaces only ever occur inside single quotes and are where a
    token ends (list2cmdline joins tokens with one space). A token never contains ``"`` after
    a backslash, so list2cmdline does not double any backslash, and its ``"`` → ``\\"``
    rewrite is what sh needs outside quotes anyway. ``'`` is written ``\\'`` outside quotes.
    """
    if argument == "":
        return ["''"]
    tokens: list[str] = []
    current: list[str] = []
    quoted = False
    for character in argument:
        if character in _PLAIN:
            current.append(character)
        elif character == " ":
            if not quoted:
                current.append("'")
                quoted = True
            # An empty token would become `""`; `''` closes and reopens the quote instead.
            tokens.append("".join(current) or "''")
            current = []
        elif character in "'\"":
            if quoted:
                current.append("'")
                quoted = False
            current.append("\\'" if character == "'" else '"')
        elif character == "\t":
            raise RenderError(
                "a RayJob entry point cannot carry a TAB character in an argument "
                "(KubeRay's `ray job submit` quoting would split it)"
            )
        else:
            if not quoted:
                current.append("'")
                quoted = True
            current.append(character)
    if quoted:
        current.append("'")
    if current:
        tokens.append("".join(current))
    return tokens


def ray_entrypoint(argv: Sequence[str]) -> str:
    """The RayJob ``entrypoint`` that makes Ray run exactly ``argv``.

    KubeRay's submitter runs ``bash -c "... ray job submit ... -- <entrypoint> ; ..."``;
    ``ray job submit`` joins the words bash gives it with ``subprocess.list2cmdline``; Ray's
    job supervisor runs that string with ``/bin/sh``. So: sh-quote each argument into
    list2cmdline-proof tokens (:func:`_sh_tokens`), bash-quote the tokens (``shlex.join``),
    and double ``$`` for the kubelet, which expands ``$(NAME)`` in the submitter's args.
    Plain commands come out unchanged: ``python train.py --steps 1500``.
    """
    words = [token for argument in argv for token in _sh_tokens(argument)]
    return _literal(shlex.join(words))


def _literal(text: str) -> str:
    """``text`` as a container command, argument or env value: the kubelet turns ``$$`` into
    ``$`` and expands ``$(NAME)``, so doubling every ``$`` keeps the text as it is."""
    return text.replace("$", "$$")


def ray_command(spec: Spec) -> list[str]:
    """What the Ray driver runs: the entry point, or for a sweep the SDK's Ray Tune driver
    around it (``tau.ray_tune``, shipped with the bundle in ``py_modules``)."""
    command = list(spec.run.command())
    if spec.execution.is_sweep:
        return ["python", "-m", "tau.ray_tune", "--", *command]
    return command


#: A sweep's Ray Tune driver comes with the bundle (the SDK rides in py_modules).
SWEEP_NEEDS_BUNDLE: Final = "a sweep needs its project zip: the Ray Tune driver ships with it"


def kubernetes_problems(spec: Spec) -> list[tuple[str, str]]:
    """(path, message) for what the Kubernetes backend cannot run exactly as the spec says
    (for policy, at submission, so it never surfaces later as a failed delivery)."""
    problems: list[tuple[str, str]] = []
    if spec.run.workload_kind == "rayjob":
        for index, argument in enumerate(spec.run.args):
            if "\t" in argument:
                problems.append(
                    (
                        f"run.args[{index}]",
                        "a RayJob cannot pass a TAB character in an argument; "
                        "use workload_kind: job, or spaces",
                    )
                )
        for index, requirement in enumerate(spec.runtime.pip):
            if "$" in requirement or "`" in requirement:
                problems.append(
                    (
                        f"runtime.pip[{index}]",
                        "KubeRay hands pip requirements to a shell that would expand `$` "
                        "and backquotes; write the requirement without them",
                    )
                )
    return problems


# ---------------------------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------------------------

_HEX64 = re.compile(r"[0-9a-f]{64}")
_URL = re.compile(r"https?://[^\s/?#]+(/[^\s?#]*)?")


def _check_target(spec: Spec, target: RunTarget) -> None:
    problems = []
    try:
        target.workload_name  # noqa: B018 - checks the run name and the attempt
    except RenderError as exc:
        problems.append(str(exc))
    for what, value, check in (
        ("namespace", target.namespace, dns1123_label_problem),
        ("LocalQueue name", target.local_queue, dns1123_label_problem),
        ("workspace", target.workspace, label_value_problem),
        ("token Secret name", target.token_secret, dns1123_subdomain_problem),
        ("spec name", spec.name, label_value_problem),
    ):
        problem = check(value)
        if problem:
            problems.append(f"{what} {value!r} {problem}")
    if spec.queue.priority is not None:
        problem = label_value_problem(spec.queue.priority)
        if problem:
            problems.append(f"priority {spec.queue.priority!r} {problem}")
    if target.run_id < 1 or target.attempt < 1:
        problems.append("run_id and attempt start at 1")
    if not _URL.fullmatch(target.portal_url):
        problems.append(f"portal URL {target.portal_url!r} is not an http(s) URL")
    if target.bundle_sha256 is not None and not _HEX64.fullmatch(target.bundle_sha256):
        problems.append(f"bundle digest {target.bundle_sha256!r} is not a SHA-256 hex digest")
    if spec.runtime.image is None:
        problems.append("runtime.image is unset (workspace policy fills it before rendering)")
    gpu_type = spec.compute.gpu_type
    if gpu_type is not None and (target.flavor is None or target.flavor.name != gpu_type):
        problems.append(f"compute.gpu_type is {gpu_type!r}, so the flavor {gpu_type!r} is needed")
    if gpu_type is None and target.flavor is not None:
        problems.append("a flavor was given but the spec sets no compute.gpu_type")
    if target.flavor is not None:
        for key, value in target.flavor.node_labels.items():
            problem = label_key_problem(key) or label_value_problem(value)
            if problem:
                problems.append(f"flavor node label {key}={value!r}: {problem}")
    if problems:
        raise RenderError("; ".join(problems))


def _object_labels(spec: Spec, target: RunTarget) -> dict[str, str]:
    return {
        labels.MANAGED_BY: labels.MANAGED_BY_TAUGRID,
        labels.WORKSPACE: target.workspace,
        labels.RUN: target.run_name,
        labels.RUN_ID: str(target.run_id),
        labels.ATTEMPT: str(target.attempt),
        labels.SPEC_NAME: spec.name,
    }


def _workload_metadata(spec: Spec, target: RunTarget) -> Manifest:
    object_labels = _object_labels(spec, target)
    object_labels[labels.KUEUE_QUEUE_NAME] = target.local_queue
    if spec.queue.priority is not None:
        object_labels[labels.KUEUE_PRIORITY_CLASS] = spec.queue.priority
    if spec.run.max_runtime is not None:
        object_labels[labels.KUEUE_MAX_EXEC_TIME_SECONDS] = str(
            spec.run.max_runtime + MAX_EXEC_TIME_GRACE_SECONDS
        )
    annotations = {labels.SPEC_HASH: spec_hash(spec)}
    if target.bundle_sha256 is not None:
        annotations[labels.BUNDLE_SHA256] = target.bundle_sha256
    return {
        "name": target.workload_name,
        "namespace": target.namespace,
        "labels": object_labels,
        "annotations": annotations,
    }


def _pod_metadata(spec: Spec, target: RunTarget, component: str) -> Manifest:
    pod_labels = _object_labels(spec, target)
    pod_labels[labels.COMPONENT] = component
    return {"labels": pod_labels}


def _resources(amounts: Mapping[str, str]) -> Manifest:
    # Requests equal limits: the pod gets exactly what Kueue admitted (Guaranteed QoS).
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _worker_resources(spec: Spec) -> Manifest:
    """A worker's requests and limits: ``compute.limits`` where it says more than the
    request (Burstable QoS), else the request (Guaranteed). GPUs are never overcommitted."""
    compute = spec.compute
    requests = {"cpu": compute.cpus, "memory": compute.memory}
    limits = {"cpu": compute.cpu_limit, "memory": compute.memory_limit}
    if compute.gpus:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(compute.gpus)
    return {"requests": requests, "limits": limits}


def _head_resources(spec: Spec) -> Manifest:
    head = spec.compute.ray_head
    return {
        "requests": {"cpu": head.cpus, "memory": head.memory},
        "limits": {"cpu": head.cpu_limit, "memory": head.memory_limit},
    }


def head_requests(spec: Spec) -> dict[str, str]:
    """What the Ray head asks for (and Kueue counts): ``compute.head`` or the default."""
    head = spec.compute.ray_head
    return {"cpu": head.cpus, "memory": head.memory}


def _env_var(name: str, value: str) -> Manifest:
    """A literal environment variable. An empty value is written as no value (the same empty
    variable in the container), because that is how the API server stores it."""
    return {"name": name, "value": _literal(value)} if value else {"name": name}


def _platform_env(target: RunTarget) -> list[Manifest]:
    values = [
        (ENV_RUN_ID, str(target.run_id)),
        (ENV_RUN_NAME, target.run_name),
        (ENV_WORKSPACE, target.workspace),
        (ENV_ATTEMPT, str(target.attempt)),
        (ENV_OUTPUT_DIR, OUTPUT_DIR),
        (ENV_CHECKPOINT_DIR, CHECKPOINT_DIR),
    ]
    if target.resume_from is not None:
        values.append((ENV_RESUME_FROM, target.resume_from))
    values += [
        (ENV_RETRY_REASON, target.retry_reason),
        (ENV_API_URL, target.portal_url.rstrip("/")),
    ]
    env: list[Manifest] = [_env_var(name, value) for name, value in values]
    env.append(
        {
            "name": ENV_RUN_TOKEN,
            "valueFrom": {"secretKeyRef": {"name": target.token_secret, "key": RUN_TOKEN_KEY}},
        }
    )
    return env


def _spec_env(spec: Spec, target: RunTarget) -> list[Manifest]:
    env: list[Manifest] = [_env_var(variable.name, variable.value) for variable in spec.runtime.env]
    if target.staged_data is not None:
        env.append({"name": ENV_DATA_DIR, "value": STAGED_DATA_DIR})
    elif spec.storage.data_pvc is not None:
        env.append({"name": ENV_DATA_DIR, "value": DATASET_DIR})
    env += [
        {"name": ref.env, "valueFrom": {"secretKeyRef": {"name": ref.secret, "key": ref.key}}}
        for ref in spec.runtime.secrets
    ]
    return env


def _spec_env_names(spec: Spec) -> set[str]:
    return {variable.name for variable in spec.runtime.env} | {
        ref.env for ref in spec.runtime.secrets
    }


def nccl_may_run(spec: Spec) -> bool:
    """Whether the run's GPUs may talk to each other through NCCL: a worker with several GPUs
    (torchrun's processes in one pod), or GPU workers that train together. A sweep's trials
    each train alone on one worker's GPUs, so there only a worker with several GPUs counts."""
    gpus = spec.compute.gpus
    if spec.execution.is_sweep:
        return gpus > 1
    return gpus > 0 and gpus * spec.compute.workers > 1


def _nccl_env(spec: Spec) -> list[Manifest]:
    """:data:`NCCL_ENV` for a GPU container of a run where NCCL may run, without the names
    the spec sets itself."""
    if not nccl_may_run(spec):
        return []
    taken = _spec_env_names(spec)
    return [_env_var(name, value) for name, value in NCCL_ENV if name not in taken]


def _data_volumes(spec: Spec, target: RunTarget, *, memory_limit: str) -> list[Manifest]:
    """The pod's volumes; ``memory_limit`` is the memory limit of the container that mounts
    them, and the size of its ``/dev/shm`` (module docstring, "Shared memory")."""
    source = dict(target.data_volume) if target.data_volume is not None else {"emptyDir": {}}
    volumes: list[Manifest] = [
        {"name": _DATA_VOLUME, **source},
        {"name": _SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": memory_limit}},
    ]
    storage = spec.storage
    if storage.data_pvc is not None:
        claim: Manifest = {"claimName": storage.data_pvc}
        if storage.read_only:
            claim["readOnly"] = True
        volumes.append({"name": _DATASET_VOLUME, "persistentVolumeClaim": claim})
    if target.staged_data is not None:
        size = str(staged_volume_bytes(*target.staged_data))
        volumes.append({"name": _STAGED_VOLUME, "emptyDir": {"sizeLimit": size}})
    return volumes


def _data_mounts(spec: Spec, target: RunTarget) -> list[Manifest]:
    run_dir = f"runs/{target.run_name}"
    mounts: list[Manifest] = [
        {
            "name": _DATA_VOLUME,
            "mountPath": OUTPUT_DIR,
            "subPath": f"{run_dir}/outputs/attempt-{target.attempt}",
        },
        {"name": _DATA_VOLUME, "mountPath": CHECKPOINT_DIR, "subPath": f"{run_dir}/checkpoints"},
        {"name": _SHM_VOLUME, "mountPath": SHM_DIR},
    ]
    if spec.storage.data_pvc is not None:
        mount: Manifest = {"name": _DATASET_VOLUME, "mountPath": DATASET_DIR}
        if spec.storage.read_only:
            mount["readOnly"] = True
        mounts.append(mount)
    if target.staged_data is not None:
        mounts.append({"name": _STAGED_VOLUME, "mountPath": STAGED_DATA_DIR, "readOnly": True})
    return mounts


def staged_volume_bytes(files: int, size: int) -> int:
    """The ``sizeLimit`` of the volume that holds ``files`` staged files of ``size`` bytes."""
    return size + files * STAGE_BYTES_PER_FILE + STAGE_SLACK_BYTES


def data_url(target: RunTarget) -> str:
    """Where the stager reads the run's pinned files (the portal's listing, run token auth)."""
    base = target.portal_url.rstrip("/")
    return f"{base}/api/v1/workspaces/{target.workspace}/runs/{target.run_name}/data/"


def _stager(target: RunTarget) -> Manifest:
    assert target.staged_data is not None
    base = target.portal_url.rstrip("/")
    report = (
        f"{base}/api/v1/workspaces/{target.workspace}/runs/{target.run_name}/report/data-staged/"
    )
    return {
        "name": STAGER,
        "image": target.fetcher_image,
        "command": [
            "python3",
            "-I",
            "-c",
            STAGE_SCRIPT,
            _literal(data_url(target)),
            STAGED_DATA_DIR,
            str(target.staged_data[1]),
            _literal(report),
        ],
        "env": _platform_env(target),
        "resources": _resources(FETCHER_RESOURCES),
        "volumeMounts": [{"name": _STAGED_VOLUME, "mountPath": STAGED_DATA_DIR}],
        # Its last words (the file that failed) become the pod's reason for failing.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": _init_security(),
    }


def bundle_url(target: RunTarget) -> str:
    """Where the fetcher downloads the run's bundle (the portal's endpoint, run token auth)."""
    base = target.portal_url.rstrip("/")
    return f"{base}/api/v1/workspaces/{target.workspace}/runs/{target.run_name}/bundle/"


def _fetcher(target: RunTarget, digest: str) -> Manifest:
    return {
        "name": _FETCHER,
        "image": target.fetcher_image,
        "command": [
            "python3",
            "-I",
            "-c",
            FETCH_SCRIPT,
            _literal(bundle_url(target)),
            digest,
            FETCH_DIR,
            str(MAX_BUNDLE_BYTES),
            workload_sdk.packed(),
        ],
        "env": _platform_env(target),
        "resources": _resources(FETCHER_RESOURCES),
        "volumeMounts": [{"name": _CODE_VOLUME, "mountPath": FETCH_DIR}],
        "securityContext": _init_security(),
    }


def _init_security() -> Manifest:
    """The fetcher's and the stager's: nobody, no capabilities, a read-only root file system."""
    return {
        "runAsUser": 65534,
        "runAsGroup": 65534,
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _code_mount(*, read_only: bool) -> Manifest:
    mount: Manifest = {"name": _CODE_VOLUME, "mountPath": CODE_DIR, "subPath": "code"}
    if read_only:
        mount["readOnly"] = True
    return mount


def _sdk_mount() -> Manifest:
    return {"name": _CODE_VOLUME, "mountPath": SDK_DIR, "subPath": "sdk", "readOnly": True}


def _with_sdk_on_path(env: list[Manifest]) -> list[Manifest]:
    """``env`` with ``PYTHONPATH`` leading to the SDK: the spec's own ``PYTHONPATH`` (a literal
    in ``runtime.env``) comes after it; one taken from a Secret is left alone (its value is
    not known here, and the researcher chose it)."""
    for variable in env:
        if variable["name"] == "PYTHONPATH":
            if "valueFrom" not in variable:
                variable["value"] = workload_sdk.python_path(SDK_DIR, variable.get("value"))
            return env
    return [*env, {"name": "PYTHONPATH", "value": SDK_DIR}]


_CODE_VOLUME_SPEC: Final[Mapping[str, Any]] = {"name": _CODE_VOLUME, "emptyDir": {}}


# ---------------------------------------------------------------------------------------------
# RayJob
# ---------------------------------------------------------------------------------------------


def runtime_env_yaml(spec: Spec, target: RunTarget) -> str | None:
    """The RayJob's ``runtimeEnvYAML``: pip requirements and the bundle as working dir.

    A requirement of Ray itself is left out: the image's Ray runs the cluster, and a Ray of
    another version in the runtime environment would not talk to it. (``runtime.pip`` names
    Ray for the local executor, which starts a Ray cluster only when the run's environment
    has Ray: docs/distributed.md.)"""
    runtime_env: dict[str, Any] = {}
    pip = [requirement for requirement in spec.runtime.pip if project_name(requirement) != "ray"]
    if pip:
        runtime_env["pip"] = pip
    if spec.execution.is_sweep:
        # In the runtime environment, so that the driver and every trial on every worker
        # see the sweep.
        runtime_env["env_vars"] = {
            **sweep_environment(spec),
            "TAU_METRICS_FILE": spec.outputs.metrics_file,
        }
    if target.bundle_sha256 is not None:
        runtime_env["working_dir"] = CODE_DIR
        # The SDK the fetcher wrote, shipped by Ray to the driver and every worker.
        runtime_env["py_modules"] = [f"{SDK_DIR}/tau"]
    if not runtime_env:
        return None
    dumped: str = yaml.dump(
        runtime_env,
        Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper),
        default_flow_style=False,
        sort_keys=True,
        allow_unicode=True,
        width=2**16,
    )
    return dumped


def render_rayjob(spec: Spec, target: RunTarget) -> Manifest:
    """A KubeRay ``ray.io/v1`` RayJob for a ``workload_kind: rayjob`` spec."""
    _check_target(spec, target)
    if spec.run.workload_kind != "rayjob":
        raise RenderError(f"workload_kind is {spec.run.workload_kind!r}, not 'rayjob'")
    problems = kubernetes_problems(spec)
    if problems:
        raise RenderError("; ".join(f"{path}: {message}" for path, message in problems))
    if spec.execution.is_sweep and target.bundle_sha256 is None:
        raise RenderError(f"execution.launcher: {SWEEP_NEEDS_BUNDLE}")
    image = spec.runtime.image
    assert image is not None  # checked above
    workers = spec.compute.workers

    def env(*, worker: bool = False) -> list[Manifest]:
        # A fresh list per container: no two containers share (and could co-mutate) one.
        # NCCL runs on the workers only (the head and the submitter have no GPUs).
        return _platform_env(target) + (_nccl_env(spec) if worker else []) + _spec_env(spec, target)

    head_pod: Manifest = {
        "enableServiceLinks": False,
        "containers": [
            {
                "name": "ray-head",
                "image": image,
                "env": env(),
                "resources": _head_resources(spec),
                "volumeMounts": _data_mounts(spec, target),
            }
        ],
        "volumes": _data_volumes(spec, target, memory_limit=spec.compute.ray_head.memory_limit),
    }
    worker_pod: Manifest = {
        "enableServiceLinks": False,
        "containers": [
            {
                "name": "ray-worker",
                "image": image,
                "env": env(worker=True),
                "resources": _worker_resources(spec),
                "volumeMounts": _data_mounts(spec, target),
            }
        ],
        "volumes": _data_volumes(spec, target, memory_limit=spec.compute.memory_limit),
    }
    if target.flavor is not None:
        worker_pod["nodeSelector"] = dict(target.flavor.node_labels)
    if target.staged_data is not None:
        # The driver runs on the head; tasks on the workers: each pod stages its own copy.
        head_pod["initContainers"] = [_stager(target)]
        worker_pod["initContainers"] = [_stager(target)]

    submitter_env = [
        *env(),
        # Ship the verified bundle whole: no .gitignore filtering, no default excludes.
        {"name": "RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "value": "1"},
        _env_var("RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES", ""),
    ]
    submitter_container: Manifest = {
        "name": "ray-job-submitter",
        "image": image,
        "env": submitter_env,
        "resources": _resources(SUBMITTER_RESOURCES),
    }
    submitter_pod: Manifest = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "containers": [submitter_container],
    }
    if target.bundle_sha256 is not None:
        submitter_pod["initContainers"] = [_fetcher(target, target.bundle_sha256)]
        submitter_container["volumeMounts"] = [_code_mount(read_only=True), _sdk_mount()]
        submitter_pod["volumes"] = [dict(_CODE_VOLUME_SPEC)]

    rayjob_spec: Manifest = {
        "entrypoint": ray_entrypoint(ray_command(spec)),
        "submissionMode": "K8sJobMode",
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": RAYJOB_TTL_SECONDS,
        "backoffLimit": 0,
    }
    runtime_env = runtime_env_yaml(spec, target)
    if runtime_env is not None:
        rayjob_spec["runtimeEnvYAML"] = runtime_env
    if spec.run.max_runtime is not None:
        rayjob_spec["activeDeadlineSeconds"] = spec.run.max_runtime
    rayjob_spec["rayClusterSpec"] = {
        "headGroupSpec": {
            # No Ray tasks or actors on the head: the work goes where `compute` put resources.
            "rayStartParams": {"num-cpus": "0"},
            "template": {
                "metadata": _pod_metadata(spec, target, labels.COMPONENT_HEAD),
                "spec": head_pod,
            },
        },
        "workerGroupSpecs": [
            {
                "groupName": RAY_WORKER_GROUP,
                "replicas": workers,
                "minReplicas": workers,
                "maxReplicas": workers,
                "rayStartParams": {},
                "template": {
                    "metadata": _pod_metadata(spec, target, labels.COMPONENT_WORKER),
                    "spec": worker_pod,
                },
            }
        ],
    }
    rayjob_spec["submitterPodTemplate"] = {
        "metadata": _pod_metadata(spec, target, labels.COMPONENT_SUBMITTER),
        "spec": submitter_pod,
    }
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": _workload_metadata(spec, target),
        "spec": rayjob_spec,
    }


# ---------------------------------------------------------------------------------------------
# batch/v1 Job
# ---------------------------------------------------------------------------------------------


def _rendezvous_env(spec: Spec, name: str) -> list[Manifest]:
    """The rendezvous table (``tau.rendezvous``) as a pod of the Indexed Job ``name`` says it:
    worker 0 is pod 0 through the headless Service, the rank is the pod's completion index."""
    said: Mapping[rendezvous.Value, str] = {
        rendezvous.Value.MASTER_ADDR: f"{name}-0.{name}",
        rendezvous.Value.MASTER_PORT: str(rendezvous.DEFAULT_PORT),
        rendezvous.Value.WORKERS: str(spec.compute.workers),
        # One process per pod: torchrun numbers the processes it starts there itself.
        rendezvous.Value.LOCAL_RANK: "0",
    }
    index = f"metadata.annotations['{labels.JOB_COMPLETION_INDEX}']"

    def variable(variable_name: str, value: rendezvous.Value) -> Manifest:
        if value is rendezvous.Value.RANK:
            # The same template for every pod: each reads its own index when it starts.
            return {"name": variable_name, "valueFrom": {"fieldRef": {"fieldPath": index}}}
        return _env_var(variable_name, said[value])

    # The spec's own value wins: never silently replace what the researcher set.
    taken = _spec_env_names(spec)
    return [
        variable(variable_name, value)
        for variable_name, value in rendezvous.RENDEZVOUS
        if variable_name not in taken
    ]


def render_job(spec: Spec, target: RunTarget) -> Manifest:
    """A ``batch/v1`` Job for a ``workload_kind: job`` spec: one pod, or an Indexed Job with
    one pod per worker (plus the headless Service from :func:`render_dependents`)."""
    _check_target(spec, target)
    if spec.run.workload_kind != "job":
        raise RenderError(f"workload_kind is {spec.run.workload_kind!r}, not 'job'")
    name = target.workload_name
    workers = spec.compute.workers
    indexed = workers > 1

    env = _platform_env(target)
    if indexed:
        env += _rendezvous_env(spec, name)
    env += _nccl_env(spec)
    env += _spec_env(spec, target)
    mounts = _data_mounts(spec, target)
    volumes = _data_volumes(spec, target, memory_limit=spec.compute.memory_limit)
    container: Manifest = {
        "name": "workload",
        "image": spec.runtime.image,
        "command": [_literal(word) for word in spec.run.command()],
        "env": env,
        "resources": _worker_resources(spec),
    }
    pod: Manifest = {"restartPolicy": "Never", "enableServiceLinks": False}
    if target.bundle_sha256 is not None:
        container["workingDir"] = CODE_DIR
        container["env"] = _with_sdk_on_path(env)
        mounts[:0] = [_code_mount(read_only=False), _sdk_mount()]
        checkpoint_dir = spec.resilience.checkpoint_dir
        if checkpoint_dir is not None and checkpoint_dir != ".":
            # The promise of resilience.checkpoint_dir: relative to the project directory.
            mounts.append(
                {
                    "name": _DATA_VOLUME,
                    "mountPath": f"{CODE_DIR}/{checkpoint_dir}",
                    "subPath": f"runs/{target.run_name}/checkpoints",
                }
            )
        pod["initContainers"] = [_fetcher(target, target.bundle_sha256)]
        volumes.insert(0, dict(_CODE_VOLUME_SPEC))
    if target.staged_data is not None:
        pod.setdefault("initContainers", []).append(_stager(target))
    container["volumeMounts"] = mounts
    pod["containers"] = [container]
    pod["volumes"] = volumes
    if indexed:
        pod["subdomain"] = name
    if target.flavor is not None:
        pod["nodeSelector"] = dict(target.flavor.node_labels)

    job_spec: Manifest = {
        "backoffLimit": 0,
        "completions": workers,
        "parallelism": workers,
    }
    if indexed:
        job_spec["completionMode"] = "Indexed"
    if spec.run.max_runtime is not None:
        job_spec["activeDeadlineSeconds"] = spec.run.max_runtime
    job_spec["ttlSecondsAfterFinished"] = JOB_TTL_SECONDS
    job_spec["template"] = {
        "metadata": _pod_metadata(spec, target, labels.COMPONENT_WORKER),
        "spec": pod,
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _workload_metadata(spec, target),
        "spec": job_spec,
    }


def render_workload(spec: Spec, target: RunTarget) -> Manifest:
    """The RayJob or Job, by ``run.workload_kind``."""
    if spec.run.workload_kind == "rayjob":
        return render_rayjob(spec, target)
    return render_job(spec, target)


# ---------------------------------------------------------------------------------------------
# Dependents: created after the workload, owned by it
# ---------------------------------------------------------------------------------------------


def render_run_secret(spec: Spec, target: RunTarget, *, token: str, owner: Owner) -> Manifest:
    """The attempt's Secret holding its run token, owned by (and deleted with) the workload."""
    _check_target(spec, target)
    if not token or not token.isprintable():
        raise RenderError("the run token must be non-empty printable text")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": target.token_secret,
            "namespace": target.namespace,
            "labels": _object_labels(spec, target),
            "ownerReferences": [owner.reference()],
        },
        "type": "Opaque",
        # An attempt's token never changes; immutable Secrets also spare the kubelet a watch.
        "immutable": True,
        "data": {RUN_TOKEN_KEY: base64.b64encode(token.encode("utf-8")).decode("ascii")},
    }


def render_rendezvous_service(spec: Spec, target: RunTarget, *, owner: Owner) -> Manifest:
    """The headless Service that gives each pod of a multi-worker Job a DNS name
    (``<job>-<index>.<job>``), owned by the Job."""
    _check_target(spec, target)
    name = target.workload_name
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": target.namespace,
            "labels": _object_labels(spec, target),
            "ownerReferences": [owner.reference()],
        },
        "spec": {
            "clusterIP": "None",
            # Rendezvous happens before any pod is Ready: publish addresses at once.
            "publishNotReadyAddresses": True,
            "selector": {labels.RUN: target.run_name, labels.ATTEMPT: str(target.attempt)},
            "ports": [
                {
                    "name": "rendezvous",
                    "port": rendezvous.DEFAULT_PORT,
                    "targetPort": rendezvous.DEFAULT_PORT,
                    "protocol": "TCP",
                }
            ],
        },
    }


def needs_rendezvous_service(spec: Spec) -> bool:
    return spec.run.workload_kind == "job" and spec.compute.workers > 1


def render_dependents(spec: Spec, target: RunTarget, *, token: str, owner: Owner) -> list[Manifest]:
    """What is created right after the workload, pointing at it (see the module docstring
    for the order): the run token Secret and, for a multi-worker Job, the headless Service."""
    objects = [render_run_secret(spec, target, token=token, owner=owner)]
    if needs_rendezvous_service(spec):
        objects.append(render_rendezvous_service(spec, target, owner=owner))
    return objects
