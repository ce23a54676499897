"""Code bundles: what is refused (and that a refusal leaves nothing behind anywhere), what is
kept (once per content), and unpacking only into a fresh directory.

Hostile archives are built byte by byte where zipfile would not write them: a zip bomb of
1 GiB of zeros (made from one repeated deflate block, so the test stays small and fast),
headers that lie about sizes, names that are not UTF-8.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import struct
import uuid
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse

from runs import bundles, submission
from runs.bundles import BundleRejected
from runs.models import CodeBundle, Run
from tests.runs.factories import TINY_SPEC

pytestmark = pytest.mark.django_db

GIB = 2**30
MIB = 2**20
UNIX = 3  # "version made by" high byte: external attributes hold a Unix mode


# ---------------------------------------------------------------------------------------------
# Building archives by hand
# ---------------------------------------------------------------------------------------------


@dataclass
class Entry:
    name: bytes
    data: bytes  # as stored (compressed when method is DEFLATED)
    file_size: int
    crc: int
    method: int = zipfile.ZIP_DEFLATED
    flags: int = 0
    mode: int = stat.S_IFREG | 0o644


def raw_zip(entries: list[Entry]) -> bytes:
    """A zip archive exactly as described: local headers, data, central directory, end."""
    out = io.BytesIO()
    central = io.BytesIO()
    for entry in entries:
        offset = out.tell()
        out.write(
            struct.pack(
                "<IHHHHHIIIHH",
                0x04034B50,
                20,
                entry.flags,
                entry.method,
                0,
                0x21,
                entry.crc,
                len(entry.data),
                entry.file_size,
                len(entry.name),
                0,
            )
        )
        out.write(entry.name)
        out.write(entry.data)
        central.write(
            struct.pack(
                "<IHHHHHHIIIHHHHHII",
                0x02014B50,
                (UNIX << 8) | 20,
                20,
                entry.flags,
                entry.method,
                0,
                0x21,
                entry.crc,
                len(entry.data),
                entry.file_size,
                len(entry.name),
                0,
                0,
                0,
                0,
                entry.mode << 16,
                offset,
            )
        )
        central.write(entry.name)
    directory = central.getvalue()
    start = out.tell()
    out.write(directory)
    out.write(
        struct.pack(
            "<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries), len(directory), start, 0
        )
    )
    return out.getvalue()


def deflated(data: bytes) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    return compressor.compress(data) + compressor.flush()


def stored_entry(name: bytes, data: bytes, **extra: Any) -> Entry:
    return Entry(name, deflated(data), len(data), zlib.crc32(data), **extra)


def zeros_deflated(size: int) -> tuple[bytes, int]:
    """A raw deflate stream of ``size`` zero bytes (a whole number of MiB), and its CRC-32.
    After a full flush the compressor starts from scratch, so one compressed MiB repeated
    is a valid stream for many: 1 GiB costs 1 MB and a few milliseconds."""
    block_input = bytes(MIB)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = compressor.compress(block_input) + compressor.flush(zlib.Z_FULL_FLUSH)
    final = zlib.compressobj(9, zlib.DEFLATED, -15).flush()
    crc = 0
    for _ in range(size // MIB):
        crc = zlib.crc32(block_input, crc)
    return block * (size // MIB) + final, crc


def zip_of(files: dict[str, bytes], modes: dict[str, int] | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (modes or {}).get(name, stat.S_IFREG | 0o644) << 16
            archive.writestr(info, data)
    return buffer.getvalue()


PROJECT = {
    "train.py": b"print('training')\n",
    "pkg/__init__.py": b"",
    "pkg/model.py": b"WEIGHTS = [0.1, 0.2]\n",
    "run.sh": b"#!/bin/sh\nexec python train.py\n",
}


# ---------------------------------------------------------------------------------------------
# Fixtures: storage in a temporary area, and a watch on everything around it
# ---------------------------------------------------------------------------------------------


@dataclass
class Area:
    root: Path  # the test's temporary area
    storage: Path  # where bundles are kept (settings.VAR_DIR/bundles)
    escape_name: str  # a file name hostile entries try to create outside

    def files(self) -> set[Path]:
        return {path for path in self.root.rglob("*") if not path.is_dir()}

    def escapes(self) -> list[Path]:
        """Places a hostile entry could have reached, that must not exist."""
        candidates = [
            self.root.parent / self.escape_name,
            self.root / self.escape_name,
            Path("/tmp") / self.escape_name,
            Path.cwd() / self.escape_name,
        ]
        return [path for path in candidates if path.exists()]


@pytest.fixture
def area(settings: Any, tmp_path: Path) -> Area:
    settings.VAR_DIR = tmp_path / "var"
    return Area(tmp_path, tmp_path / "var" / "bundles", f"escaped-{uuid.uuid4().hex}.txt")


def upload(world: Any, data: bytes | io.RawIOBase) -> CodeBundle:
    stream = io.BytesIO(data) if isinstance(data, bytes) else data
    return bundles.store_upload(workspace=world.alpha, upload=stream)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------------------------


def _ten_thousand_files() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for index in range(10_000):
            archive.writestr(f"f/{index}.txt", b"")
    return buffer.getvalue()


def _bomb(declared: int, crc_of_declared: bool) -> bytes:
    stream, crc = zeros_deflated(GIB)
    if crc_of_declared:
        crc = zlib.crc32(bytes(declared))
    return raw_zip([Entry(b"zeros.bin", stream, declared, crc)])


#: (what, builder taking the escape file name, what the refusal says)
HOSTILE: list[tuple[str, Callable[[str], bytes], str]] = [
    ("zip bomb: 1 GiB of zeros in 1 MB", lambda _: _bomb(GIB, False), "zip bomb"),
    (
        "lying size header: declares 1 KiB, inflates to 1 GiB",
        lambda _: _bomb(1024, True),
        "crafted size header",
    ),
    (
        "lying size header: declares more than it holds",
        lambda _: raw_zip([Entry(b"small.txt", deflated(b"tiny"), 400 * MIB, zlib.crc32(b"tiny"))]),
        "expands",
    ),
    ("parent directory entry", lambda e: zip_of({f"../{e}": b"x"}), "points outside"),
    ("nested parent entry", lambda e: zip_of({f"pkg/../../{e}": b"x"}), "points outside"),
    ("absolute path", lambda e: zip_of({f"/tmp/{e}": b"x"}), "is an absolute path"),
    ("drive path", lambda e: zip_of({f"C:/{e}": b"x"}), "is an absolute path"),
    ("backslash path", lambda e: zip_of({f"..\\{e}": b"x"}), "not allowed in a path"),
    (
        "symbolic link",
        lambda _: zip_of({"link": b"/etc/passwd"}, {"link": stat.S_IFLNK | 0o777}),
        "is a symbolic link",
    ),
    (
        "device file",
        lambda _: zip_of({"tty": b""}, {"tty": stat.S_IFCHR | 0o666}),
        "not a regular file or folder",
    ),
    ("10,000 files", lambda _: _ten_thousand_files(), "10000 entries; the limit is 5000"),
    ("not a zip", lambda _: b"#!/bin/sh\necho a shell script\n" * 100, "not a zip file"),
    ("empty upload", lambda _: b"", "not a zip file"),
    ("truncated zip", lambda _: zip_of(PROJECT)[:-30], "not a zip file"),
    (
        "UTF-8 flag, invalid UTF-8 name",
        lambda _: raw_zip([stored_entry(b"\xff\xfe.py", b"x", flags=0x800)]),
        "not valid UTF-8",
    ),
    (
        "CP437 name without the UTF-8 flag",
        lambda _: raw_zip([stored_entry(b"caf\x82.py", b"x")]),
        "file names must be UTF-8",
    ),
    (
        "encrypted entry",
        lambda _: raw_zip([stored_entry(b"secret.py", b"x", flags=0x1)]),
        "encrypted",
    ),
    (
        "the same path twice",
        lambda _: raw_zip([stored_entry(b"a.py", b"1"), stored_entry(b"./a.py", b"2")]),
        "twice",
    ),
    (
        "a path that is a file and a folder",
        lambda _: zip_of({"pkg": b"x", "pkg/mod.py": b"y"}),
        "both as a file and as a folder",
    ),
    ("a file named '.'", lambda _: raw_zip([stored_entry(b".", b"x")]), "is not a file name"),
    (
        "corrupt data (bad CRC)",
        lambda _: raw_zip([Entry(b"a.py", deflated(b"hello"), 5, 12345)]),
        "damaged",
    ),
]


@pytest.mark.parametrize(("what", "build", "message"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_archives_are_refused_and_leave_nothing(
    world: Any, area: Area, what: str, build: Callable[[str], bytes], message: str
) -> None:
    data = build(area.escape_name)
    before = area.files()
    with pytest.raises(BundleRejected) as refused:
        upload(world, data)
    text = str(refused.value)
    assert text.startswith("The bundle"), text
    assert message in text, f"{what}: {text}"
    assert area.files() == before, "a refused upload left a file behind"
    assert not [path for path in area.storage.rglob("*") if path.is_file()]
    assert area.escapes() == []
    assert not CodeBundle.objects.for_workspace(world.alpha).exists()


def test_the_zip_bomb_is_refused_quickly_without_inflating_it(world: Any, area: Area) -> None:
    import time

    bomb, crc = zeros_deflated(GIB)
    data = raw_zip([Entry(b"zeros.bin", bomb, GIB, crc)])
    assert len(data) < 2 * MIB
    started = time.monotonic()
    with pytest.raises(BundleRejected, match="zip bomb"):
        upload(world, data)
    assert time.monotonic() - started < 2


class Endless(io.RawIOBase):
    """An upload that never ends (a client streaming forever)."""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        buffer[:] = bytes(len(buffer))
        return len(buffer)


def test_an_oversized_upload_is_cut_off_while_streaming(world: Any, area: Area) -> None:
    with pytest.raises(BundleRejected, match="larger than 50 MiB"):
        upload(world, Endless())
    assert not [path for path in area.storage.rglob("*") if path.is_file()]


# ---------------------------------------------------------------------------------------------
# Acceptance, deduplication, unpacking
# ---------------------------------------------------------------------------------------------


def test_a_valid_bundle_is_stored_once_by_digest(world: Any, area: Area) -> None:
    data = zip_of(PROJECT, {"run.sh": stat.S_IFREG | 0o755})
    digest = hashlib.sha256(data).hexdigest()
    first = upload(world, data)
    again = upload(world, data)
    assert first.pk == again.pk
    assert (first.sha256, first.size, first.file_count) == (digest, len(data), 4)
    path = bundles.bundle_path(digest)
    assert path == area.storage / digest[:2] / f"{digest}.zip"
    assert path.read_bytes() == data
    assert stat.S_IMODE(path.stat().st_mode) == 0o440
    assert [p for p in area.storage.rglob("*") if p.is_file()] == [path]  # no temporary left

    # Another workspace gets its own row for the same content, and shares the file.
    other = bundles.store_upload(workspace=world.beta, upload=io.BytesIO(data))
    assert other.pk != first.pk
    assert other.sha256 == digest
    assert [p for p in area.storage.rglob("*") if p.is_file()] == [path]


def test_zipfile_writestr_bundles_are_accepted(world: Any, area: Area) -> None:
    """What Python's own zipfile writes (no file-type bits in the mode) is a plain bundle."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("train.py", "print(1)\n")
        archive.writestr("data/", "")
    assert upload(world, buffer.getvalue()).file_count == 1


def test_unpack_into_a_fresh_directory(world: Any, area: Area) -> None:
    bundle = upload(world, zip_of(PROJECT, {"run.sh": stat.S_IFREG | 0o4777}))
    destination = area.root / "runs" / "1" / "work"
    bundles.unpack(bundle.sha256, destination)
    unpacked = {
        str(path.relative_to(destination)): path.read_bytes()
        for path in destination.rglob("*")
        if path.is_file()
    }
    assert unpacked == PROJECT
    mode = stat.S_IMODE((destination / "run.sh").stat().st_mode)
    assert mode == 0o755  # executable kept, setuid and world-write dropped


def test_unpack_refuses_an_existing_directory(world: Any, area: Area) -> None:
    bundle = upload(world, zip_of(PROJECT))
    existing = area.root / "work"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        bundles.unpack(bundle.sha256, existing)
    assert [path.name for path in existing.iterdir()] == ["keep.txt"]


def test_unpack_refuses_a_stored_file_that_no_longer_matches_its_digest(
    world: Any, area: Area
) -> None:
    bundle = upload(world, zip_of(PROJECT))
    path = bundles.bundle_path(bundle.sha256)
    os.chmod(path, 0o640)
    path.write_bytes(zip_of({"train.py": b"print('swapped')\n"}))
    destination = area.root / "work"
    with pytest.raises(BundleRejected, match="does not match its digest"):
        bundles.unpack(bundle.sha256, destination)
    assert not destination.exists()


def test_bundle_paths_come_only_from_digests(area: Area) -> None:
    for bad in ("../../etc/passwd", "ABC", "0" * 63, "g" * 64):
        with pytest.raises(ValueError, match="not a SHA-256"):
            bundles.bundle_path(bad)


# ---------------------------------------------------------------------------------------------
# Request size: an upload that could never be accepted is not read
# ---------------------------------------------------------------------------------------------


class Unreadable(io.RawIOBase):
    """A request body that fails the test if anything reads a byte of it."""

    def readable(self) -> bool:
        return True

    def read(self, *args: Any) -> bytes:
        raise AssertionError("the body was read")

    def readline(self, *args: Any) -> bytes:
        raise AssertionError("the body was read")


DECLARED = 200 * 2**20  # the attack: a 200 MB upload, streamed whole before the size check


def declared_post(client: Any, url: str, **headers: Any) -> Any:
    return client.generic(
        "POST",
        url,
        b"",
        content_type="multipart/form-data; boundary=xyz",
        CONTENT_LENGTH=str(DECLARED),
        **{"wsgi.input": Unreadable()},
        **headers,
    )


def test_a_submission_too_large_is_refused_unread_on_the_api(world: Any, area: Area) -> None:
    url = reverse("api:run-list", kwargs={"workspace_slug": "alpha"})
    response = declared_post(world.api_client_for("researcher"), url)
    assert response.status_code == 413
    problem = response.json()["problems"][0]
    assert problem["path"] == "bundle"
    assert problem["message"] == submission.too_large_problem(DECLARED).message
    assert "200.0 MiB" in problem["message"]
    assert "50 MiB" in problem["message"]
    assert Run.objects.for_workspace(world.alpha).count() == 0
    # Just under the limit is not refused by its size (here: read, and not a form at all).
    just_under = world.api_client_for("researcher").post(
        url, b"x", content_type="multipart/form-data; boundary=xyz"
    )
    assert just_under.status_code == 400
    assert "problems" not in just_under.json()


@pytest.mark.parametrize(("htmx", "status"), [(True, 400), (False, 413)])
def test_a_submission_too_large_is_refused_unread_on_the_page(
    world: Any, area: Area, htmx: bool, status: int
) -> None:
    url = reverse("run-submit", kwargs={"workspace_slug": "alpha"})
    headers = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    response = declared_post(world.client_for("researcher"), url, **headers)
    assert response.status_code == status
    page = response.content.decode()
    assert submission.too_large_problem(DECLARED).message in page
    assert "Not submitted" in page
    assert Run.objects.for_workspace(world.alpha).count() == 0


def test_the_live_check_is_refused_unread_too(world: Any) -> None:
    url = reverse("run-validate", kwargs={"workspace_slug": "alpha"})
    response = declared_post(world.client_for("researcher"), url, HTTP_HX_REQUEST="true")
    assert response.status_code == 400


def test_no_more_than_the_bundle_limit_is_written_while_reading(
    world: Any, area: Area, monkeypatch: Any
) -> None:
    """Declared within the limit, a file larger than any acceptable bundle: Django's upload
    handler writes no more than one byte past the bundle limit to disk, and the submission
    is refused for its size."""
    monkeypatch.setattr(bundles, "MAX_BUNDLE_BYTES", 2**20)
    written: list[int] = []
    complete = bundles.BoundedUploadHandler.file_complete

    def measure(self: Any, file_size: int) -> Any:
        self.file.flush()
        written.append(os.path.getsize(self.file.temporary_file_path()))
        return complete(self, file_size)

    monkeypatch.setattr(bundles.BoundedUploadHandler, "file_complete", measure)
    big = io.BytesIO(b"PK" + bytes(3 * 2**20))
    big.name = "project.zip"
    spec = io.BytesIO(TINY_SPEC)
    spec.name = "tau.yaml"
    url = reverse("api:run-list", kwargs={"workspace_slug": "alpha"})
    response = world.api_client_for("researcher").post(
        url, {"spec": spec, "bundle": big}, format="multipart"
    )
    assert response.status_code == 400
    assert response.json()["problems"][0]["message"] == "The bundle is larger than 1 MiB."
    assert max(written) == 2**20 + 1
    assert Run.objects.for_workspace(world.alpha).count() == 0
