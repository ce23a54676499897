"""What can go wrong talking to Kubernetes, as a few exception types callers can act on.

Every failure of a call through :mod:`kube` is a :class:`KubeError` with ``status`` (the HTTP
status, 0 when no answer came), ``reason`` (Kubernetes' machine-readable reason, e.g.
``AlreadyExists``) and ``message`` (Kubernetes' own sentence, meant for a person: it is what
the admin and a failed delivery show). The subclasses are what callers decide on:

- :class:`NotFound` (404) — the object is not there;
- :class:`Conflict` (409) — it already exists, its ``resourceVersion`` moved on, or a
  server-side apply collided with another field manager;
- :class:`Forbidden` (403; :class:`Unauthorized` for 401) — RBAC says no;
- :class:`Invalid` (422, 400, and the 500 a server-side apply gets for a body the API server
  cannot type) — the API server refused the object's content;
  :class:`RefusedByWebhook` is an :class:`Invalid` refused by an admission webhook (Kueue's,
  KubeRay's), whatever status the webhook chose (controller-runtime answers 403), with the
  webhook's name and its own message;
- :class:`Unavailable` — no answer (refused, reset, timed out), 429 or 5xx, including a
  webhook that could not be called: worth retrying later;
- :class:`Gone` (410) — a watch or list asked for a ``resourceVersion`` the API server no
  longer keeps (``Expired``): list again and watch from the new version;
- :class:`UnknownKind` — the cluster does not serve that apiVersion/kind (Kueue or KubeRay
  missing, or the wrong version);
- :class:`KubeConfigError` — TauGrid has no usable configuration to reach a cluster.

A denial by a webhook is checked before the status code because an admission webhook's
"no" is about the object, not about who asked: treating Kueue's 403 as a permission problem
would send a platform engineer to RBAC for a quota typo.

Messages never carry credentials: they are built from the response body (which the API
server writes for the caller, without its token) or from the connection error's cause, and
an address's ``user:password@`` part is dropped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "Cause",
    "Conflict",
    "Forbidden",
    "Gone",
    "Invalid",
    "KubeConfigError",
    "KubeError",
    "NotFound",
    "RefusedByWebhook",
    "Unauthorized",
    "Unavailable",
    "UnknownKind",
    "error_from_response",
    "safe_address",
]

# apiserver: webhookerrors.ToStatusErr writes `admission webhook "<name>" denied the request: …`
# (or `… denied the request without explanation`).
WEBHOOK_DENIAL = re.compile(r'admission webhook "(?P<name>[^"]+)" denied the request(?::\s*)?')
# A server-side apply body the API server cannot even type (e.g. two entries with the same key
# in a list-map, like a flavor listed twice in a ClusterQueue) comes back as a 500 with this
# message: the body is at fault, and retrying it cannot help.
TYPED_PATCH_FAILURE = "failed to create typed patch object"
# The most of a non-Status body (a proxy's HTML page) worth putting in a message.
BODY_EXCERPT_CHARS = 300


@dataclass(frozen=True)
class Cause:
    """One of ``Status.details.causes``: which field, what is wrong with it."""

    field: str
    message: str
    reason: str


class KubeError(Exception):
    """A call to the Kubernetes API failed; ``message`` says why in Kubernetes' words."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 0,
        reason: str = "",
        causes: tuple[Cause, ...] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason
        self.causes = causes

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status={self.status}, reason={self.reason!r}, "
            f"message={self.message!r})"
        )


class NotFound(KubeError):
    """404: the object (or its namespace) does not exist."""


class Conflict(KubeError):
    """409: already exists, stale ``resourceVersion``, or a field-manager conflict."""


class Forbidden(KubeError):
    """403: the identity TauGrid uses may not do this (RBAC)."""


class Unauthorized(Forbidden):
    """401: the cluster did not accept the credentials at all (expired or wrong token)."""


class Invalid(KubeError):
    """422 or 400: the API server (schema, CEL rules) refused the object's content; also an
    apply body it cannot type (a duplicate key in a list-map), which it answers with 500."""


class RefusedByWebhook(Invalid):
    """An admission webhook refused the request. ``webhook`` is its name (e.g.
    ``vclusterqueue.kb.io``), ``webhook_message`` what it said, without the API server's
    prefix; ``message`` keeps the whole sentence."""

    def __init__(
        self,
        message: str,
        *,
        webhook: str,
        webhook_message: str,
        status: int = 0,
        reason: str = "",
        causes: tuple[Cause, ...] = (),
    ) -> None:
        super().__init__(message, status=status, reason=reason, causes=causes)
        self.webhook = webhook
        self.webhook_message = webhook_message


class Gone(KubeError):
    """410: the ``resourceVersion`` a watch (or a paged list) started from is older than what
    the API server keeps (reason ``Expired``, or ``Gone``). Not a failure of the cluster: list
    again, then watch from the list's version."""


class Unavailable(KubeError):
    """No usable answer: connection refused or reset, timeout, TLS failure, 429, 5xx, or a
    webhook the API server could not call. Transient as far as TauGrid can tell: retry."""


class UnknownKind(KubeError):
    """The cluster does not serve this apiVersion/kind (its CRD is not installed, or not in
    that version). Not a :class:`NotFound`: deleting "nothing" of an unknown kind must not
    look like success."""


class KubeConfigError(KubeError):
    """No configuration to reach a cluster: ``TAU_KUBECONFIG`` unset outside a pod, or a file
    that is missing or unusable."""


def safe_address(url: str) -> str:
    """``url`` without any ``user:password@`` part, for messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(unparseable address)"
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def _status_body(body: bytes | str | None) -> dict[str, Any] | None:
    """The body as a ``Status`` object, when it is one."""
    if not body:
        return None
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if isinstance(parsed, dict) and parsed.get("kind") == "Status":
        return parsed
    return None


def _causes(status_body: dict[str, Any]) -> tuple[Cause, ...]:
    details = status_body.get("details")
    if not isinstance(details, dict):
        return ()
    found = []
    for cause in details.get("causes") or []:
        if isinstance(cause, dict):
            found.append(
                Cause(
                    field=str(cause.get("field", "")),
                    message=str(cause.get("message", "")),
                    reason=str(cause.get("reason", "")),
                )
            )
    return tuple(found)


def error_from_response(
    status: int, body: bytes | str | None, *, http_reason: str = ""
) -> KubeError:
    """The :class:`KubeError` for an HTTP error answer of the API server.

    ``body`` is normally a ``Status`` (``{"kind": "Status", "message", "reason", "details",
    "code"}``); anything else (a proxy's page) gives a message from the status line and the
    start of the body.
    """
    parsed = _status_body(body)
    if parsed is not None:
        message = str(parsed.get("message") or "").strip()
        reason = str(parsed.get("reason") or "")
        causes = _causes(parsed)
    else:
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body or ""
        text = " ".join(text.split())[:BODY_EXCERPT_CHARS]
        message = text
        reason = ""
        causes = ()
    if not message:
        message = f"the Kubernetes API answered {status} {http_reason or reason}".strip()
    if not reason:
        reason = http_reason

    denial = WEBHOOK_DENIAL.search(message)
    if denial is not None and 400 <= status < 500:
        said = message[denial.end() :].strip() or "(without explanation)"
        return RefusedByWebhook(
            message,
            webhook=denial.group("name"),
            webhook_message=said,
            status=status,
            reason=reason,
            causes=causes,
        )

    kind: type[KubeError]
    if status == 500 and message.startswith(TYPED_PATCH_FAILURE):
        kind = Invalid
    elif status == 404:
        kind = NotFound
    elif status == 409:
        kind = Conflict
    elif status == 403:
        kind = Forbidden
    elif status == 401:
        kind = Unauthorized
    elif status == 410:
        kind = Gone
    elif status in (400, 422):
        kind = Invalid
    elif status == 429 or status >= 500 or status == 0:
        kind = Unavailable
    else:
        kind = KubeError
    return kind(message, status=status, reason=reason, causes=causes)
