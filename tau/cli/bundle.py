"""The code bundle ``tau run`` uploads: a zip of the project folder, minus what is ignored.

Ignored: ``.git/``, and whatever the project folder's ``.tauignore`` and ``.gitignore`` and
the spec's ``run.exclude`` name, in gitignore syntax: ``*``, ``?``, ``[…]``, ``**``, a
leading ``/`` anchors a pattern at the project folder, a trailing ``/`` matches folders only,
``!`` takes a file back in; a pattern without ``/`` matches at any depth. ``.tauignore`` is read
last, so it has the last word (``!data/keep.csv`` brings back what ``.gitignore`` left out).
Only the files at the project folder's top are read (not ``.gitignore`` files further down).
"""

from __future__ import annotations

import os
import re
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

#: The portal's limits (runs/bundles.py): a project beyond them is refused before it is sent,
#: as soon as it is known (while walking the folder, while zipping), not after zipping it all.
MAX_BUNDLE_BYTES = 50 * 2**20
MAX_UNPACKED_BYTES = 500 * 2**20
MAX_FILES = 5000
ALWAYS_IGNORED = (".git/", ".tau-bundle-*.zip")
_LEAVE_OUT = (
    "Leave data, checkpoints and environments out with .tauignore (or run.exclude); "
    "`tau run --dry-run` lists what would go."
)


class BundleTooLarge(Exception):
    """The project is more than the portal takes; the message says which limit and what to do."""


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern[str]
    negated: bool
    folders_only: bool


def _translate(glob: str) -> str:
    """A gitignore glob (without ``!``, leading or trailing ``/``) as a regex over a path."""
    out = []
    index = 0
    while index < len(glob):
        char = glob[index]
        if glob.startswith("**/", index):
            out.append("(?:.*/)?")
            index += 3
            continue
        if glob.startswith("/**", index) and index + 3 == len(glob):
            out.append("/.*")
            index += 3
            continue
        if glob.startswith("**", index):
            out.append(".*")
            index += 2
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = glob.find("]", index + 1)
            if end == -1:
                out.append(re.escape(char))
            else:
                body = glob[index + 1 : end]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                index = end
        elif char == "\\" and index + 1 < len(glob):
            index += 1
            out.append(re.escape(glob[index]))
        else:
            out.append(re.escape(char))
        index += 1
    return "".join(out)


def parse_rules(lines: Iterable[str]) -> list[Rule]:
    rules = []
    for raw in lines:
        line = raw.rstrip("\n").rstrip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        if negated:
            line = line[1:]
        folders_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        line = line.lstrip("/")
        regex = _translate(line)
        prefix = "" if anchored else "(?:.*/)?"
        rules.append(Rule(re.compile(f"{prefix}{regex}"), negated, folders_only))
    return rules


class Ignore:
    """Which paths (relative, with ``/``) of the project are left out of the bundle."""

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = list(rules)

    @classmethod
    def for_project(cls, root: Path, exclude: Sequence[str] = ()) -> Ignore:
        lines: list[str] = list(ALWAYS_IGNORED)
        for name in (".gitignore",):
            lines += _read_lines(root / name)
        lines += list(exclude)
        lines += _read_lines(root / ".tauignore")
        return cls(parse_rules(lines))

    def ignored(self, path: str, *, folder: bool) -> bool:
        verdict = False
        for rule in self.rules:
            if rule.folders_only and not folder:
                continue
            if rule.pattern.fullmatch(path):
                verdict = not rule.negated
        return verdict


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []


def project_files(root: Path, ignore: Ignore) -> list[str]:
    """Every file to ship, as sorted relative paths; ignored folders are not entered (as in
    git, a file inside an ignored folder cannot be taken back in). Raises
    :class:`BundleTooLarge` as soon as the files are more, or larger together, than the
    portal unpacks."""
    found: list[str] = []
    total = 0
    largest: list[tuple[int, str]] = []
    for folder, subfolders, files in os.walk(root):
        here = Path(folder).relative_to(root).as_posix()
        prefix = "" if here == "." else f"{here}/"
        subfolders[:] = sorted(
            name
            for name in subfolders
            if not ignore.ignored(prefix + name, folder=True)
            and not os.path.islink(os.path.join(folder, name))
        )
        for name in sorted(files):
            relative = prefix + name
            full = os.path.join(folder, name)
            if os.path.islink(full) or not os.path.isfile(full):
                continue
            if ignore.ignored(relative, folder=False):
                continue
            found.append(relative)
            size = os.stat(full).st_size
            total += size
            largest = sorted([*largest, (size, relative)], reverse=True)[:3]
            if len(found) > MAX_FILES:
                raise BundleTooLarge(
                    f"the project has more than {MAX_FILES:,} files to upload, the most the "
                    f"portal takes. {_LEAVE_OUT}"
                )
            if total > MAX_UNPACKED_BYTES:
                raise BundleTooLarge(
                    f"the project's files come to more than {MAX_UNPACKED_BYTES // 2**20} MiB, "
                    f"the most the portal unpacks (largest: {_sizes(largest)}). {_LEAVE_OUT}"
                )
    return sorted(found)


def _sizes(files: Sequence[tuple[int, str]]) -> str:
    return ", ".join(f"{name} {size / 2**20:.1f} MiB" for size, name in files)


def write_bundle(root: Path, files: Sequence[str], target: Path) -> int:
    """Zip ``files`` (relative to ``root``) into ``target``; its size in bytes. Raises
    :class:`BundleTooLarge` as soon as the zip grows past :data:`MAX_BUNDLE_BYTES`, without
    reading the rest of the project."""
    with (
        target.open("wb") as handle,
        zipfile.ZipFile(handle, "w", compression=zipfile.ZIP_DEFLATED) as archive,
    ):
        for relative in files:
            path = root / relative
            info = zipfile.ZipInfo.from_file(path, relative, strict_timestamps=False)
            info.compress_type = zipfile.ZIP_DEFLATED
            with open(path, "rb") as source, archive.open(info, "w") as member:
                while block := source.read(2**20):
                    member.write(block)
                    if handle.tell() > MAX_BUNDLE_BYTES:
                        largest = sorted(
                            ((os.stat(root / name).st_size, name) for name in files),
                            reverse=True,
                        )[:3]
                        raise BundleTooLarge(
                            f"the project is more than {MAX_BUNDLE_BYTES // 2**20} MiB zipped, "
                            f"the most the portal takes (stopped at {relative}; largest: "
                            f"{_sizes(largest)}). {_LEAVE_OUT}"
                        )
    return target.stat().st_size
