"""The README is the front door and ``docs/`` the manual, built into a site by ``make docs``
(``mkdocs build --strict``, which also fails on a broken link or anchor inside the docs).

Checked here, without the docs tools: the README stays short; every page is in the site's nav;
every relative link of the README and the docs leads to a file (and, with an anchor, to a
heading there); and every command of the README's quick start names the test that runs it, so
that a newcomer's first command cannot silently lose its test.
"""

from __future__ import annotations

import ast
import re
import unicodedata
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 200

#: Every command of the README's quick start, with the tests (pytest node ids) that run it.
#: A new command needs its test named here; a test that is renamed or removed fails this file.
QUICK_START: dict[str, tuple[str, ...]] = {
    # `make -o install run`: the command itself, its install step skipped (the suite's own).
    "make run": (
        "tests/portal/test_make_run.py::test_the_login_details_are_the_last_lines_of_start_up",
    ),
    # A fresh venv with the client installed from a copy of the checkout.
    "python3 -m venv /tmp/tau && . /tmp/tau/bin/activate && pip install .": (
        "tests/cli/test_client_install.py::test_the_client_installs_without_the_server",
    ),
    # The two halves: `create_token researcher --workspace demo` as written (the docs' curl
    # block under `make run`), and `create_token` then `tau login --token-stdin` with it.
    (
        ".venv/bin/python manage.py create_token researcher --workspace demo"
        " | tau login --url http://127.0.0.1:${PORT:-8000} --token-stdin"
    ): (
        "tests/portal/test_make_run.py::test_the_readme_curl_works_on_another_port",
        "tests/cli/test_client_install.py::test_from_a_clean_install_to_a_succeeded_run",
    ),
    "tau run --config examples/cpu-quickstart/tau.yaml --watch": (
        "tests/cli/test_client_install.py::test_from_a_clean_install_to_a_succeeded_run",
        "tests/cli/test_cli_end_to_end.py::test_tau_from_login_to_resume",
    ),
    "tau evidence pull cpu-quickstart --verify": (
        "tests/cli/test_cli_end_to_end.py::test_tau_from_login_to_resume",
    ),
}

#: The quick start's steps in the browser, by words of the README, with the tests that take them.
QUICK_START_IN_THE_BROWSER: dict[str, tuple[str, ...]] = {
    "open the demo workspace, *Submit a run*": (
        "tests/pages/test_page_words.py::test_the_readme_names_the_button_the_workspace_page_shows",
        "tests/pages/test_browser_pages.py::test_researcher_submits_and_watches_a_run_live",
    ),
    'The run page says "verified"': (
        "tests/evidence/test_browser_evidence.py::test_the_evidence_section_follows_sealing_and_checking",
    ),
}

FENCE = re.compile(r"^ *```.*?^ *```[^\n]*$", re.DOTALL | re.MULTILINE)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def prose(text: str) -> str:
    """The text without code: links and headings in code blocks and spans are not links."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """The anchor Python-Markdown's toc extension gives a heading (its default slugify, on the
    heading's text: code spans and emphasis lose their marks, links keep their text)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").replace("*", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: Counter[str] = Counter()
    for line in FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        heading = re.match(r"#{1,6} +(.+?) *#*$", line)
        if heading:
            name = slug(heading.group(1))
            found.add(name if not seen[name] else f"{name}_{seen[name]}")
            seen[name] += 1
    return found


def nav_pages(entries: Any) -> Iterator[str]:
    if isinstance(entries, str):
        yield entries
    elif isinstance(entries, list):
        for entry in entries:
            yield from nav_pages(entry)
    elif isinstance(entries, dict):
        for entry in entries.values():
            yield from nav_pages(entry)


def quick_start() -> str:
    readme = README.read_text(encoding="utf-8")
    assert "\n## Quick start\n" in readme, "the README has no quick start"
    return readme.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]


def quick_start_commands() -> list[str]:
    commands = []
    for block in re.findall(r"^ *```sh\n(.*?)^ *```", quick_start(), re.DOTALL | re.MULTILINE):
        for line in block.splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def test_the_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines: move the detail into docs/ and link to it"
    )


def test_every_page_is_in_the_nav() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["docs_dir"] == "docs"
    in_nav = list(nav_pages(config["nav"]))
    assert len(in_nav) == len(set(in_nav)), "a page is in the nav twice"
    on_disk = {page.relative_to(DOCS).as_posix() for page in pages()}
    assert sorted(on_disk - set(in_nav)) == [], "pages missing from mkdocs.yml's nav"
    assert sorted(set(in_nav) - on_disk) == [], "nav entries without a page"


@pytest.mark.parametrize(
    "document", [README, *pages()], ids=lambda path: path.relative_to(ROOT).as_posix()
)
def test_every_relative_link_leads_to_a_file(document: Path) -> None:
    broken = []
    for target in LINK.findall(prose(document.read_text(encoding="utf-8"))):
        if SCHEME.match(target) or target.startswith("/"):
            continue
        path, _, anchor = target.partition("#")
        linked = (document.parent / path).resolve() if path else document
        if not linked.is_file():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with that anchor")
    assert broken == []


def test_the_quick_start_commands_are_the_ones_listed_here() -> None:
    commands = quick_start_commands()
    assert commands, "no sh block in the README's quick start"
    assert sorted(set(commands) - set(QUICK_START)) == [], (
        "a quick-start command without its test: name the test that runs it in QUICK_START"
    )
    assert sorted(set(QUICK_START) - set(commands)) == [], "QUICK_START names a command gone"
    section = quick_start()
    for words in QUICK_START_IN_THE_BROWSER:
        assert words in section, words


def test_every_quick_start_step_names_a_test_that_exists() -> None:
    missing = []
    for node in sorted(
        {
            node
            for nodes in (*QUICK_START.values(), *QUICK_START_IN_THE_BROWSER.values())
            for node in nodes
        }
    ):
        path, *names = node.split("::")
        file = ROOT / path
        if not file.is_file():
            missing.append(f"{node}: no file {path}")
            continue
        body: list[ast.stmt] = ast.parse(file.read_text(encoding="utf-8")).body
        for name in names:
            found = next(
                (
                    statement
                    for statement in body
                    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                    and statement.name == name
                ),
                None,
            )
            if found is None:
                missing.append(f"{node}: no {name} in {path}")
                break
            body = found.body
    assert missing == []
