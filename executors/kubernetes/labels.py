"""Every label and annotation key on the Kubernetes objects TauGrid creates, in one place.

TauGrid's own keys live under ``taugrid.io/``; the others are keys that Kueue, Kubernetes or
KubeRay read or write and that TauGrid sets or selects on. Anything that renders objects
(``executors.kubernetes.render``) or finds them again (the Kubernetes backend, the reconciler)
imports the keys from here, so a key is spelt exactly once.

Labels hold what is selected on (short values: names, numbers); annotations hold what is
only read back (the 64-character spec hash does not even fit a label value).
"""

from __future__ import annotations

from typing import Final

# --- TauGrid -------------------------------------------------------------------------------

PREFIX: Final = "taugrid.io"

#: Label: the workspace's slug (``alpha``).
WORKSPACE: Final = f"{PREFIX}/workspace"
#: Label: the run's name (``train-k3x9q2``); its objects are named after it and the attempt
#: (``train-k3x9q2-a1``, ``executors.kubernetes.render.workload_name``).
RUN: Final = f"{PREFIX}/run"
#: Label: the run's primary key in the portal's database (``42``).
RUN_ID: Final = f"{PREFIX}/run-id"
#: Label: the attempt number, 1 for the first try (``2`` on the first retry).
ATTEMPT: Final = f"{PREFIX}/attempt"
#: Label: the ``name`` field of the tau.yaml the run came from (``aks-gpu-quickstart``).
SPEC_NAME: Final = f"{PREFIX}/spec-name"
#: Label: the endpoint's name (``tiny-gpt``): its RayService is named after it.
ENDPOINT: Final = f"{PREFIX}/endpoint"
#: Label: the endpoint's primary key in the portal's database.
ENDPOINT_ID: Final = f"{PREFIX}/endpoint-id"
#: Label on a RayService: which deployment of the endpoint it is (1, then one more at every
#: update or scale).
GENERATION: Final = f"{PREFIX}/generation"
#: Label on pods: which part of the workload a pod is (values below).
COMPONENT: Final = f"{PREFIX}/component"

#: Annotation: SHA-256 (hex) of the normalised spec the object was rendered from.
SPEC_HASH: Final = f"{PREFIX}/spec-hash"
#: Annotation: SHA-256 (hex) of the code bundle the workload fetches and verifies.
BUNDLE_SHA256: Final = f"{PREFIX}/bundle-sha256"

#: Values of ``COMPONENT``.
COMPONENT_HEAD: Final = "head"
COMPONENT_WORKER: Final = "worker"
COMPONENT_SUBMITTER: Final = "submitter"

# --- Kubernetes ----------------------------------------------------------------------------

#: Label: the tool that manages the object (value ``MANAGED_BY_TAUGRID``).
MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY_TAUGRID: Final = "taugrid"
#: Annotation the Job controller puts on each pod of an Indexed Job (read through the
#: downward API for the pod's rank).
JOB_COMPLETION_INDEX: Final = "batch.kubernetes.io/job-completion-index"

# --- Kueue ---------------------------------------------------------------------------------

#: Label: the LocalQueue a job is submitted to. Must be a label (the annotation is gone).
KUEUE_QUEUE_NAME: Final = "kueue.x-k8s.io/queue-name"
#: Label: the WorkloadPriorityClass of the job's Workload.
KUEUE_PRIORITY_CLASS: Final = "kueue.x-k8s.io/priority-class"
#: Label: after this many admitted seconds Kueue deactivates the Workload.
KUEUE_MAX_EXEC_TIME_SECONDS: Final = "kueue.x-k8s.io/max-exec-time-seconds"
#: Label Kueue puts on a Workload: the uid of the job it was made for (select on it to find
#: the Workload of a job).
KUEUE_JOB_UID: Final = "kueue.x-k8s.io/job-uid"

#: The TauGrid keys, for tests and for code that copies TauGrid's labels between objects.
TAUGRID_LABELS: Final = (
    WORKSPACE,
    RUN,
    RUN_ID,
    ATTEMPT,
    SPEC_NAME,
    COMPONENT,
    ENDPOINT,
    ENDPOINT_ID,
    GENERATION,
)
TAUGRID_ANNOTATIONS: Final = (SPEC_HASH, BUNDLE_SHA256)
