"""TauGrid's one adapter for the Kubernetes API: the only module that imports ``kubernetes``.

Everything else (the workspace sync, the run backend, ``cluster_check``) calls this package
with plain dicts and catches its errors, so the client library, its version quirks, timeouts
and credentials stay in one place::

    from kube import client, NotFound

    queue = client().get("kueue.x-k8s.io/v1beta2", "ClusterQueue", "team-a")
    client().apply(cluster_queue_body)          # server-side apply, field manager "taugrid"

- :mod:`kube.config` — ``TAU_KUBECONFIG`` or in-cluster configuration, one ``ApiClient`` per
  process;
- :mod:`kube.api` — :class:`KubeClient`: get/list/apply/create/update/patch/delete for any kind,
  ``list_with_version`` + ``watch`` (a :class:`Watch` of :class:`WatchEvent` s),
  ``whoami`` (SelfSubjectReview), ``can_i`` (SelfSubjectAccessReview), ``served_versions``
  (of a CRD), with a timeout on
  every request and ``spec.suspend`` never applied (Kueue owns it);
- :mod:`kube.errors` — :class:`KubeError` and the kinds of failure callers act on.
- :mod:`kube.informer` — :class:`~kube.informer.Informer`: list, then watch, one kind in a
  thread, resuming, backing off and listing again on its own;
- :mod:`kube.leader` — :class:`~kube.leader.LeaderElection`: one active replica through a
  ``coordination.k8s.io/v1`` Lease.

It imports nothing from the portal's apps (nor Django): configuration comes as arguments or
from the environment.
"""

from kube.api import (
    DEFAULT_TIMEOUT,
    FIELD_MANAGER,
    AccessReview,
    Body,
    Identity,
    KubeClient,
    Listing,
    PatchType,
    Propagation,
    ResourceInfo,
    Timeout,
    Watch,
    WatchEvent,
    client,
    reset_client,
)
from kube.config import KUBECONFIG_ENV, api_client, new_api_client, reset_api_client
from kube.errors import (
    Cause,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    KubeConfigError,
    KubeError,
    NotFound,
    RefusedByWebhook,
    Unauthorized,
    Unavailable,
    UnknownKind,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "FIELD_MANAGER",
    "KUBECONFIG_ENV",
    "AccessReview",
    "Body",
    "Cause",
    "Conflict",
    "Forbidden",
    "Gone",
    "Identity",
    "Invalid",
    "KubeClient",
    "KubeConfigError",
    "KubeError",
    "Listing",
    "NotFound",
    "PatchType",
    "Propagation",
    "RefusedByWebhook",
    "ResourceInfo",
    "Timeout",
    "Unauthorized",
    "Unavailable",
    "UnknownKind",
    "Watch",
    "WatchEvent",
    "api_client",
    "client",
    "new_api_client",
    "reset_api_client",
    "reset_client",
]
