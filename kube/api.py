"""Objects of any kind as plain dicts: get, list, server-side apply, create, update, patch,
delete, plus the questions ``cluster_check`` asks (who am I? may I? which versions are served?).

Why not ``kubernetes.dynamic.DynamicClient``: it discovers the whole API when it is built,
without a timeout, and caches what it found in a file under /tmp shared by every process of
the machine (stale after a CRD changes, and anybody's to write). Here discovery is one GET
per apiVersion, with the same timeout as every other call, cached in memory per client and
refreshed once when a kind is missing (a CRD installed after start). Requests go through the
``ApiClient``'s own serialisation and authentication (so in-cluster and exec-plugin tokens
are refreshed as usual) and every one carries ``_request_timeout``.

Server-side apply, and ``spec.suspend``
=======================================

:meth:`KubeClient.apply` sends the whole intended object as an apply patch
(``application/apply-patch+yaml``) with field manager ``taugrid``: Kubernetes then records
that TauGrid owns exactly the fields it sent, removes fields TauGrid stopped sending, and
leaves everything else (other controllers' fields, status) alone. An apply that changes
nothing is not written (``resourceVersion`` stays), so applying the same body again is free
and a drift repair is "apply again".

``force=True`` is the default: TauGrid is the authority for the objects it manages, so a
field someone changed by hand (``kubectl edit`` makes its manager the owner) is taken back
instead of failing with a :class:`~kube.errors.Conflict`; fields TauGrid does not send are
never touched. Pass ``force=False`` to learn about such a conflict instead.

``spec.suspend`` is **stripped** from every apply body, whatever the kind. Kueue owns it on
Jobs and RayJobs: its mutating webhook suspends a queue-labelled job on create (and fails
closed), and Kueue alone unsuspends it on admission and suspends it again on preemption. A
field in TauGrid's apply would make TauGrid its owner, and the next apply (a drift repair, a
label change) would force the old value back: an admitted job suspended again, or a
preempted one resumed behind Kueue's back. Stripping (rather than refusing) lets callers pass
a rendered object as is. Seen on the test cluster (tests/kube/test_adapter_cluster.py): a Job
created by apply is suspended by Kueue's webhook and that value has no owner in
``managedFields`` (admission mutations are not attributed); on admission ``kueue``
(operation ``Update``) owns it, and TauGrid's later applies leave it so. A job that must
exist suspended even where Kueue's webhook does not act can be created with
:meth:`KubeClient.create`, which sends the body unchanged: ``taugrid`` (operation ``Update``,
not ``Apply``) owns the value until Kueue's first change takes it over. No other kind's
``spec.suspend`` (a CronJob's) can be applied through this module.

Watches
=======

:meth:`KubeClient.list_with_version` gives the items and the list's ``resourceVersion``;
:meth:`KubeClient.watch` streams what changes after it (``ADDED``, ``MODIFIED``, ``DELETED``,
and ``BOOKMARK`` events that only move the version on). A watch ends by itself after its
server-side ``timeout_seconds``; the client's read timeout is a little longer, so a connection
that died silently (no FIN from a vanished apiserver) ends it too, as :class:`~kube.errors.
Unavailable`. A version the API server no longer keeps is :class:`~kube.errors.Gone` (410),
whether the server says so in the response status or, as it usually does once the stream has
started, in an ``ERROR`` event: the caller lists again. :meth:`Watch.close` ends a watch from
another thread.

Bodies are never logged: a Secret's data must not end up in a log.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal
from urllib.parse import quote

import urllib3

from kube.config import api_client, reset_api_client
from kube.errors import (
    KubeError,
    NotFound,
    Unavailable,
    UnknownKind,
    error_from_response,
    safe_address,
)

if TYPE_CHECKING:
    from kubernetes import client as k8s_client

__all__ = [
    "APPLY_CONTENT_TYPE",
    "DEFAULT_TIMEOUT",
    "FIELD_MANAGER",
    "AccessReview",
    "Body",
    "Identity",
    "KubeClient",
    "Listing",
    "PatchType",
    "Propagation",
    "ResourceInfo",
    "Timeout",
    "Watch",
    "WatchEvent",
    "client",
    "reset_client",
]

logger = logging.getLogger(__name__)

#: A Kubernetes object (or list, or Status) as JSON decodes it.
Body = dict[str, Any]
#: Seconds: one number for the whole call, or ``(connect, read)``.
Timeout = float | tuple[float, float]
Propagation = Literal["Background", "Foreground", "Orphan"]
#: How :meth:`KubeClient.patch` merges: JSON merge patch (RFC 7386, what ``kubectl cordon``
#: sends for ``spec.unschedulable``), strategic merge (built-in kinds only: lists merged by
#: their key, e.g. a container by name) or JSON patch (RFC 6902, a list of operations).
PatchType = Literal["merge", "strategic", "json"]

#: The field manager of every write: ``managedFields`` show what TauGrid owns.
FIELD_MANAGER: Final = "taugrid"
#: Connect within 5 s, then no more than 30 s of silence while reading: long enough for a
#: webhook-heavy create on a busy API server, short enough that a hung cluster does not hold a
#: worker. Per client (``KubeClient(timeout=…)``) and per call (``timeout=…``).
DEFAULT_TIMEOUT: Final[tuple[float, float]] = (5.0, 30.0)
APPLY_CONTENT_TYPE: Final = "application/apply-patch+yaml"
PATCH_CONTENT_TYPES: Final[dict[str, str]] = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
}
#: Items per page when listing (the API server's continue tokens do the rest).
LIST_PAGE_SIZE: Final = 500
#: A watch's read timeout is its server-side timeout plus this: the server ends a healthy
#: watch first, so only a dead connection reaches the client's limit.
WATCH_READ_MARGIN_SECONDS: Final = 15.0

# Names for the annotations of methods called `list`/`get` (a method named `list` hides the
# built-in inside the class body).
Bodies = list[Body]
Names = list[str]


@dataclass(frozen=True)
class ResourceInfo:
    """What discovery says about a kind: its URL name and whether it lives in a namespace."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool

    def path(self, name: str | None = None, namespace: str | None = None) -> str:
        prefix = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if namespace is not None:
            prefix = f"{prefix}/namespaces/{quote(namespace, safe='')}"
        path = f"{prefix}/{self.plural}"
        if name is not None:
            path = f"{path}/{quote(name, safe='')}"
        return path


@dataclass(frozen=True)
class AccessReview:
    """A ``SelfSubjectAccessReview``'s answer: ``allowed``, and the authorizer's ``reason``
    (often empty when denied by RBAC, which does not explain itself)."""

    allowed: bool
    reason: str


@dataclass(frozen=True)
class Identity:
    """A ``SelfSubjectReview``'s answer: the user name and groups requests are authorized as."""

    username: str
    groups: tuple[str, ...]


@dataclass(frozen=True)
class Listing:
    """A list's items (each with ``apiVersion`` and ``kind``) and the ``resourceVersion`` the
    list was read at: where a watch of the same objects starts."""

    items: list[Body]
    resource_version: str


@dataclass(frozen=True)
class WatchEvent:
    """One change a watch reports: ``type`` is ``ADDED``, ``MODIFIED``, ``DELETED`` or
    ``BOOKMARK`` (only ``object.metadata.resourceVersion`` is meaningful then)."""

    type: str
    object: Body

    @property
    def resource_version(self) -> str:
        return str((self.object.get("metadata") or {}).get("resourceVersion") or "")


class Watch:
    """A running watch: iterate over its :class:`WatchEvent` s until the server ends it
    (its ``timeout_seconds``) or :meth:`close` is called (from any thread). Errors while
    reading: :class:`~kube.errors.Gone` for an expired version, :class:`~kube.errors.
    Unavailable` for a lost connection, another :class:`~kube.errors.KubeError` for an
    ``ERROR`` event the server sent."""

    def __init__(
        self, response: Any, *, api_version: str, kind: str, describe: str, read_timeout: float
    ) -> None:
        self._response = response
        self._api_version = api_version
        self._kind = kind
        self._describe = describe
        self._read_timeout = read_timeout
        self._closed = threading.Event()
        self._finished = False  # the server ended the stream

    def close(self) -> None:
        """End the watch: a reader blocked in :meth:`__iter__` returns (without an error).

        A stream the server ended gives its connection back to the pool; one ended here is
        closed instead: the rest of it would still arrive on that connection, and the next
        request sent on it would read that instead of its answer."""
        if self._closed.is_set():
            return
        self._closed.set()
        try:
            if self._finished:
                self._response.release_conn()
                return
            shutdown: Callable[[], None] | None = getattr(self._response, "shutdown", None)
            if shutdown is not None:
                shutdown()  # urllib3 >= 2.3: unblocks a read in another thread
            self._response.close()
        except Exception:  # noqa: S110 - closing what may already be closed
            pass

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[WatchEvent]:
        buffer = b""
        try:
            for chunk in self._response.stream(amt=None, decode_content=True):
                if self._closed.is_set():
                    return
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield self._event(line)
            self._finished = not self._closed.is_set()
            if buffer.strip() and not self._closed.is_set():
                yield self._event(buffer)
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as error:
            if self._closed.is_set():
                return
            if isinstance(error, urllib3.exceptions.ReadTimeoutError):
                why = f"no event or bookmark within {self._read_timeout:g} s"
            else:
                why = f"connection lost ({type(error).__name__}: {error})"
            raise Unavailable(f"the watch of {self._describe} ended: {why}") from None
        finally:
            self.close()

    def _event(self, line: bytes) -> WatchEvent:
        try:
            decoded = json.loads(line)
        except ValueError:
            raise KubeError(
                f"the watch of {self._describe} sent something other than JSON"
            ) from None
        event_type = str(decoded.get("type") or "") if isinstance(decoded, dict) else ""
        obj = decoded.get("object") if isinstance(decoded, dict) else None
        if not event_type or not isinstance(obj, dict):
            raise KubeError(f"the watch of {self._describe} sent an event without type or object")
        if event_type == "ERROR":
            code = int(obj.get("code") or 0)
            raise error_from_response(code or 500, json.dumps(obj))
        obj.setdefault("apiVersion", self._api_version)
        obj.setdefault("kind", self._kind)
        return WatchEvent(type=event_type, object=obj)


class KubeClient:
    """The Kubernetes API for TauGrid: dicts in, dicts out, :class:`~kube.errors.KubeError`
    on failure, a timeout on every request. Thread-safe; share one (:func:`client`)."""

    def __init__(
        self,
        api: k8s_client.ApiClient,
        *,
        timeout: Timeout = DEFAULT_TIMEOUT,
        field_manager: str = FIELD_MANAGER,
    ) -> None:
        self.api = api
        self.timeout = timeout
        self.field_manager = field_manager
        self._resources: dict[str, dict[str, ResourceInfo]] = {}
        self._resources_lock = threading.Lock()

    def close(self) -> None:
        """Close the connection pool of this client's ``ApiClient`` (for clients made for one
        job, e.g. an impersonating one; the shared client lives as long as the process)."""
        close: Callable[[], None] = self.api.close
        close()

    def __repr__(self) -> str:
        # The address only: the configuration holds credentials.
        return f"KubeClient({safe_address(self.api.configuration.host)})"

    # -- reads ---------------------------------------------------------------------------------

    def get(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        *,
        timeout: Timeout | None = None,
    ) -> Body:
        """The object, or :class:`~kube.errors.NotFound`."""
        info = self.resource(api_version, kind, timeout=timeout)
        return self._call("GET", info.path(name, _scope(info, namespace)), timeout=timeout)

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout: Timeout | None = None,
    ) -> Bodies:
        """Every matching object (all pages), each with its ``apiVersion`` and ``kind`` (a
        list's items come without). A namespaced kind without ``namespace``: all namespaces."""
        return self.list_with_version(
            api_version,
            kind,
            namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            timeout=timeout,
        ).items

    def list_with_version(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout: Timeout | None = None,
    ) -> Listing:
        """Like :meth:`list`, with the ``resourceVersion`` the list was read at (what a
        :meth:`watch` of the same objects starts from). Pages are read at one version (the
        first page's), so the items are one consistent snapshot; :class:`~kube.errors.Gone`
        if that version expired between pages."""
        info = self.resource(api_version, kind, timeout=timeout)
        if namespace is not None and not info.namespaced:
            raise ValueError(f"{kind} ({api_version}) is cluster-scoped: no namespace")
        path = info.path(namespace=namespace)
        query: list[tuple[str, str | int]] = [("limit", LIST_PAGE_SIZE)]
        if label_selector:
            query.append(("labelSelector", label_selector))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        items: Bodies = []
        token = ""
        version = ""
        while True:
            page = self._call(
                "GET",
                path,
                query=[*query, ("continue", token)] if token else query,
                timeout=timeout,
            )
            for item in page.get("items") or []:
                items.append({"apiVersion": api_version, "kind": kind, **item})
            metadata = page.get("metadata") or {}
            version = version or str(metadata.get("resourceVersion") or "")
            token = str(metadata.get("continue") or "")
            if not token:
                return Listing(items=items, resource_version=version)

    def watch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        resource_version: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
        bookmarks: bool = True,
    ) -> Watch:
        """Watch ``kind`` (all namespaces without ``namespace``) from ``resource_version``
        for at most ``timeout_seconds`` (the server ends it then). Returns once the server
        has accepted the watch; iterate over the :class:`Watch` for its events.
        :class:`~kube.errors.Gone` when the version expired, whether now or in its first
        event."""
        info = self.resource(api_version, kind)
        if namespace is not None and not info.namespaced:
            raise ValueError(f"{kind} ({api_version}) is cluster-scoped: no namespace")
        query: list[tuple[str, str | int]] = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", int(timeout_seconds)),
        ]
        if bookmarks:
            query.append(("allowWatchBookmarks", "true"))
        if label_selector:
            query.append(("labelSelector", label_selector))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        path = info.path(namespace=namespace)
        request = self.api.param_serialize(
            "GET",
            path,
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        connect = self.timeout if isinstance(self.timeout, int | float) else self.timeout[0]
        read = float(timeout_seconds) + WATCH_READ_MARGIN_SECONDS
        limit = (float(connect), read)
        from kubernetes.client.exceptions import ApiException  # loaded with self.api

        try:
            response = self.api.call_api(*request, _request_timeout=limit)
        except urllib3.exceptions.HTTPError as error:
            raise self._unreachable(error, limit) from None
        except ApiException as error:
            if error.status:
                raise error_from_response(int(error.status), error.body) from None
            raise self._unreachable(error, limit) from None
        status = int(response.status)
        if not 200 <= status <= 299:
            read_body: Callable[[], bytes | None] = response.read
            raise error_from_response(status, read_body(), http_reason=str(response.reason or ""))
        where = f" in {namespace}" if namespace else ""
        return Watch(
            response.response,
            api_version=api_version,
            kind=kind,
            describe=f"{kind} ({api_version}){where}",
            read_timeout=read,
        )

    def get_path(
        self,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        timeout: Timeout | None = None,
    ) -> Body:
        """GET any API path, e.g. Kueue's visibility API (an aggregated API without kinds to
        discover)."""
        if not path.startswith("/"):
            raise ValueError(f"an absolute API path, not {path!r}")
        return self._call("GET", path, query=list((params or {}).items()), timeout=timeout)

    # -- writes --------------------------------------------------------------------------------

    def apply(
        self,
        body: Mapping[str, Any],
        *,
        force: bool = True,
        dry_run: bool = False,
        timeout: Timeout | None = None,
    ) -> Body:
        """Server-side apply ``body`` (created if missing) as field manager ``taugrid``; the
        stored object comes back. ``spec.suspend`` is stripped (see the module docstring)."""
        info, name, namespace = self._target(body, timeout)
        intended = without_suspend(body)
        query: list[tuple[str, str | int]] = [("fieldManager", self.field_manager)]
        if force:
            query.append(("force", "true"))
        if dry_run:
            query.append(("dryRun", "All"))
        logger.debug("apply %s %s/%s", info.kind, namespace or "-", name)
        return self._call(
            "PATCH",
            info.path(name, namespace),
            query=query,
            body=intended,
            content_type=APPLY_CONTENT_TYPE,
            timeout=timeout,
        )

    def create(
        self, body: Mapping[str, Any], *, dry_run: bool = False, timeout: Timeout | None = None
    ) -> Body:
        """Create ``body`` exactly as given, ``spec.suspend`` included; :class:`~kube.errors.
        Conflict` (``AlreadyExists``) if it exists. For what must be true from the first
        instant (a job created suspended); objects TauGrid keeps in step go through
        :meth:`apply`."""
        info, name, namespace = self._target(body, timeout)
        query: list[tuple[str, str | int]] = [("fieldManager", self.field_manager)]
        if dry_run:
            query.append(("dryRun", "All"))
        logger.debug("create %s %s/%s", info.kind, namespace or "-", name)
        return self._call(
            "POST", info.path(namespace=namespace), query=query, body=dict(body), timeout=timeout
        )

    def update(self, body: Mapping[str, Any], *, timeout: Timeout | None = None) -> Body:
        """Replace the object with ``body`` (a PUT). With ``metadata.resourceVersion`` it is
        a compare-and-swap: :class:`~kube.errors.Conflict` if the object changed since that
        version (how a Lease is renewed without overwriting another holder's renewal). The
        body is sent unchanged, ``spec.suspend`` included: for objects other than jobs."""
        info, name, namespace = self._target(body, timeout)
        logger.debug("update %s %s/%s", info.kind, namespace or "-", name)
        return self._call(
            "PUT",
            info.path(name, namespace),
            query=[("fieldManager", self.field_manager)],
            body=dict(body),
            timeout=timeout,
        )

    def patch(
        self,
        api_version: str,
        kind: str,
        name: str,
        body: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        namespace: str | None = None,
        patch_type: PatchType = "merge",
        subresource: str | None = None,
        timeout: Timeout | None = None,
    ) -> Body:
        """Change some fields of an existing object (:class:`~kube.errors.NotFound` if it is
        missing: a patch never creates); the stored object comes back.

        For one field another controller does not own, such as a Node's
        ``spec.unschedulable`` (``{"spec": {"unschedulable": True}}``), as ``kubectl cordon``
        does: a merge patch sets exactly the keys it names (``None`` removes one) and leaves
        the rest of the object alone, with no claim on fields as :meth:`apply` makes.
        ``subresource`` patches e.g. ``status`` (what a node's own agents write: conditions
        through ``nodes/status``). ``json`` takes a list of operations; the other types a
        mapping. The body goes as given: ``spec.suspend`` is not stripped, so this is not a
        way to resume a job behind Kueue's back (see the module docstring)."""
        if patch_type not in PATCH_CONTENT_TYPES:
            raise ValueError(f"patch_type must be merge, strategic or json, not {patch_type!r}")
        if patch_type == "json":
            if isinstance(body, Mapping | str | bytes) or not isinstance(body, Sequence):
                raise ValueError("a JSON patch is a list of operations ({'op', 'path', …})")
            sent: Any = [dict(operation) for operation in body]
        else:
            if not isinstance(body, Mapping):
                raise ValueError(f"a {patch_type} patch is a mapping of the fields to change")
            sent = dict(body)
        info = self.resource(api_version, kind, timeout=timeout)
        path = info.path(name, _scope(info, namespace))
        if subresource:
            path = f"{path}/{quote(subresource, safe='')}"
        logger.debug("patch (%s) %s %s/%s", patch_type, kind, namespace or "-", name)
        return self._call(
            "PATCH",
            path,
            query=[("fieldManager", self.field_manager)],
            body=sent,
            content_type=PATCH_CONTENT_TYPES[patch_type],
            timeout=timeout,
        )

    def delete(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        *,
        propagation: Propagation = "Background",
        missing_ok: bool = False,
        timeout: Timeout | None = None,
    ) -> bool:
        """Ask for the object's deletion; True when asked, False when it was already gone
        (``missing_ok``; otherwise :class:`~kube.errors.NotFound`).

        ``Background`` (the default) returns at once and the garbage collector removes
        dependents after; ``Foreground`` keeps the object (with a ``deletionTimestamp``)
        until its dependents are gone; ``Orphan`` leaves them. Deletion itself is
        asynchronous whenever finalizers are set: the object may still be readable after.
        """
        info = self.resource(api_version, kind, timeout=timeout)
        path = info.path(name, _scope(info, namespace))
        logger.debug("delete %s %s/%s (%s)", kind, namespace or "-", name, propagation)
        try:
            self._call("DELETE", path, query=[("propagationPolicy", propagation)], timeout=timeout)
        except NotFound:
            if missing_ok:
                return False
            raise
        return True

    # -- questions for cluster_check ----------------------------------------------------------

    def can_i(
        self,
        verb: str,
        resource: str,
        *,
        group: str = "",
        namespace: str | None = None,
        subresource: str | None = None,
        name: str | None = None,
        timeout: Timeout | None = None,
    ) -> AccessReview:
        """May this client's identity do ``verb`` on ``group``/``resource`` (plural, e.g.
        ``clusterqueues`` in ``kueue.x-k8s.io``) in ``namespace`` (None: cluster-wide or
        every namespace)? A ``SelfSubjectAccessReview``, which every authenticated identity
        may create."""
        attributes: dict[str, str] = {"verb": verb, "group": group, "resource": resource}
        if namespace is not None:
            attributes["namespace"] = namespace
        if subresource is not None:
            attributes["subresource"] = subresource
        if name is not None:
            attributes["name"] = name
        review = self._call(
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            body={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attributes},
            },
            timeout=timeout,
        )
        status = review.get("status") or {}
        reason = str(status.get("reason") or status.get("evaluationError") or "")
        return AccessReview(allowed=bool(status.get("allowed")), reason=reason)

    def whoami(self, *, timeout: Timeout | None = None) -> Identity:
        """Who the API server takes this client for (a ``SelfSubjectReview``; an
        impersonating client gets the impersonated user and its groups)."""
        review = self._call(
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
            timeout=timeout,
        )
        user = (review.get("status") or {}).get("userInfo") or {}
        return Identity(
            username=str(user.get("username") or ""),
            groups=tuple(str(group) for group in user.get("groups") or ()),
        )

    def served_versions(self, crd_name: str, *, timeout: Timeout | None = None) -> Names:
        """The versions a CustomResourceDefinition (``<plural>.<group>``, e.g.
        ``clusterqueues.kueue.x-k8s.io``) serves, in its own order;
        :class:`~kube.errors.NotFound` when it is not installed."""
        crd = self.get(
            "apiextensions.k8s.io/v1", "CustomResourceDefinition", crd_name, timeout=timeout
        )
        versions = (crd.get("spec") or {}).get("versions") or []
        return [str(v["name"]) for v in versions if isinstance(v, dict) and v.get("served")]

    # -- discovery -----------------------------------------------------------------------------

    def resource(
        self, api_version: str, kind: str, *, timeout: Timeout | None = None
    ) -> ResourceInfo:
        """The plural and scope of ``kind`` in ``api_version`` (e.g. ``batch/v1``,
        ``kueue.x-k8s.io/v1beta2``), from discovery; :class:`~kube.errors.UnknownKind` if the
        cluster does not serve it."""
        with self._resources_lock:
            known = self._resources.get(api_version, {}).get(kind)
        if known is not None:
            return known
        kinds = self._discover(api_version, timeout)
        with self._resources_lock:
            self._resources[api_version] = kinds
        if kind not in kinds:
            raise UnknownKind(
                f"the cluster serves {api_version} but no kind {kind} in it",
                status=404,
                reason="NotFound",
            )
        return kinds[kind]

    def _discover(self, api_version: str, timeout: Timeout | None) -> dict[str, ResourceInfo]:
        path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        try:
            listed = self._call("GET", path, timeout=timeout)
        except NotFound:
            raise UnknownKind(
                f"the cluster does not serve {api_version} (is its CRD installed, "
                "in this version?)",
                status=404,
                reason="NotFound",
            ) from None
        kinds: dict[str, ResourceInfo] = {}
        for entry in listed.get("resources") or []:
            plural = str(entry.get("name", ""))
            if not plural or "/" in plural:  # subresources: jobs/status
                continue
            kinds[str(entry["kind"])] = ResourceInfo(
                api_version=api_version,
                kind=str(entry["kind"]),
                plural=plural,
                namespaced=bool(entry.get("namespaced")),
            )
        return kinds

    def _target(
        self, body: Mapping[str, Any], timeout: Timeout | None
    ) -> tuple[ResourceInfo, str, str | None]:
        api_version, kind = body.get("apiVersion"), body.get("kind")
        metadata = body.get("metadata") or {}
        name = metadata.get("name")
        if not (isinstance(api_version, str) and isinstance(kind, str) and isinstance(name, str)):
            raise ValueError("a body needs apiVersion, kind and metadata.name")
        info = self.resource(api_version, kind, timeout=timeout)
        return info, name, _scope(info, metadata.get("namespace"))

    # -- transport -----------------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: Iterable[tuple[str, str | int]] = (),
        body: Any = None,
        content_type: str | None = None,
        timeout: Timeout | None = None,
    ) -> Body:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        request = self.api.param_serialize(
            method,
            path,
            query_params=list(query),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        limit = timeout if timeout is not None else self.timeout
        from kubernetes.client.exceptions import ApiException  # loaded with self.api

        try:
            response = self.api.call_api(*request, _request_timeout=limit)
            read: Callable[[], bytes | None] = response.read
            data = read()
        except urllib3.exceptions.HTTPError as error:
            raise self._unreachable(error, limit) from None
        except ApiException as error:
            # The generated client turns TLS failures into a status-0 ApiException.
            if error.status:
                raise error_from_response(int(error.status), error.body) from None
            raise self._unreachable(error, limit) from None
        status = int(response.status)
        if not 200 <= status <= 299:
            raise error_from_response(status, data, http_reason=str(response.reason or ""))
        if not data:
            return {}
        try:
            decoded = json.loads(data)
        except ValueError:
            decoded = None
        if not isinstance(decoded, dict):
            raise KubeError(
                f"{method} {path} answered something other than a JSON object", status=status
            )
        return decoded

    def _unreachable(self, error: Exception, limit: Timeout) -> Unavailable:
        where = safe_address(str(self.api.configuration.host))
        return Unavailable(f"cannot reach the Kubernetes API at {where}: {_why(error, limit)}")


def _why(error: Exception, limit: Timeout) -> str:
    """A short, credential-free cause of a connection failure."""
    if isinstance(error, urllib3.exceptions.MaxRetryError) and error.reason is not None:
        error = error.reason
    connect, read = (limit, limit) if isinstance(limit, int | float) else limit
    # Before ConnectTimeoutError: urllib3 makes NewConnectionError (refused, no route, no
    # such host) a subclass of it.
    if isinstance(error, urllib3.exceptions.NewConnectionError):
        return str(error).rpartition(": ")[2] or "connection failed"
    if isinstance(error, urllib3.exceptions.ConnectTimeoutError):
        return f"no connection within {connect:g} s"
    if isinstance(error, urllib3.exceptions.ReadTimeoutError):
        return f"no answer within {read:g} s"
    if isinstance(error, urllib3.exceptions.SSLError):
        return f"TLS failed ({error})"
    if isinstance(error, urllib3.exceptions.ProtocolError):
        return f"connection lost ({error})"
    from kubernetes.client.exceptions import ApiException  # loaded with the client

    if isinstance(error, ApiException):
        return " ".join(str(error.reason or "").split()) or "no answer"
    return str(error) or type(error).__name__


def _scope(info: ResourceInfo, namespace: str | None) -> str | None:
    if info.namespaced and not namespace:
        raise ValueError(f"{info.kind} ({info.api_version}) is namespaced: give a namespace")
    if not info.namespaced and namespace:
        raise ValueError(f"{info.kind} ({info.api_version}) is cluster-scoped: no namespace")
    return namespace if info.namespaced else None


def without_suspend(body: Mapping[str, Any]) -> Body:
    """``body`` without ``spec.suspend`` (a copy; the caller's dict is not changed)."""
    intended = dict(body)
    spec = intended.get("spec")
    if isinstance(spec, Mapping) and "suspend" in spec:
        intended["spec"] = {key: value for key, value in spec.items() if key != "suspend"}
    return intended


_client_lock = threading.Lock()
_client: KubeClient | None = None


def client() -> KubeClient:
    """The process's shared :class:`KubeClient` over the shared ``ApiClient``
    (``TAU_KUBECONFIG`` or in-cluster; :class:`~kube.errors.KubeConfigError` otherwise)."""
    global _client
    with _client_lock:
        if _client is None:
            _client = KubeClient(api_client())
        return _client


def reset_client() -> None:
    """Forget the shared client and close its connections (tests; a changed environment)."""
    global _client
    with _client_lock:
        _client = None
    reset_api_client()
