"""The ``tau`` commands (Click). docs/cli.md is their manual; a test keeps the two in step.

Exit codes: 0 success, 1 the run failed (or the portal refused an action), 2 usage or
validation error, 3 authentication or permission, 4 not found, 130 interrupted (Ctrl-C stops
watching, never the run).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import click
import httpx
import yaml
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn
from rich.table import Table

from tau import __version__
from tau.cli import bundle as bundles
from tau.cli.client import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    Api,
    CliError,
    member_path,
    problem_text,
    run_path,
    workspace_path,
)
from tau.cli.common import (
    State,
    err,
    json_option,
    out,
    print_json,
    refuse_spec,
    state_of,
    workspace_option,
)
from tau.cli.config import (
    Profile,
    config_path,
    forget_profile,
    read_config,
    save_profile,
)
from tau.cli.data import data_group
from tau.cli.downloads import attachment_name, download_to, verify_with_portal_keys
from tau.cli.logs import (
    POLL_SECONDS,
    TERMINAL_STATES,
    WAITING_STATES,
    LogFollower,
    print_run_log,
)
from tau.cli.pipelines import pipeline_group
from tau.cli.serving import serve_group
from tau.cli.templates import TAUIGNORE, TEMPLATES, TRAIN_PY, tau_yaml
from tau.spec import SpecProblem
from tau.spec.cli import reading_lines, reading_records
from tau.spec.loader import MAX_FILE_BYTES
from tau.spec.schema import check_source, json_schema, read_source

RUN_STATES = (
    "pending",
    "queued",
    "admitted",
    "running",
    "succeeded",
    "failed",
    "cancelling",
    "cancelled",
    "preempted",
    "evicted",
)
MEMBER_ROLES = ("viewer", "researcher", "admin")
#: How long `tau run cancel` waits for a cancelling run to stop before it says it is stopping.
CANCEL_WAIT_SECONDS = 15.0


def run_page(api: Api, workspace: str, name: str) -> str:
    """The run's page on the portal (the API's ``url`` is the API's own)."""
    return f"{api.url}/w/{quote(workspace, safe='')}/runs/{quote(name, safe='')}/"


def short_time(value: str | None) -> str:
    if not value:
        return "-"
    return value.replace("T", " ")[:19]


# --- the root ------------------------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--profile",
    metavar="P",
    envvar="TAU_PROFILE",
    help="Which saved login to use (default: the last one logged in to; env TAU_PROFILE).",
)
@click.pass_context
def cli(ctx: click.Context, profile: str | None) -> None:
    """tau: submit and follow training runs on a TauGrid portal.

    Start with `tau login --url URL`, then `tau init` and `tau run --config tau.yaml --watch`.
    Exit codes: 0 ok, 1 the run failed, 2 usage or validation error, 3 authentication,
    4 not found, 130 interrupted (Ctrl-C stops watching, never the run).
    """
    ctx.obj = State(profile_name=profile)


# --- login, logout, whoami, version ---------------------------------------------------------


@cli.command()
@click.option("--url", metavar="URL", help="The portal's address, e.g. https://tau.example.org.")
@click.option("--token-stdin", is_flag=True, help="Read the API token from standard input.")
@click.option("--profile", "profile_option", metavar="P", help="Save the login under this name.")
@workspace_option
@json_option
@click.pass_context
def login(
    ctx: click.Context,
    url: str | None,
    token_stdin: bool,
    profile_option: str | None,
    workspace: str | None,
    as_json: bool,
) -> int:
    """Check an API token against the portal and save it (mode 0600).

    The token comes from a prompt, or from standard input with --token-stdin (make one on
    the portal's API tokens page, or `manage.py create_token`).
    """
    state = state_of(ctx)
    data = read_config()
    name = profile_option or state.profile_name or os.environ.get("TAU_PROFILE")
    name = name or data.get("current") or "default"
    stored = data["profiles"].get(name) or {}
    url = (url or os.environ.get("TAU_URL") or stored.get("url") or "").strip()
    if not url:
        raise CliError("say where the portal is: tau login --url https://your-portal", EXIT_USAGE)
    if not re.match(r"^https?://", url):
        raise CliError(f"{url} is not an http(s) URL (e.g. https://tau.example.org).", EXIT_USAGE)
    if token_stdin:
        token = sys.stdin.readline().strip()
    else:
        token = click.prompt("API token", hide_input=True).strip()
    if not token:
        raise CliError("no token given.", EXIT_USAGE)
    api = Api(url, token)
    try:
        reachable = api.get("/api/v1/workspaces/")
    finally:
        api.close()
    slugs = [row["slug"] for row in reachable]
    if workspace and workspace not in slugs:
        raise CliError(
            f"this token does not reach workspace {workspace!r} (it reaches: "
            f"{', '.join(slugs) or 'none'}).",
            EXIT_NOT_FOUND,
        )
    default = workspace or (slugs[0] if len(slugs) == 1 else None)
    path = save_profile(Profile(name=name, url=url.rstrip("/"), token=token, workspace=default))
    if as_json:
        print_json(
            {
                "profile": name,
                "url": url.rstrip("/"),
                "workspace": default,
                "workspaces": reachable,
                "config": str(path),
            }
        )
    else:
        roles = ", ".join(f"{row['slug']} ({row.get('role') or 'staff'})" for row in reachable)
        out.print(f"Logged in to {url.rstrip('/')} (profile {name}); saved in {path}.")
        out.print(f"Workspaces: {roles or 'none'}" + (f"; default {default}" if default else ""))
    return EXIT_OK


@cli.command()
@click.option("--profile", "profile_option", metavar="P", help="The profile to forget.")
@json_option
@click.pass_context
def logout(ctx: click.Context, profile_option: str | None, as_json: bool) -> int:
    """Forget the saved token of a profile (the token itself stays valid on the portal;
    revoke it there)."""
    state = state_of(ctx)
    data = read_config()
    name = profile_option or state.profile_name or data.get("current") or "default"
    removed = forget_profile(name)
    if as_json:
        print_json({"profile": name, "removed": removed})
    elif removed:
        out.print(f"Logged out of profile {name}.")
    else:
        out.print(f"No saved login under profile {name}.")
    return EXIT_OK


def _me(api: Api) -> dict[str, Any] | None:
    """Who the token belongs to, where the portal says it (``/api/v1/me/``)."""
    try:
        answer = api.get("/api/v1/me/")
    except CliError as error:
        if error.code == EXIT_NOT_FOUND:
            return None
        raise
    return answer if isinstance(answer, dict) else None


@cli.command()
@json_option
@click.pass_context
def whoami(ctx: click.Context, as_json: bool) -> int:
    """Show the portal, profile and workspaces this token reaches."""
    state = state_of(ctx)
    api = state.api()
    reachable = api.get("/api/v1/workspaces/")
    me = _me(api)
    profile = state.profile
    answer = {
        "profile": profile.name,
        "url": api.url,
        "token_from": "TAU_TOKEN" if os.environ.get("TAU_TOKEN") else str(config_path()),
        "user": me,
        "default_workspace": profile.workspace,
        "workspaces": reachable,
    }
    if as_json:
        print_json(answer)
        return EXIT_OK
    if me and me.get("username"):
        out.print(f"User: {me['username']}")
    out.print(f"Portal: {api.url} (profile {profile.name}, token from {answer['token_from']})")
    for row in reachable:
        marker = " (default)" if row["slug"] == profile.workspace else ""
        out.print(f"  {row['slug']}: {row.get('role') or 'platform staff'}{marker}")
    return EXIT_OK


@cli.command()
@click.option("--short", is_flag=True, help="Print only the version number.")
@json_option
def version(short: bool, as_json: bool) -> int:
    """Show the version of tau (and Python)."""
    if as_json:
        print_json(
            {
                "version": __version__,
                "python": sys.version.split()[0],
                "config": str(config_path()),
            }
        )
    elif short:
        out.print(__version__)
    else:
        out.print(f"tau {__version__} (Python {sys.version.split()[0]})")
    return EXIT_OK


@cli.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> int:
    """Print the shell completion script for bash, zsh or fish.

    bash: eval "$(tau completion bash)" in ~/.bashrc; zsh: eval "$(tau completion zsh)" in
    ~/.zshrc; fish: tau completion fish > ~/.config/fish/completions/tau.fish
    """
    from click.shell_completion import get_completion_class

    completer = get_completion_class(shell)
    assert completer is not None
    sys.stdout.write(completer(cli, {}, "tau", "_TAU_COMPLETE").source() + "\n")
    return EXIT_OK


# --- init --------------------------------------------------------------------------------


def _spec_name_for(folder: Path) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", folder.resolve().name.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = f"run-{name}".rstrip("-")
    return name[:38].rstrip("-") or "my-run"


@cli.command()
@click.argument("directory", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--template",
    type=click.Choice(sorted(TEMPLATES)),
    default="cpu",
    show_default=True,
    help="cpu: one process on CPUs; gpu: a Ray job on GPUs; torchrun: multi-node PyTorch.",
)
@click.option("--name", metavar="NAME", help="The spec's name (default: from the folder's).")
@click.option("--force", is_flag=True, help="Overwrite an existing tau.yaml.")
@json_option
def init(
    directory: Path | None, template: str, name: str | None, force: bool, as_json: bool
) -> int:
    """Write a commented tau.yaml and a .tauignore (and a train.py if there is none)."""
    folder = directory or Path()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "tau.yaml"
    if target.exists() and not force:
        raise CliError(f"{target} exists; pass --force to overwrite it.", EXIT_USAGE)
    text = tau_yaml(template, name or _spec_name_for(folder))
    _spec, problems = check_source(text)
    if problems:
        raise CliError(
            "the template does not validate with this name: "
            + "; ".join(problem.format() for problem in problems),
            EXIT_USAGE,
        )
    written = [target]
    target.write_text(text, encoding="utf-8")
    for extra, content in ((".tauignore", TAUIGNORE), ("train.py", TRAIN_PY)):
        path = folder / extra
        if not path.exists():
            path.write_text(content, encoding="utf-8")
            written.append(path)
    if as_json:
        print_json({"template": template, "written": [str(path) for path in written]})
    else:
        out.print("Wrote " + ", ".join(str(path) for path in written) + ".")
        out.print(f"Next: tau run --config {target} --watch")
    return EXIT_OK


# --- validate, schema ------------------------------------------------------------------


def _problem_record(name: str, problem: SpecProblem) -> dict[str, Any]:
    return {"file": name, **problem.to_dict(), "severity": "error"}


@click.command("validate")
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False, allow_dash=True))
@json_option
def validate_command(files: Sequence[str], as_json: bool) -> int:
    """Check tau.yaml files offline with the server's own checker (default ./tau.yaml).

    Problems print as FILE:LINE:COLUMN: path: message (hint). Exit 2 if any file is invalid.
    """
    names = list(files) or ["tau.yaml"]
    records: list[dict[str, Any]] = []
    status = EXIT_OK
    for name in names:
        shown = "<stdin>" if name == "-" else name
        try:
            if name == "-":
                data = sys.stdin.buffer.read(MAX_FILE_BYTES + 1)
            else:
                data = Path(name).read_bytes()[: MAX_FILE_BYTES + 1]
        except OSError as error:
            status = EXIT_USAGE
            problem = SpecProblem("(file)", 0, 0, f"cannot read the file: {error.strerror}")
            records.append(_problem_record(shown, problem))
            if not as_json:
                err.print(f"{shown}: cannot read the file: {error.strerror}")
            continue
        reading = read_source(data)
        if reading.problems:
            status = EXIT_USAGE
        records.extend(reading_records(shown, reading))
        if not as_json:
            for line in reading_lines(shown, reading):
                out.print(line)
    if as_json:
        print_json(records)
    return status


@click.command("schema")
def schema_command() -> int:
    """Print the JSON Schema of tau.yaml (draft 2020-12), for editors."""
    print_json(json_schema())
    return EXIT_OK


# --- tau run (submit) ---------------------------------------------------------------------


def _parse_setting(setting: str) -> tuple[list[str], Any]:
    path, sep, raw = setting.partition("=")
    if not sep or not path.strip():
        raise CliError(f"--set {setting!r}: write it as path=value, e.g. compute.cpus=2", 2)
    keys = path.strip().split(".")
    if any(not key for key in keys):
        raise CliError(f"--set {setting!r}: the path has an empty part.", EXIT_USAGE)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return keys, value


def apply_settings(source: bytes, settings: Sequence[str]) -> bytes:
    """The tau.yaml with ``--set path=value`` applied (values read as YAML: 2, true, [a, b]).
    Comments are lost from what is submitted, not from the file."""
    if not settings:
        return source
    try:
        document = yaml.safe_load(source)
    except yaml.YAMLError:
        return source  # the checker reports the problem with its line
    if not isinstance(document, dict):
        return source
    for setting in settings:
        keys, value = _parse_setting(setting)
        node: Any = document
        for key in keys[:-1]:
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            if not isinstance(child, dict):
                raise CliError(f"--set {setting}: {key} is not a block.", EXIT_USAGE)
            node = child
        node[keys[-1]] = value
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True).encode()


def _multipart(
    spec: bytes, bundle_path: Path, progress: Callable[[int], None]
) -> tuple[str, int, Iterator[bytes]]:
    boundary = f"tau-{secrets.token_hex(12)}"

    def part(name: str, filename: str) -> bytes:
        return (
            f"--{boundary}\r\n"
            f'Content-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()

    head = part("spec", "tau.yaml") + spec + b"\r\n" + part("bundle", "project.zip")
    tail = f"\r\n--{boundary}--\r\n".encode()
    total = len(head) + bundle_path.stat().st_size + len(tail)

    def body() -> Iterator[bytes]:
        yield head
        with bundle_path.open("rb") as handle:
            while chunk := handle.read(256 * 1024):
                progress(len(chunk))
                yield chunk
        yield tail

    return f"multipart/form-data; boundary={boundary}", total, body()


def submit(
    state: State,
    *,
    config: Path,
    workspace: str | None,
    settings: Sequence[str],
    directory: Path | None,
    watch: bool,
    as_json: bool,
    dry_run: bool,
) -> int:
    try:
        source = config.read_bytes()
    except OSError as error:
        raise CliError(f"cannot read {config}: {error.strerror}", EXIT_USAGE) from None
    source = apply_settings(source, settings)
    spec, problems = check_source(source)
    if spec is None or problems:
        count = f"{len(problems)} problem{'' if len(problems) == 1 else 's'}"
        raise refuse_spec(
            str(config),
            [p.to_dict() for p in problems],
            f"{config} is not valid ({count}); nothing was sent.",
        )
    root = directory or (config.parent / spec.run.project_dir)
    if not root.is_dir():
        raise CliError(f"the project folder {root} does not exist.", EXIT_USAGE)
    try:
        files = bundles.project_files(root, bundles.Ignore.for_project(root, spec.run.exclude))
    except bundles.BundleTooLarge as refused:
        raise CliError(str(refused), EXIT_USAGE) from None
    if dry_run:
        if as_json:
            print_json({"spec_name": spec.name, "project": str(root), "files": files})
        else:
            out.print(f"Would upload {len(files)} files from {root}:")
            for name in files:
                out.print(f"  {name}", markup=False)
        return EXIT_OK
    workspace = state.workspace_for(workspace)
    api = state.api()
    with tempfile.TemporaryDirectory(prefix="tau-bundle-") as scratch:
        archive = Path(scratch) / "project.zip"
        try:
            size = bundles.write_bundle(root, files, archive)
        except bundles.BundleTooLarge as refused:
            raise CliError(str(refused), EXIT_USAGE) from None
        show_progress = err.is_terminal and not as_json
        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            console=err,
            disable=not show_progress,
            transient=True,
        ) as bar:
            task = bar.add_task(f"Uploading {len(files)} files", total=size)
            content_type, total, body = _multipart(
                source, archive, lambda sent: bar.advance(task, sent)
            )
            try:
                response = api.http.post(
                    run_path(workspace),
                    content=body,
                    headers={"Content-Type": content_type, "Content-Length": str(total)},
                    timeout=300,
                )
            except Exception as error:
                raise CliError(f"the upload to {api.url} failed: {error}") from None
    if response.status_code in {400, 413}:
        answer = api.json_of(response)
        if isinstance(answer, dict) and answer.get("problems"):
            # The portal's own words ("The run was not submitted."), said once.
            said = str(answer.get("detail") or "The run was not submitted.")
            raise refuse_spec(str(config), answer["problems"], said, answer)
    api.check(response)
    run = api.json_of(response)
    link = run_page(api, workspace, run["name"])
    if not watch:
        if as_json:
            print_json({**run, "web_url": link})
        else:
            out.print(f"Submitted {run['name']} to {workspace} ({run['state']}).")
            out.print(f"  {link}")
            out.print(f"Follow it: tau run status {run['name']} --watch")
        return EXIT_OK
    if not as_json:
        out.print(f"Submitted {run['name']} to {workspace}: {link}")
    return watch_run(api, workspace, run["name"], logs=not as_json, as_json=as_json)


class RunGroup(click.Group):
    """``tau run`` submits; ``tau run <subcommand>`` does the rest."""

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage(ctx.command_path, "--config FILE [OPTIONS]")
        formatter.write_usage(ctx.command_path, "COMMAND [ARGS]...")


@cli.group("run", cls=RunGroup, invoke_without_command=True)
@click.option(
    "--config",
    "-c",
    metavar="FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The tau.yaml to submit (default ./tau.yaml).",
)
@workspace_option
@click.option(
    "--set",
    "settings",
    metavar="PATH=VALUE",
    multiple=True,
    help="Change a field for this run only, e.g. --set compute.cpus=2 (repeatable).",
)
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="The project folder to upload (default: the config file's, run.project_dir).",
)
@click.option("--watch", is_flag=True, help="Follow the run's state and log until it ends.")
@click.option("--dry-run", is_flag=True, help="Check and list the files to upload; submit nothing.")
@json_option
@click.pass_context
def run_group(
    ctx: click.Context,
    config: Path | None,
    workspace: str | None,
    settings: tuple[str, ...],
    directory: Path | None,
    watch: bool,
    dry_run: bool,
    as_json: bool,
) -> int:
    """Submit a run: tau run --config tau.yaml [--watch]; or a run subcommand below.

    The project folder is zipped, leaving out .git/ and what .tauignore, .gitignore and
    run.exclude name. With --watch the exit status is the run's: 0 succeeded, 1 failed or
    cancelled.
    """
    state = state_of(ctx)
    if ctx.invoked_subcommand is not None:
        if config or settings or directory or watch or dry_run or as_json:
            raise click.UsageError(
                "--config, --set, --dir, --watch, --dry-run and --json go after the "
                f"subcommand ({ctx.invoked_subcommand}), or with `tau run` alone to submit."
            )
        state.workspace = workspace
        return EXIT_OK
    if config is None:
        if not Path("tau.yaml").is_file():
            raise click.UsageError(
                "say which tau.yaml to submit: tau run --config FILE (or `tau init` to write one)"
            )
        config = Path("tau.yaml")
    return submit(
        state,
        config=config,
        workspace=workspace,
        settings=settings,
        directory=directory,
        watch=watch,
        as_json=as_json,
        dry_run=dry_run,
    )


run_group.add_command(validate_command)
run_group.add_command(schema_command)


# --- following a run ----------------------------------------------------------------------


def _state_line(run: dict[str, Any]) -> str:
    text = f"{time.strftime('%H:%M:%S')} {run['name']}: {run['state']}"
    if run.get("queue_position"):
        text += f" (position {run['queue_position']})"
    if run.get("state_reason"):
        text += f" — {run['state_reason']}"
    if run.get("failure_class"):
        text += f" [{run['failure_class']}]"
    return text


def watch_run(
    api: Api, workspace: str, name: str, *, logs: bool, as_json: bool, quiet: bool = False
) -> int:
    """Follow the run until it ends; its outcome as the exit status. Ctrl-C stops watching
    (exit 130), never the run."""
    path = run_path(workspace, name)
    follower = LogFollower(api, path) if logs else None
    seen: tuple[str, str] | None = None
    try:
        while True:
            run = api.get(path)
            # NAME may be a spec name: what is said from here on names the run itself.
            name = str(run["name"])
            moment = (run["state"], run.get("state_reason") or "")
            if moment != seen:
                seen = moment
                if as_json:
                    sys.stdout.write(json.dumps(run, ensure_ascii=False) + "\n")
                    sys.stdout.flush()
                elif not quiet:
                    err.print(_state_line(run), markup=False)
            if follower is not None:
                text = follower.read(attempt_count=int(run.get("attempt_count") or 0))
                if text:
                    sys.stdout.write(text)
                    sys.stdout.flush()
            if run["state"] in TERMINAL_STATES:
                break
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        raise CliError(
            f"stopped watching; {name} goes on (`tau run cancel {name}` stops it).",
            EXIT_INTERRUPTED,
        ) from None
    if not as_json and not quiet:
        err.print(f"{name} {run['state']}.", markup=False)
    return EXIT_OK if run["state"] == "succeeded" else EXIT_FAILED


def _newest_local_spec_name() -> str | None:
    try:
        spec, _problems = check_source(Path("tau.yaml").read_bytes())
    except OSError:
        return None
    return spec.name if spec is not None else None


def _run_summary(run: dict[str, Any], api: Api, workspace: str) -> None:
    out.print(f"{run['name']}  {run['state']}", markup=False)
    rows = [
        ("spec", run.get("spec_name")),
        ("reason", run.get("state_reason")),
        ("queue position", run.get("queue_position")),
        ("failure", run.get("failure_class")),
        ("attempts", run.get("attempt_count")),
        ("priority", run.get("priority")),
        ("backend", run.get("backend")),
        ("submitted by", run.get("submitted_by")),
        ("created", short_time(run.get("created_at"))),
        ("started", short_time(run.get("started_at"))),
        ("finished", short_time(run.get("finished_at"))),
        ("page", run_page(api, workspace, run["name"])),
    ]
    for label, value in rows:
        if value not in (None, "", "-"):
            out.print(f"  {label + ':':15} {value}", markup=False)
    # What ended each failed attempt: the reason above names only the newest, and a retried
    # attempt's message is nowhere else.
    for attempt in run.get("attempts") or []:
        if attempt.get("failure_class"):
            said = attempt.get("failure_message") or attempt.get("failure_hint") or ""
            label = f"attempt {attempt['number']}:"
            out.print(f"  {label:15} {attempt['failure_class']}: {said}".rstrip(), markup=False)
    for warning in run.get("warnings") or []:
        out.print(f"  warning: {warning}", markup=False)


@run_group.command("status")
@click.argument("name", required=False)
@workspace_option
@click.option("--watch", is_flag=True, help="Follow state changes until the run ends.")
@json_option
@click.pass_context
def status_command(
    ctx: click.Context, name: str | None, workspace: str | None, watch: bool, as_json: bool
) -> int:
    """A run's state: NAME is a run name or a spec name (its newest run); default the newest
    run of ./tau.yaml, else of the workspace."""
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    api = state.api()
    if name is None:
        spec_name = _newest_local_spec_name()
        rows = api.get(run_path(ws), name=spec_name, limit=1)["results"]
        if not rows:
            raise CliError("no runs yet" + (f" of {spec_name}" if spec_name else ""), 4)
        name = str(rows[0]["name"])
    if watch:
        return watch_run(api, ws, name, logs=False, as_json=as_json)
    run = api.get(run_path(ws, name))
    if as_json:
        print_json(run)
    else:
        _run_summary(run, api, ws)
    return EXIT_OK


@run_group.command("logs")
@click.argument("name")
@workspace_option
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the run ends.")
@click.option("--attempt", type=click.IntRange(min=1), help="Which attempt (default newest).")
@json_option
@click.pass_context
def logs_command(
    ctx: click.Context,
    name: str,
    workspace: str | None,
    follow: bool,
    attempt: int | None,
    as_json: bool,
) -> int:
    """Print a run's log; with -f follow it until the run ends (then exit with its outcome)."""
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    api = state.api()
    return print_run_log(api, ws, name, follow=follow, attempt=attempt, as_json=as_json)


@run_group.command("list")
@workspace_option
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(RUN_STATES),
    help="Only runs in this state (repeatable).",
)
@click.option("--mine", is_flag=True, help="Only runs you submitted.")
@click.option("--submitter", metavar="USER", help="Only runs this user submitted.")
@click.option("--name", metavar="NAME", help="Only runs of this spec name.")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 1000))
@json_option
@click.pass_context
def list_command(
    ctx: click.Context,
    workspace: str | None,
    states: tuple[str, ...],
    mine: bool,
    submitter: str | None,
    name: str | None,
    limit: int,
    as_json: bool,
) -> int:
    """The workspace's runs, newest first."""
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    api = state.api()
    if mine:
        me = _me(api)
        if not me or not me.get("username"):
            raise CliError(
                "this portal does not say whose token this is (no /api/v1/me/); use "
                "--submitter USER instead of --mine.",
                EXIT_USAGE,
            )
        submitter = str(me["username"])
    rows: list[dict[str, Any]] = []
    params: dict[str, Any] = {"name": name, "submitter": submitter, "limit": min(limit, 200)}
    if states:
        params["state"] = list(states)
    for row in api.pages(run_path(ws), **params):
        rows.append(row)
        if len(rows) >= limit:
            break
    if as_json:
        print_json(rows)
        return EXIT_OK
    _runs_table(rows, title=f"Runs in {ws}")
    return EXIT_OK


def _cell(value: Any) -> str:
    return "-" if value in (None, "") else str(value)


def _runs_table(rows: Sequence[dict[str, Any]], *, title: str, queue: bool = False) -> None:
    if not rows:
        out.print(f"{title}: none.")
        return
    table = Table(title=title, title_justify="left", box=None, pad_edge=False)
    columns = (
        ["#", "name", "state", "priority", "submitted by", "reason"]
        if queue
        else [
            "name",
            "state",
            "attempts",
            "submitted by",
            "created",
            "finished",
        ]
    )
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        if queue:
            cells = [
                str(row.get("queue_position") or "-"),
                row["name"],
                row["state"],
                str(row.get("priority") or "-"),
                str(row.get("submitted_by") or "-"),
                str(row.get("state_reason") or ""),
            ]
        else:
            cells = [
                row["name"],
                row["state"],
                str(row.get("attempt_count", "")),
                str(row.get("submitted_by") or "-"),
                short_time(row.get("created_at")),
                short_time(row.get("finished_at")),
            ]
        table.add_row(*cells)
    out.print(table)


def _act(ctx: click.Context, name: str, workspace: str | None, action: str, body: Any) -> Any:
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    api = state.api()
    return ws, api, api.post(run_path(ws, name) + f"{action}/", body)


@run_group.command("cancel")
@click.argument("name")
@workspace_option
@json_option
@click.pass_context
def cancel_command(ctx: click.Context, name: str, workspace: str | None, as_json: bool) -> int:
    """Cancel a run (its owner or a workspace admin); waits a few seconds for it to stop."""
    ws, api, run = _act(ctx, name, workspace, "cancel", None)
    # A run that was handed to its backend is `cancelling` until the backend has stopped it,
    # which mostly takes a moment (a queued Kubernetes job is deleted at once): say how it
    # ended rather than a state it has already left.
    deadline = time.monotonic() + CANCEL_WAIT_SECONDS
    try:
        while run["state"] == "cancelling" and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
            run = api.get(run_path(ws, run["name"]))
    except KeyboardInterrupt:
        raise CliError(
            f"stopped waiting; {run['name']} is being cancelled.", EXIT_INTERRUPTED
        ) from None
    if as_json:
        print_json(run)
    elif run["state"] == "cancelling":
        out.print(
            f"{run['name']}: cancelling; its backend is still stopping it "
            f"(`tau run status {run['name']} --watch` follows it to the end).",
            markup=False,
        )
    else:
        out.print(f"{run['name']}: {run['state']}.", markup=False)
    return EXIT_OK


@run_group.command("resume")
@click.argument("name")
@workspace_option
@click.option("--checkpoint", type=int, metavar="ID", help="Resume from this checkpoint's id.")
@click.option("--watch", is_flag=True, help="Then follow it until it ends.")
@json_option
@click.pass_context
def resume_command(
    ctx: click.Context,
    name: str,
    workspace: str | None,
    checkpoint: int | None,
    watch: bool,
    as_json: bool,
) -> int:
    """Start a finished run again, from its newest checkpoint (or --checkpoint ID)."""
    body = {} if checkpoint is None else {"checkpoint": checkpoint}
    ws, api, run = _act(ctx, name, workspace, "resume", body)
    if watch:
        if not as_json:
            out.print(f"Resumed {run['name']} (attempt {run['attempt_count']}).")
        return watch_run(api, ws, run["name"], logs=not as_json, as_json=as_json)
    if as_json:
        print_json(run)
    else:
        out.print(f"Resumed {run['name']}: {run['state']} (attempt {run['attempt_count']}).")
    return EXIT_OK


@run_group.command("history")
@click.argument("name")
@workspace_option
@json_option
@click.pass_context
def history_command(ctx: click.Context, name: str, workspace: str | None, as_json: bool) -> int:
    """A run's events, oldest first (every state change, with its reason)."""
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    api = state.api()
    path = run_path(ws, name) + "events/"
    events: list[dict[str, Any]] = []
    after = 0
    while True:
        response = api.request("GET", path, params={"after": after})
        page = api.json_of(response)
        events.extend(page)
        if not page or "next" not in response.headers.get("Link", ""):
            break
        after = int(page[-1]["seq"])
    if as_json:
        print_json(events)
        return EXIT_OK
    messages = _failure_messages(api, ws, name, events)
    for event in events:
        change = ""
        if event.get("new_state"):
            change = f"{event.get('old_state') or '-'} → {event['new_state']}  "
        message = event.get("message") or ""
        out.print(
            f"{event['seq']:>4}  {short_time(event['time'])}  {event['kind']:<20} {change}"
            f"{message}",
            markup=False,
        )
        # An event that ended an attempt names its class; what Kubernetes or the program
        # said is the attempt's (a retry's event does not repeat it).
        data = event.get("data")
        if not isinstance(data, dict) or not data.get("failure_class"):
            continue
        number = data.get("attempt")
        said = messages.get(number) if isinstance(number, int) else None
        if said and said not in message:
            out.print(f"{'':>29}attempt {number}: {said}", markup=False)
    return EXIT_OK


def _failure_messages(
    api: Api, workspace: str, name: str, events: list[dict[str, Any]]
) -> dict[int, str]:
    """Each failed attempt's message by number, read only when an event names a failure."""
    if not any(isinstance(e.get("data"), dict) and e["data"].get("failure_class") for e in events):
        return {}
    run = api.get(run_path(workspace, name))
    return {
        int(attempt["number"]): str(attempt["failure_message"])
        for attempt in run.get("attempts") or []
        if attempt.get("failure_message")
    }


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 24) -> str:
    if not values:
        return ""
    if len(values) > width:
        stride = len(values) / width
        values = [values[int(index * stride)] for index in range(width - 1)] + [values[-1]]
    low, high = min(values), max(values)
    spread = (high - low) or 1.0
    return "".join(SPARKS[int((value - low) / spread * (len(SPARKS) - 1))] for value in values)


@run_group.command("metrics")
@click.argument("name")
@workspace_option
@click.option("--key", "keys", multiple=True, metavar="K", help="Only this metric (repeatable).")
@json_option
@click.pass_context
def metrics_command(
    ctx: click.Context, name: str, workspace: str | None, keys: tuple[str, ...], as_json: bool
) -> int:
    """A run's metrics: last, lowest and highest value of each, with a sparkline."""
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    api = state.api()
    answer = api.get(run_path(ws, name) + "metrics/", keys=",".join(keys) or None)
    series: dict[str, list[list[float]]] = answer.get("series") or {}
    missing = [key for key in keys if key not in series]
    if as_json:
        print_json(answer)
        return EXIT_NOT_FOUND if missing else EXIT_OK
    if missing:
        raise CliError(
            f"no metric {', '.join(missing)}; this run has: {', '.join(answer['keys']) or 'none'}",
            EXIT_NOT_FOUND,
        )
    if not series:
        out.print(f"{name}: no metrics yet.")
        return EXIT_OK
    table = Table(box=None, pad_edge=False)
    for column in ("metric", "points", "last step", "last", "min", "max", "trend"):
        table.add_column(column)
    for key, points in series.items():
        values = [float(point[1]) for point in points]
        table.add_row(
            key,
            str(len(points)),
            f"{points[-1][0]:g}" if points else "-",
            f"{values[-1]:.6g}" if values else "-",
            f"{min(values):.6g}" if values else "-",
            f"{max(values):.6g}" if values else "-",
            sparkline(values),
        )
    out.print(table)
    return EXIT_OK


# --- queue and workspaces ----------------------------------------------------------------


@cli.command("queue")
@click.argument("workspace", required=False, metavar="[WS]")
@json_option
@click.pass_context
def queue_command(ctx: click.Context, workspace: str | None, as_json: bool) -> int:
    """The runs waiting in a workspace, in queue order, with why they wait."""
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    api = state.api()
    rows = list(api.pages(run_path(ws), state=list(WAITING_STATES), limit=200))
    rows.sort(key=lambda row: (row.get("queue_position") or 10**9, row.get("created_at") or ""))
    if as_json:
        print_json(rows)
    else:
        _runs_table(rows, title=f"Waiting in {ws}", queue=True)
    return EXIT_OK


@cli.group("workspace")
def workspace_group() -> None:
    """Your workspaces, their settings and quotas."""


@workspace_group.command("list")
@json_option
@click.pass_context
def workspace_list(ctx: click.Context, as_json: bool) -> int:
    """The workspaces this token reaches, with your role in each."""
    rows = state_of(ctx).api().get("/api/v1/workspaces/")
    if as_json:
        print_json(rows)
        return EXIT_OK
    table = Table(box=None, pad_edge=False)
    for column in ("workspace", "name", "role", "members", "GPU quota"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            row["slug"],
            str(row.get("name") or ""),
            str(row.get("role") or "staff"),
            str(row.get("member_count", "")),
            str(row.get("gpu_quota", "")),
        )
    out.print(table)
    return EXIT_OK


@workspace_group.command("show")
@click.argument("workspace", required=False, metavar="[WS]")
@json_option
@click.pass_context
def workspace_show(ctx: click.Context, workspace: str | None, as_json: bool) -> int:
    """One workspace's settings."""
    state = state_of(ctx)
    row = state.api().get(workspace_path(state.workspace_for(workspace)))
    if as_json:
        print_json(row)
        return EXIT_OK
    for key, value in row.items():
        if isinstance(value, list):
            value = ", ".join(str(item) for item in value)
        out.print(f"{key + ':':20} {value if value not in (None, '') else '-'}", markup=False)
    return EXIT_OK


@workspace_group.command("quota")
@click.argument("workspace", required=False, metavar="[WS]")
@json_option
@click.pass_context
def workspace_quota(ctx: click.Context, workspace: str | None, as_json: bool) -> int:
    """A workspace's quotas per flavor and resource."""
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    rows = state.api().get(workspace_path(ws) + "quota/")
    if as_json:
        print_json(rows)
        return EXIT_OK
    if not rows:
        out.print(f"{ws}: no quotas set.")
        return EXIT_OK
    table = Table(box=None, pad_edge=False)
    columns = list(rows[0].keys())
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(_cell(row.get(column)) for column in columns))
    out.print(table)
    return EXIT_OK


@workspace_group.group("members")
def members_group() -> None:
    """A workspace's members and their roles: its members read them, its admins change them
    (a workspace keeps at least one admin)."""


@members_group.command("list")
@workspace_option
@json_option
@click.pass_context
def members_list(ctx: click.Context, workspace: str | None, as_json: bool) -> int:
    """The workspace's members with their roles, by username."""
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    rows = state.api().get(member_path(ws))
    if as_json:
        print_json(rows)
        return EXIT_OK
    table = Table(title=f"Members of {ws}", title_justify="left", box=None, pad_edge=False)
    for column in ("member", "name", "role", "joined"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(
            str(row["username"]),
            _cell(row.get("full_name")),
            str(row["role"]),
            short_time(row.get("joined"))[:10],
        )
    out.print(table)
    return EXIT_OK


@members_group.command("add")
@click.argument("username")
@click.option(
    "--role",
    type=click.Choice(MEMBER_ROLES),
    default="researcher",
    show_default=True,
    help="viewer: reads; researcher: also submits runs; admin: also manages members.",
)
@workspace_option
@json_option
@click.pass_context
def members_add(
    ctx: click.Context, username: str, role: str, workspace: str | None, as_json: bool
) -> int:
    """Add someone (an admin adds people who already share a workspace with them; the
    platform team adds anyone)."""
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    member = state.api().post(member_path(ws), {"username": username, "role": role})
    if as_json:
        print_json(member)
    else:
        out.print(f"Added {member['username']} to {ws} as {member['role']}.", markup=False)
    return EXIT_OK


@members_group.command("set-role")
@click.argument("username")
@click.argument("role", type=click.Choice(MEMBER_ROLES))
@workspace_option
@json_option
@click.pass_context
def members_set_role(
    ctx: click.Context, username: str, role: str, workspace: str | None, as_json: bool
) -> int:
    """Change a member's role to ROLE (viewer, researcher or admin)."""
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    api = state.api()
    before = api.get(member_path(ws, username))
    member = api.patch(member_path(ws, username), {"role": role})
    if as_json:
        print_json(member)
    elif before["role"] == member["role"]:
        out.print(f"{member['username']} was already {member['role']} in {ws}.", markup=False)
    else:
        out.print(
            f"{member['username']} is now {member['role']} in {ws} (was {before['role']}).",
            markup=False,
        )
    return EXIT_OK


@members_group.command("remove")
@click.argument("username")
@workspace_option
@json_option
@click.pass_context
def members_remove(ctx: click.Context, username: str, workspace: str | None, as_json: bool) -> int:
    """Remove a member: their access, and their tokens' access, to the workspace ends at once
    (their runs stay)."""
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    state.api().delete(member_path(ws, username))
    if as_json:
        print_json({"workspace": ws, "username": username, "removed": True})
    else:
        out.print(f"Removed {username} from {ws}.", markup=False)
    return EXIT_OK


@cli.group("evidence")
def evidence_group() -> None:
    """Sealed evidence records of runs (docs/evidence.md)."""


@evidence_group.command("verify")
@click.argument("file", metavar="FILE")
@click.option(
    "--key",
    metavar="PUBKEY_OR_KEYRING",
    help="The keys to trust: the portal's keyring (GET /api/v1/evidence/keys/), a PEM public "
    "key or a base64 raw key. Without it the signer is not checked.",
)
@json_option
def evidence_verify(file: str, key: str | None, as_json: bool) -> int:
    """Check an exported record offline: the signature, every digest, the event chain.

    Exit 0: every check passed; 1: something does not match (each mismatch named); 2: the
    record or the key cannot be read."""
    # Imported here: `cryptography` loads only for the command that needs it.
    from tau.evidence.verify import verify_and_report

    return verify_and_report(file, key, as_json=as_json)


@evidence_group.command("pull")
@click.argument("name")
@workspace_option
@click.option(
    "-o",
    "--output",
    metavar="FILE",
    type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
    help="Where to write the record (default: the portal's file name, "
    "<run>-<n>.evidence.tar, in the current folder). - writes to standard output.",
)
@click.option("--force", is_flag=True, help="Replace FILE if it exists.")
@click.option(
    "--verify",
    "then_verify",
    is_flag=True,
    help="Then check it offline against the portal's published keyring, as "
    "`tau evidence verify FILE --key KEYS` would.",
)
@json_option
@click.pass_context
def evidence_pull(
    ctx: click.Context,
    name: str,
    workspace: str | None,
    output: Path | None,
    force: bool,
    then_verify: bool,
    as_json: bool,
) -> int:
    """Download a finished run's sealed evidence record (one tar file).

    NAME is a run name or a spec name (its newest run). The file is written under a
    temporary name and renamed when complete, so an interrupted download leaves nothing
    that looks whole."""
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    api = state.api()
    to_stdout = output is not None and str(output) == "-"
    if to_stdout and (then_verify or as_json):
        raise CliError(
            "-o - writes the record to standard output: leave out --verify and --json.",
            EXIT_USAGE,
        )
    if output is not None and not to_stdout and output.exists() and not force:
        raise CliError(f"{output} exists; use --force to replace it.", EXIT_USAGE)
    path = run_path(ws, name) + "evidence/"
    try:
        with api.http.stream("GET", path, headers={"Accept": "application/x-tar"}) as response:
            if response.status_code >= 400:
                response.read()
                if response.status_code == 409:
                    said = problem_text(api.json_of(response))
                    # Given up after repeated failures: nothing comes by waiting.
                    yet = "" if "could not be sealed" in said else " yet"
                    raise CliError(f"no evidence of {name} to download{yet}: {said}")
                api.check(response)
            if to_stdout:
                for chunk in response.iter_bytes():
                    sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
                return EXIT_OK
            target = output or Path(attachment_name(response) or f"{name}.evidence.tar")
            if output is None and target.exists() and not force:
                raise CliError(
                    f"{target} exists; use --force to replace it (or -o FILE).", EXIT_USAGE
                )
            size = download_to(response, target, quiet=as_json)
    except CliError:
        raise
    except KeyboardInterrupt:
        raise CliError("download stopped; nothing was written.", EXIT_INTERRUPTED) from None
    except httpx.HTTPError as error:
        raise CliError(f"the download from {api.url} failed: {error}") from None
    if not as_json:
        out.print(f"Wrote {target} ({size:,} bytes).", markup=False)
    if not then_verify:
        if as_json:
            print_json({"file": str(target), "size": size})
        return EXIT_OK
    return verify_with_portal_keys(api, target, as_json=as_json)


# --- short aliases ------------------------------------------------------------------------

for _alias, _command in (
    ("status", status_command),
    ("logs", logs_command),
    ("list", list_command),
    ("cancel", cancel_command),
    ("resume", resume_command),
    ("history", history_command),
    ("metrics", metrics_command),
    ("validate", validate_command),
):
    cli.add_command(_command, _alias)

cli.add_command(data_group)
cli.add_command(serve_group)
cli.add_command(pipeline_group)
