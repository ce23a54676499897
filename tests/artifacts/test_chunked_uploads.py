"""A workload's artifact upload sent in chunks (``Transfer-Encoding: chunked``, no
``Content-Length``: what a client streaming a file of unknown size sends) keeps every byte,
on production's web server (gunicorn, as the Helm chart starts it) and on the embedded
default's (uvicorn). It used to be answered 201 with an empty file kept: Django reads a WSGI
body only as far as its declared length."""

from __future__ import annotations

import hashlib
import http.client
import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runs import artifacts
from runs.models import Artifact
from tests.artifacts.test_artifacts import run_with_artifacts
from tests.runs.processes import Portal, portal_processes
from tests.runs.test_api import run_token

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

#: Three chunks, one of them larger than the store's read size (64 KiB).
CHUNKS = [b"weights " * 10, bytes(range(256)) * 400, b"end"]


def upload_in_chunks(portal: Portal, token: str, run_name: str, name: str) -> tuple[int, Any]:
    where = urllib.parse.urlsplit(portal.url)
    assert where.hostname is not None
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
    query = urllib.parse.urlencode({"path": name})
    connection.putrequest(
        "POST", f"/api/v1/workspaces/alpha/runs/{run_name}/report/artifacts/?{query}"
    )
    connection.putheader("Authorization", f"Bearer {token}")
    connection.putheader("Content-Type", "application/octet-stream")
    connection.putheader("Transfer-Encoding", "chunked")
    connection.endheaders()
    for chunk in CHUNKS:
        connection.send(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
    connection.send(b"0\r\n\r\n")
    response = connection.getresponse()
    body = response.read()
    connection.close()
    return response.status, json.loads(body)


@pytest.fixture(params=["gunicorn", "uvicorn"])
def portal(request: Any, tmp_path: Path, settings: Any) -> Iterator[Portal]:
    settings.VAR_DIR = tmp_path / "var"  # where the portal keeps artifacts, read here too
    for started in portal_processes(
        tmp_path, settings.CELERY_BROKER_URL, gunicorn=request.param == "gunicorn"
    ):
        started.start(worker=False, beat=False)
        yield started


def test_a_chunked_upload_keeps_every_byte(world: Any, portal: Portal) -> None:
    run = run_with_artifacts(world)
    status, answer = upload_in_chunks(portal, run_token(world, run), run.name, "model/w.pt")
    sent = b"".join(CHUNKS)
    assert status == 201, (answer, portal.log("web")[-2000:])
    assert (answer["size"], answer["sha256"]) == (len(sent), hashlib.sha256(sent).hexdigest())
    kept = Artifact.objects.for_workspace(world.alpha).get(run=run, path="model/w.pt")
    with artifacts.open_artifact(kept) as stored:
        assert stored.read() == sent
