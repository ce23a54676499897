"""A sweep on a Ray cluster: the RayJob's driver for ``execution.launcher: ray-tune``.

``python -m tau.ray_tune -- <the run's command…>`` runs on the Ray head, with the code as
Ray's ``working_dir`` and this SDK among its ``py_modules``; ``TAU_SWEEP`` (in the runtime
environment, so every trial sees it too) holds the trials, ``max_concurrent_trials``,
``metric``, ``mode`` and the resources of one trial. Ray Tune runs one trial per entry of
``trials`` (numbered as the spec expands its grid, ``num_samples`` included), at most
``max_concurrent_trials`` at once, each on the cluster's workers:

* a script that defines ``train_func(config)`` has it called with the trial's values, and a
  mapping it returns is reported after the steps the trial reported (``returned_row``);
* any other entry point runs as a sub-process with ``TAU_TRIAL_ID`` and ``TAU_TRIAL_CONFIG``,
  and every row it appends to its metrics file is reported as it comes.

What a trial reports goes to Ray Tune (for its own comparison of trials) and to the portal
under ``trial-<n>/<key>`` (``tau.log_metrics``); the driver tells the portal each trial's
state as it changes (``tau.sdk.report_trials``). The driver exits 0 when every trial
succeeded, 1 otherwise.
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tau import sdk
from tau.sweep import (
    POLL_SECONDS,
    TRAIN_FUNC,
    defines_train_func,
    describe,
    python_script,
    returned_row,
)

#: The key in Ray Tune's config that says which of the spec's trials a Tune trial is.
TRIAL_KEY = "__tau_trial"


#: How long the driver's last report of its trials may wait for a busy portal.
FINAL_REPORT_SECONDS = 180.0


def _numbers(values: Mapping[str, Any]) -> dict[str, float]:
    return {
        key: float(value)
        for key, value in values.items()
        if key != "step" and isinstance(value, int | float) and not isinstance(value, bool)
    }


def run_trial(command: Sequence[str], values: dict[str, Any], number: int, report: Any) -> None:
    """One trial, inside a Ray Tune trial actor; ``report`` is ``ray.tune.report``."""
    os.environ["TAU_TRIAL_ID"] = str(number)
    os.environ["TAU_TRIAL_CONFIG"] = json.dumps(values, sort_keys=True)
    script = python_script(command)
    if script is not None and defines_train_func(Path(script)):
        sys.argv = [script, *command[2:]]
        sys.path.insert(0, str(Path(script).resolve().parent))
        sdk.forget_logged_steps()  # Ray may run several trials in one worker process
        namespace = runpy.run_path(script, run_name="__tau_trial__")
        result = namespace[TRAIN_FUNC](values)
        row = returned_row(result, last_step=sdk.last_logged_step())
        if row is not None:
            sdk.log_metrics(row["step"], **_numbers(row))
            report({**_numbers(row), "step": row["step"]})
        sdk.flush()
        return
    output = Path(tempfile.mkdtemp(prefix=f"tau-trial-{number}-"))
    metrics_file = output / (os.environ.get("TAU_METRICS_FILE") or "metrics.jsonl")
    env = {**os.environ, "TAU_OUTPUT_DIR": str(output)}
    process = subprocess.Popen(list(command), env=env)  # noqa: S603 - the run's own command
    offset = 0
    while True:
        code = process.poll()
        offset = _report_rows(metrics_file, offset, report, final=code is not None)
        if code is not None:
            break
        time.sleep(POLL_SECONDS)
    sdk.flush()
    if code != 0:
        raise RuntimeError(f"trial {number} exited with code {code}")


def _report_rows(path: Path, offset: int, report: Any, *, final: bool) -> int:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        return offset
    end = len(data) if final else data.rfind(b"\n") + 1
    for raw in data[: max(end, 0)].splitlines():
        try:
            row = json.loads(raw)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and _numbers(row):
            sdk.log_metrics(row["step"], **_numbers(row))
            report({**_numbers(row), "step": row["step"]})
    return offset + max(end, 0)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["--"]:
        arguments = arguments[1:]
    if not arguments:
        print("usage: python -m tau.ray_tune -- COMMAND…", file=sys.stderr)
        return 2
    settings = json.loads(os.environ["TAU_SWEEP"])
    trials: list[dict[str, Any]] = settings["trials"]
    command = arguments

    import ray  # type: ignore[import-not-found]
    from ray import tune

    ray.init(address=os.environ.get("RAY_ADDRESS") or "auto")
    states: dict[int, dict[str, Any]] = {
        number: {"trial": number, "config": values, "state": "pending"}
        for number, values in enumerate(trials, start=1)
    }

    def tell(*, patience: float = 0.0) -> None:
        sdk.report_trials([states[number] for number in sorted(states)], patience=patience)

    class Progress(tune.Callback):  # type: ignore[misc]
        """Each Tune trial's start and end, said in the log and to the portal."""

        def on_trial_start(self, iteration: int, trials: Any, trial: Any, **info: Any) -> None:
            number = trial.config[TRIAL_KEY]
            states[number].update(state="running", started_at=time.time())
            print(
                f"[sweep] trial {number} of {len(states)} started: "
                f"{describe(states[number]['config'])}",
                flush=True,
            )
            tell()

        def _ended(self, trial: Any, state: str, code: int) -> None:
            number = trial.config[TRIAL_KEY]
            states[number].update(state=state, exit_code=code, finished_at=time.time())
            print(f"[sweep] trial {number} {state}", flush=True)
            tell()

        def on_trial_complete(self, iteration: int, trials: Any, trial: Any, **info: Any) -> None:
            self._ended(trial, "succeeded", 0)

        def on_trial_error(self, iteration: int, trials: Any, trial: Any, **info: Any) -> None:
            self._ended(trial, "failed", 1)

    # Ray Tune starts each trial in a folder of its own; the code is where the driver is.
    code = os.getcwd()

    def trainable(config: dict[str, Any]) -> None:
        number = config[TRIAL_KEY]
        os.chdir(code)
        run_trial(command, trials[number - 1], number, tune.report)

    resources = settings.get("resources_per_trial") or {"cpu": 1}
    limit = int(settings.get("max_concurrent_trials") or 1)
    print(
        f"[sweep] {len(trials)} trial{'s' if len(trials) != 1 else ''} on Ray Tune, at most "
        f"{limit} at once, compared by {settings.get('metric')} ({settings.get('mode')})",
        flush=True,
    )
    tell()
    tuner = tune.Tuner(
        tune.with_resources(trainable, resources),
        param_space={TRIAL_KEY: tune.grid_search(list(range(1, len(trials) + 1)))},
        tune_config=tune.TuneConfig(num_samples=1, max_concurrent_trials=limit),
        run_config=tune.RunConfig(
            name=os.environ.get("TAU_RUN_NAME") or "sweep",
            storage_path=tempfile.mkdtemp(prefix="tau-tune-"),
            callbacks=[Progress()],
            verbose=0,
        ),
    )
    results = tuner.fit()
    failed = [number for number, state in sorted(states.items()) if state["state"] != "succeeded"]
    # The end of every trial once more, waiting out a busy portal: a report lost on the way
    # is not the last word.
    tell(patience=FINAL_REPORT_SECONDS)
    sdk.flush()
    if failed or results.errors:
        print(
            f"[sweep] {len(failed)} of {len(states)} trials failed: "
            + ", ".join(f"trial {number}" for number in failed),
            flush=True,
        )
        return 1
    print(f"[sweep] all {len(states)} trials succeeded", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
