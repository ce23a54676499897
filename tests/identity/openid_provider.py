"""The real OpenID provider for tests: the npm package ``oidc-provider`` run by Node.js.

It listens on 127.0.0.2 so that its cookies never mix with the portal's on 127.0.0.1, has
one confidential client (TauGrid) and a few accounts with e-mail, name and groups. Its
development login page accepts any password for a known login name.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

OP_DIR = Path(__file__).resolve().parent / "oidc_provider"
HOST = "127.0.0.2"
ACCOUNTS = {
    "grace": {
        "email": "grace@example.org",
        "name": "Grace Hopper",
        "given_name": "Grace",
        "family_name": "Hopper",
        "preferred_username": "grace",
        "groups": ["alpha-researchers"],
    },
}


@dataclass(frozen=True)
class OpenIDProvider:
    issuer: str
    client_id: str
    client_secret: str


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def start_provider(portal_url: str) -> Iterator[OpenIDProvider]:
    node = shutil.which("node")
    if node is None or not (OP_DIR / "node_modules" / "oidc-provider").exists():
        message = (
            "the test OpenID provider needs node and `npm ci` in tests/identity/oidc_provider "
            "(make test-tools)"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    port = _free_port(HOST)
    provider = OpenIDProvider(
        issuer=f"http://{HOST}:{port}", client_id="taugrid", client_secret=secrets.token_urlsafe(24)
    )
    config = {
        "issuer": provider.issuer,
        "port": port,
        "host": HOST,
        "cookie_key": secrets.token_urlsafe(24),
        "client": {
            "client_id": provider.client_id,
            "client_secret": provider.client_secret,
            "redirect_uris": [f"{portal_url}/oidc/callback/"],
            "post_logout_redirect_uris": [f"{portal_url}/login/"],
        },
        "accounts": ACCOUNTS,
    }
    process = subprocess.Popen(
        [node, "server.mjs"],
        cwd=OP_DIR,
        env={**os.environ, "TAU_TEST_OP_CONFIG": json.dumps(config)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        assert process.stdout is not None
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if line.startswith("ready "):
                break
            if not line and process.poll() is not None:
                raise RuntimeError(f"the test OpenID provider exited with {process.returncode}")
        else:
            raise RuntimeError("the test OpenID provider did not start within 30s")
        yield provider
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
