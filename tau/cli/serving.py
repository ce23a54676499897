"""``tau serve``: a workspace's model endpoints (issue 34; docs/cli.md, *Serving models*).

``tau serve deploy`` sends the project folder and its tau.yaml (``run.workload_kind:
rayservice`` with a ``serve`` block) as a run is submitted: the application's code travels in
the zip. ``--model NAME@VERSION`` and ``--from-finetune RUN`` (the version the run registered,
or its newest checkpoint, registered first) change the config's ``serve.model`` before it is
sent, and ``--replicas N`` its ``serve.replicas``: the form the portal takes has no field of
its own for them, and what is deployed is then exactly the tau.yaml the endpoint's record
keeps. ``tau serve invoke`` goes through the portal's proxy
route with the same token, which needs the ``endpoints:invoke`` scope.
"""

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
import yaml
from rich.table import Table

from tau.cli import bundle as bundles
from tau.cli.client import (
    EXIT_AUTH,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    Api,
    CliError,
    problem_text,
    run_path,
)
from tau.cli.common import (
    err,
    json_option,
    out,
    print_json,
    refuse_spec,
    state_of,
    workspace_option,
)
from tau.cli.data import asset_path, split_ref
from tau.spec.model import Spec
from tau.spec.schema import MAX_REPLICAS, check_source

#: How often ``status --watch`` and ``logs -f`` ask the portal.
POLL_SECONDS = 1.0
#: States ``status --watch`` ends at (with every replica ready, for ``ready``), and its exit.
SETTLED = {"ready": EXIT_OK, "stopped": EXIT_FAILED, "failed": EXIT_FAILED}
#: How long a request to an endpoint may take before tau gives up (the portal's own limit,
#: TAU_ENDPOINT_INVOKE_TIMEOUT_SECONDS, is usually the shorter).
INVOKE_SECONDS = 600.0
#: The media type ``--data`` is sent as unless ``--content-type`` says another.
JSON_TYPE = "application/json"


def endpoint_path(workspace: str, name: str | None = None) -> str:
    path = f"/api/v1/workspaces/{quote(workspace, safe='')}/endpoints/"
    return path if name is None else f"{path}{quote(name, safe='')}/"


def _conflict_state(error: CliError) -> str | None:
    """The endpoint's state when the portal refused with a 409 that names it (``state``):
    not possible while it is stopped, failed…"""
    details = error.details
    if isinstance(details, dict) and isinstance(details.get("state"), str):
        return str(details["state"])
    return None


# --- deploy ----------------------------------------------------------------------------------


def _model_ref(text: str) -> tuple[str, str]:
    """``--model NAME@VERSION``: ``tiny-gpt@3``, ``tiny-gpt@production``; NAME alone is its
    newest ready version."""
    name, version = split_ref(text)
    return name, version or "latest"


def finetuned_model(
    api: Api, workspace: str, run_ref: str, *, quiet: bool = False
) -> tuple[str, int, str]:
    """The model version the run registered, as ``(model, version, run name)``: one a version
    of which names the run as ``produced_by``, looked for in the model its tau.yaml's
    ``outputs.model`` names (or, without one, in every model of the workspace: a version
    registered with ``tau data model register --run``). A run that registered none has its
    newest complete checkpoint registered instead (:func:`_register_checkpoint`).
    ``CliError`` saying why when there is neither; nothing is deployed then."""
    run = api.get(run_path(workspace, run_ref))
    name = str(run["name"])
    outputs = (run.get("spec") or {}).get("outputs") or {}
    declared = (outputs.get("model") or {}).get("name")
    models = (
        [str(declared)]
        if declared
        else [row["name"] for row in api.get(asset_path(workspace, "model"))]
    )
    made: list[tuple[str, dict[str, Any]]] = []
    for model in models:
        try:
            versions = api.get(f"{asset_path(workspace, 'model', model)}versions/")
        except CliError as error:
            if error.code == EXIT_NOT_FOUND:  # the run's first version was never made
                continue
            raise
        made.extend((model, version) for version in versions if version.get("produced_by") == name)
    ready = [(model, version) for model, version in made if version.get("state") == "ready"]
    if not ready:
        if made:  # what the run registered is not ready: say so rather than serve another
            raise CliError(_none_made(run, declared, made), EXIT_NOT_FOUND)
        return _register_checkpoint(api, workspace, run, declared, quiet=quiet)
    chosen = {model for model, _version in ready}
    if len(chosen) > 1:
        refs = ", ".join(f"{model}@{version['number']}" for model, version in ready)
        raise CliError(
            f"{name} registered versions of several models ({refs}): say which to serve with "
            "--model NAME@VERSION.",
            EXIT_USAGE,
        )
    model, version = max(ready, key=lambda pair: int(pair[1]["number"]))
    return model, int(version["number"]), name


def _register_checkpoint(
    api: Api, workspace: str, run: dict[str, Any], declared: Any, *, quiet: bool
) -> tuple[str, int, str]:
    """The run's newest complete checkpoint, registered as the next version of the model its
    ``outputs.model`` names (or, without one, of a model named after the run; the portal
    makes it if it is new, once it has found the checkpoint). ``CliError`` when the run wrote
    none, or the portal refuses it."""
    name = str(run["name"])
    checkpoints = api.get(f"{run_path(workspace, name)}checkpoints/")
    steps = [int(row["step"]) for row in checkpoints if row.get("complete")]
    if not steps:
        raise CliError(_none_made(run, declared, [], wrote_some=bool(checkpoints)), EXIT_NOT_FOUND)
    step = max(steps)
    model = str(declared) if declared else name
    try:
        version = api.post(
            f"{asset_path(workspace, 'model', model)}versions/",
            {"source": "checkpoint", "run": name, "step": step},
        )
    except CliError as error:
        raise CliError(
            f"{name} registered no model version, and its checkpoint step {step} could not be "
            f"registered as a version of {model}: {error} Nothing was deployed.",
            error.code,
            details=error.details,
        ) from None
    said = f"Registered {name}'s checkpoint step {step} as {version['ref']}."
    (err if quiet else out).print(said, markup=False)
    return model, int(version["number"]), name


def _none_made(
    run: dict[str, Any],
    declared: Any,
    made: list[tuple[str, dict[str, Any]]],
    *,
    wrote_some: bool = False,
) -> str:
    name = run["name"]
    if made:
        states = ", ".join(
            f"{model}@{version['number']} is {version.get('state')}" for model, version in made
        )
        return (
            f"{name} registered no model version that can be served ({states}); nothing was "
            "deployed."
        )
    checkpoint = "no complete checkpoint" if wrote_some else "no checkpoint"
    if run.get("state") != "succeeded":
        what = f"outputs.model ({declared})" if declared else "a model version"
        return (
            f"{name} is {run.get('state')}: a run registers {what} only when it succeeds, and "
            f"it wrote {checkpoint} to serve instead; nothing was deployed."
        )
    why = (
        f"its tau.yaml names outputs.model {declared}, but no version of it was made by this run"
        if declared
        else "its tau.yaml has no outputs.model"
    )
    return (
        f"{name} registered no model version ({why}) and wrote {checkpoint}; nothing was "
        f"deployed. Make one of what it kept with `tau data model register NAME --run {name} "
        "--path PATH`, then deploy it with `tau serve deploy --model NAME@VERSION`."
    )


def with_overrides(source: bytes, *, model: tuple[str, str] | None, replicas: int | None) -> bytes:
    """The tau.yaml with ``serve.model`` and ``serve.replicas`` set (comments are lost from
    what is sent, not from the file, as with ``tau run --set``)."""
    if model is None and replicas is None:
        return source
    document = yaml.safe_load(source)
    serve = document.get("serve") if isinstance(document, dict) else None
    if not isinstance(serve, dict):
        return source  # the checker said what is wrong already
    if model is not None:
        serve["model"] = {"name": model[0], "version": model[1]}
    if replicas is not None:
        serve["replicas"] = replicas
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True).encode()


def _checked(config: Path, source: bytes) -> Spec:
    """The spec of an endpoint's tau.yaml, checked offline (exit 2 with every problem)."""
    spec, problems = check_source(source)
    if spec is None or problems:
        count = f"{len(problems)} problem{'' if len(problems) == 1 else 's'}"
        raise refuse_spec(
            str(config),
            [problem.to_dict() for problem in problems],
            f"{config} is not valid ({count}); nothing was sent.",
        )
    if spec.serve is None:
        raise CliError(
            f"{config} describes a run, not an endpoint: an endpoint's tau.yaml has "
            "`run.workload_kind: rayservice` and a `serve` block (submit a run with `tau run`).",
            EXIT_USAGE,
        )
    return spec


def read_config(config: Path, *, replicas: int | None) -> tuple[bytes, Spec]:
    """The endpoint's tau.yaml and its spec, checked offline before the portal is asked
    anything (a run's model is looked up only for a config that can be deployed)."""
    try:
        source = config.read_bytes()
    except OSError as error:
        raise CliError(f"cannot read {config}: {error.strerror}", EXIT_USAGE) from None
    spec = _checked(config, source)
    if replicas is not None and spec.serve is not None and spec.serve.autoscaling is not None:
        raise CliError(
            f"{config} autoscales (serve.autoscaling): --replicas does not apply; change its "
            "bounds in the file instead.",
            EXIT_USAGE,
        )
    return source, spec


def deploy(
    api: Api,
    workspace: str,
    *,
    config: Path,
    source: bytes,
    spec: Spec,
    model: tuple[str, str] | None,
    replicas: int | None,
    quiet: bool,
) -> dict[str, Any]:
    """Deploy the endpoint ``config`` (read as ``source``, checked as ``spec``) describes,
    with its project folder; the portal's answer."""
    if model is not None or replicas is not None:
        source = with_overrides(source, model=model, replicas=replicas)
        spec = _checked(config, source)
    root = config.parent / spec.run.project_dir
    if not root.is_dir():
        raise CliError(f"the project folder {root} does not exist.", EXIT_USAGE)
    with tempfile.TemporaryDirectory(prefix="tau-bundle-") as scratch:
        archive = Path(scratch) / "project.zip"
        try:
            files = bundles.project_files(root, bundles.Ignore.for_project(root, spec.run.exclude))
            bundles.write_bundle(root, files, archive)
        except bundles.BundleTooLarge as refused:
            raise CliError(str(refused), EXIT_USAGE) from None
        if not quiet:
            err.print(f"Uploading {len(files)} files from {root}.", markup=False)
        with archive.open("rb") as zipped:
            try:
                response = api.http.post(
                    endpoint_path(workspace),
                    files={
                        "spec": ("tau.yaml", source, "application/octet-stream"),
                        "bundle": ("project.zip", zipped, "application/zip"),
                    },
                    timeout=300,
                )
            except httpx.HTTPError as error:
                raise CliError(f"the upload to {api.url} failed: {error}") from None
    if response.status_code == 400:
        answer = api.json_of(response)
        if isinstance(answer, dict) and answer.get("problems"):
            said = str(answer.get("detail") or "The endpoint was not deployed.")
            raise refuse_spec(str(config), answer["problems"], said, answer)
    if response.status_code == 409:
        answer = api.json_of(response)
        said = problem_text(answer)
        if "has an endpoint named" in said:
            raise CliError(
                f"{said} Change it (`tau serve scale {spec.name} --replicas N`), or delete it "
                f"first (`tau serve delete {spec.name}`).",
                details=answer,
            )
        raise CliError(f"the portal answered 409: {said}", details=answer)
    api.check(response)
    answer = api.json_of(response)
    assert isinstance(answer, dict)
    return answer


# --- what is said of an endpoint ---------------------------------------------------------------


def _model_text(row: dict[str, Any]) -> str:
    model = row.get("model")
    return f"{model['name']}@{model['version']}" if isinstance(model, dict) else "-"


def _replicas_text(row: dict[str, Any]) -> str:
    text = f"{row.get('replicas_ready', 0)}/{row.get('replicas_desired', 0)}"
    scaling = row.get("autoscaling")
    if isinstance(scaling, dict):
        text += f" (autoscaling {scaling['min_replicas']}-{scaling['max_replicas']})"
    return text


def _state_line(row: dict[str, Any]) -> str:
    text = (
        f"{time.strftime('%H:%M:%S')} {row['name']}: {row['state']}, "
        f"{row.get('replicas_ready', 0)} of {row.get('replicas_desired', 0)} replicas ready"
    )
    if row.get("state_reason"):
        text += f" — {row['state_reason']}"
    return text


def _traffic_text(row: dict[str, Any]) -> str | None:
    if row.get("requests_per_second") is None:
        return None
    parts = [f"{row['requests_per_second']:g} requests/s"]
    if row.get("latency_p95_ms") is not None:
        parts.append(f"p95 {row['latency_p95_ms']:g} ms")
    if row.get("error_rate") is not None:
        parts.append(f"{100 * float(row['error_rate']):.1f}% errors")
    return ", ".join(parts)


def _summary(api: Api, row: dict[str, Any]) -> None:
    out.print(f"{row['name']}  {row['state']}", markup=False)
    rows = [
        ("reason", row.get("state_reason")),
        ("replicas", f"{_replicas_text(row)} ready"),
        ("model", _model_text(row)),
        ("generation", row.get("generation")),
        ("traffic", _traffic_text(row)),
        ("backend", row.get("backend")),
        ("deployed by", row.get("created_by")),
        ("created", _time(row.get("created_at"))),
        ("updated", _time(row.get("updated_at"))),
        ("address", row.get("url")),
        ("invoke", f"{api.url}{row['invoke_url']}" if row.get("invoke_url") else None),
    ]
    for label, value in rows:
        if value not in (None, "", "-"):
            out.print(f"  {label + ':':13} {value}", markup=False)


def _time(value: Any) -> str:
    return str(value).replace("T", " ")[:19] if value else "-"


def _settled(row: dict[str, Any]) -> int | None:
    """The exit status ``status --watch`` ends with once the endpoint has settled: ready with
    every replica, stopped or failed; None while it is on its way."""
    state = str(row["state"])
    if state == "ready" and int(row.get("replicas_ready") or 0) < int(
        row.get("replicas_desired") or 0
    ):
        return None
    return SETTLED.get(state)


def watch_endpoint(api: Api, workspace: str, name: str, *, as_json: bool) -> int:
    """Follow the endpoint until it settles (``_settled``); Ctrl-C stops watching, never it."""
    path = endpoint_path(workspace, name)
    seen: tuple[Any, ...] | None = None
    try:
        while True:
            row = api.get(path)
            moment = (
                row["state"],
                row.get("state_reason"),
                row.get("replicas_ready"),
                row.get("replicas_desired"),
            )
            if moment != seen:
                seen = moment
                if as_json:
                    sys.stdout.write(json.dumps(row, ensure_ascii=False) + "\n")
                    sys.stdout.flush()
                else:
                    err.print(_state_line(row), markup=False)
            settled = _settled(row)
            if settled is not None:
                if not as_json:
                    err.print(f"{name} is {row['state']}.", markup=False)
                return settled
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        raise CliError(
            f"stopped watching; {name} goes on (`tau serve delete {name}` stops it).",
            EXIT_INTERRUPTED,
        ) from None


# --- the commands --------------------------------------------------------------------------------


@click.group("serve")
def serve_group() -> None:
    """Model endpoints of a workspace: deploy, follow, scale, invoke, delete (docs/cli.md)."""


@serve_group.command("deploy")
@click.option(
    "--config",
    "-c",
    metavar="FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The endpoint's tau.yaml (run.workload_kind: rayservice; default ./tau.yaml); its "
    "project folder is uploaded with it.",
)
@click.option(
    "--from-finetune",
    "from_finetune",
    metavar="RUN",
    help="Serve the model version this run registered (its outputs.model), or else its "
    "newest complete checkpoint, registered as the model's next version.",
)
@click.option(
    "--model",
    "model_text",
    metavar="NAME@VERSION",
    help="Serve this model version (a number or an alias) instead of the config's.",
)
@click.option(
    "--replicas",
    type=click.IntRange(1, MAX_REPLICAS),
    metavar="N",
    help=f"Run N replicas (1 to {MAX_REPLICAS}) instead of the config's serve.replicas.",
)
@workspace_option
@json_option
@click.pass_context
def deploy_command(
    ctx: click.Context,
    config: Path | None,
    from_finetune: str | None,
    model_text: str | None,
    replicas: int | None,
    workspace: str | None,
    as_json: bool,
) -> int:
    """Deploy an endpoint from tau.yaml and its project folder (zipped as for `tau run`).

    Its name is the tau.yaml's `name`. `tau serve status NAME --watch` follows it until it
    is ready."""
    if from_finetune and model_text:
        raise click.UsageError("--from-finetune and --model each name the model: give one.")
    if config is None:
        if not Path("tau.yaml").is_file():
            raise click.UsageError("say which tau.yaml to deploy: tau serve deploy --config FILE")
        config = Path("tau.yaml")
    model = _model_ref(model_text) if model_text else None
    source, spec = read_config(config, replicas=replicas)
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    api = state.api()
    run_name = None
    if from_finetune:
        name, number, run_name = finetuned_model(api, ws, from_finetune, quiet=as_json)
        model = (name, str(number))
    endpoint = deploy(
        api,
        ws,
        config=config,
        source=source,
        spec=spec,
        model=model,
        replicas=replicas,
        quiet=as_json,
    )
    if as_json:
        print_json(endpoint)
        return EXIT_OK
    served = _model_text(endpoint)
    made = f", made by {run_name}" if run_name else ""
    out.print(
        f"Deployed {endpoint['name']} to {ws} ({endpoint['state']}): "
        f"{endpoint['replicas_desired']} replica{'' if endpoint['replicas_desired'] == 1 else 's'}"
        + (f", model {served}{made}" if served != "-" else "")
        + ".",
        markup=False,
    )
    out.print(f"Follow it: tau serve status {endpoint['name']} --watch", markup=False)
    return EXIT_OK


@serve_group.command("list")
@workspace_option
@json_option
@click.pass_context
def list_command(ctx: click.Context, workspace: str | None, as_json: bool) -> int:
    """The workspace's endpoints, newest first."""
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    rows = list(state.api().pages(endpoint_path(ws), limit=200))
    if as_json:
        print_json(rows)
        return EXIT_OK
    if not rows:
        out.print(f"No endpoints in {ws}: `tau serve deploy --config tau.yaml`.", markup=False)
        return EXIT_OK
    table = Table(title=f"Endpoints in {ws}", title_justify="left", box=None, pad_edge=False)
    for column in ("name", "state", "ready", "model", "deployed by", "updated"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(
            str(row["name"]),
            str(row["state"]),
            _replicas_text(row),
            _model_text(row),
            str(row.get("created_by") or "-"),
            _time(row.get("updated_at")),
        )
    out.print(table)
    return EXIT_OK


@serve_group.command("status")
@click.argument("name")
@workspace_option
@click.option(
    "--watch",
    is_flag=True,
    help="Follow its changes until it is ready with every replica (exit 0), stopped or "
    "failed (exit 1).",
)
@json_option
@click.pass_context
def status_command(
    ctx: click.Context, name: str, workspace: str | None, watch: bool, as_json: bool
) -> int:
    """An endpoint's state, replicas, model, traffic and address."""
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    api = state.api()
    if watch:
        return watch_endpoint(api, ws, name, as_json=as_json)
    row = api.get(endpoint_path(ws, name))
    if as_json:
        print_json(row)
    else:
        _summary(api, row)
    return EXIT_OK


@serve_group.command("scale")
@click.argument("name")
@click.option(
    "--replicas",
    required=True,
    type=click.IntRange(1, MAX_REPLICAS),
    metavar="N",
    help=f"How many replicas to run (1 to {MAX_REPLICAS}).",
)
@workspace_option
@json_option
@click.pass_context
def scale_command(
    ctx: click.Context, name: str, replicas: int, workspace: str | None, as_json: bool
) -> int:
    """Run N replicas of an endpoint (its deployer or a workspace admin); refused for one
    that autoscales."""
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    try:
        row = state.api().patch(endpoint_path(ws, name), {"replicas": replicas})
    except CliError as error:
        if _conflict_state(error) is None:
            raise
        raise CliError(
            str(error).removeprefix("the portal answered 409: "), error.code, details=error.details
        ) from None
    if as_json:
        print_json(row)
    else:
        out.print(
            f"{row['name']}: {row['replicas_desired']} replicas wanted (generation "
            f"{row['generation']}), {row['replicas_ready']} ready; {row['state']}.",
            markup=False,
        )
    return EXIT_OK


@serve_group.command("delete")
@click.argument("name")
@workspace_option
@json_option
@click.pass_context
def delete_command(ctx: click.Context, name: str, workspace: str | None, as_json: bool) -> int:
    """Stop an endpoint and free its name and resources (its deployer or a workspace admin);
    its record and history are kept."""
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    state.api().delete(endpoint_path(ws, name))
    if as_json:
        print_json({"workspace": ws, "name": name, "deleted": True})
    else:
        out.print(f"Deleted {name} from {ws}; its record and history are kept.", markup=False)
    return EXIT_OK


def _log_piece(api: Api, path: str, params: dict[str, Any]) -> dict[str, Any] | str:
    """A piece of the log, or the endpoint's state when nothing of it runs (a 409)."""
    try:
        piece = api.get(path, **params)
    except CliError as error:
        said = _conflict_state(error)
        if said is None:
            raise
        return said
    assert isinstance(piece, dict)
    return piece


@serve_group.command("logs")
@click.argument("name")
@workspace_option
@click.option("-f", "--follow", is_flag=True, help="Keep printing until it stops.")
@click.option("--replica", metavar="R", help="Which replica's log (default: the portal's choice).")
@click.option(
    "--tail",
    type=click.IntRange(0, 10000),
    default=200,
    show_default=True,
    metavar="N",
    help="Start with the last N lines.",
)
@json_option
@click.pass_context
def logs_command(
    ctx: click.Context,
    name: str,
    workspace: str | None,
    follow: bool,
    replica: str | None,
    tail: int,
    as_json: bool,
) -> int:
    """Print the end of a replica's log; with -f follow it (Ctrl-C stops following).

    -f ends when the endpoint stops (exit 0) or fails (exit 1)."""
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    api = state.api()
    path = endpoint_path(ws, name) + "logs/"
    piece = _log_piece(api, path, {"replica": replica, "tail": tail})
    if isinstance(piece, str):
        raise CliError(
            f"{name} is {piece}: nothing of it runs, so it has no log to read.",
            details={"state": piece},
        )
    if not follow:
        if as_json:
            print_json(piece)
            return EXIT_OK
        sys.stdout.write(piece["text"])
        sys.stdout.flush()
        if not piece["text"]:
            said = f": {piece['note']}" if piece.get("note") else "."
            err.print(
                f"{name} ({piece['replica'] or 'no replica'}) has no log yet{said}", markup=False
            )
        return EXIT_OK
    followed = str(piece.get("replica") or "")
    said = ""
    try:
        while True:
            text = str(piece.get("text") or "")
            if text:
                if as_json:
                    text_line = json.dumps({"replica": followed, "text": text}) + "\n"
                    sys.stdout.write(text_line)
                else:
                    sys.stdout.write(text)
                sys.stdout.flush()
            note = str(piece.get("note") or "")
            if note and note != said:
                err.print(f"{name}: no log yet: {note}", markup=False)
            said = note
            if not text:
                time.sleep(POLL_SECONDS)
            offset = int(piece["next_offset"])
            piece = _log_piece(api, path, {"replica": replica, "offset": offset})
            if not isinstance(piece, str) and str(piece.get("replica") or "") != followed:
                # Another replica's log than the one followed: it is gone, or (without
                # --replica) the portal now shows another (a new generation that serves, a
                # pod replaced). That one's log from its start.
                followed = str(piece.get("replica") or "")
                err.print(f"--- {followed or 'no replica'} ---", markup=False)
                piece = _log_piece(api, path, {"replica": followed or None, "offset": 0})
            if isinstance(piece, str):
                err.print(f"{name} is {piece}.", markup=False)
                return EXIT_FAILED if piece == "failed" else EXIT_OK
    except KeyboardInterrupt:
        raise CliError(f"stopped following; {name} goes on.", EXIT_INTERRUPTED) from None


def _request_body(data: str | None, content_type: str | None) -> tuple[bytes, str | None]:
    """What ``--data`` sends: ``@FILE`` a file's bytes, ``@-`` standard input's, else the
    text itself; JSON unless ``--content-type`` says otherwise (then checked to be JSON)."""
    if data is None:
        return b"", content_type
    if data == "@-":
        body = sys.stdin.buffer.read()
    elif data.startswith("@"):
        try:
            body = Path(data[1:]).read_bytes()
        except OSError as error:
            raise CliError(
                f"--data {data}: cannot read it ({error.strerror}).", EXIT_USAGE
            ) from None
    else:
        body = data.encode()
    if content_type is None:
        try:
            json.loads(body)
        except ValueError as error:
            raise CliError(
                f"--data {data if len(data) < 60 else data[:57] + '…'} is not JSON ({error}); "
                "say what it is with --content-type.",
                EXIT_USAGE,
            ) from None
        content_type = JSON_TYPE
    return body, content_type


@serve_group.command("invoke")
@click.argument("name")
@click.option(
    "--data",
    "-d",
    metavar="@FILE|TEXT",
    help="The request's body: @FILE reads a file, @- standard input, else the text itself "
    "(JSON unless --content-type says otherwise).",
)
@click.option(
    "--path",
    "route",
    default="",
    metavar="PATH",
    help="The path on the endpoint, after its route prefix (e.g. v1/chat/completions).",
)
@click.option("--content-type", metavar="TYPE", help="The body's media type (default JSON).")
@workspace_option
@json_option
@click.pass_context
def invoke_command(
    ctx: click.Context,
    name: str,
    data: str | None,
    route: str,
    content_type: str | None,
    workspace: str | None,
    as_json: bool,
) -> int:
    """Send a request to an endpoint through the portal and print its answer as it comes.

    The token needs the `endpoints:invoke` scope. Exit 0 when it answers 2xx; 1 when it
    answers an error, or is not ready or updating (its state said); 3, 4 as elsewhere."""
    state = state_of(ctx)
    ws = state.workspace_for(workspace)
    api = state.api()
    body, media_type = _request_body(data, content_type)
    path = endpoint_path(ws, name) + "invoke/" + quote(route.lstrip("/"), safe="/?=&%")
    headers = {"Accept": "*/*"}
    if media_type:
        headers["Content-Type"] = media_type
    try:
        with api.http.stream(
            "POST", path, content=body, headers=headers, timeout=INVOKE_SECONDS
        ) as response:
            if response.status_code >= 400 and not _relayed(response):
                response.read()
                _refused(api, response, name)
            if as_json:
                response.read()
                print_json(_answer_record(response))
            else:
                ended_with_newline = True
                for chunk in response.iter_bytes():
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.buffer.flush()
                    ended_with_newline = chunk.endswith(b"\n")
                if not ended_with_newline and sys.stdout.isatty():
                    sys.stdout.write("\n")
            status = response.status_code
    except CliError:
        raise
    except httpx.HTTPError as error:
        raise CliError(f"the request to {name} through {api.url} failed: {error}") from None
    if status >= 400:
        if not as_json:
            err.print(f"{name} answered {status}.", markup=False)
        return EXIT_FAILED
    return EXIT_OK


#: The portal's proxy names the endpoint in this header on every answer it passes on.
RELAYED_MARK = "X-Tau-Endpoint"


def _relayed(response: httpx.Response) -> bool:
    """Whether an answer is the endpoint's own, passed on by the proxy (which marks it with
    :data:`RELAYED_MARK`), rather than the portal's refusal (no address, not ready, no
    scope…)."""
    return RELAYED_MARK in response.headers


def _refused(api: Api, response: httpx.Response, name: str) -> None:
    """The portal's refusal of a request to the endpoint, as an exit status."""
    body: Any = None
    if "json" in response.headers.get("Content-Type", ""):
        try:
            body = response.json()
        except ValueError:
            body = None
    if response.status_code == 409 and isinstance(body, dict) and body.get("state"):
        raise CliError(
            f"{name} is {body['state']}: it answers no requests now (`tau serve status {name}`).",
            EXIT_FAILED,
            details=body,
        )
    if response.status_code == 403:
        raise CliError(
            f"not allowed: {problem_text(body) if body else 'refused'} Invoking needs a token "
            "with the endpoints:invoke scope (make one on the portal's API tokens page).",
            EXIT_AUTH,
            details=body,
        )
    api.check(response)


def _answer_record(response: httpx.Response) -> dict[str, Any]:
    """``--json``: the answer's status, content type and body (parsed when it is JSON)."""
    media_type = response.headers.get("Content-Type", "")
    body: Any = response.text
    if "json" in media_type:
        try:
            body = response.json()
        except ValueError:
            body = response.text
    return {"status": response.status_code, "content_type": media_type, "body": body}
