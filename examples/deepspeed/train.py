"""Data-parallel training with DeepSpeed ZeRO stage 2, one process per worker: on CPUs with
the gloo backend, on GPUs with NCCL (chosen from what the machine has).

Every worker runs this same script with the rendezvous settings TauGrid gives each worker
(``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``: docs/distributed.md), on the
local executor (one sandboxed process per worker, over loopback) and on Kubernetes (one pod
per worker) alike. No ``deepspeed`` launcher (it starts the workers itself, over ssh or pdsh):
TauGrid has started them.

* the task: examples/ddp's, fit a small network to a fixed "teacher" network; every worker
  draws its own batches from a generator seeded by (step, rank), so a run is deterministic
  and a resumed run computes exactly what an uninterrupted one would have;
* ZeRO stage 2: the engine averages the gradients over the workers, each worker keeping
  only its shard of them and of the optimizer state (here SGD's momentum); each updates its
  shard of the parameters, and the shards are gathered again. The configuration is a dict in
  code (``deepspeed_config``);
* metrics: rank 0 appends ``{"step", "loss"}`` rows (the loss averaged over all workers) to
  ``$TAU_OUTPUT_DIR/metrics.jsonl``;
* checkpoints: DeepSpeed's own (``engine.save_checkpoint``: every worker writes its shard of
  the optimizer state, rank 0 the model), into ``$TAU_CHECKPOINT_DIR/.step-<n>/`` renamed by
  rank 0 to ``step-<n>/`` with a ``COMPLETE`` marker once every worker has written, and
  reported with the workload SDK (``tau.checkpoint_saved``); every worker resumes from
  ``$TAU_RESUME_FROM`` (``engine.load_checkpoint``) when the platform hands one over;
* ``--kill-at-step N``: on the first attempt, worker 1 kills itself (SIGKILL) at step N, as
  a node lost mid-run would; the others see their peer gone and fail, and the retry resumes.

The model ends in ``$TAU_OUTPUT_DIR/model/final.pt`` (rank 0).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
from pathlib import Path

import deepspeed
import deepspeed.ops
import torch
import torch.distributed as dist
from torch import nn

try:
    import tau  # the TauGrid workload SDK (standard library only)
except ImportError:  # outside a TauGrid run, without the tau package: the COMPLETE marker only
    tau = None

FEATURES = 16


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--kill-at-step", type=int, default=0)
    return parser.parse_args()


def deepspeed_config(batch_size: int) -> dict[str, object]:
    return {
        "train_micro_batch_size_per_gpu": batch_size,  # per worker, GPU or not
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 2},
        # ZeRO is tested with DeepSpeed's own optimizers, whose fast forms are compiled
        # kernels (CUDA, or C++ for CPUAdam); a plain torch optimizer needs no compiler.
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,  # the metrics below say how training goes
    }


def teacher() -> nn.Module:
    """The function to learn: the same on every worker and every attempt."""
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, 1)).requires_grad_(False)


def batch(step: int, rank: int, size: int, target: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    inputs = torch.randn(size, FEATURES, generator=generator)
    return inputs, target(inputs)


def save_checkpoint(engine: deepspeed.DeepSpeedEngine, root: Path, step: int) -> Path:
    """``root/step-<step>/``, a DeepSpeed checkpoint folder (its ``latest`` file names the tag
    inside), written by every worker under a hidden name and renamed by rank 0 once all have
    written: TauGrid never sees half of one. Every worker calls this."""
    staging, final = root / f".step-{step}", root / f"step-{step}"
    if engine.global_rank == 0:
        shutil.rmtree(staging, ignore_errors=True)  # a leftover of a lost attempt
    dist.barrier()
    # Returns once every worker has written its part (DeepSpeed ends it with a barrier).
    engine.save_checkpoint(str(staging), client_state={"step": step})
    if engine.global_rank == 0:
        (staging / "COMPLETE").write_text(f"{step}\n", encoding="utf-8")
        if final.exists():  # a leftover without COMPLETE: it never counted
            shutil.rmtree(final)
        staging.rename(final)
    return final


def main() -> int:
    args = parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":  # one GPU per process: the one torchrun or the table numbers it by
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    else:
        # On CPUs DeepSpeed compiles a shared-memory all-reduce for inference (C++, ninja, a
        # minute or more) as its communication starts; training never calls it, and the
        # engine's collectives go through gloo.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend=backend, init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    target = teacher()
    torch.manual_seed(0)  # the same initial weights on every worker
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=deepspeed_config(args.batch_size)
    )
    loss_fn = nn.MSELoss()

    start = 0
    resume_from = os.environ.get("TAU_RESUME_FROM")
    if resume_from:  # every worker loads the model and its own shard of the optimizer state
        _, client_state = engine.load_checkpoint(resume_from)
        start = int(client_state["step"])
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
            loss = loss_fn(engine(inputs.to(engine.device)), wanted.to(engine.device))
            engine.backward(loss)  # the gradients averaged over every worker, each its shard
            engine.step()
            if step % 10 == 0:
                mean = loss.detach().clone()
                dist.all_reduce(mean)
                if rank == 0:
                    row = {"step": step, "loss": round(mean.item() / world, 6)}
                    metrics.write(json.dumps(row) + "\n")
                    metrics.flush()
            if step % args.checkpoint_every == 0:
                path = save_checkpoint(engine, checkpoints, step)  # every worker
                if tau is not None:
                    tau.checkpoint_saved(path, step)  # reported by rank 0 only
    if rank == 0:
        (output / "model").mkdir(exist_ok=True)
        torch.save(engine.module.state_dict(), output / "model" / "final.pt")
        print(f"done: step {args.steps}, {world} workers", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
