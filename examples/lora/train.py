"""Fine-tuning with LoRA (Hugging Face PEFT) of a tiny GPT-2-style transformer built from a
config in code: no weights are downloaded, so it runs anywhere, in seconds, on a CPU (on a
GPU when the machine has one: tau.gpu.yaml).

LoRA freezes the base model and trains small low-rank matrices beside its attention and MLP
projections; what the fine-tuning produces is that adapter (a few KB here), saved with
``save_pretrained`` as the run's model output in ``$TAU_OUTPUT_DIR/adapter/`` (declared in
``outputs.artifacts``, so TauGrid keeps it and seals it into the run's evidence).

* the base: ``GPT2LMHeadModel`` from a small ``GPT2Config``, its weights fixed by a seed (a
  stand-in for a pretrained checkpoint: the same base in every attempt);
* the task: next-token prediction on counting sequences (``k, k+1, k+2, …`` modulo the
  vocabulary), batches drawn from a generator seeded by the step;
* metrics: ``loss`` every 10 steps through the workload SDK (or ``metrics.jsonl``);
* checkpoints: the adapter and the optimizer state in ``$TAU_CHECKPOINT_DIR/step-<n>/``,
  written to a temporary folder and renamed, with a ``COMPLETE`` marker; a retry resumes
  from ``$TAU_RESUME_FROM``.

The GPU form with a 4-bit quantized base (QLoRA) is examples/qlora.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import GPT2Config, GPT2LMHeadModel

try:
    import tau  # the TauGrid workload SDK (standard library only)
except ImportError:  # outside a TauGrid run, without the tau package: metrics.jsonl only
    tau = None

BASE_SEED = 0
VOCABULARY = 64
LENGTH = 32


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.03)
    parser.add_argument("--rank", type=int, default=8, help="LoRA's rank r")
    parser.add_argument("--checkpoint-every", type=int, default=50)
    return parser.parse_args()


def base_model() -> GPT2LMHeadModel:
    """The frozen base: the same weights in every attempt (seeded)."""
    torch.manual_seed(BASE_SEED)
    config = GPT2Config(vocab_size=VOCABULARY, n_positions=LENGTH, n_embd=32, n_layer=2, n_head=2)
    return GPT2LMHeadModel(config)


def batch(step: int, size: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(step)
    starts = torch.randint(0, VOCABULARY, (size, 1), generator=generator)
    return (starts + torch.arange(LENGTH)) % VOCABULARY


def save_checkpoint(
    root: Path, step: int, model: PeftModel, optimizer: torch.optim.Optimizer
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step}"
    staging = Path(tempfile.mkdtemp(prefix=f".step-{step}-", dir=root))
    model.save_pretrained(staging / "adapter")
    torch.save({"optimizer": optimizer.state_dict(), "step": step}, staging / "trainer.pt")
    (staging / "COMPLETE").write_text(f"{step}\n", encoding="utf-8")
    if final.exists():
        shutil.rmtree(final)
    staging.rename(final)
    return final


def main() -> int:
    args = parse_args()
    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resume_from = os.environ.get("TAU_RESUME_FROM")
    if resume_from:
        model = PeftModel.from_pretrained(
            base_model(), Path(resume_from) / "adapter", is_trainable=True
        )
    else:
        lora = LoraConfig(
            r=args.rank,
            lora_alpha=2 * args.rank,
            target_modules=["c_attn", "c_proj", "c_fc"],
            lora_dropout=0.0,
            fan_in_fan_out=True,  # GPT-2's Conv1D layers store their weights transposed
        )
        model = get_peft_model(base_model(), lora)
    model.to(device)
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=args.lr)
    start = 0
    if resume_from:
        state = torch.load(Path(resume_from) / "trainer.pt", map_location="cpu", weights_only=True)
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
        print(f"resumed from step {start}", flush=True)
    total = sum(parameter.numel() for parameter in model.parameters())
    print(
        f"LoRA r={args.rank}: {sum(p.numel() for p in trainable):,} of {total:,} parameters "
        f"train, on {device}",
        flush=True,
    )

    output = Path(os.environ.get("TAU_OUTPUT_DIR", "outputs"))
    checkpoints = Path(os.environ.get("TAU_CHECKPOINT_DIR", "checkpoints"))
    output.mkdir(parents=True, exist_ok=True)
    model.train()
    with open(output / "metrics.jsonl", "a", encoding="utf-8") as metrics:
        for step in range(start + 1, args.steps + 1):
            ids = batch(step, args.batch_size).to(device)
            loss = model(input_ids=ids, labels=ids).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 10 == 0:
                print(f"step {step}: loss {loss.item():.4f}", flush=True)
                if tau is not None:
                    tau.log_metrics(step, loss=loss.item())
                else:
                    metrics.write(json.dumps({"step": step, "loss": loss.item()}) + "\n")
            if step % args.checkpoint_every == 0:
                path = save_checkpoint(checkpoints, step, model, optimizer)
                if tau is not None:
                    tau.checkpoint_saved(path, step)
    model.save_pretrained(output / "adapter")
    print(f"done: step {args.steps}, the adapter in {output / 'adapter'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
