"""The evidence tests' VAR_DIR and signing key; deliveries, seals and checks made by the tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from evidence import sealing, verification
from runs import delivery


@pytest.fixture
def var_dir(tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's VAR_DIR (bundles, the generated signing key), with deliveries, seals and
    checks made by the test, not by a worker."""
    directory = tmp_path / "var"
    directory.mkdir()
    settings.VAR_DIR = directory
    settings.TAU_EVIDENCE_SIGNING_KEY = None
    settings.TAU_EVIDENCE_GENERATED_KEY_PATH = directory / "evidence_signing_key.pem"
    settings.TAU_EVIDENCE_PUBLIC_KEYS_FILE = ""
    monkeypatch.setattr(delivery, "publish", lambda delivery_id: None)
    monkeypatch.setattr(sealing, "publish", lambda request_id: None)
    monkeypatch.setattr(verification, "publish", lambda record_id: None)
    return directory
