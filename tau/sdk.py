"""The workload SDK: a training script reports to TauGrid from inside its run.

    import tau

    start = tau.resume_from()                  # the checkpoint to resume from, or None
    for step in range(first, last):
        ...
        tau.log_metrics(step, loss=loss, lr=lr)  # batched, sent in the background
        if step % 500 == 0:
            save(f"{os.environ['TAU_CHECKPOINT_DIR']}/step-{step}")
            tau.checkpoint_saved(f"{os.environ['TAU_CHECKPOINT_DIR']}/step-{step}", step)
    tau.save_artifact(f"{os.environ['TAU_OUTPUT_DIR']}/model/final.pt")  # uploads it now

What it reads is what every run gets in its environment, on the local executor and on
Kubernetes alike (docs/TAU_YAML.md): ``TAU_API_URL``, ``TAU_RUN_TOKEN`` (a token that reports
on this run only), ``TAU_WORKSPACE``, ``TAU_RUN_NAME``, ``TAU_RESUME_FROM``.

It never stands in the training loop's way: ``log_metrics`` only appends to a buffer; a
background thread sends the rows in batches (one report a second at most, within the portal's
limit of reports a minute). When the portal cannot be reached the rows wait in the buffer
(bounded: the oldest go first, and that is said) and a warning goes to stderr once per outage;
they are sent when it answers again. Nothing here raises into the training loop because of
the portal. At exit the buffer is flushed for at most ``FLUSH_AT_EXIT_SECONDS``.

``save_artifact`` uploads one file the run declared in ``outputs.artifacts`` (its name
relative to ``TAU_OUTPUT_DIR`` must match a pattern) and waits for it: the file is streamed,
never read whole; a refusal or an unreachable portal is a warning and ``False``, never an
exception. On the local executor the declared files are also collected when the attempt
ends, so it is needed there only to keep a file the workload deletes before it exits.

Outside a run (no ``TAU_RUN_TOKEN``) the calls do nothing but say so once.

In a multi-worker run (``WORLD_SIZE`` > 1, docs/distributed.md) metrics and checkpoints are
reported by the worker of ``RANK`` 0 only: every worker of a data-parallel training sees the
same averaged loss and saves the same model, and a row from each would count once per worker.
The other workers' ``log_metrics`` and ``checkpoint_saved`` do nothing (said once);
``report_from_every_rank()`` makes a worker report too (with keys of its own, say).

Standard library only: a workload's image needs nothing installed for it.
"""

from __future__ import annotations

import atexit
import json
import math
import operator
import os
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Mapping
from typing import Any

__all__ = [
    "checkpoint_saved",
    "flush",
    "log_metrics",
    "report_from_every_rank",
    "resume_from",
    "save_artifact",
    "track",
]

#: The most rows one report carries (the portal takes up to 5,000).
ROWS_PER_REPORT = 1000
#: The most rows kept while the portal cannot be reached; the oldest go first.
MAX_BUFFERED_ROWS = 100_000
#: Between two reports, at least this long (the portal allows 120 reports a minute per run).
SEND_INTERVAL_SECONDS = 1.0
#: After a failed report, wait this long, doubling up to MAX_RETRY_SECONDS.
FIRST_RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 30.0
#: How long one report may take.
REQUEST_TIMEOUT_SECONDS = 10.0
#: How long the process's exit waits for what is left in the buffer.
FLUSH_AT_EXIT_SECONDS = 10.0
#: The largest step (and checkpoint size) the portal takes: 2^53 - 1, the largest integer a
#: run's evidence and every JSON reader hold exactly (``tau.evidence.canonical``'s
#: ``MAX_SAFE_INTEGER``, not imported: this module needs nothing but the standard library).
MAX_STEP = 2**53 - 1


def _whole_number(value: Any, what: str) -> int | str:
    """``value`` as an int (a NumPy or PyTorch integer too), or why the portal would refuse
    it: not a whole number, negative, or above ``MAX_STEP``."""
    try:
        number = operator.index(value) if not isinstance(value, bool) else None
    except TypeError:
        number = None
    if number is None or not 0 <= number <= MAX_STEP:
        return f"{what} must be a whole number from 0 to 2^53 - 1 ({MAX_STEP}), not {value!r}"
    return number


def _warn(message: str) -> None:
    print(f"tau: {message}", file=sys.stderr, flush=True)


class _Refused(Exception):
    """The portal refused a report for what it says (400, 404…): sending it again is useless."""


class _Unreachable(Exception):
    """The report did not arrive (no connection, a timeout, a 5xx, a 429): try again later."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Reporter:
    """One run's reports: a buffer of metric rows and checkpoints, and the thread that sends
    them. Made on first use from the environment (:func:`reporter`)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.api_url = environ.get("TAU_API_URL", "").rstrip("/")
        self.token = environ.get("TAU_RUN_TOKEN", "")
        workspace = environ.get("TAU_WORKSPACE", "")
        run = environ.get("TAU_RUN_NAME", "")
        self.active = bool(self.api_url and self.token and workspace and run)
        if self.active and urllib.parse.urlsplit(self.api_url).scheme not in {"http", "https"}:
            _warn(f"TAU_API_URL={self.api_url!r} is not an http(s) address: nothing is reported")
            self.active = False
        where = urllib.parse.quote(workspace, safe=""), urllib.parse.quote(run, safe="")
        self.base = f"{self.api_url}/api/v1/workspaces/{where[0]}/runs/{where[1]}/report/"
        self.rows: deque[dict[str, Any]] = deque()
        self.checkpoints: deque[dict[str, Any]] = deque()
        self.dropped = 0
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.idle = threading.Event()
        self.idle.set()
        self.thread: threading.Thread | None = None
        self.outage = False
        self.retry_at = 0.0
        self.retry_delay = FIRST_RETRY_SECONDS

    # -- what the training loop calls --

    def add_row(self, row: dict[str, Any]) -> None:
        with self.lock:
            self.rows.append(row)
            if len(self.rows) > MAX_BUFFERED_ROWS:
                self.rows.popleft()
                self.dropped += 1
                if self.dropped in (1, 1000) or self.dropped % 100_000 == 0:
                    _warn(
                        f"{self.dropped} metric row(s) dropped: the portal has not answered "
                        f"and at most {MAX_BUFFERED_ROWS} are kept"
                    )
            self.idle.clear()
        self._ensure_thread()

    def add_checkpoint(self, report: dict[str, Any]) -> None:
        with self.lock:
            self.checkpoints.append(report)
            self.idle.clear()
        self._ensure_thread()
        self.wake.set()  # a checkpoint goes at once: a resume needs it

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for everything buffered to be sent; True when it was."""
        if not self.active:
            return True
        self.wake.set()
        return self.idle.wait(timeout)

    # -- the sending thread --

    def _ensure_thread(self) -> None:
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self._run, name="tau-reporter", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        while True:
            self.wake.wait(SEND_INTERVAL_SECONDS)
            self.wake.clear()
            pause = self.retry_at - time.monotonic()
            if pause > 0:
                time.sleep(min(pause, SEND_INTERVAL_SECONDS))
                continue
            try:
                self._send_pending()
            except Exception as error:  # never let the thread die: the buffer stays
                _warn(f"reporting failed unexpectedly ({type(error).__name__}: {error})")
                self.retry_at = time.monotonic() + MAX_RETRY_SECONDS

    def _send_pending(self) -> None:
        while True:
            with self.lock:
                checkpoint = self.checkpoints[0] if self.checkpoints else None
                batch = [] if checkpoint else list(_first(self.rows, ROWS_PER_REPORT))
                if checkpoint is None and not batch:
                    self.idle.set()
                    return
            try:
                if checkpoint is not None:
                    self._post("checkpoints/", checkpoint)
                else:
                    self._post("metrics/", {"rows": batch})
            except _Unreachable as error:
                self._unreachable(error)
                return
            except _Refused as error:
                what = "a checkpoint" if checkpoint is not None else f"{len(batch)} metric row(s)"
                _warn(f"the portal refused {what}, which are dropped: {error}")
            self._reached()
            with self.lock:
                if checkpoint is not None:
                    self.checkpoints.popleft()
                else:
                    for _ in batch:
                        self.rows.popleft()
            if checkpoint is None:
                time.sleep(SEND_INTERVAL_SECONDS)  # within the portal's reports a minute

    def _unreachable(self, error: _Unreachable) -> None:
        if not self.outage:
            with self.lock:
                waiting = len(self.rows)
            _warn(
                f"the portal cannot be reached ({error}); {waiting} metric row(s) wait and "
                "will be sent when it answers. Training goes on."
            )
            self.outage = True
        delay = error.retry_after if error.retry_after is not None else self.retry_delay
        self.retry_at = time.monotonic() + delay
        self.retry_delay = min(self.retry_delay * 2, MAX_RETRY_SECONDS)

    def _reached(self) -> None:
        if self.outage:
            _warn("the portal answers again; the waiting rows are being sent")
        self.outage = False
        self.retry_delay = FIRST_RETRY_SECONDS

    def _post(self, what: str, body: dict[str, Any]) -> None:
        request = urllib.request.Request(  # noqa: S310 - http(s) only, checked in __init__
            self.base + what,
            data=json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {self.token}",
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
            method="POST",
        )
        try:
            with urllib.request.urlopen(  # noqa: S310 - http(s) only, checked in __init__
                request, timeout=REQUEST_TIMEOUT_SECONDS
            ) as response:
                response.read()
        except urllib.error.HTTPError as error:
            detail = _detail(error)
            if error.code == 429 or error.code >= 500:
                retry_after = error.headers.get("Retry-After") if error.headers else None
                raise _Unreachable(
                    f"HTTP {error.code}: {detail}",
                    float(retry_after) if retry_after and retry_after.isdigit() else None,
                ) from None
            raise _Refused(f"HTTP {error.code}: {detail}") from None
        except (OSError, ValueError) as error:  # URLError, timeouts, a reset connection
            raise _Unreachable(str(getattr(error, "reason", error))) from None


def _first(rows: deque[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    taken: list[dict[str, Any]] = []
    for row in rows:
        if len(taken) == count:
            break
        taken.append(row)
    return taken


def _detail(error: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(error.read() or b"{}")
    except (OSError, ValueError):
        return str(error.reason)
    if isinstance(body, dict):
        problems = body.get("problems")
        if isinstance(problems, list) and problems:
            return f"{body.get('detail', '')} {problems[0]}".strip()
        return str(body.get("detail") or error.reason)
    return str(error.reason)


_reporter: Reporter | None = None
_reporter_lock = threading.Lock()
_said_outside = False
_every_rank = False
_said_rank = False
#: The largest step ``log_metrics`` took in this process since ``forget_logged_steps``: a
#: sweep's trial puts the mapping ``train_func`` returns after it (``tau.sweep``).
_last_logged_step: int | None = None


def last_logged_step() -> int | None:
    """The largest step ``log_metrics`` was given (since ``forget_logged_steps``), or None."""
    return _last_logged_step


def forget_logged_steps() -> None:
    """Start counting steps afresh (a sweep's next trial in the same process)."""
    global _last_logged_step
    _last_logged_step = None


def reporter() -> Reporter:
    """This process's reporter, made from the environment on first use."""
    global _reporter
    with _reporter_lock:
        if _reporter is None:
            _reporter = Reporter(os.environ)
            atexit.register(_flush_at_exit)
        return _reporter


def _reset() -> None:
    """Forget the reporter (tests, or a process that changed its environment)."""
    global _reporter, _said_outside, _every_rank, _said_rank
    with _reporter_lock:
        _reporter = None
        _said_outside = False
        _every_rank = False
        _said_rank = False


def _outside_a_run(what: str) -> bool:
    global _said_outside
    if reporter().active:
        return False
    if not _said_outside:
        _warn(f"not inside a TauGrid run (no TAU_RUN_TOKEN): {what} is not reported")
        _said_outside = True
    return True


def _not_the_reporting_rank(what: str) -> bool:
    """Whether this worker of a multi-worker run leaves ``what`` to rank 0 (module
    docstring)."""
    global _said_rank
    rank = os.environ.get("RANK", "").strip()
    if _every_rank or os.environ.get("WORLD_SIZE", "1").strip() in {"", "1"} or rank in {"", "0"}:
        return False
    if not _said_rank:
        _warn(
            f"this is worker RANK {rank}: {what} is reported by rank 0 only "
            "(tau.report_from_every_rank() reports from here too)"
        )
        _said_rank = True
    return True


def report_from_every_rank(enabled: bool = True) -> None:
    """Report this worker's metrics and checkpoints too, whatever its ``RANK`` (by default
    only rank 0 of a multi-worker run reports; module docstring)."""
    global _every_rank
    _every_rank = enabled


def _flush_at_exit() -> None:
    current = _reporter
    if current is None or not current.active:
        return
    if not current.flush(FLUSH_AT_EXIT_SECONDS):
        with current.lock:
            left = len(current.rows) + len(current.checkpoints)
        _warn(f"{left} report(s) could not be sent before the run ended")


# -- the API --


def log_metrics(step: int, **values: float) -> None:
    """Record metric values at ``step`` (``tau.log_metrics(10, loss=0.31)``). Returns at once;
    the rows go to the portal in the background. A value that is not a finite number is
    skipped with a warning."""
    if _outside_a_run("log_metrics") or _not_the_reporting_rank("log_metrics"):
        return
    number = _whole_number(step, "step")
    if isinstance(number, str):
        _warn(f"log_metrics: {number}; row skipped")
        return
    global _last_logged_step
    _last_logged_step = number if _last_logged_step is None else max(_last_logged_step, number)
    row: dict[str, Any] = {"step": number}
    # A sweep's trial: its keys are its own (``trial-3/loss``), so trials never mix.
    trial = os.environ.get("TAU_TRIAL_ID", "")
    prefix = f"trial-{trial}/" if trial.isdigit() else ""
    for key, value in values.items():
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(float(value))
        ):
            _warn(f"log_metrics: {key}={value!r} at step {step} is not a finite number; skipped")
            continue
        row[prefix + key] = value
    if len(row) > 1:
        reporter().add_row(row)


def report_trials(trials: list[dict[str, Any]], *, patience: float = 0.0) -> bool:
    """A sweep driver's account of its trials (``{trial, config, state, exit_code,
    started_at, finished_at}`` each), sent now with a few tries — or, with ``patience``, with
    tries for up to that many seconds (the last word on the trials, which nothing after it
    repairs: a busy portal's 429s, which every process of the run shares, are waited out);
    False, with a warning, when the portal could not take it. Used by ``tau.ray_tune``; a
    trial never needs it."""
    if _outside_a_run("report_trials"):
        return False
    delay = FIRST_RETRY_SECONDS
    deadline = time.monotonic() + patience
    attempt = 0
    while True:
        attempt += 1
        try:
            reporter()._post("trials/", {"trials": trials})
            return True
        except _Refused as error:
            _warn(f"report_trials: the portal refused the trials: {error}")
            return False
        except _Unreachable as error:
            wait = error.retry_after or delay
            if attempt >= 4 and time.monotonic() + wait > deadline:
                _warn(f"report_trials: the portal cannot be reached: {error}")
                return False
            time.sleep(wait)
            delay = min(delay * 2, MAX_RETRY_SECONDS)


def trial_config() -> dict[str, Any]:
    """This trial's values in a sweep (``execution.configs``), or {} outside a sweep."""
    raw = os.environ.get("TAU_TRIAL_CONFIG")
    if not raw:
        return {}
    config = json.loads(raw)
    return config if isinstance(config, dict) else {}


def checkpoint_saved(path: str | os.PathLike[str], step: int, *, size: int | None = None) -> None:
    """Register a checkpoint that is complete on disk (under ``TAU_CHECKPOINT_DIR``): the
    newest one is what a resumed or retried attempt starts from (:func:`resume_from`). Sent
    at once in the background."""
    if _outside_a_run("checkpoint_saved") or _not_the_reporting_rank("checkpoint_saved"):
        return
    number = _whole_number(step, "step")
    size_number = None if size is None else _whole_number(size, "size")
    for why in (number, size_number):
        if isinstance(why, str):
            _warn(f"checkpoint_saved: {why}; not reported")
            return
    report: dict[str, Any] = {"step": number, "path": os.fspath(path)}
    if size_number is not None:
        report["size"] = size_number
    reporter().add_checkpoint(report)


def resume_from() -> str | None:
    """The checkpoint this attempt should start from (``TAU_RESUME_FROM``), or None."""
    return os.environ.get("TAU_RESUME_FROM") or None


def flush(timeout: float = FLUSH_AT_EXIT_SECONDS) -> bool:
    """Wait up to ``timeout`` seconds until everything reported so far has reached the
    portal; True when it has (it is also done at exit)."""
    current = _reporter
    return True if current is None else current.flush(timeout)


#: Tries of one artifact upload when the portal cannot be reached (or asks to wait).
ARTIFACT_TRIES = 3


def save_artifact(path: str | os.PathLike[str], name: str | None = None) -> bool:
    """Upload the file at ``path`` as one of the run's artifacts, kept with its evidence and
    downloadable from the run page. ``name`` is its path among the run's artifacts; by
    default ``path`` relative to ``TAU_OUTPUT_DIR`` (or the file's own name when it lies
    elsewhere). The name must match one of the run's ``outputs.artifacts`` patterns, and the
    run's and workspace's artifact limits apply.

    Unlike the reports, this waits for the upload (the file is streamed, never read into
    memory whole), so call it where a pause is fine: after an evaluation, at the end. True
    when the portal kept the file; False, with a warning, otherwise — it never raises."""
    if _outside_a_run("save_artifact"):
        return False
    try:
        return _upload_artifact(os.fspath(path), name)
    except Exception as error:  # never into the training loop
        _warn(f"save_artifact: {path!s} not saved ({type(error).__name__}: {error})")
        return False


def _artifact_name(path: str, name: str | None) -> str:
    if name:
        return name
    output = os.environ.get("TAU_OUTPUT_DIR")
    absolute = os.path.abspath(path)
    if output:
        relative = os.path.relpath(absolute, os.path.abspath(output))
        if relative != os.curdir and not relative.startswith(os.pardir + os.sep):
            return relative.replace(os.sep, "/")
    return os.path.basename(absolute)


def _upload_artifact(path: str, name: str | None) -> bool:
    current = reporter()
    artifact = _artifact_name(path, name)
    address = current.base + "artifacts/?" + urllib.parse.urlencode({"path": artifact})
    delay = FIRST_RETRY_SECONDS
    for tries_left in range(ARTIFACT_TRIES - 1, -1, -1):
        try:
            with open(path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                request = urllib.request.Request(  # noqa: S310 - http(s) only, checked in Reporter
                    address,
                    data=handle,  # http.client sends a file in blocks
                    headers={
                        "Authorization": f"Bearer {current.token}",
                        "Content-Type": "application/octet-stream",
                        "Content-Length": str(size),
                        "Accept": "application/json",
                    },
                    method="POST",
                )
                with urllib.request.urlopen(  # noqa: S310 - http(s) only, checked in Reporter
                    request, timeout=REQUEST_TIMEOUT_SECONDS
                ) as response:
                    response.read()
            return True
        except urllib.error.HTTPError as error:
            detail = _detail(error)
            if (error.code == 429 or error.code >= 500) and tries_left:
                retry_after = error.headers.get("Retry-After") if error.headers else None
                time.sleep(float(retry_after) if retry_after and retry_after.isdigit() else delay)
                delay = min(delay * 2, MAX_RETRY_SECONDS)
                continue
            _warn(
                f"save_artifact: the portal did not keep {artifact!r}: HTTP {error.code}: {detail}"
            )
            return False
        except (OSError, ValueError) as error:
            if isinstance(error, OSError) and error.filename == path:
                _warn(f"save_artifact: cannot read {path}: {error.strerror or error}")
                return False
            if tries_left:
                time.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_SECONDS)
                continue
            reason = getattr(error, "reason", error)
            _warn(f"save_artifact: {artifact!r} not saved, the portal cannot be reached: {reason}")
            return False
    return False


class _Track:
    """``from tau import track; track.log(step=10, loss=0.31)``: the spelling the tau.yaml
    contract (TAU_YAML.md, "What a running workload sees") gives, kept working beside the
    functions above; each method is the function it names."""

    @staticmethod
    def log(step: int, **values: float) -> None:
        log_metrics(step, **values)

    @staticmethod
    def checkpoint(path: str | os.PathLike[str], step: int, *, size: int | None = None) -> None:
        checkpoint_saved(path, step, size=size)


track = _Track()
