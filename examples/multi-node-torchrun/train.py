"""Data-parallel training over several nodes with torchrun and DistributedDataParallel.

torchrun starts one process per GPU on every worker; each process joins the NCCL process
group from the environment torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, …).
Rank 0 writes the metrics rows and the checkpoints; every rank resumes from
``$TAU_RESUME_FROM`` when the platform hands over a checkpoint.

It needs GPUs and torch, so it does not run on a laptop; the cpu-quickstart example does.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps-per-epoch", type=int, default=500)
    args = parser.parse_args()

    dist.init_process_group("nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    torch.manual_seed(1234 + rank)

    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 10)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=3e-4)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator(device="cpu").manual_seed(0)
    teacher = nn.Linear(1024, 10).requires_grad_(False)
    teacher.weight.copy_(torch.randn(10, 1024, generator=generator))
    teacher = teacher.to(device)

    output_dir = Path(os.environ.get("TAU_OUTPUT_DIR", "outputs"))
    checkpoint_dir = Path(os.environ.get("TAU_CHECKPOINT_DIR", "checkpoints"))
    start_epoch = 0
    resume_from = os.environ.get("TAU_RESUME_FROM")
    if resume_from:
        state = torch.load(Path(resume_from) / "state.pt", map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"]
        if rank == 0:
            print(f"resumed from step {state['step']}", flush=True)

    metrics = None
    if rank == 0:
        output_dir.mkdir(parents=True, exist_ok=True)
        metrics = open(output_dir / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
    for epoch in range(start_epoch, args.epochs):
        for batch in range(args.steps_per_epoch):
            x = torch.randn(args.batch_size, 1024, device=device)
            loss = loss_fn(ddp(x), teacher(x).argmax(dim=1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step = epoch * args.steps_per_epoch + batch + 1
            if metrics is not None and step % 50 == 0:
                metrics.write(json.dumps({"step": step, "loss": loss.item()}) + "\n")
                metrics.flush()
        step = (epoch + 1) * args.steps_per_epoch
        if rank == 0:
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
        dist.barrier()
    if metrics is not None:
        metrics.close()
        model_dir = output_dir / "model"
        model_dir.mkdir(exist_ok=True)
        torch.save(model.state_dict(), model_dir / "weights.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
