"""``tau pipeline``: pipelines of stages (docs/pipelines.md). Checking a pipeline.yaml is
offline, with the server's own checker (:mod:`tau.pipeline`): no portal, no login.

``tau pipeline run`` checks the same way first, then sends the folder of pipeline.yaml as one
zip (every stage's project is a folder in it; ``.tauignore`` and ``.gitignore`` at its top
leave files out, as for ``tau run``); the portal checks it again, with the workspace's own
rules, and starts the stages as what they need succeeds."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import click
import httpx
from rich.table import Table

from tau.cli import bundle as bundles
from tau.cli.client import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    Api,
    CliError,
    problem_text,
)
from tau.cli.common import err, json_option, out, print_json, state_of, workspace_option
from tau.cli.downloads import attachment_name, download_to, verify_with_portal_keys
from tau.cli.logs import print_run_log
from tau.pipeline import DEFAULT_FILE, check_lines, check_pipeline, json_schema

#: How often ``--watch`` asks the portal.
POLL_SECONDS = 1.0
#: How ``--watch`` ends, by the pipeline's final state. A gate that said no (``stopped``) is
#: not a failure: the pipeline did what it was told.
SETTLED = {
    "succeeded": EXIT_OK,
    "stopped": EXIT_OK,
    "failed": EXIT_FAILED,
    "cancelled": EXIT_FAILED,
}


def pipeline_path(workspace: str, name: str | None = None, action: str = "") -> str:
    base = f"/api/v1/workspaces/{quote(workspace, safe='')}/pipelines/"
    if name is None:
        return base
    return f"{base}{quote(name, safe='')}/{action}"


def _problem_lines(problems: list[dict[str, Any]]) -> None:
    for problem in problems:
        text = (
            f"{problem.get('file')}:{problem.get('line') or 0}:{problem.get('column') or 0}: "
            f"{problem.get('path')}: {problem.get('message')}"
        )
        if problem.get("hint"):
            text += f" ({problem['hint']})"
        err.print(text, markup=False)


def submit(
    api: Api, workspace: str, config: Path, *, quiet: bool, rerun: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Send the folder of ``config`` as one zip; the portal's answer (the pipeline)."""
    root = config.parent
    with tempfile.TemporaryDirectory(prefix="tau-bundle-") as scratch:
        archive = Path(scratch) / "pipeline.zip"
        try:
            files = bundles.project_files(root, bundles.Ignore.for_project(root, ()))
            bundles.write_bundle(root, files, archive)
        except bundles.BundleTooLarge as refused:
            raise CliError(str(refused), EXIT_USAGE) from None
        if not quiet:
            err.print(f"Uploading {len(files)} files from {root.resolve()}.", markup=False)
        with archive.open("rb") as zipped:
            try:
                response = api.http.post(
                    pipeline_path(workspace),
                    data={"rerun": list(rerun)},
                    files={"bundle": ("pipeline.zip", zipped, "application/zip")},
                    timeout=300,
                )
            except httpx.HTTPError as error:
                raise CliError(f"the upload to {api.url} failed: {error}") from None
    if response.status_code == 400:
        answer = api.json_of(response)
        if isinstance(answer, dict) and answer.get("problems"):
            _problem_lines(answer["problems"])
            said = str(answer.get("detail") or "The pipeline was not submitted.")
            raise CliError(said, EXIT_USAGE, details=answer)
    api.check(response)
    answer = api.json_of(response)
    assert isinstance(answer, dict)
    return answer


def _time(value: Any) -> str:
    return str(value).replace("T", " ")[:19] if value else "-"


def _stage_line(stage: dict[str, Any]) -> str:
    text = f"  {stage['name']}: {stage['state']}"
    if stage.get("run"):
        text += f" ({stage['run']})"
    elif stage.get("endpoint"):
        text += f" (endpoint {stage['endpoint']})"
    if stage["state"] == "reused":
        text += ", reused: the same spec, code and inputs succeeded before"
    gate = stage.get("gate")
    if gate and gate.get("passed") is not None:
        verdict = "passed" if gate["passed"] else "not passed"
        text += f"; gate {gate['when']}: {gate['value']:g} {verdict}"
    if stage.get("reason"):
        text += f" — {stage['reason']}"
    return text


def _summary(row: dict[str, Any]) -> None:
    said = f"{row['name']}: {row['state']}"
    if row.get("state_reason"):
        said += f" — {row['state_reason']}"
    out.print(said, markup=False)
    for stage in row["stages"]:
        out.print(_stage_line(stage), markup=False)


def watch_pipeline(api: Api, workspace: str, name: str, *, as_json: bool) -> int:
    """Follow the pipeline until it ends; a line for each stage that changes. Ctrl-C stops
    watching, never the pipeline."""
    path = pipeline_path(workspace, name)
    seen: dict[str, tuple[Any, ...]] = {}
    try:
        while True:
            row = api.get(path)
            changed = False
            for stage in row["stages"]:
                moment = (stage["state"], stage.get("run"), stage.get("reason"))
                if seen.get(stage["name"]) != moment:
                    seen[stage["name"]] = moment
                    changed = True
                    if not as_json:
                        err.print(_stage_line(stage).strip(), markup=False)
            if changed and as_json:
                sys.stdout.write(json.dumps(row, ensure_ascii=False) + "\n")
                sys.stdout.flush()
            settled = SETTLED.get(str(row["state"]))
            if settled is not None:
                if not as_json:
                    reason = f": {row['state_reason']}" if row.get("state_reason") else ""
                    err.print(f"{name} {row['state']}{reason}.", markup=False)
                return settled
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        raise CliError(
            f"stopped watching; {name} goes on (`tau pipeline cancel {name}` stops it).",
            EXIT_INTERRUPTED,
        ) from None


@click.group("pipeline")
def pipeline_group() -> None:
    """Pipelines: stages of a workload's life in one graph, each a tau.yaml (docs/pipelines.md)."""


@pipeline_group.command("validate")
@click.option(
    "--config",
    "-c",
    metavar="FILE",
    default=DEFAULT_FILE,
    show_default=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The pipeline.yaml; each stage's tau.yaml is read relative to its folder.",
)
@json_option
def validate_command(config: Path, as_json: bool) -> int:
    """Check a pipeline.yaml and every stage's tau.yaml offline, all problems at once.

    Problems print as FILE:LINE:COLUMN: path: message (hint). Exit 2 if anything is invalid.
    """
    shown = str(config)
    check = check_pipeline(config, shown=shown)
    if as_json:
        print_json([problem.to_dict() for problem in check.problems])
    else:
        for line in check_lines(check, shown):
            (out if check.ok else err).print(line, markup=False)
    return EXIT_OK if check.ok else EXIT_USAGE


@pipeline_group.command("schema")
def schema_command() -> int:
    """Print the JSON Schema of pipeline.yaml (draft 2020-12), for editors."""
    print_json(json_schema())
    return EXIT_OK


@pipeline_group.command("run")
@click.option(
    "--config",
    "-c",
    metavar="FILE",
    default=DEFAULT_FILE,
    show_default=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The pipeline.yaml; its folder (every stage's project in it) is uploaded.",
)
@click.option(
    "--watch",
    is_flag=True,
    help="Follow it until it ends: exit 0 when it succeeded or a gate stopped it, 1 when it "
    "failed or was cancelled.",
)
@click.option(
    "--rerun",
    "rerun",
    metavar="STAGE",
    multiple=True,
    help="Run STAGE (and every stage after it) afresh even where an earlier pipeline's run "
    "of it matches; may be given more than once.",
)
@workspace_option
@json_option
@click.pass_context
def run_command(
    ctx: click.Context,
    config: Path,
    watch: bool,
    rerun: tuple[str, ...],
    workspace: str | None,
    as_json: bool,
) -> int:
    """Submit a pipeline: checked here first (as `tau pipeline validate`), then by the portal
    with the workspace's rules; its first stages start at once."""
    shown = str(config)
    check = check_pipeline(config, shown=shown)
    if not check.ok:
        for line in check_lines(check, shown):
            err.print(line, markup=False)
        raise CliError(
            "The pipeline was not submitted: fix the problems above.",
            EXIT_USAGE,
            details={"problems": [problem.to_dict() for problem in check.problems]},
        )
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    api = state.api()
    stages = [stage.name for stage in check.pipeline.stages] if check.pipeline else []
    for name in rerun:
        if name not in stages:
            raise click.BadParameter(
                f"{name!r} is not a stage of {shown} (its stages: {', '.join(stages)}).",
                param_hint="--rerun",
            )
    row = submit(api, ws, config, quiet=as_json, rerun=rerun)
    if watch:
        if not as_json:
            out.print(f"Submitted {row['name']} to {ws}.", markup=False)
        return watch_pipeline(api, ws, row["name"], as_json=as_json)
    if as_json:
        print_json(row)
        return EXIT_OK
    out.print(f"Submitted {row['name']} to {ws}.", markup=False)
    out.print(f"Follow it: tau pipeline status {row['name']} --watch", markup=False)
    return EXIT_OK


@pipeline_group.command("status")
@click.argument("name")
@click.option(
    "--watch",
    is_flag=True,
    help="Follow it until it ends (exit as for `tau pipeline run --watch`).",
)
@workspace_option
@json_option
@click.pass_context
def status_command(
    ctx: click.Context, name: str, watch: bool, workspace: str | None, as_json: bool
) -> int:
    """A pipeline's state and each stage's: its run, its gate, why it waits."""
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    api = state.api()
    if watch:
        return watch_pipeline(api, ws, name, as_json=as_json)
    row = api.get(pipeline_path(ws, name))
    if as_json:
        print_json(row)
    else:
        _summary(row)
    return EXIT_OK


@pipeline_group.command("list")
@workspace_option
@json_option
@click.pass_context
def list_command(ctx: click.Context, workspace: str | None, as_json: bool) -> int:
    """The workspace's pipelines, newest first."""
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    rows = list(state.api().pages(pipeline_path(ws), limit=200))
    if as_json:
        print_json(rows)
        return EXIT_OK
    if not rows:
        out.print(f"No pipelines in {ws}: `tau pipeline run -c pipeline.yaml`.", markup=False)
        return EXIT_OK
    table = Table(title=f"Pipelines in {ws}", title_justify="left", box=None, pad_edge=False)
    for column in ("name", "state", "stages done", "submitted by", "submitted"):
        table.add_column(column, overflow="fold")
    for row in rows:
        done = sum(stage["state"] in {"succeeded", "reused"} for stage in row["stages"])
        table.add_row(
            str(row["name"]),
            str(row["state"]),
            f"{done}/{len(row['stages'])}",
            str(row.get("created_by") or "-"),
            _time(row.get("created_at")),
        )
    out.print(table)
    return EXIT_OK


@pipeline_group.command("cancel")
@click.argument("name")
@workspace_option
@json_option
@click.pass_context
def cancel_command(ctx: click.Context, name: str, workspace: str | None, as_json: bool) -> int:
    """Cancel a pipeline: its running stages are cancelled and no new one starts."""
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    api = state.api()
    response = api.http.post(pipeline_path(ws, name, "cancel/"), json={})
    if response.status_code == 409:
        answer = api.json_of(response)
        raise CliError(problem_text(answer), EXIT_FAILED, details=answer)
    api.check(response)
    row = api.json_of(response)
    if as_json:
        print_json(row)
    elif row["state"] == "running":
        out.print(f"Cancelling {name}: its running stages are being stopped.", markup=False)
    else:
        out.print(f"{name} is {row['state']}.", markup=False)
    return EXIT_OK


@pipeline_group.command("resume")
@click.argument("name")
@click.option(
    "--rerun",
    "rerun",
    metavar="STAGE",
    multiple=True,
    help="Run STAGE (and every stage after it) afresh, as a new run; may be given more than once.",
)
@click.option("--watch", is_flag=True, help="Follow it until it ends (as `run --watch`).")
@workspace_option
@json_option
@click.pass_context
def resume_command(
    ctx: click.Context,
    name: str,
    rerun: tuple[str, ...],
    watch: bool,
    workspace: str | None,
    as_json: bool,
) -> int:
    """Run a pipeline that failed, stopped or was cancelled again from where it ended.

    Each stage that failed or was cancelled resumes its run (a new attempt, from its newest
    checkpoint); the stages that succeeded keep their outputs and are not run again."""
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    api = state.api()
    response = api.http.post(pipeline_path(ws, name, "resume/"), json={"rerun": list(rerun)})
    if response.status_code == 409:
        answer = api.json_of(response)
        raise CliError(problem_text(answer), EXIT_FAILED, details=answer)
    api.check(response)
    row = api.json_of(response)
    if watch:
        if not as_json:
            out.print(f"Resumed {name}.", markup=False)
        return watch_pipeline(api, ws, name, as_json=as_json)
    if as_json:
        print_json(row)
        return EXIT_OK
    out.print(f"Resumed {name}: it is {row['state']}.", markup=False)
    for stage in row["stages"]:
        out.print(_stage_line(stage), markup=False)
    return EXIT_OK


@pipeline_group.command("evidence")
@click.argument("name")
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the record (default: the portal's file name, <name>.pipeline.tar, in "
    "the current folder).",
)
@click.option("--force", is_flag=True, help="Replace the file if it exists.")
@click.option(
    "--verify",
    "then_verify",
    is_flag=True,
    help="Check it once written, every stage's record included, against the portal's keys.",
)
@workspace_option
@json_option
@click.pass_context
def evidence_command(
    ctx: click.Context,
    name: str,
    output: Path | None,
    force: bool,
    then_verify: bool,
    workspace: str | None,
    as_json: bool,
) -> int:
    """Download a pipeline's record: its signed manifest, pipeline.yaml, its history and each
    stage's own record, in one file (`tau evidence verify FILE` checks it offline)."""
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    api = state.api()
    if output is not None and output.exists() and not force:
        raise CliError(f"{output} exists; use --force to replace it.", EXIT_USAGE)
    try:
        with api.http.stream(
            "GET", pipeline_path(ws, name, "evidence/"), headers={"Accept": "application/x-tar"}
        ) as response:
            if response.status_code >= 400:
                response.read()
                if response.status_code == 409:
                    said = problem_text(api.json_of(response))
                    raise CliError(f"no record of {name} to download yet: {said}")
                api.check(response)
            target = output or Path(attachment_name(response) or f"{name}.pipeline.tar")
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


@pipeline_group.command("logs")
@click.argument("name")
@click.argument("stage")
@click.option(
    "-f",
    "--follow",
    is_flag=True,
    help="Keep printing until the stage's run ends (waiting for it to start, if it has not).",
)
@click.option("--attempt", type=click.IntRange(min=1), help="Which attempt (default newest).")
@workspace_option
@json_option
@click.pass_context
def logs_command(
    ctx: click.Context,
    name: str,
    stage: str,
    follow: bool,
    attempt: int | None,
    workspace: str | None,
    as_json: bool,
) -> int:
    """Print the log of a pipeline's stage: its run's, as `tau run logs` does."""
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    api = state.api()
    said = ""
    try:
        while True:
            row = api.get(pipeline_path(ws, name))
            found = next((item for item in row["stages"] if item["name"] == stage), None)
            if found is None:
                names = ", ".join(item["name"] for item in row["stages"])
                raise CliError(f"{name} has no stage {stage!r} (its stages: {names}).", EXIT_USAGE)
            if found.get("endpoint"):
                raise CliError(
                    f"{stage} is an endpoint: `tau serve logs {found['endpoint']}` prints its log.",
                    EXIT_USAGE,
                )
            if found.get("run"):
                break
            why = (found.get("reason") or "it waits for the stages it needs").removeprefix(
                "not started: "
            )
            if not follow or row["state"] != "running":
                raise CliError(f"{stage} of {name} has not started: {why}.")
            if why != said:
                err.print(f"{stage} has not started yet: {why}.", markup=False)
                said = why
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        raise CliError(f"stopped waiting; {name} goes on.", EXIT_INTERRUPTED) from None
    return print_run_log(api, ws, found["run"], follow=follow, attempt=attempt, as_json=as_json)
