"""A hyperparameter search with deterministic validation: a small PyTorch classifier, one
trial per combination of learning rate and hidden width, compared by accuracy on a held-out
validation set. On a GPU when there is one (the article's "GPU Ray Tune" example), else on
the CPU.

TauGrid (or Ray Tune, on Kubernetes) calls ``train_func(config)`` once per trial with that
trial's values (``{"lr": 0.01, "hidden": 64, "epochs": 15}``). Everything a trial computes is
fixed by seeds: the dataset and its train/validation split (:data:`DATA_SEED`), the model's
initial weights and the order of the batches (:data:`TRAIN_SEED`), with PyTorch's
deterministic algorithms on and one thread. So a trial gives the same ``val_accuracy`` and
``val_loss`` every time it runs, and two searches with the same values pick the same best
trial with the same validation numbers (the test suite runs this search twice and compares).

Each trial reports ``loss``, ``val_loss`` and ``val_accuracy`` after every epoch through the
workload SDK (``trial-<n>/val_accuracy`` on the run page); the mapping ``train_func`` returns
is its final row, what the trials are compared by (``execution.metric``).

Try one trial without TauGrid:

    python examples/ray-tune/train.py --lr 0.05 --hidden 32
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch
from torch import nn

try:
    import tau  # the TauGrid workload SDK (standard library only)
except ImportError:  # outside a TauGrid run, without the tau package: print instead
    tau = None

DATA_SEED = 7
TRAIN_SEED = 1234
FEATURES = 10
CLASSES = 3
SAMPLES = 1200
VALIDATION = 300  # the last samples: never trained on
BATCH = 50


def deterministic() -> torch.device:
    """One thread, deterministic kernels, seeded: the same numbers on every run."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # for CUDA's determinism
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def dataset() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three classes drawn around three seeded centres; the same split in every trial."""
    generator = torch.Generator().manual_seed(DATA_SEED)
    centres = torch.randn(CLASSES, FEATURES, generator=generator) * 1.5
    labels = torch.randint(0, CLASSES, (SAMPLES,), generator=generator)
    inputs = centres[labels] + torch.randn(SAMPLES, FEATURES, generator=generator) * 2.4
    split = SAMPLES - VALIDATION
    return inputs[:split], labels[:split], inputs[split:], labels[split:]


def report(epoch: int, **values: float) -> None:
    print(f"epoch {epoch}: " + ", ".join(f"{k} {v:.4f}" for k, v in values.items()), flush=True)
    if tau is not None:
        tau.log_metrics(epoch, **values)


def train_func(config: dict[str, Any]) -> dict[str, float]:
    """Train with ``config``'s ``lr``, ``hidden`` and ``epochs``; the final row."""
    device = deterministic()
    lr, hidden, epochs = float(config["lr"]), int(config["hidden"]), int(config.get("epochs", 15))
    train_x, train_y, val_x, val_y = (tensor.to(device) for tensor in dataset())
    torch.manual_seed(TRAIN_SEED)
    model = nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, CLASSES)).to(
        device
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    order = torch.Generator().manual_seed(TRAIN_SEED)
    row: dict[str, float] = {}
    for epoch in range(1, epochs + 1):
        model.train()
        total = 0.0
        for batch in torch.randperm(len(train_x), generator=order).split(BATCH):
            batch = batch.to(device)
            loss = loss_fn(model(train_x[batch]), train_y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(batch)
        model.eval()
        with torch.no_grad():
            logits = model(val_x)
            val_loss = loss_fn(logits, val_y).item()
            accuracy = (logits.argmax(dim=1) == val_y).float().mean().item()
        row = {
            "loss": round(total / len(train_x), 6),
            "val_loss": round(val_loss, 6),
            "val_accuracy": round(accuracy, 6),
        }
        report(epoch, **row)
    print(f"lr {lr}, hidden {hidden}: val_accuracy {row['val_accuracy']:.4f}", flush=True)
    return row


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=15)
    arguments = parser.parse_args()
    train_func({"lr": arguments.lr, "hidden": arguments.hidden, "epochs": arguments.epochs})
