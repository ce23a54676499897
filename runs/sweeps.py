"""What a sweep's driver is told, the same on every backend.

A run with ``execution.launcher: ray-tune`` does not start its entry point directly: a driver
runs the trials around it — ``tau.sweep`` on this machine, ``tau.ray_tune`` on a Ray cluster —
and reads what to run from the environment variable ``TAU_SWEEP`` (:func:`sweep_environment`).
Both executors put the same JSON there, so a sweep behaves alike wherever it runs.
"""

from __future__ import annotations

import json
from typing import Any, Final

from tau.spec import Spec

#: The environment variable the sweep drivers read.
SWEEP_VARIABLE: Final = "TAU_SWEEP"


def sweep_settings(spec: Spec) -> dict[str, Any]:
    """What ``tau.sweep`` (local) and ``tau.ray_tune`` (a Ray cluster) run."""
    sweep = spec.execution
    resources: dict[str, float] = {"cpu": 1}
    if spec.compute.gpus:
        resources["gpu"] = spec.compute.gpus
    return {
        "trials": sweep.trials(),
        "max_concurrent_trials": sweep.max_concurrent_trials,
        "metric": sweep.metric,
        "mode": sweep.mode,
        "metrics_file": spec.outputs.metrics_file,
        # A trial takes one CPU and one worker's GPUs, so each GPU trial has a worker's GPUs.
        "resources_per_trial": resources,
    }


def sweep_environment(spec: Spec) -> dict[str, str]:
    """``{"TAU_SWEEP": …}`` for a sweep, nothing for any other run."""
    if not spec.execution.is_sweep:
        return {}
    return {SWEEP_VARIABLE: json.dumps(sweep_settings(spec), sort_keys=True)}
