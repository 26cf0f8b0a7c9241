"""The reference for preference tuning: TRL's `DPOTrainer` with the seed recipe's settings, timed.

The seed recipe (shared seed_baseline.py) as TRL would be given it: the slice loaded in NF4 with
double quantisation and float32 compute, norms and lm_head cast to float32,
`prepare_model_for_kbit_training` with gradient checkpointing, LoRA r=8/alpha=16 on q/k/v/o
without dropout, PagedAdamW8bit at 1e-4, TF32 off; DPO's reference is the same model with the
adapter off (TRL's default for a PEFT model without `ref_model`), sigmoid loss, beta 0.1, one
pair per step. The data is the file `bench.trainer_job` writes for ours (`"method": "dpo"`):
the same word-level tokenizer and pairs whose every sequence is `seq` tokens.

Each optimizer step is timed between TrainerCallback's step begin and end with the GPUs
synchronised; the first `warm` steps are left out. One JSON line:

    python -m bench.trl_dpo '{"path": SLICE, "work": DIR, "seq": 2048, "steps": 6, "warm": 2}'
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch


def load_seed_recipe(model_path: Path, device: str) -> Any:
    """The slice as the seed recipe loads it, with its LoRA adapter (no dropout)."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    if device == "cpu":  # a dry run of this script: no NF4 kernels without a GPU
        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    else:
        quant = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=torch.float32,
            bnb_4bit_use_double_quant=True,
        )
        model = AutoModelForCausalLM.from_pretrained(
            str(model_path),
            quantization_config=quant,
            device_map="auto",
            dtype=torch.float32,
            low_cpu_mem_usage=True,
            attn_implementation="sdpa",
        )
    for name, module in model.named_modules():
        if "norm" in name.lower() or "lm_head" in name.lower():
            module.to(torch.float32)
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    lora = LoraConfig(
        r=8,
        lora_alpha=16,
        lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora)


def dpo_config(work: Path, seq: int, steps: int, device: str) -> Any:
    """TRL's settings for the seed recipe: fp32 (bf16 and TF32 off), paged 8-bit AdamW at a
    constant 1e-4, gradient checkpointing, one pair per step, sigmoid loss with beta 0.1."""
    from trl import DPOConfig

    return DPOConfig(
        output_dir=str(work / "trl-output"),
        per_device_train_batch_size=1,
        gradient_accumulation_steps=1,
        max_steps=steps,
        learning_rate=1e-4,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="paged_adamw_8bit" if device == "cuda" else "adamw_torch",
        gradient_checkpointing=True,
        bf16=False,
        fp16=False,
        tf32=False if device == "cuda" else None,
        beta=0.1,
        loss_type=["sigmoid"],
        max_length=seq,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=device == "cpu",
        dataloader_num_workers=0,
        seed=0,
    )


def timer(device: str, times: list[float], losses: list[float]) -> Any:
    """A TrainerCallback timing each optimizer step (the GPU synchronised at both ends) and
    keeping each logged loss."""
    from transformers import TrainerCallback

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    class Timer(TrainerCallback):  # type: ignore[misc]
        began = 0.0

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            sync()
            self.began = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            sync()
            times.append(time.perf_counter() - self.began)

        def on_log(
            self, _args: Any, _state: Any, _control: Any, logs: dict[str, float] | None = None, **__: Any
        ) -> None:
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    return Timer()


def back_to_fp32(model: Any) -> list[str]:
    """TRL casts some of the model to bf16 behind bf16=False (a Pascal card would stop on it): they
    go back to float32, so both sides run the seed recipe's pure fp32 compute; returns their names."""
    cast = [n for n, p in model.named_parameters() if p.dtype in (torch.float16, torch.bfloat16)]
    for name, param in model.named_parameters():
        if name in set(cast):
            param.data = param.data.float()
    return cast


def run(spec: dict[str, Any]) -> dict[str, Any]:
    from datasets import load_dataset
    from transformers import AutoTokenizer
    from trl import DPOTrainer

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    work = Path(spec["work"])
    device = "cuda" if torch.cuda.is_available() and not spec.get("cpu") else "cpu"
    warm, steps = int(spec.get("warm", 2)), int(spec["steps"])
    start = time.time()
    model = load_seed_recipe(work / "model", device)
    load_s = time.time() - start
    tokenizer = AutoTokenizer.from_pretrained(str(work / "model"))
    data = load_dataset("json", data_files=str(work / "data" / "train.jsonl"), split="train")
    times: list[float] = []
    losses: list[float] = []
    args = dpo_config(work, spec["seq"], warm + steps, device)
    callback = timer(device, times, losses)
    trainer = DPOTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer, callbacks=[callback])
    cast = back_to_fp32(trainer.model)
    half = sorted({str(p.dtype) for p in trainer.model.parameters() if p.dtype in (torch.float16, torch.bfloat16)})
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    timed = times[warm:]
    result: dict[str, Any] = {
        "event": "trl-dpo",
        "seq": spec["seq"],
        "steps": len(timed),
        "warm": warm,
        "pairs_per_step": 1,
        "step_s": round(sum(timed) / len(timed), 3) if timed else None,
        "pairs_s": round(len(timed) / sum(timed), 4) if timed else None,
        # Two sequences of `seq` tokens each per pair, as ours counts its tokens.
        "tok_s": round(2 * spec["seq"] * len(timed) / sum(timed), 1) if timed else None,
        "load_s": round(load_s, 1),
        "half_params": half,
        "half_params_cast_by_trl": {"count": len(cast), "first": cast[:4]},
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
    }
    if device == "cuda":
        result["peak_gib"] = [
            round(torch.cuda.max_memory_allocated(i) / 2**30, 2) for i in range(torch.cuda.device_count())
        ]
    return result


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))), flush=True)
