#!/usr/bin/env python3
"""Build the portal's image (deploy/Containerfile) on this machine with buildah, and look
inside it: what ``make test`` does to prove the Containerfile builds and the image it makes
runs the portal.

    python deploy/dev/oci_image.py build     # prints the image name
    python deploy/dev/oci_image.py base      # only the stand-in base image (below)

tests/deploy/test_image.py builds it and runs the checks inside.

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
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_services import apt_install

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "deploy" / "Containerfile"
BASE = "localhost/taugrid-python-base:3.11-bookworm"
IMAGE = "localhost/taugrid:test"
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
        "--file",
        str(CONTAINERFILE),
        "--tag",
        IMAGE,
        str(ROOT),
    )
    log(f"built {IMAGE} in {time.monotonic() - started:.0f}s")
    return IMAGE


def inspect(name: str = IMAGE) -> dict[str, object]:
    data: dict[str, object] = json.loads(buildah("inspect", "--type", "image", name, capture=True))
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
    parser.add_argument("command", choices=["build", "base"])
    args = parser.parse_args(argv)
    try:
        if args.command == "base":
            ensure_tools()
            build_base()
            return 0
        print(build())
        return 0
    except (ImageError, subprocess.CalledProcessError) as error:
        log(f"error: {error}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
