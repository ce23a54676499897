"""Uploads over the API (issue 33): the files declared first, then sent in pieces that may
stop anywhere and go on from where the portal says; nothing ``ready`` that is not whole and
checked, nothing stored of a refused declaration, no piece of another workspace's version."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from catalog import storage
from catalog.models import Asset, AssetFile, AssetVersion
from tau.manifest import scan
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
    catalog's routes set their own, in both web servers' guards."""
    from catalog.uploads import DECLARATION_BYTES
    from web.asgi import body_limit

    assert body_limit("api:dataset-version-file", "PUT") == settings.TAU_DATA_UPLOAD_PIECE_BYTES
    assert body_limit("api:model-versions", "POST") == DECLARATION_BYTES
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
