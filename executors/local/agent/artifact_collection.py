"""Collecting a local attempt's artifacts: the files in its output folder that match the
run's ``outputs.artifacts`` patterns, kept when the attempt ends (``runs.artifacts``).

The agent may run as root and the folder is the workload's: nothing here follows a symbolic
link (a link to a host file is not an artifact, a linked folder is not entered), only
regular files are read (a FIFO would block), and each file is opened one path component at
a time below the folder (``open_regular_file``), so a link swapped in after the walk is
refused too. A file that is not kept (a limit, an unreadable file) is a note in the run's
history or the agent's log, never the end of the attempt's recording.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from executors.local.agent.collect import open_regular_file
from runs import artifacts
from runs.models import Run

logger = logging.getLogger(__name__)

#: Entries looked at per attempt: a workload that writes millions of files does not hold
#: the agent's loop for minutes.
MAX_WALK_ENTRIES = 100_000


@dataclass
class CollectedArtifacts:
    kept: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (path, why)


def matching_files(output: Path, patterns: list[str]) -> list[str]:
    """Relative POSIX paths of the regular files below ``output`` that match ``patterns``,
    sorted; links are neither returned nor followed."""
    if not patterns:
        return []
    found: list[str] = []
    seen = 0
    # Through descriptors: a folder swapped for a link while it is walked is not entered
    # (os.walk would list the link's target, a host folder, by its path).
    for folder, folders, files, folder_fd in os.fwalk(output, follow_symlinks=False):
        folders.sort()
        for name in files:
            seen += 1
            if seen > MAX_WALK_ENTRIES:
                logger.warning("%s: more than %d files; the rest not looked at", output, seen - 1)
                return sorted(found)
            relative = (Path(folder) / name).relative_to(output).as_posix()
            if not artifacts.matches_declared(relative, patterns):
                continue
            try:
                info = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                found.append(relative)
    return sorted(found)


def collect_artifacts(*, run: Run, attempt: int, output: Path) -> CollectedArtifacts:
    """Keep every file of ``output`` that the run declared (``outputs.artifacts``)."""
    collected = CollectedArtifacts()
    for relative in matching_files(output, artifacts.declared_patterns(run)):
        try:
            descriptor = open_regular_file(output / relative, output)
        except OSError as exc:
            collected.refused.append((relative, f"not read: {exc.strerror or exc}"))
            continue
        with os.fdopen(descriptor, "rb") as source:
            try:
                artifacts.store_artifact(run=run, attempt=attempt, name=relative, source=source)
            except artifacts.ArtifactRefused as exc:
                collected.refused.append((relative, str(exc)))
                continue
        collected.kept.append(relative)
    for relative, why in collected.refused:
        logger.info("%s attempt %d: artifact %s not kept: %s", run.name, attempt, relative, why)
    return collected
