"""Data-parallel training with Ray Train: a ``TorchTrainer`` with two workers, each a Ray actor
on a worker node of the run's Ray cluster (a worker pod on Kubernetes; a worker node on
loopback on the local executor), checkpointing through Ray Train's own API.

This script is the RayJob's driver: it builds the trainer and waits for it; Ray Train starts
``train_loop`` on every worker, sets up ``torch.distributed`` between them (gloo on CPUs,
NCCL on GPUs) and wraps the model in DistributedDataParallel (``prepare_model``).

* the task: the same as examples/ddp (fit a small network to a fixed "teacher" network; each
  worker's batches seeded by (step, rank)), so a resumed run computes what an uninterrupted
  one would have;
* metrics: rank 0 sends ``loss`` (averaged over the workers) every 10 steps with
  ``tau.log_metrics``, and reports it to Ray Train with each checkpoint;
* checkpoints: every ``--checkpoint-every`` steps each worker calls ``ray.train.report`` with
  rank 0's state as a ``Checkpoint``; Ray Train persists it as ``step-<n>`` under its run
  folder in ``$TAU_CHECKPOINT_DIR`` (``RunConfig.storage_path``), and rank 0 then tells TauGrid
  (``tau.checkpoint_saved``), so the portal lists it and a retry is handed the newest;
* resume: ``ray.train.get_checkpoint()`` (Ray Train finds its own newest checkpoint when the
  driver runs again with the same run folder), else the checkpoint TauGrid hands over
  (``$TAU_RESUME_FROM``);
* ``--kill-at-step N``: on the first attempt, worker 1 kills itself (SIGKILL) at step N; Ray
  Train sees a worker lost, the trainer fails, and the retry resumes.

The model ends in ``$TAU_OUTPUT_DIR/model/final.pt``, written by the driver from the last
checkpoint.
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
from pathlib import Path
from typing import Any

import ray
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from torch import nn

import tau

FEATURES = 16
#: Ray Train's folder for this run, under the checkpoint directory.
RUN_FOLDER = "ray-train"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--kill-at-step", type=int, default=0)
    return parser.parse_args()


def teacher() -> nn.Module:
    """The function to learn: the same on every worker and every attempt."""
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, 1)).requires_grad_(False)


def batch(step: int, rank: int, size: int, target: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    inputs = torch.randn(size, FEATURES, generator=generator)
    return inputs, target(inputs)


def load_state(checkpoint: Checkpoint) -> dict[str, Any]:
    with checkpoint.as_directory() as folder:
        state: dict[str, Any] = torch.load(Path(folder) / "state.pt", weights_only=True)
    return state


def train_loop(config: dict[str, Any]) -> None:
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    device = ray.train.torch.get_device()
    target = teacher().to(device)
    torch.manual_seed(0)  # the same initial weights on every worker
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 1))
    ddp = ray.train.torch.prepare_model(model)  # DistributedDataParallel, on the device
    optimizer = torch.optim.SGD(ddp.parameters(), lr=config["lr"], momentum=0.9)
    loss_fn = nn.MSELoss()

    start = 0
    checkpoint = ray.train.get_checkpoint()
    source = "Ray Train's newest checkpoint"
    if checkpoint is None and config["resume_from"]:
        checkpoint, source = Checkpoint(config["resume_from"]), "TAU_RESUME_FROM"
    if checkpoint is not None:
        state = load_state(checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
        print(f"rank {rank}: resumed from step {start} ({source})", flush=True)
    node = ray.get_runtime_context().get_node_id()[:8]
    print(
        f"rank {rank} of {world} on node {node}: {dist.get_backend()}, "
        f"steps {start + 1}..{config['steps']}",
        flush=True,
    )

    mean_loss = None
    for step in range(start + 1, config["steps"] + 1):
        if step == config["kill_at_step"] and rank == 1 and config["first_attempt"]:
            print(f"rank {rank}: killed at step {step} (first attempt only)", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        inputs, wanted = batch(step, rank, config["batch_size"], target)
        loss = loss_fn(ddp(inputs.to(device)), wanted)
        optimizer.zero_grad()
        loss.backward()  # DDP averages the gradients over every worker here
        optimizer.step()
        if step % 10 == 0:
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            mean_loss = round(mean.item() / world, 6)
            tau.log_metrics(step, loss=mean_loss)  # rank 0's call is the one that counts
        if step % config["checkpoint_every"] == 0:
            with tempfile.TemporaryDirectory() as folder:
                saved = None
                if rank == 0:
                    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
                    torch.save({**state, "step": step}, Path(folder) / "state.pt")
                    saved = Checkpoint.from_directory(folder)
                # Every worker reports (a barrier); rank 0's checkpoint is persisted.
                ray.train.report(
                    {"step": step, "loss": mean_loss},
                    checkpoint=saved,
                    checkpoint_dir_name=f"step-{step}",
                )
            if rank == 0:
                persisted = Path(config["storage"]) / RUN_FOLDER / f"step-{step}"
                tau.checkpoint_saved(persisted, step)
                tau.flush()  # the metrics up to the checkpoint reach the portal now
    tau.flush()


def main() -> int:
    args = parse_args()
    storage = Path(os.environ.get("TAU_CHECKPOINT_DIR", "checkpoints")).resolve()
    output = Path(os.environ.get("TAU_OUTPUT_DIR", "outputs"))
    config = {
        **vars(args),
        "storage": str(storage),
        "resume_from": os.environ.get("TAU_RESUME_FROM"),
        "first_attempt": os.environ.get("TAU_ATTEMPT", "1") == "1",
    }
    trainer = TorchTrainer(
        train_loop,
        train_loop_config=config,
        # One CPU per worker (Ray Train's default), on the nodes that have them: the workers.
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=torch.cuda.is_available()),
        run_config=RunConfig(name=RUN_FOLDER, storage_path=str(storage)),
    )
    result = trainer.fit()
    if result.checkpoint is None:
        print("no checkpoint was reported", flush=True)
        return 1
    state = load_state(result.checkpoint)
    (output / "model").mkdir(parents=True, exist_ok=True)
    torch.save(state["model"], output / "model" / "final.pt")
    print(f"done: step {state['step']}, {args.workers} workers, loss {result.metrics['loss']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
