"""Key ids, the keyring, and the key files a verifier accepts."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tau.evidence.canonical import canonical_json
from tau.evidence.keys import (
    KeyFormatError,
    key_id,
    keyring_document,
    load_trusted_keys,
    public_key_bytes,
    read_signature_document,
    signature_document,
    signature_is_valid,
)


def test_key_id_is_the_start_of_the_public_keys_sha256() -> None:
    raw = bytes(range(32))
    assert key_id(raw) == "ed25519-" + hashlib.sha256(raw).hexdigest()[:16]
    with pytest.raises(KeyFormatError, match="32 bytes"):
        key_id(b"short")


def test_signature_document_is_canonical_and_verifies() -> None:
    key = Ed25519PrivateKey.generate()
    document = signature_document(key, b'{"format":"taugrid-evidence/1"}')
    parsed = json.loads(document)
    assert canonical_json(parsed) == document
    assert sorted(parsed) == ["algorithm", "key_id", "public_key", "signature"]
    signature = read_signature_document(document)
    assert signature.key_id == key_id(public_key_bytes(key))
    assert signature_is_valid(signature, b'{"format":"taugrid-evidence/1"}')
    assert not signature_is_valid(signature, b'{"format":"taugrid-evidence/2"}')


def test_keyring_round_trip_and_the_other_forms() -> None:
    old, new = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    document = keyring_document([(public_key_bytes(new), True), (public_key_bytes(old), False)])
    assert [entry["key_id"] for entry in document["keys"]] == sorted(
        key_id(public_key_bytes(key)) for key in (old, new)
    )
    expected = {key_id(public_key_bytes(key)): public_key_bytes(key) for key in (old, new)}
    assert load_trusted_keys(json.dumps(document).encode()) == expected
    pem = old.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    only_old = {key_id(public_key_bytes(old)): public_key_bytes(old)}
    assert load_trusted_keys(pem) == only_old
    assert load_trusted_keys(base64.b64encode(public_key_bytes(old)) + b"\n") == only_old


def test_unreadable_keys_say_why() -> None:
    with pytest.raises(KeyFormatError, match="not JSON"):
        load_trusted_keys(b"{nope")
    with pytest.raises(KeyFormatError, match='no "keys" list'):
        load_trusted_keys(b'{"key": []}')
    with pytest.raises(KeyFormatError, match="holds no keys"):
        load_trusted_keys(b'{"keys": []}')
    raw = bytes(32)
    wrong_id = {
        "keys": [
            {
                "key_id": "ed25519-x",
                "algorithm": "Ed25519",
                "public_key": base64.b64encode(raw).decode(),
                "current": True,
            }
        ]
    }
    with pytest.raises(KeyFormatError, match="is not the id of its key"):
        load_trusted_keys(json.dumps(wrong_id).encode())
    ec_pem = (
        generate_private_key(SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(KeyFormatError, match="not an Ed25519 public key"):
        load_trusted_keys(ec_pem)
    with pytest.raises(KeyFormatError, match="is 3 bytes"):
        load_trusted_keys(base64.b64encode(b"abc"))
    with pytest.raises(KeyFormatError, match="neither"):
        load_trusted_keys("é".encode())
