"""tau/manifest.py: the manifest of a folder (issue 33) — what a dataset or model version is.
Built and checked the same way by the tau client and the portal; agrees with ``sha256sum``;
refuses what is not a plain file or path, and the limits, before reading a byte; streams."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import socket
import subprocess
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from tau import manifest
from tau.manifest import Entry, Known, Manifest, ManifestError, check_path, scan, verify


def tree(root: Path) -> Path:
    """A folder with nested, empty, hidden and non-ASCII files."""
    (root / "train" / "shards").mkdir(parents=True)
    (root / "train" / "shards" / "00.txt").write_bytes(b"the quick brown fox\n" * 100)
    (root / "train" / "shards" / "01.txt").write_bytes(b"jumps over the lazy dog\n")
    (root / "empty.bin").write_bytes(b"")
    (root / ".meta").write_text("hidden, but data all the same\n")
    (root / "名前 with spaces.json").write_text('{"ok": true}\n')
    (root / "nothing-inside").mkdir()
    return root


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_manifest_lists_every_regular_file_with_its_size_and_sha256(tmp_path: Path) -> None:
    built = scan(tree(tmp_path / "data"))
    assert [entry.path for entry in built.files] == [
        ".meta",
        "empty.bin",
        "train/shards/00.txt",
        "train/shards/01.txt",
        "名前 with spaces.json",
    ]
    assert built.get("train/shards/00.txt") == Entry(
        "train/shards/00.txt", 2000, sha256(b"the quick brown fox\n" * 100)
    )
    assert built.get("empty.bin") == Entry("empty.bin", 0, sha256(b""))
    assert built.files_count == 5
    assert built.total_bytes == 2000 + 24 + 0 + 30 + 13


@pytest.mark.slow  # runs coreutils' sha256sum
def test_the_file_lines_are_exactly_what_sha256sum_prints(tmp_path: Path) -> None:
    root = tree(tmp_path / "data")
    built = scan(root)
    files = sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file())
    printed = subprocess.run(
        ["sha256sum", "--", *files], cwd=root, capture_output=True, text=True, check=True
    ).stdout
    assert built.sha256sum() == printed
    # And the copy checks with nothing but coreutils.
    (tmp_path / "SHA256SUMS").write_text(built.sha256sum())
    checked = subprocess.run(
        ["sha256sum", "--check", "--strict", str(tmp_path / "SHA256SUMS")],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_digest_is_the_sha256_of_the_documented_canonical_form() -> None:
    one = Manifest.of([Entry("b/ü.txt", 3, "a" * 64), Entry("a.txt", 0, "b" * 64)])
    canonical = (
        '{"files":[{"path":"a.txt","sha256":"' + "b" * 64 + '","size":0},'
        '{"path":"b/ü.txt","sha256":"' + "a" * 64 + '","size":3}],"format":1}'
    ).encode()
    assert one.canonical() == canonical
    assert one.digest == "sha256:" + sha256(canonical)


def test_the_digest_follows_the_bytes_and_names_not_the_order_of_writing(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    for root, names in ((first, ["a", "b", "c"]), (second, ["c", "a", "b"])):
        root.mkdir()
        for name in names:
            (root / name).write_text(f"file {name}\n")
    assert scan(first).digest == scan(second).digest
    (second / "b").write_text("file B\n")  # the same size, one byte differs
    assert scan(first).digest != scan(second).digest
    (second / "b").write_text("file b\n")
    (second / "b").rename(second / "d")
    assert scan(first).digest != scan(second).digest


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("", "1 to 1024 characters"),
        ("x" * 1025, "1 to 1024 characters"),
        ("/etc/passwd", "is absolute"),
        ("../secrets", "outside the folder"),
        ("a/../../b", "outside the folder"),
        ("a//b", "empty or '.' part"),
        ("./a", "empty or '.' part"),
        ("a/", "empty or '.' part"),
        ("a\\b", "backslash"),
        ("gnp\u202e.exe", "U+202E"),
        ("line\nbreak", "U+000A"),
        ("bad\udcff", "not valid UTF-8"),
    ],
)
def test_a_path_that_is_not_plain_and_relative_is_refused(path: str, why: str) -> None:
    with pytest.raises(ManifestError, match=re.escape(why)):
        check_path(path)


@pytest.mark.parametrize("path", ["a", "a/b.txt", "ü/日本.txt", "with space", ".hidden/x"])
def test_a_plain_relative_path_is_kept_as_written(path: str) -> None:
    assert check_path(path) == path


def special(root: Path, kind: str) -> Path:
    target = root / "real.txt"
    target.write_text("real\n")
    if kind == "symlink to a file":
        (root / "link").symlink_to(target)
    elif kind == "symlink to a folder":
        (root / "outside").mkdir()
        (root / "link").symlink_to(root / "outside", target_is_directory=True)
    elif kind == "dangling symlink":
        (root / "link").symlink_to(root / "nowhere")
    elif kind == "FIFO":
        os.mkfifo(root / "link")
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(root / "link"))
        server.close()
    return root / "link"


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("symlink to a file", "a symlink"),
        ("symlink to a folder", "a symlink"),
        ("dangling symlink", "a symlink"),
        ("FIFO", "a named pipe (FIFO)"),
        ("socket", "a socket"),
    ],
)
def test_anything_but_files_and_folders_is_refused_with_its_path_before_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, said: str
) -> None:
    root = tmp_path / "data"
    (root / "deep").mkdir(parents=True)
    special(root / "deep", kind)
    read: list[Path] = []
    monkeypatch.setattr(manifest, "hash_file", lambda path, *a, **k: read.append(path))
    with pytest.raises(ManifestError) as refused:
        scan(root)
    assert str(refused.value) == f"deep/link is {said}; only files and folders are kept."
    assert read == []


def test_a_file_swapped_for_a_symlink_after_the_listing_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").write_text("real\n")
    (tmp_path / "swapped").symlink_to(tmp_path / "real")
    with pytest.raises(ManifestError, match="swapped is a symlink"):
        manifest.hash_file(tmp_path / "swapped", name="swapped")
    os.mkfifo(tmp_path / "pipe")  # opened without blocking, then refused
    with pytest.raises(ManifestError, match="pipe is no longer a regular file"):
        manifest.hash_file(tmp_path / "pipe", name="pipe")


def test_the_limits_are_checked_from_the_listing_before_a_byte_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "data"
    root.mkdir()
    for number in range(4):
        (root / f"{number}.bin").write_bytes(b"x" * (10 + number))
    read: list[Path] = []
    monkeypatch.setattr(manifest, "hash_file", lambda path, *a, **k: read.append(path))
    with pytest.raises(ManifestError, match="more than 3 files, the most allowed"):
        scan(root, max_files=3)
    with pytest.raises(
        ManifestError, match=re.escape("3.bin is 13 bytes; one file may have at most 12")
    ):
        scan(root, max_file_bytes=12)
    assert read == []


def test_a_file_that_changes_while_it_is_read_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "data"
    root.mkdir()
    (root / "growing.log").write_text("line 1\n")
    real = manifest.hash_file

    def read_while_it_grows(path: Path, *args: Any, **kwargs: Any) -> tuple[int, str]:
        result = real(path, *args, **kwargs)
        with path.open("a") as file:
            file.write("line 2\n")
        return result

    monkeypatch.setattr(manifest, "hash_file", read_while_it_grows)
    with pytest.raises(ManifestError, match=re.escape("growing.log changed while it was read")):
        scan(root)


def test_a_resumed_scan_reads_only_what_changed_or_is_new(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tree(tmp_path / "data")
    kept: dict[str, Known] = {}
    first = scan(
        root,
        on_file=lambda entry, mtime: kept.update(
            {entry.path: Known(entry.size, mtime, entry.sha256)}
        ),
    )
    assert set(kept) == {entry.path for entry in first.files}
    (root / "train" / "shards" / "01.txt").write_text("a new second shard\n")
    (root / "late.txt").write_text("added after the interruption\n")
    read: list[str] = []
    real = manifest.hash_file

    def counting(path: Path, *args: Any, **kwargs: Any) -> tuple[int, str]:
        read.append(str(path.relative_to(root)))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(manifest, "hash_file", counting)
    resumed = scan(root, known=kept)
    assert sorted(read) == ["late.txt", "train/shards/01.txt"]
    monkeypatch.setattr(manifest, "hash_file", real)
    assert resumed == scan(root)


def test_progress_counts_every_byte_up_to_the_total(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    (root / "big.bin").write_bytes(os.urandom(3 * manifest.PROGRESS_EVERY_BYTES // 2))
    (root / "small.bin").write_bytes(b"s" * 1000)
    said: list[tuple[int, int]] = []
    built = scan(root, progress=lambda done, total: said.append((done, total)))
    assert said[-1] == (built.total_bytes, built.total_bytes)
    assert len(said) >= 2  # during the large file, and at the end
    assert [done for done, _ in said] == sorted(done for done, _ in said)


def test_hashing_takes_the_same_memory_for_any_file_size(tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    with big.open("wb") as file:
        file.truncate(96 * 1024 * 1024)  # sparse: 96 MiB of zeros, nothing on the disk
    tracemalloc.start()
    try:
        size, digest = manifest.hash_file(big)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert size == 96 * 1024 * 1024
    zeros = hashlib.sha256()
    for _ in range(96):
        zeros.update(bytes(1024 * 1024))
    assert digest == zeros.hexdigest()
    assert peak < 3 * manifest.CHUNK_BYTES, peak


def test_verify_names_every_file_that_differs_from_the_manifest(tmp_path: Path) -> None:
    root = tree(tmp_path / "data")
    recorded = scan(root)
    assert verify(root, recorded) == []
    (root / "train" / "shards" / "00.txt").write_bytes(b"THE quick brown fox\n" + b"x" * 1980)
    (root / "train" / "shards" / "01.txt").write_bytes(b"cut")
    (root / ".meta").unlink()
    (root / "stray.tmp").write_text("left behind\n")
    problems = verify(root, recorded)
    assert [str(problem) for problem in problems] == [
        ".meta: missing",
        "stray.tmp: not in the manifest",
        "train/shards/00.txt: its content differs (SHA-256)",
        "train/shards/01.txt: its size differs",
    ]


def test_a_manifest_from_json_round_trips_and_refuses_what_could_not_be_files() -> None:
    built = Manifest.of([Entry("a/b.txt", 3, "c" * 64), Entry("a/c.txt", 1, "d" * 64)])
    assert Manifest.from_dict(built.as_dict()) == built
    file = {"path": "x", "size": 1, "sha256": "e" * 64}
    refused = [
        ({"format": 2, "files": []}, "format 1"),
        ({"format": 1, "files": {}}, "are a list"),
        ({"format": 1, "files": [file, file]}, "listed twice"),
        ({"format": 1, "files": [{**file, "size": -1}]}, "whole number of bytes"),
        ({"format": 1, "files": [{**file, "size": True}]}, "whole number of bytes"),
        ({"format": 1, "files": [{**file, "size": 1.5}]}, "whole number of bytes"),
        ({"format": 1, "files": [{**file, "sha256": "E" * 64}]}, "64 lowercase hex digits"),
        ({"format": 1, "files": [{**file, "mode": 0o777}]}, "exactly a path, size and sha256"),
        ({"format": 1, "files": [{**file, "path": "../x"}]}, "outside the folder"),
        ({"format": 1, "files": [{**file, "path": 7}]}, "path is text"),
        (
            {"format": 1, "files": [file, {**file, "path": "x/y"}]},
            "'x' is a file and also the folder of 'x/y'",
        ),
    ]
    for data, why in refused:
        with pytest.raises(ManifestError, match=re.escape(why)):
            Manifest.from_dict(data)
    with pytest.raises(ManifestError, match="holds at most 1"):
        Manifest.from_dict({"format": 1, "files": [file, {**file, "path": "y"}]}, max_files=1)


def test_a_missing_folder_or_a_file_given_as_the_folder_is_said_plainly(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="does not exist"):
        scan(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ManifestError, match="is not a folder"):
        scan(tmp_path / "file")


def _parents(paths: set[str]) -> set[str]:
    """Every path, and every folder above one, as a path of its own."""
    found = set(paths)
    for path in paths:
        while "/" in path:
            path = path.rpartition("/")[0]
            found.add(path)
    return found


def add_all(streamed: manifest.StreamedManifest, entries: list[Entry]) -> None:
    for entry in entries:
        streamed.add(entry)


def test_a_streamed_manifest_checks_and_hashes_as_the_manifest_does() -> None:
    """Entries added one at a time, in path order, give the digest, count and bytes of
    Manifest.of for the same entries, and are refused where it refuses them: random paths of
    every kind (characters that sort around '/', non-ASCII, quotes, files that are also
    folders), each set both ways."""
    alphabet = ["a", "b", "!", "-", ".", "0", "é", "名", "😀", '"', "~", " "]
    rng = random.Random(33)
    refused = 0
    for _ in range(400):
        paths = set()
        for _ in range(rng.randint(1, 30)):
            parts = [
                "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 3)))
                for _ in range(rng.randint(1, 3))
            ]
            with contextlib.suppress(ManifestError):
                paths.add(check_path("/".join(parts)))
        entries = [Entry(p, rng.randint(0, 10**12), sha256(p.encode())) for p in paths]
        streamed = manifest.StreamedManifest()
        paths_of = {entry.path for entry in entries}
        if any(path.rpartition("/")[0] in paths_of for path in _parents(paths_of)):
            # Only a file that is also a folder is left to refuse here (which pair is named
            # first may differ: Manifest.of looks at a set).
            refused += 1
            with pytest.raises(ManifestError, match="is a file and also the folder of"):
                Manifest.of(entries)
            with pytest.raises(ManifestError, match="is a file and also the folder of"):
                add_all(streamed, sorted(entries))
            continue
        whole = Manifest.of(entries)
        lines = [streamed.add(entry) for entry in sorted(entries)]
        assert (streamed.digest, streamed.files_count, streamed.total_bytes) == (
            whole.digest,
            whole.files_count,
            whole.total_bytes,
        )
        assert [json.loads(line) for line in lines] == whole.as_dict()["files"]
    assert 20 < refused < 380  # both kinds of set were tried


def test_a_streamed_manifest_refuses_what_is_out_of_order_twice_or_too_many() -> None:
    streamed = manifest.StreamedManifest(max_files=3)
    assert streamed.digest == Manifest.of([]).digest
    streamed.add(Entry("b", 1, "a" * 64))
    with pytest.raises(ManifestError, match="'b' is listed twice"):
        streamed.add(Entry("b", 1, "a" * 64))
    with pytest.raises(ManifestError, match="'a' comes after 'b': list the files sorted by path"):
        streamed.add(Entry("a", 1, "a" * 64))
    with pytest.raises(ManifestError, match="'b' is a file and also the folder of 'b/c'"):
        streamed.add(Entry("b/c", 1, "a" * 64))
    streamed.add(Entry("b!", 1, "a" * 64))
    with pytest.raises(ManifestError, match="'b' is a file and also the folder of 'b/c'"):
        streamed.add(Entry("b/c", 1, "a" * 64))  # 'b!' between them: still found
    streamed.add(Entry("c", 2, "a" * 64))
    with pytest.raises(ManifestError, match="More than 3 files"):
        streamed.add(Entry("d", 1, "a" * 64))
    assert (streamed.files_count, streamed.total_bytes) == (3, 4)


def test_a_folder_is_walked_in_path_order_a_file_at_a_time(tmp_path: Path) -> None:
    """A folder sorts where its files' paths sort (``a!x`` before ``a/b``, ``a/b`` before
    ``a0``), so the walk needs no sorting of the whole listing."""
    names = ["a/b", "a!x", "a0", "ab/c", "z/é/名", "z/e", "a.b/c", "a-b", "a/b!/x", "a/b0"]
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    walked = [item.path for item in manifest.walk_files(tmp_path)]
    assert walked == sorted(names) == [item.path for item in manifest.list_files(tmp_path)]
