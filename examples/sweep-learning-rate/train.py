"""One trial of a learning-rate sweep: least-squares regression by gradient descent on a
synthetic, seeded dataset. Pure Python standard library.

TauGrid (or Ray Tune, on Kubernetes) calls ``train_func(config)`` once per trial with that
trial's values (``{"learning_rate": 0.1, "steps": 30}``). Each trial reports ``loss`` and
``val_loss`` every 10 steps through the workload SDK; the portal keeps them as
``trial-<n>/loss`` and draws one line per trial. The mapping ``train_func`` returns is the
trial's last row: its final ``val_loss`` is what the trials are compared by (``execution.metric``
in tau.yaml). A learning rate that is too large diverges: the trial still succeeds and simply
reports a large loss (capped), so the comparison shows why it lost.

The data and the starting weights are the same in every trial (seeded), so two sweeps with
the same values report the same numbers.

Try one trial without TauGrid:

    python examples/sweep-learning-rate/train.py --learning-rate 0.1
"""

from __future__ import annotations

import argparse
import math
import random
from typing import Any

try:
    import tau  # the TauGrid workload SDK (standard library only)
except ImportError:  # outside a TauGrid run, without the tau package: print instead
    tau = None

SEED = 11
FEATURES = 8
SAMPLES = 400
LOG_EVERY = 10
#: A diverging trial's loss is reported as this, not as an overflow.
LOSS_CAP = 1e6


def dataset() -> tuple[list[list[float]], list[float], list[float]]:
    """Inputs, targets and the true weights: y = x·w + noise, the same in every trial."""
    rng = random.Random(SEED)  # noqa: S311 - a seeded dataset, not a secret
    weights = [rng.uniform(-2, 2) for _ in range(FEATURES)]
    inputs = [[rng.gauss(0, 1) for _ in range(FEATURES)] for _ in range(SAMPLES)]
    targets = [
        sum(x * w for x, w in zip(row, weights, strict=True)) + rng.gauss(0, 0.1) for row in inputs
    ]
    return inputs, targets, weights


def mean_squared_error(
    weights: list[float], inputs: list[list[float]], targets: list[float]
) -> float:
    total = 0.0
    for row, target in zip(inputs, targets, strict=True):
        error = sum(x * w for x, w in zip(row, weights, strict=True)) - target
        total += error * error
        if total > LOSS_CAP * len(targets):
            return LOSS_CAP
    return min(LOSS_CAP, total / len(targets))


def report(step: int, **values: float) -> None:
    print(f"step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in values.items()), flush=True)
    if tau is not None:
        tau.log_metrics(step, **values)


def train_func(config: dict[str, Any]) -> dict[str, float]:
    """Train with ``config["learning_rate"]`` for ``config["steps"]`` steps; the final row."""
    learning_rate = float(config["learning_rate"])
    steps = int(config.get("steps", 30))
    inputs, targets, _ = dataset()
    split = SAMPLES * 3 // 4
    train_x, train_y = inputs[:split], targets[:split]
    val_x, val_y = inputs[split:], targets[split:]
    weights = [0.0] * FEATURES
    loss = val_loss = LOSS_CAP
    for step in range(1, steps + 1):
        gradient = [0.0] * FEATURES
        for row, target in zip(train_x, train_y, strict=True):
            error = sum(x * w for x, w in zip(row, weights, strict=True)) - target
            for index, x in enumerate(row):
                gradient[index] += 2 * error * x / split
        weights = [w - learning_rate * g for w, g in zip(weights, gradient, strict=True)]
        if not all(math.isfinite(w) and abs(w) < 1e6 for w in weights):
            print(f"learning rate {learning_rate} diverged at step {step}")
            return {"loss": LOSS_CAP, "val_loss": LOSS_CAP}
        if step % LOG_EVERY == 0 or step == steps:
            loss = mean_squared_error(weights, train_x, train_y)
            val_loss = mean_squared_error(weights, val_x, val_y)
            report(step, loss=loss, val_loss=val_loss)
    print(f"learning rate {learning_rate}: val_loss {val_loss:.5f} after {steps} steps")
    return {"loss": loss, "val_loss": val_loss}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=30)
    arguments = parser.parse_args()
    train_func({"learning_rate": arguments.learning_rate, "steps": arguments.steps})
