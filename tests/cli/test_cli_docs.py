"""docs/cli.md and ``tau --help`` agree: every command and every option Click knows is on the
page, and every ``tau …`` command the page's tables name exists."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click

from tau.cli.commands import cli

DOC = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    context = click.Context(group)
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        assert command is not None
        yield (*path, name)
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))


def _command(path: tuple[str, ...]) -> click.Command:
    command: click.Command = cli
    for name in path:
        assert isinstance(command, click.Group)
        found = command.get_command(click.Context(command), name)
        assert found is not None
        command = found
    return command


def test_every_command_is_documented() -> None:
    missing = [" ".join(("tau", *path)) for path in _commands(cli)]
    missing = [name for name in missing if f"`{name}" not in DOC]
    assert missing == []


def test_every_option_is_documented() -> None:
    missing = []
    for path in [(), *_commands(cli)]:
        for parameter in _command(path).params:
            if not isinstance(parameter, click.Option):
                continue
            for flag in parameter.opts:
                if flag.startswith("--") and flag != "--help" and flag not in DOC:
                    missing.append(f"tau {' '.join(path)} {flag}")
    assert missing == []


def test_every_documented_command_exists() -> None:
    documented = set(re.findall(r"^\| `(tau [a-z ]+?)(?: \[| [A-Z-]|`)", DOC, re.MULTILINE))
    known = {" ".join(("tau", *path)) for path in _commands(cli)}
    assert documented
    assert documented - known == set()


def test_the_tokens_page_is_called_what_the_portal_calls_it() -> None:
    """The page where tokens are made is named as the portal's menu names it, on this page
    and in `tau login --help` (both said "Tokens page")."""
    base = (Path(__file__).resolve().parents[2] / "templates" / "base.html").read_text()
    found = re.search(r"""<a href="\{% url 'tokens' %\}">([^<]+)</a>""", base)
    assert found is not None
    label = found.group(1)
    assert f"*{label}*\npage" in DOC or f"*{label}* page" in DOC
    assert "*Tokens*" not in DOC
    login_help = _command(("login",)).help or ""
    assert f"{label} page" in " ".join(login_help.split())
