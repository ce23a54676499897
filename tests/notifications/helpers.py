"""Real receivers for notification tests: an HTTP endpoint (the standard library's server,
in a thread, on 127.0.0.1) that checks every delivery's signature the way a receiver in the
wild should, and an SMTP server (aiosmtpd) that keeps what it is sent."""

from __future__ import annotations

import email
import email.policy
import hashlib
import hmac
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from runs.models import Run, RunState
from runs.state import transition
from tests.runs.processes import free_port

SECRET = "a-receiver-secret-0123456789"
#: How old a timestamp the receiver accepts, as a receiver refusing replays would.
TOLERANCE_SECONDS = 300


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    signature_ok: bool
    timestamp_ok: bool

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Endpoint:
    """An HTTP server answering each POST with ``statuses`` in turn (then the last one)."""

    secret: str = SECRET
    statuses: list[int] = field(default_factory=lambda: [200])
    answer: bytes = b"ok"
    headers: dict[str, str] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/taugrid"

    def verify(self, headers: dict[str, str], body: bytes) -> tuple[bool, bool]:
        timestamp = headers.get("X-TauGrid-Timestamp", "")
        expected = hmac.new(
            self.secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256
        ).hexdigest()
        signature_ok = hmac.compare_digest(
            headers.get("X-TauGrid-Signature", ""), f"sha256={expected}"
        )
        timestamp_ok = timestamp.isdigit() and abs(time.time() - int(timestamp)) < TOLERANCE_SECONDS
        return signature_ok, timestamp_ok


def _handler(endpoint: Endpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            headers = dict(self.headers.items())
            signature_ok, timestamp_ok = endpoint.verify(headers, body)
            endpoint.received.append(Received(self.path, headers, body, signature_ok, timestamp_ok))
            index = min(len(endpoint.received), len(endpoint.statuses)) - 1
            status = endpoint.statuses[index]
            if not (signature_ok and timestamp_ok) and status < 300:
                status = 401  # what a careful receiver answers to a forged delivery
            self.send_response(status)
            for name, value in endpoint.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(endpoint.answer)))
            self.end_headers()
            self.wfile.write(endpoint.answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    hook = Endpoint()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hook))
    hook.port = int(server.server_address[1])
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()


class Trickler:
    """A slow receiver, as issue 30's attacker ran one: it reads each POST, then answers
    ``HTTP/1.1 200 OK`` one byte every ``interval`` seconds, for up to ``hold`` seconds per
    connection (a timeout per read never fires). Real sockets on 127.0.0.1, a thread per
    connection; ``connections`` counts the POSTs it was sent, ``open_now`` those it holds,
    ``held`` how long each one it let go was held (until the sender hung up)."""

    #: Long enough never to be over before ``hold`` at a byte a second.
    ANSWER = (
        b"HTTP/1.1 200 OK\r\nX-Padding: "
        + b"." * 400
        + b"\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    )

    def __init__(self, *, interval: float = 1.0, hold: float = 120.0) -> None:
        self.interval = interval
        self.hold = hold
        self.connections = 0
        self.open_now = 0
        self.held: list[float] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/slow"

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._trickle, args=(client,), daemon=True).start()

    def _trickle(self, client: socket.socket) -> None:
        with self._lock:
            self.connections += 1
            self.open_now += 1
        started = time.monotonic()
        try:
            client.settimeout(10)
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = client.recv(4096)
                if not chunk:
                    return
                request += chunk
            for byte in self.ANSWER[:-1]:  # never the last byte: the answer never completes
                if self._stopping.wait(self.interval) or time.monotonic() - started > self.hold:
                    return
                client.sendall(bytes([byte]))  # fails once the sender has hung up
        except OSError:
            return
        finally:
            client.close()
            with self._lock:
                self.open_now -= 1
                self.held.append(time.monotonic() - started)

    def stop(self) -> None:
        self._stopping.set()
        self._server.close()


@pytest.fixture
def trickler() -> Iterator[Trickler]:
    receiver = Trickler()
    yield receiver
    receiver.stop()


class Mailbox:
    """What the SMTP server was sent, parsed."""

    def __init__(self) -> None:
        self.messages: list[EmailMessage] = []
        self.envelopes: list[tuple[str, list[str]]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(message, EmailMessage)
        self.messages.append(message)
        self.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
        return "250 Message accepted for delivery"


@dataclass
class Smtp:
    host: str
    port: int
    mailbox: Mailbox

    def wait_for(self, count: int, timeout: float = 10) -> list[EmailMessage]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(self.mailbox.messages) < count:
            time.sleep(0.1)
        return self.mailbox.messages


@pytest.fixture
def smtp() -> Iterator[Smtp]:
    mailbox = Mailbox()
    port = free_port()
    controller = Controller(mailbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield Smtp("127.0.0.1", port, mailbox)
    finally:
        controller.stop()


@pytest.fixture
def notify_settings(settings: Any, smtp: Smtp) -> Any:
    """Webhooks may reach the test receivers on 127.0.0.1; e-mail goes to the real SMTP
    server over plain SMTP; retries wait one second, doubling, at most three tries."""
    settings.TAU_WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST = smtp.host
    settings.EMAIL_PORT = smtp.port
    settings.EMAIL_USE_TLS = False
    settings.EMAIL_HOST_USER = ""
    settings.EMAIL_HOST_PASSWORD = ""
    settings.DEFAULT_FROM_EMAIL = "TauGrid <taugrid@example.org>"
    settings.TAU_PUBLIC_URL = "https://taugrid.example.org"
    settings.TAU_NOTIFY_RETRY_SECONDS = 1
    settings.TAU_NOTIFY_RETRY_MAX_SECONDS = 8
    settings.TAU_NOTIFY_MAX_TRIES = 3
    return settings


def finish(run: Run, state: RunState = RunState.SUCCEEDED, **kwargs: Any) -> Run:
    """Take a submitted run through the queue to ``state``."""
    for step in (RunState.QUEUED, RunState.ADMITTED, RunState.RUNNING):
        if run.state != step:
            run = transition(run, step)
        if step == state:
            return run
    return transition(run, state, **kwargs)


def self_signed_certificate(directory: Any, host: str = "localhost") -> tuple[str, str]:
    """A certificate for ``host`` signed by itself, and its key, as PEM files."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path = f"{directory}/cert.pem"
    key_path = f"{directory}/key.pem"
    with open(cert_path, "wb") as out:
        out.write(certificate.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as out:
        out.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return cert_path, key_path


@pytest.fixture
def tls_endpoint(tmp_path: Any) -> Iterator[tuple[Endpoint, str]]:
    """An HTTPS endpoint on 127.0.0.1 with a certificate for ``localhost``; and the
    certificate's file, for a client that should trust it."""
    import ssl

    cert, key = self_signed_certificate(tmp_path)
    hook = Endpoint()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hook))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    hook.port = int(server.server_address[1])
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield hook, cert
    finally:
        server.shutdown()
        server.server_close()
