"""Uploads over the API (issue 33): the files declared first, then sent in pieces that may
stop anywhere and go on from where the portal says; nothing ``ready`` that is not whole and
checked, nothing stored of a refused declaration, no piece of another workspace's version."""

from __future__ import annotations

import ctypes
import gc
import hashlib
import io
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from catalog import storage
from catalog.ingest import asset_named, ingest_folder
from catalog.models import Asset, AssetFile, AssetVersion
from tau.cli.data import ChunkStream
from tau.manifest import Entry, Manifest, scan
from tests.datasets.test_catalog import folder

pytestmark = pytest.mark.django_db

API = "/api/v1/workspaces/alpha"
WIKI = f"{API}/datasets/wiki"


@pytest.fixture(autouse=True)
def store(settings: Any, tmp_path: Path) -> Path:
    settings.TAU_STORAGE_URL = f"file://{tmp_path / 'store'}"
    return tmp_path / "store"


def declared(files: dict[str, bytes]) -> list[dict[str, Any]]:
    return [
        {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        for path, data in files.items()
    ]


def put(client: Any, version: int, path: str, data: bytes, start: int = 0, total: int = 0):  # type: ignore[no-untyped-def]
    headers = {}
    if total:
        headers["Content-Range"] = f"bytes {start}-{start + len(data) - 1}/{total}"
    return client.put(
        f"{WIKI}/versions/{version}/files/{path}",
        data=data,
        content_type="application/octet-stream",
        headers=headers,
    )


@pytest.fixture
def researcher(world: Any) -> Any:
    client = world.client_for("researcher")
    assert client.post(f"{API}/datasets/", {"name": "wiki"}, "application/json").status_code == 201
    return client


FILES = {
    "train/part-0.txt": b"the quick brown fox\n" * 50,
    "train/part-1.txt": b"jumps over the lazy dog\n" * 40,
    "README": b"a small corpus\n",
}


def test_declared_files_sent_in_pieces_make_a_ready_version_with_their_manifest(
    world: Any, researcher: Any, tmp_path: Path, store: Path
) -> None:
    started = researcher.post(
        f"{WIKI}/versions/", {"source": "upload", "files": declared(FILES)}, "application/json"
    )
    assert started.status_code == 201, started.json()
    body = started.json()
    assert (body["number"], body["state"], body["source"]) == (1, "ingesting", "upload")
    assert body["files_missing"] == 3
    assert body["progress"] == {"bytes_done": 0, "bytes_total": sum(map(len, FILES.values()))}
    assert body["manifest_digest"] == ""

    big = FILES["train/part-0.txt"]
    first = put(researcher, 1, "train/part-0.txt", big[:300], 0, len(big))
    assert first.status_code == 200, first.json()
    assert first.json() == {
        "path": "train/part-0.txt",
        "size": len(big),
        "received": 300,
        "stored": False,
        "version_state": "ingesting",
    }
    rest = put(researcher, 1, "train/part-0.txt", big[300:], 300, len(big))
    assert rest.json()["stored"] is True
    assert put(researcher, 1, "README", FILES["README"]).json()["version_state"] == "ingesting"
    last = put(researcher, 1, "train/part-1.txt", FILES["train/part-1.txt"])
    assert last.json()["version_state"] == "ready"

    version = researcher.get(f"{WIKI}/versions/1/").json()
    expected = scan(folder(tmp_path / "local", FILES))
    assert (version["state"], version["manifest_digest"]) == ("ready", expected.digest)
    assert version["files_count"] == 3
    assert version["progress"]["bytes_done"] == version["progress"]["bytes_total"]
    for entry in expected.files:
        assert storage.blob_path(world.alpha.pk, entry.sha256).read_bytes() == FILES[entry.path]
    # The pieces' folder is gone with the upload.
    assert not (store / "workspaces" / str(world.alpha.pk) / "uploads" / "1").exists()


def test_an_interrupted_upload_goes_on_where_the_portal_says_it_stopped(
    world: Any, researcher: Any
) -> None:
    files = declared(FILES)
    assert (
        researcher.post(
            f"{WIKI}/versions/", {"source": "upload", "files": files}, "application/json"
        ).status_code
        == 201
    )
    big = FILES["train/part-0.txt"]
    put(researcher, 1, "train/part-0.txt", big[:250], 0, len(big))
    put(researcher, 1, "README", FILES["README"])

    # Declaring the same files again is the same version, with what it is missing.
    again = researcher.post(
        f"{WIKI}/versions/",
        {"source": "upload", "files": list(reversed(files))},
        "application/json",
    )
    assert again.status_code == 200
    assert (again.json()["number"], again.json()["files_missing"]) == (1, 2)
    missing = researcher.get(f"{WIKI}/versions/1/files/?missing=true").json()
    assert [(row["path"], row["received"], row["stored"]) for row in missing["results"]] == [
        ("train/part-0.txt", 250, False),
        ("train/part-1.txt", 0, False),
    ]
    # A piece from anywhere else is refused with where to go on from; nothing changes.
    wrong = put(researcher, 1, "train/part-0.txt", big[100:200], 100, len(big))
    assert wrong.status_code == 409
    assert wrong.json()["received"] == 250
    assert "holds its first 250 bytes" in wrong.json()["detail"]
    put(researcher, 1, "train/part-0.txt", big[250:], 250, len(big))
    put(researcher, 1, "train/part-1.txt", FILES["train/part-1.txt"])
    assert researcher.get(f"{WIKI}/versions/1/").json()["state"] == "ready"
    # Once ready, the same declaration starts a new version, which needs no byte sent: the
    # workspace's store holds them all.
    third = researcher.post(
        f"{WIKI}/versions/", {"source": "upload", "files": files}, "application/json"
    ).json()
    assert (third["number"], third["state"], third["files_missing"]) == (2, "ready", 0)
    assert (
        third["manifest_digest"] == researcher.get(f"{WIKI}/versions/1/").json()["manifest_digest"]
    )


def test_bytes_that_do_not_match_the_declaration_are_dropped_and_sent_again(
    world: Any, researcher: Any
) -> None:
    researcher.post(
        f"{WIKI}/versions/", {"source": "upload", "files": declared(FILES)}, "application/json"
    )
    forged = b"X" * len(FILES["README"])
    refused = put(researcher, 1, "README", forged)
    assert refused.status_code == 400
    assert refused.json()["received"] == 0
    assert "do not match its declared SHA-256" in refused.json()["detail"]
    assert not storage.blob_path(world.alpha.pk, hashlib.sha256(forged).hexdigest()).exists()
    row = AssetFile.objects.for_workspace(world.alpha).get(path="README")
    assert (row.received, row.stored) == (0, False)
    assert put(researcher, 1, "README", FILES["README"]).json()["stored"] is True


def test_pieces_past_the_declared_size_or_too_large_or_for_a_ready_version_are_refused(
    world: Any, researcher: Any, settings: Any
) -> None:
    researcher.post(
        f"{WIKI}/versions/", {"source": "upload", "files": declared(FILES)}, "application/json"
    )
    readme = FILES["README"]
    past = put(researcher, 1, "README", readme + b"more")
    assert past.status_code == 400
    assert "ends past its declared size" in past.json()["detail"]
    other_total = put(researcher, 1, "README", readme[:5], 0, len(readme) + 1)
    assert other_total.status_code == 400
    assert "was declared as 15 bytes" in other_total.json()["detail"]
    assert put(researcher, 1, "nope.txt", b"x").status_code == 404
    bad_range = researcher.put(
        f"{WIKI}/versions/1/files/README",
        data=readme,
        content_type="application/octet-stream",
        headers={"Content-Range": "bytes 0-3/15"},
    )
    assert bad_range.status_code == 400
    settings.TAU_DATA_UPLOAD_PIECE_BYTES = 2**16
    huge = put(researcher, 1, "train/part-0.txt", b"x" * (2**16 + 1), 0, 2**16 + 1)
    assert huge.status_code == 413
    for path in FILES:
        put(researcher, 1, path, FILES[path])
    late = put(researcher, 1, "README", readme)
    assert late.status_code == 409
    assert "wiki@1 is ready: it takes no more files" in late.json()["detail"]
    assert researcher.get(f"{WIKI}/versions/1/").json()["files_count"] == 3


@pytest.mark.parametrize(
    ("files", "said"),
    [
        ([{"path": "../etc/passwd", "size": 1, "sha256": "0" * 64}], "points outside the folder"),
        ([{"path": "/etc/passwd", "size": 1, "sha256": "0" * 64}], "is absolute"),
        ([{"path": "a\\b", "size": 1, "sha256": "0" * 64}], "backslash"),
        ([{"path": "a", "size": 1, "sha256": "0" * 64}] * 2, "listed twice"),
        ([{"path": "a", "size": -1, "sha256": "0" * 64}], "whole number of bytes"),
        ([{"path": "a", "size": 1, "sha256": "ABC"}], "64 lowercase hex"),
        ([{"path": "a", "size": 1}], "exactly a path, size and sha256"),
        ([], "at least one file"),
        (
            [{"path": f"f{n}", "size": 1, "sha256": "0" * 64} for n in range(4)],
            "holds at most 3",
        ),
        ([{"path": "big", "size": 10**6, "sha256": "0" * 64}], "TAU_DATA_MAX_FILE_BYTES"),
    ],
)
def test_a_bad_declaration_is_refused_and_makes_nothing(
    world: Any, researcher: Any, settings: Any, files: Any, said: str
) -> None:
    settings.TAU_DATA_MAX_FILES = 3
    settings.TAU_DATA_MAX_FILE_BYTES = 10**5
    refused = researcher.post(
        f"{WIKI}/versions/", {"source": "upload", "files": files}, "application/json"
    )
    assert refused.status_code == 400
    assert said in refused.json()["files"][0]
    assert not AssetVersion.objects.for_workspace(world.alpha).exists()


def test_sources_and_names_that_are_not_accepted_say_so(world: Any, researcher: Any) -> None:
    ftp = researcher.post(f"{WIKI}/versions/", {"source": "ftp", "files": []}, "application/json")
    assert ftp.status_code == 400
    assert "'ftp' is not a source here" in ftp.json()["source"][0]
    prefix = researcher.post(f"{WIKI}/versions/", {"source": "prefix"}, "application/json")
    assert prefix.status_code == 400
    assert "A folder of the workspace's own" in prefix.json()["prefix"][0]
    url = researcher.post(f"{WIKI}/versions/", {"source": "url", "files": []}, "application/json")
    assert url.status_code == 400
    assert url.json()["url"] == ["The file's URL, https://…"]
    bad_name = researcher.post(f"{API}/datasets/", {"name": "Wiki!"}, "application/json")
    assert bad_name.status_code == 400
    assert "Not a name here" in bad_name.json()["name"][0]
    twice = researcher.post(f"{API}/datasets/", {"name": "wiki"}, "application/json")
    assert twice.status_code == 409
    assert Asset.objects.for_workspace(world.alpha).count() == 1


def test_verify_finds_a_changed_or_lost_stored_file(world: Any, researcher: Any) -> None:
    researcher.post(
        f"{WIKI}/versions/", {"source": "upload", "files": declared(FILES)}, "application/json"
    )
    for path, data in FILES.items():
        put(researcher, 1, path, data)
    good = researcher.post(f"{WIKI}/versions/1/verify/")
    assert good.status_code == 200
    assert (good.json()["ok"], good.json()["problems"]) == (True, [])
    readme = storage.blob_path(world.alpha.pk, hashlib.sha256(FILES["README"]).hexdigest())
    readme.write_bytes(b"A small corpus\n")  # one bit flipped in the store
    storage.blob_path(
        world.alpha.pk, hashlib.sha256(FILES["train/part-1.txt"]).hexdigest()
    ).unlink()
    bad = researcher.post(f"{WIKI}/versions/1/verify/").json()
    assert bad["ok"] is False
    assert bad["problems"] == [
        "README: the stored copy differs from the manifest (SHA-256)",
        "train/part-1.txt: missing from the store",
    ]
    version = AssetVersion.objects.for_workspace(world.alpha).get(number=1)
    assert version.verified_at is not None
    assert "README" in version.verify_problems
    assert world.client_for("viewer").post(f"{WIKI}/versions/1/verify/").status_code == 403


def test_aliases_are_set_moved_and_removed_by_members(world: Any, researcher: Any) -> None:
    for number, content in ((1, b"one\n"), (2, b"two\n")):
        researcher.post(
            f"{WIKI}/versions/",
            {"source": "upload", "files": declared({"a.txt": content})},
            "application/json",
        )
        put(researcher, number, "a.txt", content)
    alias = f"{WIKI}/aliases/train/"
    set_one = researcher.put(alias, {"version": "1"}, "application/json")
    assert set_one.status_code == 200
    assert set_one.json() == {"alias": "train", "version": 1}
    assert researcher.get(f"{WIKI}/versions/train/").json()["number"] == 1
    assert researcher.put(alias, {"version": "latest"}, "application/json").json()["version"] == 2
    latest = researcher.put(f"{WIKI}/aliases/latest/", {"version": "1"}, "application/json")
    assert latest.status_code == 400
    assert "kept by the catalog" in latest.json()["detail"]
    missing = researcher.put(alias, {"version": "9"}, "application/json")
    assert missing.status_code == 400
    assert researcher.get(f"{WIKI}/versions/train/").json()["number"] == 2
    assert researcher.delete(alias).status_code == 204
    assert researcher.get(f"{WIKI}/versions/train/").status_code == 404
    assert researcher.delete(alias).status_code == 404
    assert researcher.delete(f"{WIKI}/aliases/latest/").status_code == 400


def test_deleting_a_dataset_keeps_blobs_another_dataset_holds(world: Any, researcher: Any) -> None:
    shared, own = b"shared bytes\n", b"only wiki's\n"
    researcher.post(f"{API}/datasets/", {"name": "other"}, "application/json")
    for base, files in ((WIKI, {"s": shared, "o": own}), (f"{API}/datasets/other", {"s": shared})):
        researcher.post(
            f"{base}/versions/", {"source": "upload", "files": declared(files)}, "application/json"
        )
        for path, data in files.items():
            researcher.put(
                f"{base}/versions/1/files/{path}",
                data=data,
                content_type="application/octet-stream",
            )
    blob = {
        data: storage.blob_path(world.alpha.pk, hashlib.sha256(data).hexdigest())
        for data in (shared, own)
    }
    assert all(path.exists() for path in blob.values())
    assert researcher.delete(f"{WIKI}/").status_code == 403  # the workspace admin's call
    assert world.client_for("workspace_admin").delete(f"{WIKI}/").status_code == 204
    assert researcher.get(f"{WIKI}/").status_code == 404
    assert (blob[shared].exists(), blob[own].exists()) == (True, False)
    assert researcher.get(f"{API}/datasets/other/versions/1/").json()["state"] == "ready"


def test_another_workspace_cannot_declare_send_verify_or_alias_here(
    world: Any, researcher: Any
) -> None:
    researcher.post(
        f"{WIKI}/versions/", {"source": "upload", "files": declared(FILES)}, "application/json"
    )
    outsider = world.client_for("outsider")
    assert (
        outsider.post(
            f"{WIKI}/versions/", {"source": "upload", "files": declared(FILES)}, "application/json"
        ).status_code
        == 404
    )
    assert put(outsider, 1, "README", FILES["README"]).status_code == 404
    assert outsider.post(f"{WIKI}/versions/1/verify/").status_code == 404
    assert (
        outsider.put(f"{WIKI}/aliases/x/", {"version": "1"}, "application/json").status_code == 404
    )
    row = AssetFile.objects.for_workspace(world.alpha).get(path="README")
    assert (row.received, row.stored) == (0, False)


def test_a_declaration_and_a_piece_may_be_larger_than_other_json_bodies(
    world: Any, researcher: Any, settings: Any
) -> None:
    """Django's limit for JSON (2.5 MiB) would refuse a declaration of 20,000 files; the
    catalog's routes set their own, in both web servers' guards: a streamed declaration's
    (1 KiB a file on average), and a JSON body's own, smaller one in its parser."""
    from catalog.uploads import DECLARATION_BYTES
    from web.asgi import body_limit

    assert body_limit("api:dataset-version-file", "PUT") == settings.TAU_DATA_UPLOAD_PIECE_BYTES
    assert body_limit("api:model-versions", "POST") == 1_000_001 * 1024
    settings.TAU_DATA_MAX_FILES = 10
    assert body_limit("api:model-versions", "POST") == DECLARATION_BYTES
    settings.TAU_DATA_MAX_FILES = 1_000_000
    assert body_limit("api:model-versions", "GET") == settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    assert body_limit("api:run-list", "POST") != DECLARATION_BYTES
    files = [
        {"path": f"shards/{n:05}/tokens.bin", "size": n, "sha256": f"{n:064x}"}
        for n in range(25_000)
    ]
    body = json.dumps({"source": "upload", "files": files})
    assert len(body) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    started = researcher.post(f"{WIKI}/versions/", body, "application/json")
    assert started.status_code == 201, started.content[:300]
    assert started.json()["files_missing"] == 25_000
    assert started.json()["progress"]["bytes_total"] == sum(range(25_000))


def test_options_describes_every_catalog_route(world: Any, researcher: Any) -> None:
    researcher.post(
        f"{WIKI}/versions/", {"source": "upload", "files": declared(FILES)}, "application/json"
    )
    for path in (
        "/",
        "/wiki/",
        "/wiki/versions/",
        "/wiki/versions/1/",
        "/wiki/versions/1/files/",
        "/wiki/versions/1/files/README",
        "/wiki/versions/1/verify/",
        "/wiki/aliases/train/",
        "/nothing/aliases/train/",
    ):
        answer = researcher.options(f"{API}/datasets{path}")
        assert answer.status_code in (200, 404), (path, answer.content[:300])
    described = researcher.options(f"{API}/datasets/").json()
    assert "name" in described["actions"]["POST"]
    # Each write by its own body (DRF asks as the action "metadata": each was the asset's).
    versions = researcher.options(f"{API}/datasets/wiki/versions/").json()
    assert "source" in versions["actions"]["POST"]
    alias = researcher.options(f"{API}/datasets/wiki/aliases/train/").json()
    assert set(alias["actions"]["PUT"]) == {"version"}


# --- Streamed declarations (JSON lines) --------------------------------------------------------

NDJSON = "application/x-ndjson"


class GeneratedBody(ChunkStream):
    """A request body made as it is read, from an iterator of byte strings: a declaration of
    a million files that never exists whole in the test either."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.pulled = 0  # chunks taken from the iterator so far
        super().__init__(self._counted(chunks))

    def _counted(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        for chunk in chunks:
            self.pulled += 1
            yield chunk


def synthetic(count: int, *, size: int = 1) -> Iterator[dict[str, Any]]:
    """``count`` files sorted by path, fake SHA-256s (a declaration is not checked against
    bytes until they are sent)."""
    for n in range(count):
        yield {
            "path": f"shards/{n // 1000:04}/part-{n % 1000:03}.bin",
            "size": size + n % 7,
            "sha256": f"{n:064x}",
        }


def ndjson(
    header: dict[str, Any], files: Callable[[], Iterator[dict[str, Any]]]
) -> Callable[[], Iterator[bytes]]:
    def lines() -> Iterator[bytes]:
        yield json.dumps(header).encode() + b"\n"
        for item in files():
            yield json.dumps(item).encode() + b"\n"

    return lines


def stream(
    client: Any,
    lines: Callable[[], Iterator[bytes]],
    base: str = WIKI,
    *,
    length: int | None = None,
) -> Any:
    """POST the declaration ``lines()`` makes, generated while it is read; its length from a
    first pass (as a client's spool file gives it) unless given."""
    if length is None:
        length = sum(map(len, lines()))
    body = io.BufferedReader(GeneratedBody(lines()), buffer_size=64 * 1024)
    answer = client.generic(
        "POST",
        f"{base}/versions/",
        b"-",  # replaced by the generated body below
        content_type=NDJSON,
        **{"wsgi.input": body, "CONTENT_LENGTH": str(length)},
    )
    answer.generated = body.raw
    return answer


def files_of(world: Any, version: int, asset: str = "wiki") -> Any:
    return AssetFile.objects.for_workspace(world.alpha).filter(
        version__asset__name=asset, version__number=version
    )


def test_a_streamed_declaration_is_the_json_ones_version_with_the_same_digest(
    world: Any, researcher: Any
) -> None:
    """Both forms of the same files: one manifest digest, and while the upload is unfinished,
    one version, whichever form declares it again. Paths of every kind sort by code point."""
    paths = ["README", "a!x", "a/b", "a0", "ä/x", "名前 with spaces.json", "z" * 1000, "😀.bin"]
    files = [
        {"path": path, "size": n, "sha256": hashlib.sha256(path.encode()).hexdigest()}
        for n, path in enumerate(paths)
    ] + list(synthetic(3000))
    files.sort(key=lambda item: item["path"])
    expected = Manifest.of(Entry(**item) for item in files)

    started = stream(
        researcher, ndjson({"source": "upload", "files_count": len(files)}, lambda: iter(files))
    )
    assert started.status_code == 201, started.json()
    body = started.json()
    assert (body["number"], body["state"], body["files_missing"]) == (1, "ingesting", len(files))
    assert body["progress"] == {"bytes_done": 0, "bytes_total": expected.total_bytes}
    version = AssetVersion.objects.for_workspace(world.alpha).get(number=1)
    assert version.declared_digest == expected.digest
    assert version.source_detail == f"{len(files):,} files uploaded"
    recorded = files_of(world, 1).order_by("path").values_list("path", "size", "sha256", "stored")
    assert [row[:3] for row in recorded] == [(e.path, e.size, e.sha256) for e in expected.files]
    assert not any(row[3] for row in recorded)

    # The same files again, streamed or as JSON, are that version, to go on with.
    again = stream(
        researcher, ndjson({"source": "upload", "files_count": len(files)}, lambda: iter(files))
    )
    assert (again.status_code, again.json()["number"]) == (200, 1)
    as_json = researcher.post(
        f"{WIKI}/versions/", {"source": "upload", "files": files}, "application/json"
    )
    assert (as_json.status_code, as_json.json()["number"]) == (200, 1)
    assert files_of(world, 1).count() == len(files)

    # The JSON form of the same files, declared first elsewhere, has the same digest.
    researcher.post(f"{API}/datasets/", {"name": "other"}, "application/json")
    other = researcher.post(
        f"{API}/datasets/other/versions/",
        {"source": "upload", "files": list(reversed(files))},
        "application/json",
    )
    assert other.status_code == 201
    assert (
        AssetVersion.objects.for_workspace(world.alpha).get(asset__name="other").declared_digest
        == expected.digest
    )


def test_a_streamed_upload_is_sent_and_made_ready_and_files_held_count_as_sent(
    world: Any, researcher: Any, tmp_path: Path
) -> None:
    ingest_folder(
        asset_named(world.alpha, "dataset", "wiki"),
        folder(tmp_path / "held", {"README": FILES["README"]}),
        source="upload",
    )
    files = sorted(declared(FILES), key=lambda item: item["path"])
    started = stream(
        researcher, ndjson({"source": "upload", "files_count": 3}, lambda: iter(files))
    )
    assert started.status_code == 201, started.json()
    body = started.json()
    assert (body["number"], body["files_missing"]) == (2, 2)  # README is in the store
    assert body["progress"]["bytes_done"] == len(FILES["README"])
    for path in ("train/part-0.txt", "train/part-1.txt"):
        put(researcher, 2, path, FILES[path])
    version = researcher.get(f"{WIKI}/versions/2/").json()
    assert (version["state"], version["manifest_digest"]) == (
        "ready",
        scan(folder(tmp_path / "local", FILES)).digest,
    )


def peak_growth(action: Callable[[], Any]) -> tuple[int, Any]:
    """How far this process's resident memory rose above where it started, at its highest,
    while ``action`` ran (Linux: the high-water mark is reset first, and what the allocators
    hold free is handed back, so that the action cannot hide in memory freed earlier)."""

    def kib(field: str) -> int:
        found = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
        assert found is not None
        return int(found.group(1))

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    before = kib("VmRSS")
    result = action()
    return (kib("VmHWM") - before) * 1024, result


@pytest.mark.slow  # generates, parses and records 200,000 files (10-20 s)
def test_two_hundred_thousand_files_are_declared_in_the_memory_of_a_few(
    world: Any, researcher: Any
) -> None:
    """The streamed form holds a line and a batch of rows, whatever the count: declaring
    200,000 files raises the portal's peak memory less than the JSON form raises it for a
    tenth of them (what the JSON form needs grows with the files: the body, its parse, the
    manifest), and the version records every one."""
    count = 200_000
    lines = ndjson({"source": "upload", "files_count": count}, lambda: synthetic(count))
    streamed_growth, started = peak_growth(lambda: stream(researcher, lines))
    assert started.status_code == 201, started.json()
    assert (started.json()["number"], started.json()["files_missing"]) == (1, count)
    assert files_of(world, 1).count() == count

    researcher.post(f"{API}/datasets/", {"name": "other"}, "application/json")
    body = json.dumps({"source": "upload", "files": [*synthetic(count // 10)]})
    json_growth, as_json = peak_growth(
        lambda: researcher.post(f"{API}/datasets/other/versions/", body, "application/json")
    )
    assert as_json.status_code == 201
    assert streamed_growth < json_growth, (streamed_growth, json_growth)
    assert streamed_growth < 24 * 2**20, streamed_growth


def test_a_declaration_of_more_files_than_a_version_holds_is_refused_at_its_count(
    world: Any, researcher: Any
) -> None:
    """A million and one files: refused from the first line, which says how many follow,
    without reading the rest."""
    too_many = stream(
        researcher,
        ndjson({"source": "upload", "files_count": 1_000_001}, lambda: synthetic(1_000_001)),
        length=1_000_001 * 126,  # about what it is, not generated twice to find out
    )
    assert too_many.status_code == 400
    assert too_many.json()["files"] == [
        "1,000,001 files: a version holds at most 1,000,000 (TAU_DATA_MAX_FILES)."
    ]
    assert too_many.generated.pulled < 1000
    assert not AssetVersion.objects.for_workspace(world.alpha).exists()


def test_more_files_than_the_first_line_said_are_refused_before_any_is_recorded(
    world: Any, researcher: Any, settings: Any
) -> None:
    settings.TAU_DATA_MAX_FILES = 1000
    lying = stream(
        researcher, ndjson({"source": "upload", "files_count": 1000}, lambda: synthetic(1001))
    )
    assert lying.status_code == 400
    assert lying.json()["files"] == ["Line 1,002: more files than the 1,000 line 1 declares."]
    fewer = stream(
        researcher, ndjson({"source": "upload", "files_count": 1000}, lambda: synthetic(999))
    )
    assert fewer.json()["files"] == ["Line 1 declares 1,000 files; 999 followed. Send them all."]
    assert not AssetVersion.objects.for_workspace(world.alpha).exists()
    assert not AssetFile.objects.for_workspace(world.alpha).exists()


@pytest.mark.slow  # reads a million lines
def test_a_million_and_one_files_are_refused_and_nothing_is_recorded(
    world: Any, researcher: Any
) -> None:
    lying = stream(
        researcher,
        ndjson({"source": "upload", "files_count": 1_000_000}, lambda: synthetic(1_000_001)),
    )
    assert lying.status_code == 400
    assert lying.json()["files"] == [
        "Line 1,000,002: more files than the 1,000,000 line 1 declares."
    ]
    assert not AssetVersion.objects.for_workspace(world.alpha).exists()
    assert not AssetFile.objects.for_workspace(world.alpha).exists()


def entry(path: str, size: Any = 1, sha256: str = "0" * 64) -> bytes:
    return json.dumps({"path": path, "size": size, "sha256": sha256}).encode() + b"\n"


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        (entry("a/../../etc/passwd"), "Line 2,502: 'a/../../etc/passwd' points outside the folder"),
        (entry("/etc/passwd"), "Line 2,502: '/etc/passwd' is absolute"),
        (
            entry("shards/0002/part-499.bin"),
            "Line 2,502: 'shards/0002/part-499.bin' is listed twice.",
        ),
        (
            entry("shards/0002/part-500.bin", -1),
            "Line 2,502: 'shards/0002/part-500.bin': its size must be a whole number of bytes.",
        ),
        (
            entry("shards/0002/part-500.bin", 1, "X" * 64),
            "its sha256 must be 64 lowercase hex digits",
        ),
        (
            entry("shards/0000/part-000.bin/x"),
            "Line 2,502: 'shards/0000/part-000.bin/x' comes after 'shards/0002/part-499.bin': "
            "list the files sorted by path",
        ),
        (
            entry("shards/0002/part-499.bin/x"),
            "Line 2,502: 'shards/0002/part-499.bin' is a file and also the folder of "
            "'shards/0002/part-499.bin/x'.",
        ),
        (
            entry("shards/0002/part-500.bin", 10**6),
            "Line 2,502: shards/0002/part-500.bin is 1,000,000 bytes; one file may be at most "
            "100,000",
        ),
        (
            b'{"path": "x", "size": 1}\n',
            "Line 2,502: Each file of a manifest has exactly a path, size and sha256.",
        ),
        (b"{not json\n", "Line 2,502: not JSON in UTF-8."),
        (b'"' + b"x" * 20000 + b'"\n', "Line 2,502 is longer than 16,384 bytes."),
        (
            entry("shards/0002/part-500\u202e.bin"),
            "Line 2,502: The path 'shards/0002/part-500\\u202e.bin' must be printable text",
        ),
    ],
)
def test_a_bad_line_in_the_middle_of_a_stream_is_named_and_nothing_is_kept(
    world: Any, researcher: Any, settings: Any, bad: bytes, said: str
) -> None:
    settings.TAU_DATA_MAX_FILE_BYTES = 10**5

    def lines() -> Iterator[bytes]:
        yield json.dumps({"source": "upload", "files_count": 5001}).encode() + b"\n"
        for number, item in enumerate(synthetic(5000)):
            if number == 2500:
                yield bad
            yield json.dumps(item).encode() + b"\n"

    refused = stream(researcher, lines)
    assert refused.status_code == 400, refused.json()
    assert said in refused.json()["files"][0], refused.json()
    assert not AssetVersion.objects.for_workspace(world.alpha).exists()
    assert not AssetFile.objects.for_workspace(world.alpha).exists()


@pytest.mark.parametrize(
    ("first", "said"),
    [
        (b"[1, 2]\n", 'Line 1 is a JSON object, {"source": "upload", "files_count": N}'),
        (b'{"source": "url", "files_count": 1}\n', 'Line 1\'s source is "upload"'),
        (b'{"source": "upload"}\n', "Line 1's files_count is the number of files that follow"),
        (b'{"source": "upload", "files_count": 1, "files": []}\n', "Line 1 holds 'files'"),
    ],
)
def test_a_first_line_that_is_not_a_declarations_is_refused(
    world: Any, researcher: Any, first: bytes, said: str
) -> None:
    refused = stream(researcher, lambda: iter([first, entry("a")]))
    assert refused.status_code == 400
    assert said in [*refused.json().get("files", []), refused.json()["detail"]][0]
    assert not AssetVersion.objects.for_workspace(world.alpha).exists()


def test_a_streamed_upload_past_the_quota_is_refused_with_the_numbers(
    world: Any, researcher: Any, tmp_path: Path
) -> None:
    ingest_folder(
        asset_named(world.alpha, "dataset", "wiki"),
        folder(tmp_path / "one", {"a.bin": b"a" * 60}),
        source="upload",
    )
    world.alpha.storage_quota_bytes = 100
    world.alpha.save()
    files = declared({"a.bin": b"a" * 60, "b.bin": b"b" * 50})
    refused = stream(
        researcher, ndjson({"source": "upload", "files_count": 2}, lambda: iter(files))
    )
    assert refused.status_code == 400
    assert refused.json()["files"] == [
        "This upload needs 50 more bytes, and alpha keeps 60 of its 100-byte storage quota: "
        "delete versions it no longer needs, or ask the platform team for more."
    ]
    assert AssetVersion.objects.for_workspace(world.alpha).count() == 1
    assert AssetFile.objects.for_workspace(world.alpha).count() == 1


def test_a_json_declaration_past_its_limit_or_a_stream_without_a_length_is_refused_unread(
    world: Any, researcher: Any
) -> None:
    from catalog.uploads import DECLARATION_BYTES

    large = researcher.generic(
        "POST",
        f"{WIKI}/versions/",
        b'{"source": "upload", "files": []}',
        content_type="application/json",
        CONTENT_LENGTH=str(DECLARATION_BYTES + 1),
    )
    assert large.status_code == 413
    assert "stream it as JSON lines (application/x-ndjson" in large.json()["detail"]
    unsized = researcher.generic("POST", f"{WIKI}/versions/", b"", CONTENT_TYPE=NDJSON)
    assert unsized.status_code == 411
    empty = researcher.generic(
        "POST", f"{WIKI}/versions/", b"", CONTENT_TYPE=NDJSON, CONTENT_LENGTH="0"
    )
    assert empty.status_code == 400
    assert "An empty declaration" in empty.json()["detail"]
    assert not AssetVersion.objects.for_workspace(world.alpha).exists()


def test_the_last_file_kept_checks_the_rows_in_code_point_order_and_names_a_lost_blob(
    world: Any, researcher: Any, tmp_path: Path
) -> None:
    """The digest of what was kept is taken row by row in code-point order, whatever the
    database's collation (the suite's sorts by code point; others sort 'a' before 'B', so
    the query says COLLATE "C"); a file counted as sent whose blob is gone by the end is
    named, and the version fails."""
    files = {name: f"{name}\n".encode() for name in ("B", "Z", "a", "e", "é", "名", "a/b")}
    files.pop("a")  # 'a' would be a file and the folder of 'a/b'
    entries = sorted(declared(files), key=lambda item: item["path"])
    started = stream(
        researcher, ndjson({"source": "upload", "files_count": 6}, lambda: iter(entries))
    )
    assert started.status_code == 201, started.json()
    *first, (last, data) = files.items()
    for path, content in first:
        put(researcher, 1, path, content)
    with CaptureQueriesContext(connection) as queries:
        put(researcher, 1, last, data)
    assert any('ORDER BY "catalog_assetfile"."path" COLLATE "C"' in q["sql"] for q in queries)
    ready = researcher.get(f"{WIKI}/versions/1/").json()
    assert (ready["state"], ready["manifest_digest"]) == (
        "ready",
        scan(folder(tmp_path / "local", files)).digest,
    )

    # Version 2 holds 'B' already (version 1's blob), which is lost before its last file.
    more = {**files, "new.txt": b"new\n"}
    entries = sorted(declared(more), key=lambda item: item["path"])
    started = stream(
        researcher, ndjson({"source": "upload", "files_count": 7}, lambda: iter(entries))
    )
    assert started.json()["files_missing"] == 1
    storage.blob_path(world.alpha.pk, hashlib.sha256(files["B"]).hexdigest()).unlink()
    assert put(researcher, 2, "new.txt", b"new\n").json()["version_state"] == "failed"
    failed = researcher.get(f"{WIKI}/versions/2/").json()
    assert failed["error"] == "B: its stored copy is missing or incomplete."
