"""Endpoints for tests, made the way real ones are: deployed from tau.yaml text through the
service, on the fake backend that runs endpoints (tests.serving.fakes)."""

from __future__ import annotations

import io
from typing import Any

from django.conf import settings
from django.test import override_settings

from catalog.ingest import asset_named, ingest_folder, set_alias
from catalog.models import AssetVersion
from serving import services
from serving.models import Endpoint, EndpointState
from tests.runs.factories import zip_bytes
from tests.serving import fakes

ENDPOINT_SPEC = b"""schema_version: 1
name: chat
run:
  workload_kind: rayservice
serve:
  import_path: app:deployment
  replicas: 1
compute:
  cpus: 1
  memory: 256Mi
"""

#: The same, serving alpha's model ``tiny-gpt`` by its alias ``production``.
MODEL_SPEC = ENDPOINT_SPEC.replace(
    b"  replicas: 1\n", b"  replicas: 1\n  model: {name: tiny-gpt, version: production}\n"
)

AUTOSCALING_SPEC = ENDPOINT_SPEC.replace(
    b"  replicas: 1\n",
    b"  autoscaling: {min_replicas: 1, max_replicas: 4, target_ongoing_requests: 2}\n",
)

RUN_SPEC = b"""schema_version: 1
name: tiny
run:
  entrypoint: main.py
  workload_kind: job
compute:
  cpus: 1
  memory: 256Mi
"""

#: The project ENDPOINT_SPEC serves (its import path's module must be in the zip).
ENDPOINT_FILES = {"app.py": "deployment = None\n"}


def model_version(world: Any, tmp_path: Any, *, name: str = "tiny-gpt") -> AssetVersion:
    """A ready version 1 of alpha's model ``name``, with the alias ``production``."""
    source = tmp_path / f"model-{name}"
    source.mkdir(exist_ok=True)
    (source / "weights.bin").write_bytes(b"0123456789")
    version = ingest_folder(asset_named(world.alpha, "model", name), source, source="prefix")
    set_alias(version, "production")
    return version


def make_endpoint(
    world: Any,
    *,
    who: str = "researcher",
    spec: bytes = ENDPOINT_SPEC,
    files: dict[str, str] | None = ENDPOINT_FILES,
    state: EndpointState | None = None,
    name: str | None = None,
    workspace: Any = None,
) -> Endpoint:
    """A deployed endpoint in alpha; ``state`` forces a state afterwards (bypassing the
    machine, for tests that need an endpoint in a given state and nothing else)."""
    with override_settings(TAU_BACKEND_CLASSES=fakes.backend_classes(settings)):
        endpoint = services.deploy_endpoint(
            workspace=workspace or world.alpha,
            user=world.users[who],
            spec_source=spec,
            bundle=io.BytesIO(zip_bytes(files)) if files is not None else None,
            name=name,
        )
    if state is not None:
        Endpoint.objects.for_workspace(endpoint.workspace_id).filter(pk=endpoint.pk).update(
            state=state
        )
        endpoint.refresh_from_db()
    return endpoint
