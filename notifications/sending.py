"""Sending one notification: a signed webhook POST, or an e-mail. No database here; the
outbox (``notifications.delivery``) decides what to send and records how it went.

Webhook POSTs are short and contained: a timeout of ``TAU_WEBHOOK_TIMEOUT_SECONDS`` for
connecting and for each read, no redirects followed (a 3xx is a failure that names where it
pointed), at most ``RESPONSE_BYTES`` of the answer read, and the connection made to an
address checked at that moment (``notifications.addresses``).

The signature lets a receiver check that TauGrid sent the body and when:
``X-TauGrid-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<raw body>" with the
secret>``, with ``X-TauGrid-Timestamp: <unix seconds>``; a receiver refuses timestamps
older than a few minutes to refuse replays.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import ssl
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage, get_connection

from notifications import addresses
from notifications.models import PayloadFormat

#: How much of an endpoint's answer is read (for the log); the rest is never read.
RESPONSE_BYTES = 4096
USER_AGENT = "TauGrid-Webhook/1"


class SendFailed(Exception):
    """Sending did not work; the message says how, for the delivery log (no secrets)."""

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class NotWanted(Exception):
    """Nothing to send any more (the person unsubscribed meanwhile); the message says why."""


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>``: HMAC-SHA256 with ``secret`` over ``timestamp + "." + body``."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return f"sha256={digest.hexdigest()}"


def webhook_body(payload: dict[str, Any], *, fmt: str, delivery_id: int, count: int) -> bytes:
    """The bytes POSTed: TauGrid's JSON, or a Slack-compatible message (``text`` and one
    ``blocks`` section, which Slack, Mattermost and Rocket.Chat incoming webhooks accept)."""
    if fmt == PayloadFormat.SLACK:
        return json.dumps(slack_message(payload, count=count), sort_keys=True).encode()
    body = {"id": delivery_id, "count": count, **payload}
    return json.dumps(body, sort_keys=True).encode()


def slack_message(payload: dict[str, Any], *, count: int) -> dict[str, Any]:
    title = str(payload.get("title", payload.get("event", "")))
    link = str(payload.get("url") or "")
    lines = [f"*{title}*" if not link else f"*<{link}|{title}>*"]
    lines += [f"{label}: {value}" for label, value in detail_lines(payload)]
    if count > 1:
        lines.append(f"(happened {count} times)")
    text = f"{title} {link}".strip()
    return {
        "text": text,
        "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)}}],
    }


def detail_lines(payload: dict[str, Any]) -> list[tuple[str, str]]:
    """What an e-mail or a chat message says beside the title, as (label, value)."""
    data = payload.get("data") or {}
    run = payload.get("run") or {}
    lines: list[tuple[str, str]] = [("Workspace", str(payload.get("workspace", "")))]
    if run:
        lines.append(("Run", str(run.get("name", ""))))
        if run.get("submitted_by"):
            lines.append(("Submitted by", str(run["submitted_by"])))
    for label, name in (
        ("Failure", "failure_class_label"),
        ("Why", "reason"),
        ("Hint", "hint"),
        ("Cancelled by", "cancelled_by"),
        ("Waiting for", "waiting_minutes"),
        ("Month", "month"),
        ("Threshold", "threshold_percent"),
        ("Flavor", "flavor"),
        ("GPU-hours used", "used_gpu_hours"),
        ("GPU-hour budget", "budget_gpu_hours"),
    ):
        value = data.get(name)
        if value in (None, ""):
            continue
        if name == "waiting_minutes":
            value = f"{value} minutes"
        elif name == "threshold_percent":
            value = f"{value}%"
        lines.append((label, str(value)))
    return lines


def _timeout() -> float:
    return float(getattr(settings, "TAU_WEBHOOK_TIMEOUT_SECONDS", 5))


class _CheckedHTTPConnection(http.client.HTTPConnection):
    """http.client's connection, connected to a checked address of its host."""

    def connect(self) -> None:
        self.sock = addresses.connect(self.host, self.port, self.timeout or _timeout())


class _CheckedHTTPSConnection(http.client.HTTPSConnection):
    """The same over TLS: the certificate is checked against the host's name."""

    def connect(self) -> None:
        sock = addresses.connect(self.host, self.port, self.timeout or _timeout())
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


def post_webhook(*, url: str, secret: str, body: bytes, now: float | None = None) -> int:
    """POST ``body`` to ``url``, signed. The status code if it is 2xx; ``SendFailed``
    otherwise (with the endpoint's own words, bounded)."""
    try:
        parts = addresses.split_url(url)
    except addresses.RefusedAddress as exc:
        raise SendFailed(str(exc)) from None
    host = parts.hostname
    assert host is not None
    port = addresses.default_port(parts)
    timeout = _timeout()
    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        connection = _CheckedHTTPSConnection(
            host, port, timeout=timeout, context=ssl.create_default_context()
        )
    else:
        connection = _CheckedHTTPConnection(host, port, timeout=timeout)
    timestamp = str(int(now if now is not None else time.time()))
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "X-TauGrid-Timestamp": timestamp,
        "X-TauGrid-Signature": signature(secret, timestamp, body),
    }
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        answer = response.read(RESPONSE_BYTES)
        status = int(response.status)
    except addresses.RefusedAddress as exc:
        raise SendFailed(str(exc)) from None
    except (OSError, http.client.HTTPException) as exc:
        raise SendFailed(f"{type(exc).__name__}: {exc}") from None
    finally:
        connection.close()
    if 200 <= status < 300:
        return status
    words = answer.decode("utf-8", errors="replace").strip()[:500]
    if 300 <= status < 400:
        location = response.getheader("Location") or "nowhere"
        raise SendFailed(
            f"HTTP {status}: redirects are not followed (it pointed to {location[:300]}); "
            "give the webhook its final URL.",
            status_code=status,
        )
    raise SendFailed(f"HTTP {status}: {words}" if words else f"HTTP {status}", status_code=status)


@dataclass(frozen=True)
class Email:
    to: str
    subject: str
    body: str
    unsubscribe_url: str


def send_email(email: Email) -> None:
    """Send one e-mail through Django's e-mail backend (SMTP: ``TAU_EMAIL_*``), with the
    one-click unsubscribe headers of RFC 8058."""
    message = EmailMessage(
        subject=email.subject,
        body=email.body,
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[email.to],
        headers={
            "List-Unsubscribe": f"<{email.unsubscribe_url}>",
            "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
            "Auto-Submitted": "auto-generated",
        },
        connection=get_connection(timeout=getattr(settings, "EMAIL_TIMEOUT", None) or 10),
    )
    try:
        message.send()
    except Exception as exc:
        raise SendFailed(f"{type(exc).__name__}: {exc}") from None
