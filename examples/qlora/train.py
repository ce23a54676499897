"""QLoRA: LoRA fine-tuning (Hugging Face PEFT) of a causal language model whose frozen base
is loaded in 4 bits (bitsandbytes NF4, double quantization, bfloat16 compute), on one GPU.

It needs a CUDA GPU, torch, transformers, peft, accelerate and bitsandbytes in its image, and
the base model from the Hugging Face Hub; it does not run on a laptop (the CPU form is
examples/lora). The adapter is saved in ``$TAU_OUTPUT_DIR/adapter/``; checkpoints in
``$TAU_CHECKPOINT_DIR/step-<n>/`` (adapter and optimizer, renamed into place with a
``COMPLETE`` marker), resumed from ``$TAU_RESUME_FROM``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model, prepare_model_for_kbit_training
from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

try:
    import tau
except ImportError:
    tau = None

TEXT = "TauGrid runs training on shared GPU clusters, and keeps a sealed record of each run. "


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="Qwen/Qwen2.5-0.5B")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("QLoRA needs a CUDA GPU (bitsandbytes); the CPU form is examples/lora")
    quantization = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    base = AutoModelForCausalLM.from_pretrained(
        args.model, quantization_config=quantization, device_map={"": 0}
    )
    base = prepare_model_for_kbit_training(base)
    resume_from = os.environ.get("TAU_RESUME_FROM")
    if resume_from:
        model = PeftModel.from_pretrained(base, Path(resume_from) / "adapter", is_trainable=True)
    else:
        lora = LoraConfig(
            r=args.rank,
            lora_alpha=2 * args.rank,
            lora_dropout=0.05,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(base, lora)
    optimizer = torch.optim.AdamW(
        [parameter for parameter in model.parameters() if parameter.requires_grad], lr=args.lr
    )
    start = 0
    if resume_from:
        state = torch.load(Path(resume_from) / "trainer.pt", weights_only=True)
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
    ids = tokenizer(TEXT * 8, return_tensors="pt").input_ids[:, :256].to(0)
    output = Path(os.environ.get("TAU_OUTPUT_DIR", "outputs"))
    checkpoints = Path(os.environ.get("TAU_CHECKPOINT_DIR", "checkpoints"))
    model.train()
    for step in range(start + 1, args.steps + 1):
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 10 == 0 and tau is not None:
            tau.log_metrics(step, loss=loss.item())
        if step % args.checkpoint_every == 0:
            checkpoints.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".step-{step}-", dir=checkpoints))
            model.save_pretrained(staging / "adapter")
            torch.save({"optimizer": optimizer.state_dict(), "step": step}, staging / "trainer.pt")
            (staging / "COMPLETE").write_text(f"{step}\n", encoding="utf-8")
            final = checkpoints / f"step-{step}"
            if final.exists():
                shutil.rmtree(final)
            staging.rename(final)
            if tau is not None:
                tau.checkpoint_saved(final, step)
    model.save_pretrained(output / "adapter")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
