"""Dex is built from the Go module proxy like the control plane: a wrapper module whose
placeholders come from versions.env (deploy/cluster/dex/go.mod.in), cached by version."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.cluster.plugin import load_controlplane


def test_the_wrapper_requires_dex_and_its_api_module_at_the_pinned_versions() -> None:
    controlplane = load_controlplane()
    versions = controlplane.read_versions()
    gomod = controlplane.render_wrapper_gomod(controlplane.DEX_GOMOD_TEMPLATE, versions)
    assert f"github.com/dexidp/dex {versions['DEX_VERSION']}\n" in gomod
    assert f"github.com/dexidp/dex/api/v2 {versions['DEX_API_VERSION']}\n" in gomod
    assert "tool github.com/dexidp/dex/cmd/dex" in gomod
    assert re.search(r"@[A-Z][A-Z0-9_]*@", gomod) is None, "every placeholder is filled"
    assert controlplane.DEX in controlplane.COMPONENTS  # `make cluster-build` builds it
    assert controlplane.DEX.directory(versions).name == f"dex-{versions['DEX_VERSION']}"


def test_a_placeholder_missing_from_versions_env_is_refused(tmp_path: Path) -> None:
    controlplane = load_controlplane()
    template = tmp_path / "go.mod.in"
    template.write_text("module x\n\nrequire example.org/y @Y_VERSION@\n")
    refused = r"@Y_VERSION@ is not in versions\.env"
    with pytest.raises(controlplane.ControlPlaneError, match=refused):
        controlplane.render_wrapper_gomod(template, {"DEX_VERSION": "v1"})
