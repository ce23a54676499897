"""The export tar writer: what tarfile itself would write, in constant memory, and never a
tar that reads wrong."""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Iterator

import pytest

from tau.evidence import archive


def _members() -> list[archive.Member]:
    return [
        archive.bytes_member(archive.MANIFEST, b"{}"),
        archive.bytes_member(archive.attempt_log(1), b"x" * 1000),
        archive.bytes_member(archive.artifact_member("d/" + "long-name-" * 15), b"y" * 512),
        archive.bytes_member(archive.artifact_member("résumé.txt"), b""),
    ]


def test_the_stream_is_what_tarfile_writes_for_the_same_members() -> None:
    written = b"".join(archive.tar_stream(_members(), mtime=1_700_000_000, chunk_size=64))
    expected = io.BytesIO()
    with tarfile.open(fileobj=expected, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for member in _members():
            info = tarfile.TarInfo(member.name)
            info.size, info.mtime, info.mode = member.size, 1_700_000_000, 0o644
            info.uname = info.gname = ""
            tar.addfile(info, member.open())
    assert written == expected.getvalue()
    with tarfile.open(fileobj=io.BytesIO(written)) as tar:
        read = [(info.name, info.size, info.mode, info.uid, info.mtime) for info in tar]
    assert read == [(member.name, member.size, 0o644, 0, 1_700_000_000) for member in _members()]


def test_the_bytes_are_pinned() -> None:
    # The writer's own bytes, pinned: no Python release (tarfile's output has changed between
    # them) and no refactoring may change what the same record exports to.
    written = b"".join(archive.tar_stream(_members(), mtime=1_700_000_000))
    assert hashlib.sha256(written).hexdigest() == (
        "b0b1fd59bbd5f17ba9bc98fba4d4ca829a80cef24d2f04450dc4699dda38e908"
    )


def test_a_size_beyond_ustar_goes_into_a_pax_header() -> None:
    size = 8**11  # 8 GiB: one more than ustar's 11 octal digits hold
    header = archive.member_header("attempts/1/log.txt", size, 5)
    info = tarfile.TarInfo("attempts/1/log.txt")
    info.size, info.mtime, info.mode = size, 5, 0o644
    info.uname = info.gname = ""
    assert header == info.tobuf(tarfile.PAX_FORMAT, "utf-8", "strict")
    assert b" size=8589934592\n" in header


def test_the_same_members_give_the_same_bytes() -> None:
    first = b"".join(archive.tar_stream(_members(), mtime=1))
    assert first == b"".join(archive.tar_stream(_members(), mtime=1))
    assert first != b"".join(archive.tar_stream(_members(), mtime=2))


class _Endless(io.RawIOBase):
    """A file of zeros that never ends: the writer must stop at the declared size."""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        buffer[:] = bytes(len(buffer))
        return len(buffer)


def test_content_is_streamed_in_chunks() -> None:
    size = 10 * 1024 * 1024 + 7
    member = archive.Member("attempts/1/log.txt", size, lambda: io.BufferedReader(_Endless()))
    sizes: list[int] = []

    def consume() -> None:
        for chunk in archive.tar_stream([member], mtime=0, chunk_size=1 << 20):
            sizes.append(len(chunk))

    with pytest.raises(archive.MemberSizeError, match="more than"):
        consume()
    assert max(sizes) == 1 << 20
    assert sum(sizes) == 512 + size  # the header and exactly the declared bytes


def _counted(size: int) -> Iterator[bytes]:
    return archive.tar_stream(
        [archive.Member("a.txt", size, lambda: io.BytesIO(b"z" * 100))], mtime=0
    )


@pytest.mark.parametrize(("declared", "message"), [(101, "ended after 100"), (99, "more than 99")])
def test_a_member_of_another_size_than_declared_raises(declared: int, message: str) -> None:
    with pytest.raises(archive.MemberSizeError, match=message):
        b"".join(_counted(declared))


@pytest.mark.parametrize(
    "name", ["/etc/passwd", "a/../b", "../a", "a//b", "./a", "a\\b", "a\0", "\udc80", ""]
)
def test_names_the_format_refuses(name: str) -> None:
    with pytest.raises(archive.MemberNameError):
        b"".join(archive.tar_stream([archive.bytes_member(name, b"")], mtime=0))


def test_a_name_given_twice_is_refused() -> None:
    twice = [archive.bytes_member("a", b""), archive.bytes_member("a", b"")]
    with pytest.raises(archive.MemberNameError, match="twice"):
        b"".join(archive.tar_stream(twice, mtime=0))


def test_member_names() -> None:
    assert archive.attempt_log(3) == "attempts/3/log.txt"
    assert archive.artifact_member("model/w.bin") == "artifacts/model/w.bin"
    assert archive.FORMAT == "taugrid-evidence/1"
