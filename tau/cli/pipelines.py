"""``tau pipeline``: pipelines of stages (docs/pipelines.md). Checking a pipeline.yaml is
offline, with the server's own checker (:mod:`tau.pipeline`): no portal, no login."""

from __future__ import annotations

from pathlib import Path

import click

from tau.cli.client import EXIT_OK, EXIT_USAGE
from tau.cli.common import err, json_option, out, print_json
from tau.pipeline import DEFAULT_FILE, check_lines, check_pipeline, json_schema


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
