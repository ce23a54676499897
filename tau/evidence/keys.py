"""Ed25519 keys of evidence records: key ids, the signature document (``manifest.sig``), the
keyring (``GET /api/v1/evidence/keys/``) and reading the keys a verifier is told to trust.

A record carries its signer's public key so that it can be checked with nothing else; a
keyring says which keys to *trust*. The portal keeps every public key it ever signed with in
its keyring, so records sealed before a key rotation keep verifying.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from tau.evidence.canonical import canonical_json

__all__ = [
    "ALGORITHM",
    "KeyFormatError",
    "Signature",
    "key_id",
    "keyring_document",
    "load_trusted_keys",
    "public_key_bytes",
    "read_signature_document",
    "signature_document",
    "signature_is_valid",
]

ALGORITHM = "Ed25519"
PUBLIC_KEY_SIZE = 32
SIGNATURE_SIZE = 64


class KeyFormatError(ValueError):
    """A key, keyring or signature document that cannot be read; the message says why."""


def key_id(raw_public: bytes) -> str:
    """``ed25519-`` and the first 16 hex digits of the SHA-256 of the 32 raw public key bytes:
    short enough to read out, long enough that two keys of one portal never share it."""
    if len(raw_public) != PUBLIC_KEY_SIZE:
        raise KeyFormatError(
            f"an Ed25519 public key is {PUBLIC_KEY_SIZE} bytes, not {len(raw_public)}"
        )
    return "ed25519-" + hashlib.sha256(raw_public).hexdigest()[:16]


def public_key_bytes(private_key: Ed25519PrivateKey) -> bytes:
    """The 32 raw bytes of the private key's public half."""
    return private_key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )


def signature_document(private_key: Ed25519PrivateKey, manifest_bytes: bytes) -> bytes:
    """``manifest.sig``: the signature over exactly ``manifest_bytes`` (the canonical manifest),
    with the algorithm, the key id and the public key, as canonical JSON."""
    raw_public = public_key_bytes(private_key)
    return canonical_json(
        {
            "algorithm": ALGORITHM,
            "key_id": key_id(raw_public),
            "public_key": base64.b64encode(raw_public).decode("ascii"),
            "signature": base64.b64encode(private_key.sign(manifest_bytes)).decode("ascii"),
        }
    )


def keyring_document(entries: Iterable[tuple[bytes, bool]]) -> dict[str, Any]:
    """The keyring for ``(raw public key, is it the key signing now)`` pairs, ordered by key
    id so the same keys always give the same document."""
    keys = [
        {
            "key_id": key_id(raw_public),
            "algorithm": ALGORITHM,
            "public_key": base64.b64encode(raw_public).decode("ascii"),
            "current": current,
        }
        for raw_public, current in entries
    ]
    return {"keys": sorted(keys, key=lambda key: key["key_id"])}


@dataclass(frozen=True)
class Signature:
    """A read ``manifest.sig``: whose key, and the signature bytes."""

    key_id: str
    public_key: bytes
    signature: bytes


def _base64(text: Any, what: str, size: int) -> bytes:
    if not isinstance(text, str):
        raise KeyFormatError(f"{what} is not a base64 string")
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise KeyFormatError(f"{what} is not valid base64") from None
    if len(raw) != size:
        raise KeyFormatError(f"{what} is {len(raw)} bytes, an Ed25519 one is {size}")
    # base64 leaves a few bits of the last character unused: without this, changing them
    # would change the record's bytes and still verify.
    if base64.b64encode(raw).decode("ascii") != text.strip():
        raise KeyFormatError(f"{what} is not canonical base64")
    return raw


def read_signature_document(data: bytes) -> Signature:
    """Read ``manifest.sig``; ``KeyFormatError`` when it is not one, or when its key id is not
    the id of the public key it carries (which would name another signer than the real one)."""
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        raise KeyFormatError("manifest.sig is not JSON") from None
    if not isinstance(document, dict):
        raise KeyFormatError("manifest.sig is not a JSON object")
    if canonical_json(document) != data:
        raise KeyFormatError("manifest.sig is not canonical JSON (RFC 8785)")
    if document.get("algorithm") != ALGORITHM:
        raise KeyFormatError(
            f"manifest.sig: algorithm {document.get('algorithm')!r}, not {ALGORITHM}"
        )
    public_key = _base64(document.get("public_key"), "manifest.sig public_key", PUBLIC_KEY_SIZE)
    signature = _base64(document.get("signature"), "manifest.sig signature", SIGNATURE_SIZE)
    if document.get("key_id") != key_id(public_key):
        raise KeyFormatError(
            f"manifest.sig: key_id {document.get('key_id')!r} is not the id of its public key "
            f"({key_id(public_key)})"
        )
    return Signature(key_id=key_id(public_key), public_key=public_key, signature=signature)


def signature_is_valid(signature: Signature, manifest_bytes: bytes) -> bool:
    """Whether ``signature`` is its key's Ed25519 signature over exactly ``manifest_bytes``."""
    try:
        Ed25519PublicKey.from_public_bytes(signature.public_key).verify(
            signature.signature, manifest_bytes
        )
    except InvalidSignature:
        return False
    return True


def load_trusted_keys(data: bytes) -> dict[str, bytes]:
    """The keys to trust, by key id, from a keyring (JSON, as the portal publishes it), a PEM
    public key, or one base64 raw public key. ``KeyFormatError`` says which it looked like
    and what is wrong with it."""
    text = data.strip()
    if text.startswith(b"{"):
        return _keyring_keys(text)
    if text.startswith(b"-----BEGIN"):
        try:
            loaded = serialization.load_pem_public_key(text)
        except ValueError as error:
            raise KeyFormatError(f"not a readable PEM public key: {error}") from None
        if not isinstance(loaded, Ed25519PublicKey):
            raise KeyFormatError(
                f"the PEM key is not an Ed25519 public key ({type(loaded).__name__})"
            )
        raw = loaded.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return {key_id(raw): raw}
    try:
        ascii_text = text.decode("ascii")
    except UnicodeDecodeError:
        raise KeyFormatError(
            "neither a keyring (JSON), a PEM public key nor a base64 key"
        ) from None
    raw = _base64(ascii_text, "the key", PUBLIC_KEY_SIZE)
    return {key_id(raw): raw}


def _keyring_keys(text: bytes) -> dict[str, bytes]:
    try:
        document = json.loads(text)
    except (UnicodeDecodeError, ValueError) as error:
        raise KeyFormatError(f"the keyring is not JSON: {error}") from None
    entries = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise KeyFormatError('the keyring has no "keys" list')
    trusted: dict[str, bytes] = {}
    for index, entry in enumerate(entries):
        where = f"keyring key #{index + 1}"
        if not isinstance(entry, dict):
            raise KeyFormatError(f"{where} is not an object")
        if entry.get("algorithm") != ALGORITHM:
            raise KeyFormatError(f"{where}: algorithm {entry.get('algorithm')!r}, not {ALGORITHM}")
        raw = _base64(entry.get("public_key"), f"{where} public_key", PUBLIC_KEY_SIZE)
        if entry.get("key_id") != key_id(raw):
            raise KeyFormatError(
                f"{where}: key_id {entry.get('key_id')!r} is not the id of its key ({key_id(raw)})"
            )
        trusted[key_id(raw)] = raw
    if not trusted:
        raise KeyFormatError("the keyring holds no keys")
    return trusted
