"""The portal's evidence keys: the Ed25519 private key that signs new records, and the keyring
of every public key it has signed with.

The signing key comes from ``TAU_EVIDENCE_SIGNING_KEY(_FILE)`` (PEM). Without it — only
outside production, settings refuse to start otherwise — the embedded default generates one
on first use under ``VAR_DIR`` (mode 0600, created exclusively so two processes starting at
once cannot each sign with a different key). Rotating means setting a new signing key and
adding the old public key to ``TAU_EVIDENCE_PUBLIC_KEYS_FILE`` (a keyring document): records
sealed before keep verifying against the published keyring.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from tau.evidence.keys import KeyFormatError, keyring_document, load_trusted_keys, public_key_bytes


def signing_key() -> Ed25519PrivateKey:
    """The key new records are signed with. Read each time it is asked for (sealing is rare),
    so a test or an operator changing the setting never meets a stale cached key."""
    pem = settings.TAU_EVIDENCE_SIGNING_KEY
    where = "TAU_EVIDENCE_SIGNING_KEY"
    if pem is None:
        pem = _generated_key_pem(Path(settings.TAU_EVIDENCE_GENERATED_KEY_PATH))
        where = str(settings.TAU_EVIDENCE_GENERATED_KEY_PATH)
    try:
        key = serialization.load_pem_private_key(pem.encode("ascii"), password=None)
    except (ValueError, TypeError, UnicodeEncodeError) as error:
        raise ImproperlyConfigured(f"{where} is not a readable PEM private key: {error}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ImproperlyConfigured(f"{where} is not an Ed25519 key ({type(key).__name__})")
    return key


def _generated_key_pem(path: Path) -> str:
    if path.exists():
        return path.read_text(encoding="ascii")
    path.parent.mkdir(parents=True, exist_ok=True)
    pem = (
        Ed25519PrivateKey.generate()
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        .decode("ascii")
    )
    try:
        with open(path, "x", encoding="ascii", opener=_private_opener) as handle:
            handle.write(pem)
    except FileExistsError:  # another process wrote it first: everyone signs with that one
        return path.read_text(encoding="ascii")
    return pem


def _private_opener(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


def previous_public_keys() -> dict[str, bytes]:
    """The public keys of earlier signing keys, by key id, from TAU_EVIDENCE_PUBLIC_KEYS_FILE."""
    name = settings.TAU_EVIDENCE_PUBLIC_KEYS_FILE
    if not name:
        return {}
    try:
        return load_trusted_keys(Path(name).read_bytes())
    except (OSError, KeyFormatError) as error:
        raise ImproperlyConfigured(
            f"TAU_EVIDENCE_PUBLIC_KEYS_FILE ({name}) cannot be read as a keyring: {error}"
        ) from None


def keyring() -> dict[str, Any]:
    """The keyring document ``GET /api/v1/evidence/keys/`` answers: the current public key and
    every earlier one, the current one marked."""
    current = public_key_bytes(signing_key())
    older = [raw for raw in previous_public_keys().values() if raw != current]
    return keyring_document([(current, True), *((raw, False) for raw in older)])
