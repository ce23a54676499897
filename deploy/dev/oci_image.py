#!/usr/bin/env python3
"""Build the portal's image (deploy/Containerfile) on this machine with buildah, and look
inside it: what ``make test`` does to prove the Containerfile builds and the image it makes
runs the portal.

    python deploy/dev/oci_image.py build     # prints the image name
    python deploy/dev/oci_image.py base      # only the stand-in base image (below)
    python deploy/dev/oci_image.py check     # whether the image is built from this checkout

``make test`` builds it before the tests that need it (deploy/dev/test_lanes.py), and
tests/deploy/test_image.py runs its checks inside; a test never builds it. The image carries
the digest of what it was built from (its build context, deploy/Containerfile and
.containerignore: the label ``io.taugrid.source-digest``), so those tests refuse an image
older than the code they would be checking instead of passing on it.

No container registry is reachable from the machines TauGrid is built on (only package
registries are), so the Containerfile's default base, ``docker.io/library/python:3.11-slim``,
cannot be pulled. The build therefore makes a stand-in for it from Debian's own packages:
``debootstrap`` (bookworm, minbase) with Debian's Python 3.11 and ``python`` on the PATH as
the official image has it, committed once as ``localhost/taugrid-python-base:3.11-bookworm``
and passed as ``--build-arg PYTHON_IMAGE``. Everything after that is the Containerfile as a
platform team builds it with ``podman build``.

Storage (images and layer cache) lives under ``~/.cache/taugrid/containers`` (or
``$TAUGRID_CACHE_DIR/containers``), never in the repository: the first build takes minutes
(the base, the dependencies), later ones reuse the dependency layer while only the code
changes. buildah runs as root with chroot isolation (no user namespaces or runtime needed)
and the overlay storage driver (``TAU_BUILDAH_STORAGE_DRIVER=vfs`` where the kernel refuses
overlay mounts). Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_services import apt_install

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "deploy" / "Containerfile"
IGNORE_FILE = ROOT / ".containerignore"
BASE = "localhost/taugrid-python-base:3.11-bookworm"
IMAGE = "localhost/taugrid:test"
#: The label with :func:`source_digest` of what the image was built from.
SOURCE_LABEL = "io.taugrid.source-digest"
MIRROR = os.environ.get("TAU_DEBIAN_MIRROR", "http://deb.debian.org/debian")
#: What the stand-in base has of the official python:3.11-slim image: Python with venv (and
#: the pip it bootstraps), CA certificates, and nothing to compile with.
BASE_PACKAGES = (
    "python3.11",
    "python3.11-venv",
    "python3-distutils",  # python3.11-venv depends on it; debootstrap does not resolve that
    "python3-pip-whl",
    "python3-setuptools-whl",
    "ca-certificates",
)


class ImageError(RuntimeError):
    """The image could not be built or looked into; the message says which step."""


def log(message: str) -> None:
    print(f"[oci-image] {message}", file=sys.stderr, flush=True)


def storage() -> Path:
    base = Path(os.environ.get("TAUGRID_CACHE_DIR") or Path.home() / ".cache" / "taugrid")
    return base / "containers"


#: overlay: layers and containers share the files below them (vfs, which needs no kernel
#: support, copies the whole tree for each: several times slower and gigabytes larger).
STORAGE_DRIVER = os.environ.get("TAU_BUILDAH_STORAGE_DRIVER", "overlay")


def buildah_args() -> list[str]:
    where = storage() / STORAGE_DRIVER
    return [
        "buildah",
        "--root",
        str(where / "storage"),
        "--runroot",
        str(where / "run"),
        "--storage-driver",
        STORAGE_DRIVER,
    ]


def ensure_tools() -> None:
    missing = [tool for tool in ("buildah", "debootstrap") if shutil.which(tool) is None]
    if missing:
        apt_install(missing)


def buildah(*args: str, capture: bool = False, env: Mapping[str, str] | None = None) -> str:
    command = [*buildah_args(), *args]
    done = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=capture,
        text=True,
        env={**os.environ, "BUILDAH_ISOLATION": "chroot", **(env or {})},
    )
    if done.returncode != 0:
        said = f": {done.stderr.strip()[-2000:]}" if capture else " (its output is above)"
        raise ImageError(f"buildah {' '.join(args[:2])} failed{said}")
    return done.stdout if capture else ""


def image_id(name: str) -> str | None:
    done = subprocess.run(
        [*buildah_args(), "images", "--quiet", "--noheading", name],
        capture_output=True,
        text=True,
    )
    found = done.stdout.split()
    return found[0] if done.returncode == 0 and found else None


def build_base() -> None:
    """The stand-in for python:3.11-slim from Debian's packages (once; cached)."""
    if image_id(BASE):
        log(f"base {BASE}: cached")
        return
    started = time.monotonic()
    log(f"base {BASE}: debootstrap bookworm ({', '.join(BASE_PACKAGES)}) from {MIRROR}")
    with tempfile.TemporaryDirectory(prefix="taugrid-rootfs-") as scratch:
        rootfs = Path(scratch) / "rootfs"
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                "bookworm",
                str(rootfs),
                MIRROR,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for item in (rootfs / leftover).glob("*"):
                if item.is_file():
                    item.unlink()
        (rootfs / "usr/local/bin/python").symlink_to("/usr/bin/python3.11")
        container = buildah("from", "scratch", capture=True).strip()
        try:
            mount = Path(buildah("mount", container, capture=True).strip())
            packed = subprocess.run(
                [
                    "tar",
                    "-C",
                    str(rootfs),
                    "--exclude=./dev/*",
                    "--exclude=./proc/*",
                    "-cf",
                    "-",
                    ".",
                ],
                stdout=subprocess.PIPE,
                check=True,
            )
            subprocess.run(["tar", "-C", str(mount), "-xf", "-"], input=packed.stdout, check=True)
            buildah("umount", container)
            buildah(
                "config",
                "--env",
                "LANG=C.UTF-8",
                "--env",
                "PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--cmd",
                "python",
                "--label",
                "org.opencontainers.image.description=TauGrid's stand-in for python:3.11-slim, "
                "from Debian bookworm's packages",
                container,
            )
            buildah("commit", "--quiet", container, BASE, capture=True)
        finally:
            remove_container(container)
    log(f"base {BASE}: built in {time.monotonic() - started:.0f}s")


#: This machine's CA certificates and pip configuration, lent to the build's RUN steps (never
#: copied into the image): behind a TLS-inspecting proxy or with a package mirror, pip inside
#: the build reaches PyPI the way pip outside it does.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
HOST_PIP_CONF = Path("/etc/pip.conf")


def build_volumes() -> list[str]:
    volumes: list[str] = []
    if HOST_CA_BUNDLE.is_file():
        volumes += ["--volume", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"]
    if HOST_PIP_CONF.is_file():
        volumes += ["--volume", f"{HOST_PIP_CONF}:{HOST_PIP_CONF}:ro"]
    return volumes


# --- what the image is built from ---------------------------------------------------------------


def _pattern(glob: str) -> re.Pattern[str]:
    """A .containerignore pattern as a regular expression over a path relative to the
    context: ``**`` any number of folders, ``*`` and ``?`` within one name."""
    out = ""
    i = 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif glob.startswith("**", i):
            out, i = out + ".*", i + 2
        elif glob[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif glob[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(glob[i]), i + 1
    return re.compile(out)


@dataclass(frozen=True)
class Rule:
    """One line of a .containerignore."""

    glob: str
    pattern: re.Pattern[str]
    #: A ``!`` line: it lets back in what an earlier line left out.
    keep: bool

    def covers(self, relative: str) -> bool:
        """Whether the rule matches ``relative`` or a folder above it."""
        parts = relative.split("/")
        return any(self.pattern.fullmatch("/".join(parts[:n])) for n in range(1, len(parts) + 1))

    def may_keep_under(self, folder: str) -> bool:
        """Whether this ``!`` rule could let back in something under ``folder``."""
        literal = re.split(r"[*?\[]", self.glob, maxsplit=1)[0]
        return self.keep and (literal.startswith(f"{folder}/") or f"{folder}/".startswith(literal))


def ignore_rules(text: str) -> list[Rule]:
    """The rules of a .containerignore, in order (blank lines and comments are none)."""
    rules = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        glob = os.path.normpath(line.removeprefix("!").strip()).lstrip("/")
        rules.append(Rule(glob, _pattern(glob), keep=line.startswith("!")))
    return rules


def left_out(relative: str, rules: Sequence[Rule]) -> bool:
    """Whether the build context leaves ``relative`` out, as podman and buildah read the
    rules: the last rule that matches the path or a folder above it decides."""
    excluded = False
    for rule in rules:
        if rule.covers(relative):
            excluded = not rule.keep
    return excluded


def context_files(root: Path = ROOT) -> Iterator[str]:
    """The files of the build context, relative to ``root``, in a stable order. A folder
    left out is not entered unless a ``!`` rule could let something under it back in."""
    rules = ignore_rules((root / IGNORE_FILE.name).read_text())
    for folder, dirs, files in os.walk(root):
        here = Path(folder).relative_to(root).as_posix()
        prefix = "" if here == "." else f"{here}/"
        dirs[:] = sorted(
            name
            for name in dirs
            if not left_out(prefix + name, rules)
            or any(rule.may_keep_under(prefix + name) for rule in rules)
        )
        for name in sorted(files):
            if not left_out(prefix + name, rules):
                yield prefix + name


def source_digest(root: Path = ROOT) -> str:
    """SHA-256 over the build context (every file's path and bytes; a link's target),
    deploy/Containerfile and .containerignore: what decides the image's content."""
    digest = hashlib.sha256()
    for name in ("deploy/Containerfile", IGNORE_FILE.name, *context_files(root)):
        path = root / name
        content = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
        digest.update(f"{name}\0{hashlib.sha256(content).hexdigest()}\n".encode())
    return digest.hexdigest()


def built(name: str = IMAGE) -> str:
    """``name``, when it is built from this checkout as it is now; else an :class:`ImageError`
    saying how to build it (the tests that look into the image never build it)."""
    how = "run `python deploy/dev/oci_image.py build` (make test builds it before its tests)"
    if shutil.which("buildah") is None or image_id(name) is None:
        raise ImageError(f"{name} is not built: {how}")
    labels = inspect(name)["OCIv1"]["config"].get("Labels") or {}
    if labels.get(SOURCE_LABEL) != source_digest():
        raise ImageError(f"{name} was built from other code than this checkout's: {how}")
    return name


def build() -> str:
    ensure_tools()
    build_base()
    started = time.monotonic()
    log(f"building {IMAGE} from deploy/Containerfile (cached layers are reused)")
    buildah(
        "bud",
        "--isolation",
        "chroot",
        "--layers",
        "--pull=never",
        *build_volumes(),
        "--build-arg",
        f"PYTHON_IMAGE={BASE}",
        "--label",
        f"{SOURCE_LABEL}={source_digest()}",
        "--file",
        str(CONTAINERFILE),
        "--tag",
        IMAGE,
        str(ROOT),
    )
    log(f"built {IMAGE} in {time.monotonic() - started:.0f}s")
    return IMAGE


def inspect(name: str = IMAGE) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(buildah("inspect", "--type", "image", name, capture=True))
    return data


def new_container(name: str = IMAGE) -> str:
    """A working container of the image (with the vfs driver a full copy: make one and run
    several commands in it)."""
    return buildah("from", "--pull=never", name, capture=True).strip()


def remove_container(container: str) -> None:
    subprocess.run([*buildah_args(), "rm", container], capture_output=True)


def run_inside(
    container: str, command: Sequence[str], *, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``command`` in ``container``, as the image's USER in its WORKDIR; its exit code and
    output."""
    args = [*buildah_args(), "run", "--isolation", "chroot"]
    for key, value in (env or {}).items():
        args += ["--env", f"{key}={value}"]
    return subprocess.run(
        [*args, container, "--", *command],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "BUILDAH_ISOLATION": "chroot"},
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("command", choices=["build", "base", "check"])
    args = parser.parse_args(argv)
    try:
        if args.command == "base":
            ensure_tools()
            build_base()
            return 0
        print(built() if args.command == "check" else build())
        return 0
    except (ImageError, subprocess.CalledProcessError) as error:
        log(f"error: {error}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
