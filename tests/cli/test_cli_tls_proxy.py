"""``tau`` behind a proxy and with a private certificate authority, as at many sites: the
portal (real gunicorn) is reached over HTTPS with a certificate signed by a CA of this test's
own, through an HTTP CONNECT proxy named by ``HTTPS_PROXY``. Without ``TAU_CA_BUNDLE`` the
certificate is refused with a message that names the fix; with it, the command works and
the proxy carried the connection."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import socket
import socketserver
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from identity import tokens
from tests.cli.test_cli_end_to_end import Tau, _said
from tests.runs.processes import Portal, portal_processes

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A private CA and a certificate for 127.0.0.1 signed by it: (ca.pem, cert.pem, key.pem)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("TauGrid test CA"))
        .issuer_name(_name("TauGrid test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


def pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy bytes one way until the source ends, then end the sink's writing side."""
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def relay(client: socket.socket, upstream: socket.socket) -> None:
    other = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    other.start()
    pump(client, upstream)
    other.join(timeout=30)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture
def portal(tmp_path: Path, settings: Any) -> Iterator[Portal]:
    yield from portal_processes(tmp_path, settings.CELERY_BROKER_URL)


@pytest.fixture
def https_front(portal: Portal, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """TLS in front of the portal's gunicorn, as a site's load balancer: (https URL, CA file)."""
    ca, certificate, key = make_certificates(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificate, key)

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            try:
                client = context.wrap_socket(self.request, server_side=True)
            except (ssl.SSLError, OSError):
                return  # a client that does not trust the CA gives up in the handshake
            with client, socket.create_connection(("127.0.0.1", portal.port)) as upstream:
                relay(client, upstream)

    server = _Server(("127.0.0.1", 0), Handler)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    yield f"https://127.0.0.1:{server.server_address[1]}", ca
    server.shutdown()
    server.server_close()


@pytest.fixture
def connect_proxy() -> Iterator[tuple[str, list[str]]]:
    """An HTTP CONNECT proxy: (its URL, the targets it was asked for)."""
    asked: list[str] = []

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            request_line = self.rfile.readline().decode("latin-1").split()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # the request's headers
            if len(request_line) != 3 or request_line[0] != "CONNECT":
                self.wfile.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                return
            asked.append(request_line[1])
            host, port = request_line[1].rsplit(":", 1)
            with socket.create_connection((host, int(port))) as upstream:
                self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                self.wfile.flush()
                relay(self.connection, upstream)

    server = _Server(("127.0.0.1", 0), Handler)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", asked
    server.shutdown()
    server.server_close()


def test_tau_through_a_proxy_to_a_portal_with_a_private_ca(
    world: Any,
    portal: Portal,
    https_front: tuple[str, Path],
    connect_proxy: tuple[str, list[str]],
    tmp_path: Path,
) -> None:
    portal.start(worker=False, beat=False)
    url, ca = https_front
    proxy, asked = connect_proxy
    token = tokens.issue_token(user=world.users["researcher"], name="tls").plaintext
    tau = Tau(tmp_path / "home")
    del tau.env["NO_PROXY"]
    tau.env.update({"TAU_URL": url, "TAU_TOKEN": token, "HTTPS_PROXY": proxy})

    # The site's CA is not one the system trusts: refused, and the message says what to set.
    refused = tau("whoami")
    assert refused.returncode != 0, _said(refused)
    assert "TAU_CA_BUNDLE" in refused.stderr, _said(refused)
    assert "CERTIFICATE_VERIFY_FAILED" in refused.stderr, _said(refused)

    # A CA file that cannot be read is a usage error (2), said as such.
    tau.env["TAU_CA_BUNDLE"] = str(tmp_path / "missing.pem")
    missing = tau("whoami")
    assert missing.returncode == 2, _said(missing)
    assert "TAU_CA_BUNDLE=" in missing.stderr
    assert "cannot load it" in missing.stderr

    # With the site's CA: the portal answers, through the proxy.
    tau.env["TAU_CA_BUNDLE"] = str(ca)
    me = tau.json("whoami")
    assert me["user"]["username"] == world.users["researcher"].username, me
    port = url.rsplit(":", 1)[1]
    assert asked, "the proxy was not used"
    assert set(asked) == {f"127.0.0.1:{port}"}, asked
