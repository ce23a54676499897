"""Dex, the second real OpenID provider of the login tests (next to the npm one in
openid_provider.py): built from the Go module proxy by ``make cluster-build`` (versions.env's
DEX_VERSION, cached under ~/.cache/taugrid like the control plane) and run on 127.0.0.3, so
its cookies never mix with the portal's on 127.0.0.1 or the other provider's on 127.0.0.2.

It is configured as platform teams run it: in-memory storage, one static client for TauGrid
(``redirectURIs``), the password database with static users (with and without
``preferredUsername``, with groups), and the mock connector, which logs in "Kilgore Trout"
with an opaque subject, an e-mail, a name and no preferred username. Signing keys live in
memory, so a restart is a key rotation.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import bcrypt
import pytest
import requests

from tests.cluster.plugin import load_controlplane

HOST = "127.0.0.3"
PASSWORD = "correct horse battery staple"
#: The static users of the password database (``login`` is what is typed on Dex's page).
USERS = [
    {
        "email": "ada@example.org",
        "username": "Ada Lovelace",
        "preferredUsername": "ada",
        "userID": "2f5b6c1e-6a0f-4c7e-9a53-8d2f1e0b7a11",
        "groups": ["alpha-researchers"],
    },
    {
        # An older static user: no preferredUsername, so Dex sends none.
        "email": "linus@example.org",
        "username": "Linus Example",
        "userID": "8c0d7f52-1b9e-4a61-b3c4-2e7a9f6d5c30",
        "groups": ["alpha-admins"],
    },
]


@dataclass
class Dex:
    """One Dex process; ``restart`` keeps the port and issuer and brings new signing keys."""

    issuer: str
    port: int
    client_id: str
    client_secret: str
    redirect_uri: str
    directory: Path
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    log_lines: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        """Where Dex answers (its issuer may name another host), without a trailing slash."""
        return f"http://{HOST}:{self.port}{urlsplit(self.issuer).path}".rstrip("/")

    @property
    def log_path(self) -> Path:
        return self.directory / "dex.log"

    def config(self) -> dict[str, object]:
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10, prefix=b"2a"))
        return {
            "issuer": self.issuer,
            "storage": {"type": "memory"},
            "web": {"http": f"{HOST}:{self.port}"},
            "logger": {"level": "info", "format": "text"},
            "oauth2": {"skipApprovalScreen": True, "responseTypes": ["code"]},
            "staticClients": [
                {
                    "id": self.client_id,
                    "secret": self.client_secret,
                    "name": "TauGrid",
                    "redirectURIs": [self.redirect_uri],
                }
            ],
            "enablePasswordDB": True,
            "staticPasswords": [{**user, "hash": hashed.decode()} for user in USERS],
            "connectors": [{"type": "mockCallback", "id": "mock", "name": "Example"}],
        }

    def start(self) -> None:
        binary = dex_binary()
        config_path = self.directory / "config.json"  # JSON is YAML: Dex reads it as such
        config_path.write_text(json.dumps(self.config(), indent=2))
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"--- start {self.starts}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                [str(binary), "serve", str(config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + 30
        discovery = f"{self.url}/.well-known/openid-configuration"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"Dex exited with {self.process.returncode}:\n{self.log()}")
            try:
                if requests.get(discovery, timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"Dex did not answer within 30 s:\n{self.log()}")

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def keys(self) -> list[str]:
        jwks = requests.get(f"{self.url}/keys", timeout=5).json()
        return sorted(str(key.get("kid")) for key in jwks.get("keys", []))


def dex_binary() -> Path:
    controlplane = load_controlplane()  # the cache layout and versions of the Go builds
    binary: Path = controlplane.DEX.binary(controlplane.read_versions())
    if not os.access(binary, os.X_OK):
        message = f"Dex is not built ({binary}): run `make cluster-build`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return binary


def start_dex(
    portal_url: str, directory: Path, *, issuer_path: str = "/dex", port: int | None = None
) -> Iterator[Dex]:
    """Dex for a portal at ``portal_url``; ``issuer_path`` may end in a slash."""
    port = port or _free_port()
    dex = Dex(
        issuer=f"http://{HOST}:{port}{issuer_path}",
        port=port,
        client_id="taugrid",
        client_secret=secrets.token_urlsafe(24),
        redirect_uri=f"{portal_url}/oidc/callback/",
        directory=directory,
    )
    try:
        dex.start()
        yield dex
    finally:
        dex.stop()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])
