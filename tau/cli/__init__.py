"""The ``tau`` command line: submit and follow runs on a TauGrid portal (docs/cli.md).

Only the client's dependencies (httpx, Click, Rich, PyYAML): installed without the server's.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

import click

from tau.cli.client import EXIT_INTERRUPTED, EXIT_USAGE, CliError
from tau.cli.config import ConfigError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``tau`` with ``argv`` (default ``sys.argv[1:]``); its exit status. As a console
    script the status is passed to ``sys.exit``."""
    from tau.cli.commands import cli

    arguments = list(sys.argv[1:] if argv is None else argv)
    wants_json = "--json" in arguments
    try:
        result = cli.main(arguments, prog_name="tau", standalone_mode=False)
    except BrokenPipeError:
        # `tau run logs NAME | head`: the reader has gone; say nothing more.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except click.exceptions.Abort:
        click.echo("tau: interrupted.", err=True)
        return _finish(EXIT_INTERRUPTED)
    except KeyboardInterrupt:
        click.echo("tau: interrupted.", err=True)
        return _finish(EXIT_INTERRUPTED)
    except click.ClickException as error:
        error.show()
        return _finish(error.exit_code)
    except ConfigError as error:
        click.echo(f"tau: {error}", err=True)
        return _finish(EXIT_USAGE)
    except CliError as error:
        click.echo(f"tau: {error}", err=True)
        if wants_json:
            sys.stdout.write(
                json.dumps({"error": str(error), "exit_code": error.code, "details": error.details})
                + "\n"
            )
        return _finish(error.code)
    return _finish(result if isinstance(result, int) else 0)


def _finish(code: int) -> int:
    sys.stdout.flush()
    return code


def console_main() -> None:
    sys.exit(main())
