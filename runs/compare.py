"""Comparing two runs of one workspace: what a researcher asks when a run that worked last
week fails now. Pure reads, no writes: the comparison page (``runs.views.RunCompareView``)
shows what this module finds.

* **Spec**: every leaf of the two normalised specs that differs, by its dotted path
  (``compute.gpus``, ``runtime.env.LR``), and a unified diff of the two specs as JSON.
* **Code**: the files of the two bundles, added, removed or changed (by SHA-256 of their
  bytes), with a unified diff for small text files. Read from the stored zips, each file
  read through once; files larger than ``MAX_DIFF_BYTES`` or not UTF-8 are only said to
  differ. The text is returned as data and escaped by the template like any other.
* **Environment**: what TauGrid knows about where each run ran: image and requirements,
  environment variables, backend, and the newest attempt's queue, flavors and nodes.
* **Outcome**: state, failure class, how long it ran (all of its attempts, and the newest
  when there were several) and attempts of each.

Metric curves are not here: the page draws both runs' series over each other with the
metrics API the run page uses.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import zipfile
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from runs import bundles
from runs.models import Run, RunAttempt

#: Files at most this large (each side) get a text diff; larger ones are only said to differ.
MAX_DIFF_BYTES = 64 * 1024
#: Diff lines shown per file, and over the whole page: a diff is for reading, not storage.
MAX_DIFF_LINES_PER_FILE = 400
MAX_DIFF_LINES = 4000
_CHUNK = 2**16
_MISSING = object()


@dataclass(frozen=True)
class SpecDifference:
    path: str
    a: str  # the value as JSON, or "" when that side has no such field
    b: str


@dataclass
class FileChange:
    path: str
    status: str  # "added", "removed", "changed"
    diff: list[str] = field(default_factory=list)
    note: str = ""  # why there is no diff (binary, large), or that it was cut short


@dataclass(frozen=True)
class Outcome:
    state: str
    state_label: str
    failure_class: str
    failure_label: str
    #: Time its attempts ran, all together (None: none has started); an attempt still
    #: running counts until now.
    duration: timedelta | None
    #: The newest attempt's part of it, when there were several attempts that ran.
    newest_duration: timedelta | None
    attempts: int
    running: bool  # an attempt is running now: the duration is "so far"


@dataclass(frozen=True)
class EnvironmentDifference:
    what: str
    a: str
    b: str


def _leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        leaves: dict[str, Any] = {}
        for key in sorted(value):
            leaves.update(_leaves(value[key], f"{prefix}.{key}" if prefix else str(key)))
        return leaves
    return {prefix: value}


def _shown(value: Any) -> str:
    return "" if value is _MISSING else json.dumps(value, sort_keys=True, ensure_ascii=False)


def spec_differences(a: dict[str, Any], b: dict[str, Any]) -> list[SpecDifference]:
    """Every leaf of the two specs that differs (lists compared whole), by path."""
    left, right = _leaves(a), _leaves(b)
    return [
        SpecDifference(path, _shown(left.get(path, _MISSING)), _shown(right.get(path, _MISSING)))
        for path in sorted(left.keys() | right.keys())
        if left.get(path, _MISSING) != right.get(path, _MISSING)
    ]


def spec_diff(a: Run, b: Run) -> list[str]:
    """A unified diff of the two normalised specs, as indented JSON."""
    text_a = json.dumps(a.spec, indent=2, sort_keys=True, ensure_ascii=False).splitlines()
    text_b = json.dumps(b.spec, indent=2, sort_keys=True, ensure_ascii=False).splitlines()
    return list(difflib.unified_diff(text_a, text_b, a.name, b.name, lineterm=""))


@dataclass
class _BundleFile:
    sha256: str
    size: int
    text: str | None  # the content when small and UTF-8


def _bundle_files(sha256: str | None) -> dict[str, _BundleFile]:
    if sha256 is None:
        return {}
    files: dict[str, _BundleFile] = {}
    with zipfile.ZipFile(bundles.bundle_path(sha256)) as archive:
        for info in archive.infolist():
            if info.is_dir():
                continue
            digest = hashlib.sha256()
            kept = bytearray()
            size = 0
            with archive.open(info) as stream:
                while chunk := stream.read(_CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
                    if size <= MAX_DIFF_BYTES:
                        kept.extend(chunk)
            text: str | None = None
            if size <= MAX_DIFF_BYTES:
                try:
                    text = bytes(kept).decode("utf-8")
                except UnicodeDecodeError:
                    text = None
            files[info.filename] = _BundleFile(digest.hexdigest(), size, text)
    return files


def code_changes(a: Run, b: Run) -> list[FileChange]:
    """The bundle files added, removed or changed from run ``a`` to run ``b``, by path."""
    if (a.bundle.sha256 if a.bundle else None) == (b.bundle.sha256 if b.bundle else None):
        return []
    left = _bundle_files(a.bundle.sha256 if a.bundle else None)
    right = _bundle_files(b.bundle.sha256 if b.bundle else None)
    changes: list[FileChange] = []
    budget = MAX_DIFF_LINES
    for path in sorted(left.keys() | right.keys()):
        old, new = left.get(path), right.get(path)
        if old is not None and new is not None and old.sha256 == new.sha256:
            continue
        status = "added" if old is None else "removed" if new is None else "changed"
        change = FileChange(path, status)
        before = "" if old is None else old.text
        after = "" if new is None else new.text
        if before is None or after is None:
            change.note = "binary or larger than 64 KiB: no text diff"
        elif budget <= 0:
            change.note = "diff not shown: the page shows at most so many lines"
        else:
            lines = list(
                difflib.unified_diff(
                    before.splitlines(),
                    after.splitlines(),
                    f"a/{path}",
                    f"b/{path}",
                    lineterm="",
                )
            )
            limit = min(MAX_DIFF_LINES_PER_FILE, budget)
            if len(lines) > limit:
                change.note = f"{len(lines) - limit} more diff lines not shown"
            change.diff = lines[:limit]
            budget -= len(change.diff)
        changes.append(change)
    return changes


def outcome(run: Run, attempts: list[RunAttempt], *, now: datetime) -> Outcome:
    """The run's outcome; ``attempts`` are all of its attempts (one query for both runs)."""
    ran = [
        (attempt.finished_at or now) - attempt.started_at
        for attempt in sorted(attempts, key=lambda attempt: attempt.number)
        if attempt.started_at is not None
    ]
    return Outcome(
        state=run.state,
        state_label=run.get_state_display(),
        failure_class=run.failure_class,
        failure_label=run.get_failure_class_display() if run.failure_class else "",
        duration=sum(ran, timedelta()) if ran else None,
        newest_duration=ran[-1] if len(ran) > 1 else None,
        attempts=run.attempt_count,
        running=any(
            attempt.started_at is not None and attempt.finished_at is None for attempt in attempts
        ),
    )


def _environment(run: Run, attempt: RunAttempt | None) -> dict[str, str]:
    runtime = run.spec.get("runtime") or {}
    known = {
        "image": runtime.get("image") or "",
        "pip requirements": "\n".join(runtime.get("pip") or []),
        "backend": run.get_backend_display(),
    }
    for name, value in sorted((runtime.get("env") or {}).items()):
        known[f"env {name}"] = json.dumps(value, ensure_ascii=False)
    if attempt is not None:
        known["cluster queue"] = attempt.cluster_queue
        known["flavors"] = ", ".join(f"{k}: {v}" for k, v in sorted(attempt.flavors.items()))
        known["nodes"] = ", ".join(attempt.node_names)
    return known


def environment_differences(
    a: Run, a_attempt: RunAttempt | None, b: Run, b_attempt: RunAttempt | None
) -> list[EnvironmentDifference]:
    """What differs in what TauGrid knows of each run's environment (newest attempts)."""
    left, right = _environment(a, a_attempt), _environment(b, b_attempt)
    return [
        EnvironmentDifference(what, left.get(what, ""), right.get(what, ""))
        for what in sorted(left.keys() | right.keys())
        if left.get(what, "") != right.get(what, "")
    ]
