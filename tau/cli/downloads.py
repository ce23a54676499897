"""Downloading a file the portal answers (a record, a version's files): to a temporary file
beside the target, renamed into place only once whole, with progress."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

import httpx
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from tau.cli.client import Api, CliError
from tau.cli.common import err


def attachment_name(response: httpx.Response) -> str | None:
    """The file name the portal gives (``Content-Disposition``), if it is a plain one."""
    found = re.search(r'filename="([^"/\\]+)"', response.headers.get("Content-Disposition", ""))
    if found is None or found.group(1).startswith("."):
        return None
    return found.group(1)


def download_to(response: httpx.Response, target: Path, *, quiet: bool) -> int:
    """Stream ``response`` into ``target`` through a temporary file beside it; the size."""
    total = int(response.headers.get("Content-Length") or 0) or None
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    written = 0
    try:
        with (
            os.fdopen(handle, "wb") as file,
            Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                console=err,
                disable=quiet or not err.is_terminal,
                transient=True,
            ) as bar,
        ):
            task = bar.add_task(f"Downloading {target.name}", total=total)
            for chunk in response.iter_bytes():
                file.write(chunk)
                written += len(chunk)
                bar.advance(task, len(chunk))
        if total is not None and written != total:
            raise CliError(
                f"the download ended after {written:,} of {total:,} bytes; nothing was written. "
                "Try again."
            )
        os.replace(partial, target)
    finally:
        Path(partial).unlink(missing_ok=True)
    return written


def verify_with_portal_keys(api: Api, target: Path, *, as_json: bool) -> int:
    """``tau evidence verify`` of a downloaded record against the keys the portal publishes
    (its current and earlier signing keys); the command's exit status."""
    from tau.evidence.verify import verify_and_report

    keyring = api.json_of(api.request("GET", "/api/v1/evidence/keys/"))
    with tempfile.TemporaryDirectory(prefix="tau-keys-") as scratch:
        keys_file = Path(scratch) / "keys.json"
        keys_file.write_text(json.dumps(keyring))
        return verify_and_report(str(target), str(keys_file), as_json=as_json)
