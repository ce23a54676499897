"""The article's quickstart: a small PyTorch training on one GPU, launched through Ray.

With ``workload_kind: rayjob`` this script is the Ray *driver*: it starts on the Ray head
(CPU-only) and sends the training to the GPU worker as a Ray task asking for one GPU, which
is exactly what ``compute`` requested (one worker, one GPU). It writes metrics rows to
``$TAU_OUTPUT_DIR/metrics.jsonl`` and a checkpoint per epoch under ``$TAU_CHECKPOINT_DIR``,
and resumes from ``$TAU_RESUME_FROM`` when the platform hands it a checkpoint.

It needs a GPU node, torch and ray, so it does not run on a laptop; the cpu-quickstart
example does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import ray
import torch
from torch import nn


@ray.remote(num_gpus=1)
def train(epochs: int = 5, steps_per_epoch: int = 200, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    # A fixed random "teacher" makes a learnable synthetic task.
    teacher = nn.Linear(512, 10).to(device).requires_grad_(False)

    output_dir = Path(os.environ.get("TAU_OUTPUT_DIR", "outputs"))
    checkpoint_dir = Path(os.environ.get("TAU_CHECKPOINT_DIR", "checkpoints"))
    output_dir.mkdir(parents=True, exist_ok=True)
    start_epoch = 0
    resume_from = os.environ.get("TAU_RESUME_FROM")
    if resume_from:
        state = torch.load(Path(resume_from) / "state.pt", map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"]
        print(f"resumed from step {state['step']}", flush=True)

    loss = torch.tensor(0.0)
    with open(output_dir / "metrics.jsonl", "a", encoding="utf-8") as metrics:
        for epoch in range(start_epoch, epochs):
            for batch in range(steps_per_epoch):
                x = torch.randn(256, 512, device=device)
                loss = loss_fn(model(x), teacher(x).argmax(dim=1))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                step = epoch * steps_per_epoch + batch + 1
                if step % 20 == 0:
                    metrics.write(json.dumps({"step": step, "loss": loss.item()}) + "\n")
                    metrics.flush()
            step = (epoch + 1) * steps_per_epoch
            staging = checkpoint_dir / f".step-{step}.tmp"
            staging.mkdir(parents=True, exist_ok=True)
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "epoch": epoch + 1,
                "step": step,
            }
            torch.save(state, staging / "state.pt")
            (staging / "COMPLETE").write_text(f"{step}\n", encoding="utf-8")
            staging.rename(checkpoint_dir / f"step-{step}")
    return {"loss": loss.item()}


if __name__ == "__main__":
    ray.init()
    result = ray.get(train.remote())
    print(f"done: final loss {result['loss']:.4f}")
