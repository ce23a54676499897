"""What the portal's image is built from (deploy/dev/oci_image.py): the build context as podman
and buildah read .containerignore, and the digest the image carries of it, so the tests that
look into the image (tests/deploy/test_image.py, after ``make test`` built it) refuse an image
built from other code instead of checking it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
image_tool = load_script(REPO / "deploy" / "dev" / "oci_image.py", "taugrid_oci_image")

IGNORE = """\
# everything out, then the code back in
*
!app
!setup.toml
**/__pycache__
app/vendor
"""


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    files = {
        ".containerignore": IGNORE,
        "deploy/Containerfile": "FROM scratch\nCOPY . ./\n",
        "setup.toml": "[project]\n",
        "app/main.py": "print('hello')\n",
        "app/pkg/util.py": "X = 1\n",
        "app/pkg/__pycache__/util.cpython-311.pyc": "compiled",
        "app/vendor/lib.js": "vendored",
        "tests/test_main.py": "def test(): ...\n",
        "notes.md": "notes\n",
        ".venv/lib/site.py": "site\n",
    }
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_context_is_what_containerignore_lets_in(checkout: Path) -> None:
    assert list(image_tool.context_files(checkout)) == [
        "setup.toml",
        "app/main.py",
        "app/pkg/util.py",
    ]


@pytest.mark.parametrize(
    ("path", "left_out"),
    [
        ("portal/settings.py", False),
        ("executors/local/agent/supervisor.py", False),
        ("requirements/constraints.txt", False),
        ("requirements/examples.txt", True),  # only the constraints are let back in
        ("portal/__pycache__/settings.cpython-311.pyc", True),
        ("runs/api/__pycache__/views.cpython-311.pyc", True),
        ("static/vendor/htmx.min.js", True),
        ("static/css/portal.css", False),
        ("tests/conftest.py", True),
        ("deploy/Containerfile", True),
        (".git/HEAD", True),
    ],
)
def test_the_repositorys_own_rules(path: str, left_out: bool) -> None:
    rules = image_tool.ignore_rules((REPO / ".containerignore").read_text())
    assert image_tool.left_out(path, rules) is left_out


def test_the_digest_follows_the_context_and_the_containerfile_only(checkout: Path) -> None:
    first = image_tool.source_digest(checkout)
    assert first == image_tool.source_digest(checkout)
    # What the image does not take changes nothing.
    for outside in ("tests/test_main.py", "notes.md", "app/vendor/lib.js", ".venv/lib/site.py"):
        (checkout / outside).write_text("changed\n")
    (checkout / "app/pkg/__pycache__/util.cpython-311.pyc").write_text("recompiled")
    assert image_tool.source_digest(checkout) == first
    # A file of the code, a new one, a moved one, the Containerfile: each is another image.
    seen = {first}
    for change in (
        lambda: (checkout / "app/main.py").write_text("print('bye')\n"),
        lambda: (checkout / "app/new.py").write_text(""),
        lambda: os.rename(checkout / "app/new.py", checkout / "app/pkg/new.py"),
        lambda: (checkout / "deploy/Containerfile").write_text("FROM scratch\n"),
        lambda: (checkout / ".containerignore").write_text(IGNORE + "!notes.md\n"),
    ):
        change()
        digest = image_tool.source_digest(checkout)
        assert digest not in seen
        seen.add(digest)


def test_an_image_from_other_code_is_refused_with_how_to_build_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    labels: dict[str, Any] = {}
    monkeypatch.setattr(image_tool.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(image_tool, "image_id", lambda name: "0123abcd")
    monkeypatch.setattr(
        image_tool, "inspect", lambda name: {"OCIv1": {"config": {"Labels": labels}}}
    )
    monkeypatch.setattr(image_tool, "source_digest", lambda: "digest-of-this-checkout")
    with pytest.raises(image_tool.ImageError, match="built from other code") as refused:
        image_tool.built()
    assert "python deploy/dev/oci_image.py build" in str(refused.value)
    labels[image_tool.SOURCE_LABEL] = "digest-of-this-checkout"
    assert image_tool.built() == image_tool.IMAGE
    monkeypatch.setattr(image_tool, "image_id", lambda name: None)
    with pytest.raises(image_tool.ImageError, match="is not built"):
        image_tool.built()
