"""A sweep's trials on one machine: ``python -m tau.sweep -- <the run's command…>``.

The local agent starts this instead of the entry point when a spec has
``execution.launcher: ray-tune``. It reads the sweep from ``TAU_SWEEP`` (JSON: ``trials``, a
list of configs; ``max_concurrent_trials``; ``metric``; ``mode``; ``metrics_file``) and runs
each trial as a sub-process of its own, at most ``max_concurrent_trials`` at once, inside
the run's own resources. Each trial gets

* ``TAU_TRIAL_ID`` (1, 2, …) and ``TAU_TRIAL_CONFIG`` (its values as JSON);
* its own ``TAU_OUTPUT_DIR`` (``trials/trial-<id>/`` under the run's) and log
  (``trials/trial-<id>/log.txt``), and a checkpoint folder ``trials/trial-<id>`` under
  ``TAU_CHECKPOINT_DIR``.

A script that defines ``train_func(config)`` has it called with the trial's values (as Ray
Tune calls a function trainable); a mapping it returns is the trial's last metrics row, at the
step after the last one the trial reported (``returned_row``). Any other entry point runs as
written and reads ``TAU_TRIAL_CONFIG``.

The metrics rows a trial appends to its ``metrics_file`` are copied into the run's, each key
prefixed with ``trial-<id>/`` (``tau.log_metrics`` prefixes them the same way), so the
portal keeps every trial's curves apart. ``trials.json`` in the run's output folder says
each trial's values, state and exit code, rewritten whole at every change. The sweep exits 0
when every trial succeeded and 1 otherwise; stopping it (SIGTERM) stops every trial.

Standard library only: it runs in the run's own Python, next to the SDK.
"""

from __future__ import annotations

import ast
import json
import os
import runpy
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

POLL_SECONDS = 0.2
TRIALS_FILE = "trials.json"
TRAIN_FUNC = "train_func"


def trial_key(trial: int, key: str) -> str:
    """``trial-3/loss``: how a trial's metric is named in the run."""
    return f"trial-{trial}/{key}"


def describe(config: Mapping[str, Any]) -> str:
    return ", ".join(f"{name}={value}" for name, value in config.items()) or "no values"


class Trial:
    def __init__(self, number: int, config: dict[str, Any], root: Path) -> None:
        self.number = number
        self.config = config
        self.folder = root / "trials" / f"trial-{number}"
        self.state = "pending"
        self.exit_code: int | None = None
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.metrics_offset = 0

    def record(self) -> dict[str, Any]:
        return {
            "trial": self.number,
            "config": self.config,
            "state": self.state,
            "exit_code": self.exit_code,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }


class Sweep:
    def __init__(self, command: Sequence[str], settings: Mapping[str, Any]) -> None:
        self.command = list(command)
        self.output = Path(os.environ["TAU_OUTPUT_DIR"])
        self.checkpoints = Path(os.environ.get("TAU_CHECKPOINT_DIR") or self.output)
        self.metrics_file = str(settings.get("metrics_file") or "metrics.jsonl")
        self.limit = max(1, int(settings.get("max_concurrent_trials") or 1))
        self.metric = str(settings.get("metric") or "")
        self.mode = str(settings.get("mode") or "min")
        self.trials = [
            Trial(number, dict(config), self.output)
            for number, config in enumerate(settings["trials"], start=1)
        ]
        self.stopping = False

    # -- running -----------------------------------------------------------------------

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        count = len(self.trials)
        print(
            f"[sweep] {count} trial{'s' if count != 1 else ''}, at most {self.limit} at once, "
            f"compared by {self.metric} ({self.mode})",
            flush=True,
        )
        self._write()
        waiting = list(self.trials)
        running: list[Trial] = []
        while (waiting or running) and not self.stopping:
            while waiting and len(running) < self.limit and not self.stopping:
                trial = waiting.pop(0)
                self._start(trial)
                running.append(trial)
            time.sleep(POLL_SECONDS)
            for trial in list(running):
                self._copy_metrics(trial)
                assert trial.process is not None
                code = trial.process.poll()
                if code is not None:
                    self._finish(trial, code)
                    running.remove(trial)
        if self.stopping:
            for trial in running:
                self._terminate(trial)
            for trial in waiting:
                trial.state = "cancelled"
            self._write()
            print("[sweep] stopped", flush=True)
            return 143
        failed = [trial.number for trial in self.trials if trial.state != "succeeded"]
        if failed:
            print(
                f"[sweep] {len(failed)} of {count} trials failed: "
                + ", ".join(f"trial {number}" for number in failed)
                + " (their logs are in trials/trial-<id>/log.txt)",
                flush=True,
            )
            return 1
        print(f"[sweep] all {count} trials succeeded", flush=True)
        return 0

    def _stop(self, signum: int, _frame: Any) -> None:
        self.stopping = True

    def _start(self, trial: Trial) -> None:
        trial.folder.mkdir(parents=True, exist_ok=True)
        checkpoints = self.checkpoints / "trials" / f"trial-{trial.number}"
        checkpoints.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.pop("TAU_SWEEP", None)
        env.update(
            {
                "TAU_TRIAL_ID": str(trial.number),
                "TAU_TRIAL_CONFIG": json.dumps(trial.config, sort_keys=True),
                "TAU_OUTPUT_DIR": str(trial.folder),
                "TAU_CHECKPOINT_DIR": str(checkpoints),
                "TAU_METRICS_FILE": self.metrics_file,
            }
        )
        log = open(trial.folder / "log.txt", "ab")  # noqa: SIM115 - the child holds it
        try:
            trial.process = subprocess.Popen(  # noqa: S603 - the run's own command
                self._trial_command(), stdout=log, stderr=subprocess.STDOUT, env=env
            )
        finally:
            log.close()
        trial.state = "running"
        trial.started_at = time.time()
        self._write()
        print(
            f"[sweep] trial {trial.number} of {len(self.trials)} started: {describe(trial.config)}",
            flush=True,
        )

    def _trial_command(self) -> list[str]:
        script = python_script(self.command)
        if script is not None and defines_train_func(Path(script)):
            return [self.command[0], "-m", "tau.sweep", "--call", *self.command[1:]]
        return self.command

    def _finish(self, trial: Trial, code: int) -> None:
        self._copy_metrics(trial, final=True)
        trial.exit_code = code
        trial.finished_at = time.time()
        trial.state = "succeeded" if code == 0 else "failed"
        self._write()
        print(f"[sweep] trial {trial.number} {trial.state} (exit code {code})", flush=True)

    def _terminate(self, trial: Trial) -> None:
        process = trial.process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        trial.exit_code = process.returncode
        trial.finished_at = time.time()
        trial.state = "cancelled"

    # -- what the trials write ---------------------------------------------------------

    def _copy_metrics(self, trial: Trial, *, final: bool = False) -> None:
        """Append the trial's new complete metrics lines to the run's, keys prefixed."""
        source = trial.folder / self.metrics_file
        try:
            with open(source, "rb") as handle:
                handle.seek(trial.metrics_offset)
                data = handle.read()
        except FileNotFoundError:
            return
        end = len(data) if final else data.rfind(b"\n") + 1
        if end <= 0:
            return
        trial.metrics_offset += end
        lines: list[str] = []
        for raw in data[:end].splitlines():
            try:
                row = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(row, dict) or "step" not in row:
                continue
            prefixed = {"step": row["step"]}
            prefixed.update(
                {trial_key(trial.number, key): value for key, value in row.items() if key != "step"}
            )
            lines.append(json.dumps(prefixed))
        if lines:
            target = self.output / self.metrics_file
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "a", encoding="utf-8") as handle:
                handle.write("\n".join(lines) + "\n")

    def _write(self) -> None:
        document = {
            "metric": self.metric,
            "mode": self.mode,
            "max_concurrent_trials": self.limit,
            "trials": [trial.record() for trial in self.trials],
        }
        path = self.output / TRIALS_FILE
        staging = path.with_name(f".{TRIALS_FILE}.tmp")
        staging.write_text(json.dumps(document, sort_keys=True), encoding="utf-8")
        os.replace(staging, path)


def python_script(command: Sequence[str]) -> str | None:
    if (
        len(command) >= 2
        and Path(command[0]).name.startswith("python")
        and command[1].endswith(".py")
    ):
        return command[1]
    return None


def defines_train_func(script: Path) -> bool:
    """Whether the script defines ``train_func`` at its top level (read, not run)."""
    try:
        tree = ast.parse(script.read_bytes(), filename=str(script))
    except (OSError, SyntaxError, ValueError):
        return False
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == TRAIN_FUNC
        for node in tree.body
    )


def returned_row(result: object, *, last_step: int | None) -> dict[str, Any] | None:
    """The metrics row for what ``train_func`` returned: its numbers, at the ``step`` it names,
    else at the step after the last one the trial reported (``last_step``; 0 when it reported
    none). Ray Tune counts a returned mapping as one more result; at step 0 it was a stray
    first point on every trial's curve. None when it returned no numbers."""
    if not isinstance(result, Mapping):
        return None
    values = {
        key: value
        for key, value in result.items()
        if isinstance(key, str)
        and key != "step"
        and isinstance(value, int | float)
        and not isinstance(value, bool)
    }
    if not values:
        return None
    step = result.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        step = 0 if last_step is None else last_step + 1
    return {"step": step, **values}


def _last_step_in(path: Path) -> int | None:
    """The largest step of the rows a trial appended to its metrics file itself."""
    last: int | None = None
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                step = row.get("step") if isinstance(row, dict) else None
                if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
                    last = step if last is None else max(last, step)
    except OSError:
        return None
    return last


def _last_step_logged() -> int | None:
    """The largest step the trial gave ``tau.log_metrics``: read from the SDK the script
    imported, if it did (this module imports nothing but the standard library)."""
    sdk = sys.modules.get("tau.sdk")
    last = getattr(sdk, "last_logged_step", None)
    step = last() if callable(last) else None
    return step if isinstance(step, int) else None


def call_train_func(arguments: Sequence[str]) -> int:
    """One trial of a script that defines ``train_func(config)``: load it (not as
    ``__main__``), call it with the trial's values, and keep a mapping it returns as the
    trial's last metrics row (after every step it reported, through the SDK or its file)."""
    script, *rest = arguments
    sys.argv = [script, *rest]
    sys.path.insert(0, str(Path(script).resolve().parent))
    config = json.loads(os.environ.get("TAU_TRIAL_CONFIG") or "{}")
    output = Path(os.environ["TAU_OUTPUT_DIR"])
    metrics = output / (os.environ.get("TAU_METRICS_FILE") or "metrics.jsonl")
    namespace = runpy.run_path(script, run_name="__tau_trial__")
    result = namespace[TRAIN_FUNC](config)
    steps = (_last_step_logged(), _last_step_in(metrics))
    reported = [step for step in steps if step is not None]
    row = returned_row(result, last_step=max(reported) if reported else None)
    if row is not None:
        with open(metrics, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["--call"]:
        return call_train_func(arguments[1:])
    if arguments[:1] == ["--"]:
        arguments = arguments[1:]
    if not arguments:
        print("usage: python -m tau.sweep -- COMMAND…", file=sys.stderr)
        return 2
    settings = json.loads(os.environ["TAU_SWEEP"])
    return Sweep(arguments, settings).run()


if __name__ == "__main__":
    sys.exit(main())
