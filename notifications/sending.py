"""Sending one notification: a signed webhook POST, or an e-mail. No database here; the
outbox (``notifications.delivery``) decides what to send and records how it went.

Webhook POSTs are short and contained: one deadline of ``TAU_WEBHOOK_TIMEOUT_SECONDS`` for
the whole delivery (resolving the name, connecting, TLS, sending, and reading the whole
answer), no redirects followed (a 3xx is a failure that names where it pointed), at most
``RESPONSE_BYTES`` of the answer read, and the connection made to an address checked at that
moment (``portal.addresses``). The deadline is a ``time.monotonic()`` instant: before
every send and every read the socket's timeout is set to what is left of it, so a receiver
that trickles a byte every few seconds is cut off at the deadline, like one that never
answers (a timeout per read alone would let it hold a worker for as long as it trickles).

What an endpoint answered goes to the delivery log as a short text: an HTML error page
becomes its ``<title>`` (or its text, without tags), anything else its first words, with
control characters removed, at most ``ANSWER_SUMMARY_CHARACTERS``.

The signature lets a receiver check that TauGrid sent the body and when:
``X-TauGrid-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<raw body>" with the
secret>``, with ``X-TauGrid-Timestamp: <unix seconds>``; a receiver refuses timestamps
older than a few minutes to refuse replays.

Slack-format messages are Slack's ``mrkdwn``, where ``<!channel>`` pings everyone and
``<https://…|words>`` is a link showing other words: every value that comes from people or
from a run (names, reasons, a run's last line of output) is escaped as Slack asks
(``&`` ``<`` ``>`` as ``&amp;`` ``&lt;`` ``&gt;``), so it shows as the text it is.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import io
import json
import socket
import ssl
import time
import unicodedata
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage, get_connection

from notifications.models import PayloadFormat
from portal import addresses

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


#: The most characters of one value in a chat message, and of a Slack section's text (Slack
#: refuses a section of more than 3000).
SLACK_VALUE_LIMIT = 500
SLACK_SECTION_LIMIT = 3000


def slack_escaped(text: str) -> str:
    """``text`` as Slack's mrkdwn shows it literally: ``&``, ``<`` and ``>`` escaped, so that
    ``<!channel>`` is no ping and ``<https://…|words>`` no disguised link."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _slack_value(value: object) -> str:
    text = str(value)
    if len(text) > SLACK_VALUE_LIMIT:
        text = text[: SLACK_VALUE_LIMIT - 1] + "…"
    return slack_escaped(text)


def _slack_link_target(url: str) -> str:
    """A URL inside ``<…|…>``: escaped, and no ``|`` that would end it early."""
    return slack_escaped(url.replace("|", "%7C"))


def _cut(text: str, limit: int) -> str:
    """``text`` at most ``limit`` characters, not cutting an ``&…;`` escape in two."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    ampersand = cut.rfind("&", max(0, len(cut) - 5))
    if ampersand != -1 and ";" not in cut[ampersand:]:
        cut = cut[:ampersand]
    return cut + "…"


def slack_message(payload: dict[str, Any], *, count: int) -> dict[str, Any]:
    title = _slack_value(payload.get("title", payload.get("event", "")))
    link = str(payload.get("url") or "")
    lines = [f"*{title}*" if not link else f"*<{_slack_link_target(link)}|{title}>*"]
    lines += [
        f"{slack_escaped(label)}: {_slack_value(value)}" for label, value in detail_lines(payload)
    ]
    if count > 1:
        lines.append(f"(happened {count} times)")
    text = f"{title} {slack_escaped(link)}".strip()
    return {
        "text": text,
        "blocks": [
            {
                "type": "section",
                "text": {
                    "type": "mrkdwn",
                    "text": _cut("\n".join(lines), SLACK_SECTION_LIMIT),
                },
            }
        ],
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


# -- what an endpoint answered, for the log ------------------------------------------------------

#: The most characters of an endpoint's answer kept in the delivery log.
ANSWER_SUMMARY_CHARACTERS = 200


class _PageText(HTMLParser):
    """An HTML page's ``<title>`` and its visible text (no scripts, no styles)."""

    _HIDDEN = frozenset({"script", "style", "head", "template", "noscript"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.title: list[str] = []
        self.text: list[str] = []
        self._open: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._HIDDEN or tag == "title":
            self._open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in self._open:
            del self._open[len(self._open) - 1 - self._open[::-1].index(tag) :]

    def handle_data(self, data: str) -> None:
        if "title" in self._open:
            self.title.append(data)
        elif not any(tag in self._HIDDEN for tag in self._open):
            self.text.append(data)


def _plain(text: str) -> str:
    """One line of printable text: no control or format characters (bidi overrides
    included), whitespace runs as one space."""
    kept = "".join(
        " " if character.isspace() else character
        for character in text
        if character.isspace() or unicodedata.category(character) not in {"Cc", "Cf"}
    )
    return " ".join(kept.split())


def answer_summary(body: bytes, content_type: str | None) -> str:
    """What an endpoint's answer says, short: an HTML page's title (or its text without
    tags), anything else its first words; at most ``ANSWER_SUMMARY_CHARACTERS``."""
    text = body.decode("utf-8", errors="replace")
    looks_html = "html" in (content_type or "").lower() or text.lstrip()[:1] == "<"
    if looks_html:
        page = _PageText()  # it reads broken HTML too, as browsers do
        page.feed(text)
        page.close()
        text = _plain("".join(page.title)) or _plain(" ".join(page.text))
    else:
        text = _plain(text)
    if len(text) > ANSWER_SUMMARY_CHARACTERS:
        text = text[: ANSWER_SUMMARY_CHARACTERS - 1] + "…"
    return text


# -- posting ------------------------------------------------------------------------------------


def _timeout() -> float:
    return float(getattr(settings, "TAU_WEBHOOK_TIMEOUT_SECONDS", 10))


class _DeadlineSocket:
    """A connected socket (plain or TLS) whose every send and receive may take only what is
    left until ``deadline``: the socket's timeout shrinks to it before each call, and once it
    has passed, no call is made at all. http.client reads and writes through it (the methods
    it and ``socket.SocketIO`` use)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline
        # As ``socket.socket`` does: http.client closes the connection of an answer that
        # ends with it while its reader still reads the body, so the socket is closed only
        # when both are.
        self._readers = 0
        self._closed = False

    def _time_left(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no complete answer within {_timeout():.0f}s")
        self._sock.settimeout(left)

    def sendall(self, data: bytes) -> None:
        view = memoryview(data).cast("B")
        while view:
            self._time_left()
            sent = self._sock.send(view)
            view = view[sent:]

    def recv_into(self, buffer: Any, nbytes: int = 0) -> int:
        self._time_left()
        return self._sock.recv_into(buffer, nbytes)

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        if mode != "rb":
            raise ValueError("a webhook connection is only read from as bytes")
        self._readers += 1
        return io.BufferedReader(socket.SocketIO(self, "rb"))  # type: ignore[arg-type]

    def _decref_socketios(self) -> None:
        """Called by ``socket.SocketIO`` when its reader is closed."""
        self._readers -= 1
        if self._closed and self._readers <= 0:
            self._sock.close()

    def fileno(self) -> int:
        return self._sock.fileno()

    def close(self) -> None:
        self._closed = True
        if self._readers <= 0:
            self._sock.close()


class _CheckedHTTPConnection(http.client.HTTPConnection):
    """http.client's connection, connected to a checked address of its host, every step
    within the delivery's deadline."""

    deadline: float

    def connect(self) -> None:
        sock = addresses.connect(self.host, self.port, deadline=self.deadline)
        self.sock = _DeadlineSocket(sock, self.deadline)


class _CheckedHTTPSConnection(http.client.HTTPSConnection):
    """The same over TLS: the certificate is checked against the host's name, and the
    handshake has what is left of the deadline (CPython bounds a whole handshake by the
    socket's timeout)."""

    deadline: float

    def connect(self) -> None:
        sock = addresses.connect(self.host, self.port, deadline=self.deadline)
        left = self.deadline - time.monotonic()
        if left <= 0:
            sock.close()
            raise TimeoutError(f"no complete answer within {_timeout():.0f}s")
        sock.settimeout(left)
        tls = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]
        self.sock = _DeadlineSocket(tls, self.deadline)


def post_webhook(*, url: str, secret: str, body: bytes, now: float | None = None) -> int:
    """POST ``body`` to ``url``, signed, all of it within ``TAU_WEBHOOK_TIMEOUT_SECONDS``.
    The status code if it is 2xx; ``SendFailed`` otherwise (with the endpoint's own words,
    short)."""
    try:
        parts = addresses.split_url(url)
    except addresses.RefusedAddress as exc:
        raise SendFailed(str(exc)) from None
    host = parts.hostname
    assert host is not None
    port = addresses.default_port(parts)
    timeout = _timeout()
    deadline = time.monotonic() + timeout
    connection: _CheckedHTTPConnection | _CheckedHTTPSConnection
    if parts.scheme == "https":
        connection = _CheckedHTTPSConnection(
            host, port, timeout=timeout, context=ssl.create_default_context()
        )
    else:
        connection = _CheckedHTTPConnection(host, port, timeout=timeout)
    connection.deadline = deadline
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
    response: http.client.HTTPResponse | None = None
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        answer = response.read(RESPONSE_BYTES)
        status = int(response.status)
    except addresses.RefusedAddress as exc:
        raise SendFailed(str(exc)) from None
    except TimeoutError:
        raise SendFailed(
            f"timed out: no complete answer within {timeout:.0f}s (TAU_WEBHOOK_TIMEOUT_SECONDS, "
            "for resolving, connecting, sending and the whole answer together)"
        ) from None
    except (OSError, http.client.HTTPException) as exc:
        raise SendFailed(f"{type(exc).__name__}: {exc}") from None
    finally:
        if response is not None:
            response.close()
        connection.close()
    if 200 <= status < 300:
        return status
    status_line = f"HTTP {status} {_plain(str(response.reason or ''))[:60]}".strip()
    if 300 <= status < 400:
        location = _plain(response.getheader("Location") or "nowhere")
        raise SendFailed(
            f"{status_line}: redirects are not followed (it pointed to {location[:300]}); "
            "give the webhook its final URL.",
            status_code=status,
        )
    words = answer_summary(answer, response.getheader("Content-Type"))
    if words and words not in status_line:
        raise SendFailed(f"{status_line}: {words}", status_code=status)
    raise SendFailed(status_line, status_code=status)


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
