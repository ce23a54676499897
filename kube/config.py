"""Where the cluster is and how TauGrid authenticates to it: one ``ApiClient`` per process.

``TAU_KUBECONFIG`` names a kubeconfig file (its current context is used); without it TauGrid
expects to run in a pod and uses the ServiceAccount Kubernetes mounts there
(``load_incluster_config``, which re-reads the rotating token). Neither is a
:class:`~kube.errors.KubeConfigError` that says what to set.

One client is built per process, lazily and under a lock, and reused: an ``ApiClient`` holds
a urllib3 connection pool (thread-safe) and, for in-cluster and exec-plugin credentials, the
token refresh. Building one per call would cost a TLS handshake per call and re-read
credentials. ``reset_api_client`` closes it so that tests (and a process that changed its
environment) start over.

Nothing here imports Django: settings reach this module as arguments or the environment.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from urllib3.util.retry import Retry

from kube.errors import KubeConfigError

if TYPE_CHECKING:
    from kubernetes import client as k8s_client

# The client library (its generated models, about half a second to import) is imported on
# first use, not with this module: the portal imports this package in every process, and on
# the local backend never calls it.

__all__ = [
    "KUBECONFIG_ENV",
    "api_client",
    "new_api_client",
    "reset_api_client",
]

KUBECONFIG_ENV = "TAU_KUBECONFIG"

# One retry of a failed connect (or of a read, for idempotent methods only: urllib3 never
# repeats a POST or PATCH), no retries on status codes: callers decide what a 5xx means, and
# a cluster that is down must fail in about two connect timeouts, not urllib3's default four.
RETRIES = Retry(total=1, connect=1, read=1, status=0, redirect=0, other=0, backoff_factor=0)

_lock = threading.Lock()
_shared: k8s_client.ApiClient | None = None


def new_api_client(
    kubeconfig: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    impersonate_user: str | None = None,
) -> k8s_client.ApiClient:
    """A new ``ApiClient`` for ``kubeconfig``, else ``$TAU_KUBECONFIG``, else the in-cluster
    ServiceAccount.

    ``impersonate_user`` makes every request act as that user (the ``Impersonate-User``
    header; the configured identity needs the ``impersonate`` verb): how tests see the
    cluster through a ServiceAccount's RBAC (``system:serviceaccount:<namespace>:<name>``;
    the API server adds the ServiceAccount groups itself).
    The kubeconfig file is never written back (refreshed tokens stay in memory).
    """
    from kubernetes import client as k8s_client

    env = os.environ if environ is None else environ
    path = kubeconfig if kubeconfig is not None else env.get(KUBECONFIG_ENV) or None
    configuration = k8s_client.Configuration()
    if path is not None:
        _load_kubeconfig(Path(path), configuration)
    else:
        _load_incluster(configuration)
    configuration.retries = RETRIES
    api = k8s_client.ApiClient(configuration=configuration)
    api.user_agent = "taugrid"
    if impersonate_user:
        set_header: Callable[[str, str], None] = api.set_default_header
        set_header("Impersonate-User", impersonate_user)
    return api


def _load_kubeconfig(path: Path, configuration: k8s_client.Configuration) -> None:
    if not path.is_file():
        raise KubeConfigError(
            f"{KUBECONFIG_ENV}={path} is not a file: set {KUBECONFIG_ENV} to the path of a "
            "kubeconfig (e.g. the one `make cluster-up` prints), or unset it inside a pod to "
            "use the pod's ServiceAccount"
        )
    from kubernetes import config as k8s_config
    from kubernetes.config.config_exception import ConfigException

    # The client library's loaders are untyped: a typed name for the call.
    load: Callable[..., None] = k8s_config.load_kube_config
    try:
        load(config_file=str(path), client_configuration=configuration, persist_config=False)
    except (ConfigException, OSError, ValueError, TypeError, KeyError) as error:
        # The loader's messages name fields and files, never credential values.
        raise KubeConfigError(
            f"cannot use the kubeconfig {path} ({KUBECONFIG_ENV}): {error}"
        ) from None


def _load_incluster(configuration: k8s_client.Configuration) -> None:
    from kubernetes import config as k8s_config
    from kubernetes.config.config_exception import ConfigException

    load: Callable[..., None] = k8s_config.load_incluster_config
    try:
        load(client_configuration=configuration)
    except ConfigException as error:
        raise KubeConfigError(
            f"no Kubernetes configuration: set {KUBECONFIG_ENV} to the path of a kubeconfig, "
            f"or run TauGrid in a pod with a ServiceAccount (in-cluster configuration: {error})"
        ) from None


def api_client() -> k8s_client.ApiClient:
    """The process's shared ``ApiClient`` (built on first use from the environment)."""
    global _shared
    with _lock:
        if _shared is None:
            _shared = new_api_client()
        return _shared


def reset_api_client() -> None:
    """Close and forget the shared client; the next :func:`api_client` builds a new one."""
    global _shared
    with _lock:
        previous, _shared = _shared, None
    if previous is not None:
        close: Callable[[], None] = previous.close
        close()
