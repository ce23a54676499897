"""``python -m tau.spec``: validate tau.yaml files, print the JSON Schema or a normal form.

Needs no server and no Django, so it works in CI and pre-commit hooks; the ``tau`` command
line exposes the same as ``tau run validate`` / ``tau run schema``.

    python -m tau.spec validate [--json] FILE...   exit 0 if every file is valid, else 1
    python -m tau.spec schema                      the JSON Schema (draft 2020-12)
    python -m tau.spec show FILE                   the normalised spec and its hash, as JSON

Problems print as ``FILE:LINE:COLUMN: path: message (hint)``, one per line, which editors
and CI logs turn into links. ``-`` reads standard input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TextIO

from tau.spec.dialects import Reading
from tau.spec.loader import MAX_FILE_BYTES
from tau.spec.model import spec_hash
from tau.spec.problems import SpecProblem
from tau.spec.schema import check_source, json_schema, read_source

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2


class _Unreadable(Exception):
    pass


def _read(name: str) -> bytes:
    """The file's bytes; one byte past the size limit is enough to refuse it."""
    try:
        if name == "-":
            return sys.stdin.buffer.read(MAX_FILE_BYTES + 1)
        with open(name, "rb") as handle:
            return handle.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise _Unreadable(error.strerror or str(error)) from None


def _display_name(name: str) -> str:
    return "<stdin>" if name == "-" else name


def reading_lines(shown: str, reading: Reading) -> list[str]:
    """What ``validate`` prints for one file: its problems, or ``FILE: ok (how it was read)``,
    then its warnings and notes."""
    lines = [problem.format(shown) for problem in reading.problems]
    if reading.spec is not None:
        lines.append(f"{shown}: ok ({reading.summary()})")
    lines.extend(warning.format(shown, warning=True) for warning in reading.warnings)
    lines.extend(f"{shown}: note: {note}" for note in reading.notes)
    return lines


def reading_records(shown: str, reading: Reading) -> list[dict[str, object]]:
    """``--json`` records: each problem (severity ``error``) and warning (``warning``)."""
    records: list[dict[str, object]] = [
        {"file": shown, **problem.to_dict(), "severity": "error"} for problem in reading.problems
    ]
    return records + [
        {"file": shown, **warning.to_dict(), "severity": "warning"} for warning in reading.warnings
    ]


def _file_problem(message: str) -> SpecProblem:
    return SpecProblem("(file)", 0, 0, message, None)


def validate_files(names: Sequence[str], *, as_json: bool, out: TextIO, err: TextIO) -> int:
    """Validate each file; print problems (or ``FILE: ok``); the exit status."""
    records: list[dict[str, object]] = []
    status = EXIT_OK
    for name in names:
        shown = _display_name(name)
        try:
            data = _read(name)
        except _Unreadable as error:
            status = EXIT_INVALID
            problem = _file_problem(f"cannot read the file: {error}")
            records.append({"file": shown, **problem.to_dict(), "severity": "error"})
            if not as_json:
                print(f"{shown}: cannot read the file: {error}", file=err)
            continue
        reading = read_source(data)
        if reading.problems:
            status = EXIT_INVALID
        records.extend(reading_records(shown, reading))
        if not as_json:
            for line in reading_lines(shown, reading):
                print(line, file=out)
    if as_json:
        json.dump(records, out, indent=2, ensure_ascii=False)
        out.write("\n")
    return status


def show_file(name: str, *, out: TextIO, err: TextIO) -> int:
    shown = _display_name(name)
    try:
        data = _read(name)
    except _Unreadable as error:
        print(f"{shown}: cannot read the file: {error}", file=err)
        return EXIT_INVALID
    spec, problems = check_source(data)
    if spec is None:
        for problem in problems:
            print(problem.format(shown), file=err)
        return EXIT_INVALID
    json.dump(
        {"spec_hash": spec_hash(spec), "spec": spec.to_dict()}, out, indent=2, ensure_ascii=False
    )
    out.write("\n")
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tau.spec", description="Check tau.yaml files (schema version 1)."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    validate = commands.add_parser(
        "validate", help="check files; exit 0 if all are valid, 1 otherwise"
    )
    validate.add_argument("files", nargs="+", metavar="FILE", help="tau.yaml files ('-': stdin)")
    validate.add_argument(
        "--json",
        action="store_true",
        help="print the problems as a JSON list of {file, line, column, path, message, hint}",
    )
    commands.add_parser("schema", help="print the JSON Schema (draft 2020-12)")
    show = commands.add_parser("show", help="print the normalised spec and its hash as JSON")
    show.add_argument("file", metavar="FILE")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = _parser().parse_args(argv)
    if arguments.command == "validate":
        return validate_files(
            arguments.files, as_json=arguments.json, out=sys.stdout, err=sys.stderr
        )
    if arguments.command == "schema":
        json.dump(json_schema(), sys.stdout, indent=2, ensure_ascii=False)
        sys.stdout.write("\n")
        return EXIT_OK
    return show_file(arguments.file, out=sys.stdout, err=sys.stderr)
