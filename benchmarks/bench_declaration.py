"""Declaring an upload of a million files (issue 33): ``POST …/datasets/{name}/versions/``
with the declaration streamed as JSON lines (catalog.uploads), through the API as a client
sends it, against the real PostgreSQL.

Reported: the seconds the declaration takes (read, checked and spooled a line at a time, then
recorded in one transaction), the files recorded per second, and the process's peak resident
memory before and after it (``ru_maxrss``: this process does nothing else, so the growth is
the declaration's); then the seconds the same declaration takes again while that upload is
unfinished (it finds the same version by the manifest's digest and records nothing). The
body is generated as it is read, so the client side holds no more of it than the portal.
For scale, last, the same for the JSON form of a fifth of the files (one body parsed whole;
its peak's growth is past the streamed one's, ``ru_maxrss`` being the process's highest, and
counts the test client's two copies of the body, about a fifth of it).

``TAU_BENCH_DECLARATION_FILES`` files (default 1,000,000, ``TAU_DATA_MAX_FILES``; smoke:
2,000), with paths of 35 characters, fake SHA-256s and no bytes sent. Reported, not judged.
"""

from __future__ import annotations

import io
import json
import os
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import django_test_database, report, sized
from tau.cli.data import ChunkStream

FILES = int(os.environ.get("TAU_BENCH_DECLARATION_FILES") or sized(1_000_000, 2_000))


def lines(count: int) -> Iterator[bytes]:
    yield json.dumps({"source": "upload", "files_count": count}).encode() + b"\n"
    for n in range(count):
        path = f"shards/{n // 1000:04}/part-{n % 1000:03}.tokens.bin"
        yield b'{"path": "%s", "size": %d, "sha256": "%064x"}\n' % (path.encode(), n % 4096, n)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    with django_test_database():
        from django.contrib.auth import get_user_model
        from django.test import Client

        from catalog.ingest import asset_named
        from catalog.models import AssetFile
        from identity.tokens import issue_token
        from workspaces.models import Membership, Workspace

        user = get_user_model().objects.create_user(username="bench")
        workspace = Workspace.unscoped_objects.create(
            slug="bench", name="Bench", namespace="tau-bench", local_queue="bench"
        )
        Membership.objects.create(workspace=workspace, user=user, role="researcher")
        asset_named(workspace, "dataset", "wiki")
        token = issue_token(user=user, name="bench").plaintext
        client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
        length = sum(map(len, lines(FILES)))

        def declare() -> tuple[float, Any]:
            body = io.BufferedReader(ChunkStream(lines(FILES)), buffer_size=64 * 1024)
            started = time.perf_counter()
            generated: dict[str, Any] = {"wsgi.input": body, "CONTENT_LENGTH": str(length)}
            answer = client.generic(
                "POST",
                "/api/v1/workspaces/bench/datasets/wiki/versions/",
                b"-",  # replaced by the generated body
                content_type="application/x-ndjson",
                **generated,
            )
            return time.perf_counter() - started, answer

        rss_before = peak_rss_mib()
        seconds, first = declare()
        assert first.status_code == 201, first.content[:500]
        rss_after = peak_rss_mib()
        again, second = declare()
        assert (second.status_code, second.json()["number"]) == (200, first.json()["number"])
        recorded = AssetFile.objects.for_workspace(workspace).count()
        assert recorded == FILES, recorded

        asset_named(workspace, "dataset", "small")
        json_files = FILES // 5
        as_json = json.dumps(
            {"source": "upload", "files": [json.loads(line) for line in lines(json_files)][1:]}
        )
        started = time.perf_counter()
        answer = client.post(
            "/api/v1/workspaces/bench/datasets/small/versions/", as_json, "application/json"
        )
        json_seconds = time.perf_counter() - started
        assert answer.status_code == 201, answer.content[:500]
        del as_json
        report(
            "declaration",
            {
                "files": FILES,
                "body_mib": round(length / 2**20, 1),
                "declare_seconds": round(seconds, 2),
                "files_per_second": round(FILES / seconds),
                "peak_rss_mib_before": round(rss_before, 1),
                "peak_rss_mib_after": round(rss_after, 1),
                "peak_rss_growth_mib": round(rss_after - rss_before, 1),
                "declare_again_seconds": round(again, 2),
                "json_form_files": json_files,
                "json_form_seconds": round(json_seconds, 2),
                "json_form_peak_rss_growth_mib": round(peak_rss_mib() - rss_after, 1),
            },
        )


if __name__ == "__main__":
    main()
