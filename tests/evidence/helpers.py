"""What the evidence tests share: a signing key under the test's var/, sealing done by the test
itself (no Celery worker), and an export fetched through the API into a file."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

from evidence import sealing
from evidence.models import EvidenceRecord, SealRequest
from runs.models import Run

#: A fixed Ed25519 private key for tests that sign outside the ``var_dir`` fixture.
TEST_SIGNING_KEY = (
    "-----BEGIN PRIVATE KEY-----\n"
    "MC4CAQAwBQYDK2VwBCIEIFSl0sUQ7Sa7YRpqm8Ql6wcL7t6mFqSkM8i1b1hcg3Hj\n"
    "-----END PRIVATE KEY-----\n"
)


def seal_all(run: Run) -> list[EvidenceRecord]:
    """Seal every open request of ``run``, as the worker would; its records, oldest first."""
    for request in SealRequest.objects.for_workspace(run.workspace_id).filter(
        run=run, sealed_at__isnull=True
    ):
        assert sealing.seal(request.pk)
    return records_of(run)


def records_of(run: Run) -> list[EvidenceRecord]:
    return list(
        EvidenceRecord.objects.for_workspace(run.workspace_id)
        .filter(run=run)
        .order_by("terminal_seq")
    )


def manifest_of(record: EvidenceRecord) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads(bytes(record.manifest))
    return manifest


def export_url(run: Run) -> str:
    return f"/api/v1/workspaces/{run.workspace.slug}/runs/{run.name}/evidence/"


def download(client: Any, run: Run, target: Path) -> Path:
    """The run's export through the API, written to ``target``; checks its Content-Length."""
    response = client.get(export_url(run))
    assert response.status_code == 200, response.content
    assert response.streaming
    with target.open("wb") as handle:
        for chunk in response.streaming_content:
            handle.write(chunk)
    assert int(response["Content-Length"]) == target.stat().st_size
    return target


def member_names(path: Path) -> list[str]:
    with tarfile.open(path) as tar:
        return tar.getnames()
