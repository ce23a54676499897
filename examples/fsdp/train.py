"""Fully sharded data-parallel training (PyTorch FSDP), one process per worker: on CPUs with
the gloo backend, on GPUs with NCCL (chosen from what the machine has).

FSDP shards the model's parameters, gradients and optimizer state over the workers (each holds
a part, and gathers a layer's full weights only while it computes with them), so a model
larger than one worker's memory can train. Every worker runs this script with the rendezvous
settings TauGrid gives it (docs/distributed.md).

* the task: fit a small network to a fixed "teacher"; each worker draws its own batches from a
  generator seeded by (step, rank), so a resumed run computes exactly what an uninterrupted
  one would have;
* metrics: rank 0 appends ``{"step", "loss"}`` rows (the loss averaged over all workers) to
  ``$TAU_OUTPUT_DIR/metrics.jsonl``;
* checkpoints: sharded, with torch.distributed.checkpoint (DCP): every worker writes its own
  shard of the model and optimizer state (FSDP's SHARDED_STATE_DICT; nothing is gathered, so
  a checkpoint costs each worker its share) into ``$TAU_CHECKPOINT_DIR/.step-<n>.partial/``,
  rank 0 adds DCP's metadata, the step and a ``COMPLETE`` marker, and renames the folder to
  ``step-<n>/``; on ``$TAU_RESUME_FROM`` every worker reads its shard back into the sharded
  model and optimizer (DCP reshards, so a resume may even have another number of workers);
* ``--kill-at-step N``: on the first attempt, worker 1 kills itself (SIGKILL) at step N, as a
  node lost mid-run would; the others fail with it, and the retry resumes.

The model ends in ``$TAU_OUTPUT_DIR/model/final.pt`` (rank 0, the full state).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict
from torch.distributed.fsdp import (
    FullOptimStateDictConfig,
    FullStateDictConfig,
    ShardedOptimStateDictConfig,
    ShardedStateDictConfig,
    StateDictType,
)
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

FEATURES = 16


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--kill-at-step", type=int, default=0)
    return parser.parse_args()


def teacher() -> nn.Module:
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, 1)).requires_grad_(False)


def batch(step: int, rank: int, size: int, target: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    inputs = torch.randn(size, FEATURES, generator=generator)
    return inputs, target(inputs)


def full_state(model: FSDP, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
    """The whole model's and optimizer's state, gathered from every worker onto rank 0 (every
    worker must call this; the others get empty dicts)."""
    with FSDP.state_dict_type(
        model,
        StateDictType.FULL_STATE_DICT,
        FullStateDictConfig(rank0_only=True),
        FullOptimStateDictConfig(rank0_only=True),
    ):
        return model.state_dict(), FSDP.optim_state_dict(model, optimizer)


def sharded_state(model: FSDP) -> Any:
    """FSDP's sharded view of the state: each worker's own shards, nothing gathered."""
    return FSDP.state_dict_type(
        model,
        StateDictType.SHARDED_STATE_DICT,
        ShardedStateDictConfig(),
        ShardedOptimStateDictConfig(),
    )


def save_checkpoint(root: Path, step: int, model: FSDP, optimizer: torch.optim.Optimizer) -> None:
    """``root/step-<step>/``, sharded (every worker calls this): DCP writes each worker's
    shard into a staging folder; rank 0, once DCP is done everywhere, adds the step and
    ``COMPLETE`` and renames the folder into place."""
    rank = dist.get_rank()
    final = root / f"step-{step}"
    staging = root / f".step-{step}.partial"
    done = torch.tensor([int((final / "COMPLETE").exists())])
    dist.broadcast(done, 0)  # every worker takes the same way: DCP is collective
    if done.item():
        return
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)  # a leftover of an attempt that died
        staging.mkdir()
    dist.barrier()
    with sharded_state(model):
        state = {"model": model.state_dict(), "optim": FSDP.optim_state_dict(model, optimizer)}
        dcp.save(state, checkpoint_id=str(staging))
    if rank == 0:
        (staging / "step.json").write_text(json.dumps({"step": step}) + "\n", encoding="utf-8")
        (staging / "COMPLETE").write_text(f"{step}\n", encoding="utf-8")
        if final.exists():  # a leftover without COMPLETE: it never counted
            shutil.rmtree(final)
        staging.rename(final)
    dist.barrier()


def load_checkpoint(folder: Path, model: FSDP, optimizer: torch.optim.Optimizer) -> int:
    """Each worker's shards of ``folder`` into the sharded model and optimizer; the step."""
    with sharded_state(model):
        state = {"model": model.state_dict()}
        dcp.load(state, checkpoint_id=str(folder))
        model.load_state_dict(state["model"])
        optim = load_sharded_optimizer_state_dict(
            model_state_dict=state["model"],
            optimizer_key="optim",
            storage_reader=dcp.FileSystemReader(str(folder)),
        )
        optimizer.load_state_dict(FSDP.optim_state_dict_to_load(model, optimizer, optim["optim"]))
    return int(json.loads((folder / "step.json").read_text(encoding="utf-8"))["step"])


def main() -> int:
    args = parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    target = teacher()
    torch.manual_seed(0)  # the same initial weights on every worker
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 1))

    sharded = FSDP(model, device_id=device, use_orig_params=True)
    optimizer = torch.optim.SGD(sharded.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.MSELoss()
    start = 0
    resume_from = os.environ.get("TAU_RESUME_FROM")
    if resume_from:
        start = load_checkpoint(Path(resume_from), sharded, optimizer)
        print(f"rank {rank}: resumed from step {start}", flush=True)
    first_attempt = os.environ.get("TAU_ATTEMPT", "1") == "1"
    output = Path(os.environ.get("TAU_OUTPUT_DIR", "outputs"))
    checkpoints = Path(os.environ.get("TAU_CHECKPOINT_DIR", "checkpoints"))
    output.mkdir(parents=True, exist_ok=True)
    print(f"rank {rank} of {world}: {backend}, steps {start + 1}..{args.steps}", flush=True)

    with open(output / "metrics.jsonl", "a", encoding="utf-8") as metrics:
        for step in range(start + 1, args.steps + 1):
            if step == args.kill_at_step and rank == 1 and first_attempt:
                print(f"rank {rank}: killed at step {step} (first attempt only)", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            inputs, wanted = batch(step, rank, args.batch_size, target)
            loss = loss_fn(sharded(inputs.to(device)), wanted.to(device))
            optimizer.zero_grad()
            loss.backward()  # FSDP reduces and shards the gradients here
            optimizer.step()
            if step % 10 == 0:
                mean = loss.detach().clone()
                dist.all_reduce(mean)
                if rank == 0:
                    row = {"step": step, "loss": round(mean.item() / world, 6)}
                    metrics.write(json.dumps(row) + "\n")
                    metrics.flush()
            if step % args.checkpoint_every == 0:
                save_checkpoint(checkpoints, step, sharded, optimizer)  # every worker
    model_state, _ = full_state(sharded, optimizer)
    if rank == 0:
        (output / "model").mkdir(exist_ok=True)
        torch.save(model_state, output / "model" / "final.pt")
        print(f"done: step {args.steps}, {world} workers", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
