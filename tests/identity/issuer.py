"""A minimal token issuer for verification tests: a real HTTP server on 127.0.0.1 that
serves a discovery document and a JWKS, and mints ID tokens the tests shape by hand
(wrong audience, expired, other key...).

The full login against a real OpenID provider is covered by the browser test; this exists
so every refusal rule can be tested with a token crafted to break exactly that rule.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa

CLIENT_ID = "taugrid-test"
CLIENT_SECRET = "test-client-secret-not-used-for-signing"


class Key:
    """A signing key of its own (a new one each time) under ``kid``, or ``private`` under it."""

    def __init__(
        self,
        kid: str,
        alg: str = "RS256",
        private: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | None = None,
    ) -> None:
        self.kid = kid
        self.alg = alg
        self.private: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
        if private is not None:
            self.private = private
        elif alg.startswith("RS"):
            self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        else:
            self.private = ec.generate_private_key(ec.SECP256R1())

    def public_jwk(self) -> dict[str, Any]:
        public = self.private.public_key()
        if isinstance(public, rsa.RSAPublicKey):
            text = jwt.algorithms.RSAAlgorithm.to_jwk(public)
        else:
            text = jwt.algorithms.ECAlgorithm.to_jwk(public)
        jwk: dict[str, Any] = json.loads(text)
        jwk.update({"kid": self.kid, "use": "sig", "alg": self.alg})
        return jwk


@functools.cache
def _first_key() -> rsa.RSAPrivateKey:
    """Every issuer's first key, made once per process (an RSA key takes 0.1 s to make, and
    each test has an issuer of its own); a test's other keys, an impostor's ``key-1`` among
    them, are each new."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


class Issuer:
    """Serves /.well-known/openid-configuration and /jwks; ``keys`` can change at any time."""

    def __init__(self) -> None:
        self.keys: list[Key] = [Key("key-1", private=_first_key())]
        self.jwks_requests = 0
        self.discovery_requests = 0
        #: What the discovery document says its issuer is (None: the server's own URL), its
        #: HTTP status, and fields to add to it or (None) take out of it.
        self.published_issuer: str | None = None
        self.discovery_status = 200
        self.discovery_changes: dict[str, Any] = {}
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.endswith("/.well-known/openid-configuration"):
                    issuer.discovery_requests += 1
                    if issuer.discovery_status != 200:
                        self.send_error(issuer.discovery_status)
                        return
                    body = issuer.discovery()
                elif self.path == "/jwks":
                    issuer.jwks_requests += 1
                    body = {"keys": [key.public_jwk() for key in issuer.keys]}
                else:
                    self.send_error(404)
                    return
                payload = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def discovery(self) -> dict[str, Any]:
        document = {
            "issuer": self.published_issuer or self.url,
            "authorization_endpoint": f"{self.url}/auth",
            "token_endpoint": f"{self.url}/token",
            "userinfo_endpoint": f"{self.url}/me",
            "jwks_uri": f"{self.url}/jwks",
            "end_session_endpoint": f"{self.url}/session/end",
        }
        document.update(self.discovery_changes)
        return {key: value for key, value in document.items() if value is not None}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def claims(self, **overrides: Any) -> dict[str, Any]:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.url,
            "sub": "subject-1",
            "aud": CLIENT_ID,
            "iat": now,
            "exp": now + 300,
            "nonce": "the-nonce",
        }
        claims.update(overrides)
        return {key: value for key, value in claims.items() if value is not None}

    def token(
        self, *, key: Key | None = None, headers: dict[str, Any] | None = None, **claims: Any
    ) -> str:
        key = key or self.keys[0]
        return jwt.encode(
            self.claims(**claims),
            key.private,
            algorithm=key.alg,
            headers={"kid": key.kid, **(headers or {})},
        )
