"""``tau evidence verify``: the same check and exit statuses as ``python -m tau.evidence``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tau.cli import main
from tau.evidence.keys import key_id, keyring_document, public_key_bytes
from tests.evidence_format.record import record, sample_parts


def test_tau_evidence_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = Ed25519PrivateKey.generate()
    data = record(sample_parts(), key)
    path = tmp_path / "run.evidence.tar"
    path.write_bytes(data)
    keyring = tmp_path / "keys.json"
    keyring.write_text(json.dumps(keyring_document([(public_key_bytes(key), True)])))

    assert main(["evidence", "verify", str(path), "--key", str(keyring)]) == 0
    out = capsys.readouterr().out
    assert f"signed by  {key_id(public_key_bytes(key))}, a trusted key" in out
    assert "alpha/train-gpt-7" in out

    assert main(["evidence", "verify", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["signer"]["trusted"] is None

    at = data.index(b"step 1 loss 2.5")
    path.write_bytes(data[:at] + b"X" + data[at + 1 :])
    assert main(["evidence", "verify", str(path)]) == 1
    assert "attempts/1/log.txt: SHA-256 does not match" in capsys.readouterr().out

    assert main(["evidence", "verify", str(tmp_path / "absent.tar")]) == 2
    assert main(["evidence", "verify"]) == 2
