"""Data-parallel training with torch.distributed (DistributedDataParallel), one process per
worker: on CPUs with the gloo backend, on GPUs with NCCL (chosen from what the machine has).

Every worker runs this same script with the rendezvous settings TauGrid gives each worker
(``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``: docs/distributed.md), on the
local executor (one sandboxed process per worker, over loopback) and on Kubernetes (one pod
per worker) alike.

* the task: fit a small network to a fixed "teacher" network; every worker draws its own
  batches from a generator seeded by (step, rank), so a run is deterministic and a resumed
  run computes exactly what an uninterrupted one would have;
* metrics: rank 0 appends ``{"step", "loss"}`` rows (the loss averaged over all workers) to
  ``$TAU_OUTPUT_DIR/metrics.jsonl``;
* checkpoints: rank 0 writes ``$TAU_CHECKPOINT_DIR/step-<n>/`` (model and optimizer state)
  into a temporary folder renamed into place, with a ``COMPLETE`` marker; every worker
  resumes from ``$TAU_RESUME_FROM`` when the platform hands one over;
* ``--kill-at-step N``: on the first attempt, worker 1 kills itself (SIGKILL) at step N, as
  a node lost mid-run would; the others see their peer gone and fail, and the retry resumes;
* started by ``torchrun --max-restarts K``, a failed worker makes torchrun start every worker
  again within the attempt (``TORCHELASTIC_RESTART_COUNT``): they resume from the newest
  complete checkpoint in ``$TAU_CHECKPOINT_DIR``.

The model ends in ``$TAU_OUTPUT_DIR/model/final.pt`` (rank 0).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

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
    """The function to learn: the same on every worker and every attempt."""
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, 1)).requires_grad_(False)


def batch(step: int, rank: int, size: int, target: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    inputs = torch.randn(size, FEATURES, generator=generator)
    return inputs, target(inputs)


def save_checkpoint(root: Path, step: int, state: dict[str, object]) -> None:
    """``root/step-<step>/`` atomically: written to a temporary folder, then renamed."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step}"
    if (final / "COMPLETE").exists():
        return
    staging = Path(tempfile.mkdtemp(prefix=f".step-{step}-", dir=root))
    torch.save(state, staging / "state.pt")
    (staging / "COMPLETE").write_text(f"{step}\n", encoding="utf-8")
    if final.exists():  # a leftover without COMPLETE: it never counted
        shutil.rmtree(final)
    staging.rename(final)


def newest_checkpoint(root: Path) -> Path | None:
    """The complete ``step-<n>/`` of ``root`` with the highest step, or None."""
    steps = [
        (int(folder.name.removeprefix("step-")), folder)
        for folder in root.glob("step-*")
        if folder.name.removeprefix("step-").isdigit() and (folder / "COMPLETE").exists()
    ]
    return max(steps)[1] if steps else None


def main() -> int:
    args = parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = None
    if backend == "nccl":  # one GPU per process: the one torchrun or the table numbers it by
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    target = teacher()
    torch.manual_seed(0)  # the same initial weights on every worker
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 1)).to(device)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.MSELoss()

    start = 0
    checkpoints = Path(os.environ.get("TAU_CHECKPOINT_DIR", "checkpoints"))
    resume_from = os.environ.get("TAU_RESUME_FROM")
    # torchrun --max-restarts N started this process again within the attempt, after a worker
    # failed: TAU_RESUME_FROM is still the attempt's, so the newest checkpoint is looked up.
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if restarts:
        resume_from = str(newest_checkpoint(checkpoints) or resume_from or "") or None
    if resume_from:
        state = torch.load(Path(resume_from) / "state.pt", map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
        after = f" (torchrun restart {restarts})" if restarts else ""
        print(f"rank {rank}: resumed from step {start}{after}", flush=True)
    first_attempt = os.environ.get("TAU_ATTEMPT", "1") == "1" and not restarts
    output = Path(os.environ.get("TAU_OUTPUT_DIR", "outputs"))
    output.mkdir(parents=True, exist_ok=True)
    print(f"rank {rank} of {world}: {backend}, steps {start + 1}..{args.steps}", flush=True)

    with open(output / "metrics.jsonl", "a", encoding="utf-8") as metrics:
        for step in range(start + 1, args.steps + 1):
            if step == args.kill_at_step and rank == 1 and first_attempt:
                print(f"rank {rank}: killed at step {step} (first attempt only)", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            inputs, wanted = batch(step, rank, args.batch_size, target)
            loss = loss_fn(ddp(inputs.to(device)), wanted.to(device))
            optimizer.zero_grad()
            loss.backward()  # DDP averages the gradients over every worker here
            optimizer.step()
            if step % 10 == 0:
                mean = loss.detach().clone()
                dist.all_reduce(mean)
                if rank == 0:
                    row = {"step": step, "loss": round(mean.item() / world, 6)}
                    metrics.write(json.dumps(row) + "\n")
                    metrics.flush()
            if step % args.checkpoint_every == 0 and rank == 0:
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
                save_checkpoint(checkpoints, step, {**state, "step": step})
    if rank == 0:
        (output / "model").mkdir(exist_ok=True)
        torch.save(model.state_dict(), output / "model" / "final.pt")
        print(f"done: step {args.steps}, {world} workers", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
