"""The Helm chart (deploy/helm/taugrid) as the tests render it: the helm binary that
``make cluster-build`` builds from Go modules (deploy/cluster/versions.env, HELM_VERSION),
and its output read back as objects."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.plugin import load_controlplane

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "taugrid"
PRODUCTION_VALUES = CHART / "ci" / "production-values.yaml"
GOLDEN = Path(__file__).parent / "golden"
#: The names the golden files are rendered with (a release named after the chart keeps the
#: objects' names short: taugrid-web, taugrid-worker, …).
RELEASE = "taugrid"
NAMESPACE = "taugrid"

Body = dict[str, Any]
#: Helm's own cache, configuration and data (it keeps none we need): not the user's ~/.
HELM_HOME = Path(tempfile.gettempdir()) / "taugrid-helm"
DIRS = (
    ("HOME", "home"),
    ("HELM_CACHE_HOME", "cache"),
    ("HELM_CONFIG_HOME", "config"),
    ("HELM_DATA_HOME", "data"),
)


def helm_binary() -> Path:
    """The cached helm; a failure (never a skip) when it was not built."""
    controlplane = load_controlplane()
    binary: Path = controlplane.HELM.binary(controlplane.read_versions())
    if not binary.is_file():
        pytest.fail(f"helm is not built ({binary} is missing): run `make cluster-build`")
    return binary


@dataclass(frozen=True)
class Helm:
    binary: Path

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(self.binary), *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            env={"PATH": "/usr/bin:/bin", **{name: str(HELM_HOME / part) for name, part in DIRS}},
        )
        if check and done.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{done.stderr}")
        return done

    def template(
        self,
        *values_files: Path,
        release: str = RELEASE,
        namespace: str = NAMESPACE,
        set_values: Sequence[str] = (),
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        args = ["template", release, str(CHART), "--namespace", namespace]
        for path in values_files:
            args += ["--values", str(path)]
        for value in set_values:
            args += ["--set", value]
        return self.run(*args, check=check)

    def objects(self, *values_files: Path, **kwargs: Any) -> list[Body]:
        return documents(self.template(*values_files, **kwargs).stdout)


def documents(text: str) -> list[Body]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def pod_specs(objects: Sequence[Body]) -> Iterator[tuple[str, Body]]:
    """(kind/name, pod spec) of every object that makes pods."""
    for obj in objects:
        if obj["kind"] in {"Deployment", "StatefulSet", "DaemonSet", "Job"}:
            yield f"{obj['kind']}/{obj['metadata']['name']}", obj["spec"]["template"]["spec"]
        elif obj["kind"] == "CronJob":
            spec = obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
            yield f"CronJob/{obj['metadata']['name']}", spec


def by_kind_and_name(objects: Sequence[Body]) -> dict[tuple[str, str], Body]:
    return {(obj["kind"], obj["metadata"]["name"]): obj for obj in objects}
