"""``python -m tau.evidence verify FILE [--key PUBKEY_OR_KEYRING] [--json]``: the verifier for
a machine without the ``tau`` command's other dependencies (docs/evidence.md)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tau.evidence.verify import EXIT_USAGE, verify_and_report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tau.evidence",
        description="Check an exported TauGrid evidence record, offline.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    verify = commands.add_parser(
        "verify",
        help="check the signature, every digest and the event chain of a record",
        description="Exit 0: every check passed; 1: something does not match (each named); "
        "2: the record or the key cannot be read.",
    )
    verify.add_argument("file", help="the exported record (run.evidence.tar)")
    verify.add_argument(
        "--key",
        metavar="PUBKEY_OR_KEYRING",
        help="the keys to trust: the portal's keyring (GET /api/v1/evidence/keys/), a PEM public "
        "key or a base64 raw key; without it the record's own key is used and the signer is "
        "not checked",
    )
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    try:
        arguments = parser.parse_args(argv)
    except SystemExit as exit_request:  # argparse exits 2 on a usage error, 0 for --help
        return EXIT_USAGE if exit_request.code else 0
    return verify_and_report(arguments.file, arguments.key, as_json=arguments.json)


if __name__ == "__main__":
    sys.exit(main())
