"""What every ``tau`` command shares: the consoles, the state the root command keeps (the
profile, the API client made on demand, the workspace a command acts in), and the common
options."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click
from rich.console import Console

from tau.cli.client import EXIT_AUTH, EXIT_USAGE, Api, CliError
from tau.cli.config import Profile, load_profile

F = TypeVar("F", bound=Callable[..., Any])

# In a pipe, lines as long as they are (Rich would fold tables at 80 columns).
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 1000)
err = Console(stderr=True, highlight=False, soft_wrap=True)


@dataclass
class State:
    """What the root command learned (``--profile``), and the API client made on demand."""

    profile_name: str | None = None
    workspace: str | None = None
    _api: Api | None = field(default=None, repr=False)
    _profile: Profile | None = field(default=None, repr=False)

    @property
    def profile(self) -> Profile:
        if self._profile is None:
            self._profile = load_profile(self.profile_name)
        return self._profile

    def api(self) -> Api:
        if self._api is None:
            profile = self.profile
            if not profile.url:
                raise CliError(
                    "not logged in: run `tau login --url https://your-portal` (or set TAU_URL "
                    "and TAU_TOKEN).",
                    EXIT_AUTH,
                )
            if not profile.token:
                raise CliError(
                    f"no token for {profile.url}: run `tau login` (or set TAU_TOKEN).", EXIT_AUTH
                )
            self._api = Api(profile.url, profile.token)
        return self._api

    def workspace_for(self, asked: str | None) -> str:
        """The workspace a command acts in: ``--workspace``, the profile's, or the only one
        the token reaches (a token scoped to one workspace reaches only that one)."""
        chosen = asked or self.workspace or self.profile.workspace
        if chosen:
            return chosen
        reachable = [row["slug"] for row in self.api().get("/api/v1/workspaces/")]
        if len(reachable) == 1:
            return str(reachable[0])
        if not reachable:
            raise CliError(
                "this token reaches no workspace; ask your platform team to add you to one.",
                EXIT_AUTH,
            )
        raise CliError(
            f"you belong to several workspaces ({', '.join(reachable)}): say which with "
            "--workspace WS, or make one the default with `tau login --workspace WS`.",
            EXIT_USAGE,
        )


def state_of(ctx: click.Context) -> State:
    found = ctx.find_object(State)
    if found is None:
        found = ctx.ensure_object(State)
    return found


def json_option(function: F) -> F:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print JSON (for scripts) instead of text."
    )(function)


def workspace_option(function: F) -> F:
    return click.option(
        "--workspace",
        "-w",
        metavar="WS",
        help="The workspace (default: the profile's, or the only one the token reaches).",
    )(function)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def refuse_spec(
    name: str, problems: Sequence[dict[str, Any]], said: str, answer: dict[str, Any] | None = None
) -> CliError:
    """The refusal of an invalid tau.yaml (exit 2), each problem printed on standard error as
    FILE:LINE:COLUMN: path: message (hint). With --json the error's ``details`` are the
    portal's answer (``answer``, if it refused) with the problems, each naming its file."""
    records = [{"file": name, **problem} for problem in problems]
    for problem in records:
        line = problem.get("line") or 0
        column = problem.get("column") or 0
        text = f"{name}:{line}:{column}: {problem.get('path')}: {problem.get('message')}"
        if problem.get("hint"):
            text += f" ({problem['hint']})"
        err.print(text, markup=False)
    return CliError(said, EXIT_USAGE, details={**(answer or {}), "problems": records})
