"""Logistic regression on a synthetic, seeded dataset: a small but real CPU training run.

Pure Python standard library, so it runs in any image with Python 3.10 or newer and on any
laptop. It shows everything a TauGrid workload is expected to do:

* metrics: ``tau.log_metrics(step, loss=…)``, the workload SDK that TauGrid puts on the path
  of every run (local or on Kubernetes); the portal charts them live. Outside a run, or
  where ``import tau`` fails, the same rows are appended to ``$TAU_OUTPUT_DIR/metrics.jsonl``
  (``{"step": 10, "loss": 0.31, ...}``), which the local executor reads too;
* checkpoints: ``$TAU_CHECKPOINT_DIR/step-<n>/`` every few steps, written to a temporary
  directory first and renamed into place, with a ``COMPLETE`` marker, so a crash never
  leaves a half-written checkpoint that looks finished; then ``tau.checkpoint_saved``
  registers it at once (the local executor would also find it by its name);
* resume: when ``tau.resume_from()`` (``$TAU_RESUME_FROM``) names a checkpoint, training
  continues from it. Mini-
  batches are drawn from a generator seeded by (seed, step), so a resumed run computes
  exactly the same numbers as one that never stopped;
* a simulated crash for trying retries: ``--fail-at-step N`` (or ``EXAMPLE_FAIL_AT_STEP=N``)
  exits with status 1 at step N on the first attempt only (not when ``TAU_RESUME_FROM`` is
  set or ``TAU_ATTEMPT`` is above 1). The variable is not called ``TAU_…`` because those
  names are reserved for the platform and cannot be set in tau.yaml.

Run it locally:

    TAU_OUTPUT_DIR=/tmp/o TAU_CHECKPOINT_DIR=/tmp/c python examples/cpu-quickstart/train.py
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    import tau  # the TauGrid workload SDK (standard library only)
except ImportError:  # not in a TauGrid run, and the tau package is not installed
    tau = None

KEEP_CHECKPOINTS = 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--features", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--learning-rate", type=float, default=0.5)
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument(
        "--data",
        default=None,
        help="train on a tokenized dataset (examples/data-prep's output) instead of the "
        "synthetic one: a folder, relative to $TAU_DATA_DIR when it is set",
    )
    parser.add_argument(
        "--model-dir",
        default=None,
        help="also write the model into this folder of $TAU_OUTPUT_DIR (outputs.model)",
    )
    parser.add_argument(
        "--fail-at-step",
        type=int,
        default=int(os.environ.get("EXAMPLE_FAIL_AT_STEP", "0") or 0),
        help="exit with status 1 at this step, on the first attempt only",
    )
    return parser.parse_args(argv)


def make_dataset(
    seed: int, samples: int, features: int
) -> tuple[list[list[float]], list[float], list[list[float]], list[float]]:
    """Points around a random hyperplane, with label noise; 80% train, 20% validation."""
    rng = random.Random(seed)  # noqa: S311 - reproducible data, not secrets
    true_weights = [rng.gauss(0.0, 1.0) for _ in range(features)]
    xs: list[list[float]] = []
    ys: list[float] = []
    for _ in range(samples):
        x = [rng.gauss(0.0, 1.0) for _ in range(features)]
        margin = sum(w * v for w, v in zip(true_weights, x, strict=True)) + rng.gauss(0.0, 1.0)
        xs.append(x)
        ys.append(1.0 if margin > 0 else 0.0)
    split = samples * 4 // 5
    return xs[:split], ys[:split], xs[split:], ys[split:]


def load_dataset(
    folder: Path,
) -> tuple[list[list[float]], list[float], list[list[float]], list[float]]:
    """A tokenized dataset (``vocab.txt``, ``examples.jsonl`` of ``{"ids", "label"}``) as
    bag-of-words features: 1.0 for each vocabulary word a line has; the first 80% of the
    lines train, the rest validate."""
    vocab = (folder / "vocab.txt").read_text(encoding="utf-8").split()
    xs: list[list[float]] = []
    ys: list[float] = []
    for line in (folder / "examples.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        x = [0.0] * len(vocab)
        for index in row["ids"]:
            x[index] = 1.0
        xs.append(x)
        ys.append(float(row["label"]))
    split = len(xs) * 4 // 5
    return xs[:split], ys[:split], xs[split:], ys[split:]


def data_folder(name: str) -> Path:
    base = os.environ.get("TAU_DATA_DIR")
    return Path(base) / name if base and not Path(name).is_absolute() else Path(name)


def sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def evaluate(
    weights: list[float], bias: float, xs: list[list[float]], ys: list[float]
) -> tuple[float, float]:
    """Mean binary cross-entropy and accuracy."""
    loss = 0.0
    correct = 0
    for x, y in zip(xs, ys, strict=True):
        p = sigmoid(sum(w * v for w, v in zip(weights, x, strict=True)) + bias)
        p = min(max(p, 1e-12), 1.0 - 1e-12)
        loss -= y * math.log(p) + (1.0 - y) * math.log(1.0 - p)
        correct += (p >= 0.5) == (y == 1.0)
    return loss / len(xs), correct / len(xs)


def train_step(
    weights: list[float],
    bias: float,
    xs: list[list[float]],
    ys: list[float],
    batch: list[int],
    learning_rate: float,
) -> tuple[list[float], float, float]:
    """One SGD step on a mini-batch; returns the new weights, bias and the batch's loss."""
    gradient = [0.0] * len(weights)
    bias_gradient = 0.0
    loss = 0.0
    for index in batch:
        x = xs[index]
        y = ys[index]
        p = sigmoid(sum(w * v for w, v in zip(weights, x, strict=True)) + bias)
        clipped = min(max(p, 1e-12), 1.0 - 1e-12)
        loss -= y * math.log(clipped) + (1.0 - y) * math.log(1.0 - clipped)
        error = p - y
        for j, v in enumerate(x):
            gradient[j] += error * v
        bias_gradient += error
    scale = learning_rate / len(batch)
    new_weights = [w - scale * g for w, g in zip(weights, gradient, strict=True)]
    return new_weights, bias - scale * bias_gradient, loss / len(batch)


def save_checkpoint(root: Path, step: int, state: dict[str, object]) -> Path:
    """Write ``root/step-<step>/`` atomically: a temporary directory renamed into place."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step}"
    if (final / "COMPLETE").exists():
        return final  # an earlier attempt already wrote this exact state
    staging = Path(tempfile.mkdtemp(prefix=f".step-{step}-", dir=root))
    try:
        with open(staging / "state.json", "w", encoding="utf-8") as handle:
            json.dump(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        (staging / "COMPLETE").write_text(f"{step}\n", encoding="utf-8")
        if final.exists():  # a leftover without COMPLETE; it never counted as a checkpoint
            shutil.rmtree(final)
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _prune(root)
    return final


def _prune(root: Path) -> None:
    complete = sorted(
        (int(path.name.split("-", 1)[1]), path)
        for path in root.glob("step-*")
        if path.name.split("-", 1)[1].isdigit() and (path / "COMPLETE").exists()
    )
    for _step, path in complete[:-KEEP_CHECKPOINTS]:
        shutil.rmtree(path, ignore_errors=True)


def load_checkpoint(path: Path) -> dict[str, Any]:
    if not (path / "COMPLETE").exists():
        raise SystemExit(f"TAU_RESUME_FROM={path} is not a complete checkpoint")
    with open(path / "state.json", encoding="utf-8") as handle:
        state: dict[str, Any] = json.load(handle)
    return state


def reporting() -> bool:
    """Whether the SDK reports to a portal: inside a TauGrid run, with the SDK importable."""
    return tau is not None and bool(os.environ.get("TAU_RUN_TOKEN"))


def resume_path() -> str | None:
    return tau.resume_from() if tau is not None else os.environ.get("TAU_RESUME_FROM") or None


def is_first_attempt() -> bool:
    if os.environ.get("TAU_RESUME_FROM"):
        return False
    try:
        return int(os.environ.get("TAU_ATTEMPT", "1")) <= 1
    except ValueError:
        return True


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    output_dir = Path(os.environ.get("TAU_OUTPUT_DIR", "outputs"))
    checkpoint_dir = Path(os.environ.get("TAU_CHECKPOINT_DIR", "checkpoints"))
    output_dir.mkdir(parents=True, exist_ok=True)

    if args.data:
        train_x, train_y, valid_x, valid_y = load_dataset(data_folder(args.data))
        print(f"training on {len(train_x)} examples of {data_folder(args.data)}", flush=True)
    else:
        train_x, train_y, valid_x, valid_y = make_dataset(args.seed, args.samples, args.features)
    weights = [0.0] * len(train_x[0])
    batch_size = min(args.batch_size, len(train_x))
    bias = 0.0
    start_step = 0

    resume_from = resume_path()
    if resume_from:
        state = load_checkpoint(Path(resume_from))
        start_step = int(state["step"])
        weights = [float(w) for w in state["weights"]]
        bias = float(state["bias"])
        print(f"resumed from step {start_step}", flush=True)

    report = reporting()
    started = time.monotonic()
    interval_losses: list[float] = []
    with open(output_dir / "metrics.jsonl", "a", encoding="utf-8") as metrics:
        for step in range(start_step + 1, args.steps + 1):
            if step == args.fail_at_step and is_first_attempt():
                print(f"simulated failure at step {step} (first attempt only)", file=sys.stderr)
                return 1
            # Seeded by (seed, step): the same batch whether or not the run was interrupted.
            batch = random.Random(f"{args.seed}/{step}").sample(  # noqa: S311
                range(len(train_x)), batch_size
            )
            weights, bias, batch_loss = train_step(
                weights, bias, train_x, train_y, batch, args.learning_rate
            )
            interval_losses.append(batch_loss)
            if step % args.log_every == 0 or step == args.steps:
                loss = sum(interval_losses) / len(interval_losses)
                interval_losses.clear()
                val_loss, val_accuracy = evaluate(weights, bias, valid_x, valid_y)
                values = {
                    "loss": round(loss, 6),
                    "val_loss": round(val_loss, 6),
                    "val_accuracy": round(val_accuracy, 6),
                }
                if report:
                    tau.log_metrics(step, **values)  # returns at once; sent in the background
                else:
                    metrics.write(json.dumps({"step": step, **values}) + "\n")
                    metrics.flush()
                print(
                    f"step {step}: loss {loss:.4f} val_loss {val_loss:.4f} "
                    f"val_accuracy {val_accuracy:.3f}",
                    flush=True,
                )
            if step % args.checkpoint_every == 0 or step == args.steps:
                state = {"step": step, "weights": weights, "bias": bias, "seed": args.seed}
                saved = save_checkpoint(checkpoint_dir, step, state)
                if report:
                    tau.checkpoint_saved(str(saved), step)

    val_loss, val_accuracy = evaluate(weights, bias, valid_x, valid_y)
    model = {
        "weights": weights,
        "bias": bias,
        "val_loss": val_loss,
        "val_accuracy": val_accuracy,
    }
    (output_dir / "model.json").write_text(json.dumps(model), encoding="utf-8")
    if args.model_dir:
        model_dir = output_dir / args.model_dir
        model_dir.mkdir(parents=True, exist_ok=True)
        (model_dir / "model.json").write_text(json.dumps(model), encoding="utf-8")
        if args.data:  # the words the weights belong to travel with them
            shutil.copyfile(data_folder(args.data) / "vocab.txt", model_dir / "vocab.txt")
    if report and not tau.flush(timeout=10):
        print("some metrics could not be sent to the portal in time", file=sys.stderr)
    elapsed = time.monotonic() - started
    print(
        f"done: step {args.steps} after {elapsed:.1f}s, val_loss {val_loss:.4f}, "
        f"val_accuracy {val_accuracy:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
