"""The reference for GRPO: TRL's `GRPOTrainer` with the seed recipe's settings, timed.

The slice loaded as the DPO reference loads it (`bench.trl_dpo.load_seed_recipe`: NF4 with
double quantisation and float32 compute, norms and lm_head float32, LoRA r=8/alpha=16 on
q/k/v/o without dropout, gradient checkpointing), the LoRA matrices TRL casts to bf16 put back
to float32; PagedAdamW8bit at a constant 1e-4, TF32 off, bf16 and fp16 off. GRPO's settings
are the ones our job trains with (`bench.grpo.trl_settings`, passed in as `trl`): G completions
of one prompt per optimizer step (TRL's batch counts completions: G per device, one generation
batch of G per step, so each step generates once), rollouts by transformers' `generate`
(`use_vllm=False`), our `format` reward as a Python function (`bench.grpo.format_reward`). The
data is the prompt file `bench.trainer_job` writes for ours (`"method": "grpo"`), read with the
same tokenizer.

Each optimizer step (its generation, reward, loss, backward and optimizer step) is timed between
TrainerCallback's step begin and end with the GPU synchronised; the first `warm` steps are left
out. One JSON line:

    python -m bench.trl_grpo '{"work": DIR, "steps": 4, "warm": 2, "trl": {...}, "reward": {...}}'

`"cpu": true` (or no GPU) is a dry run of this script: the slice in plain float32, AdamW.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.grpo import format_reward
from bench.trl_dpo import back_to_fp32, load_seed_recipe, timer

# What TRL logs each step and the record keeps, by TRL's name.
LOGGED = {"reward": "rewards", "completions/mean_length": "completion_lengths"}


def grpo_config(work: Path, settings: dict[str, Any], steps: int, device: str) -> Any:
    """TRL's settings: the GRPO block's values and batching (`settings`) on the seed recipe's
    optimizer and precision."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(work / "trl-output"),
        max_steps=steps,
        learning_rate=1e-4,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="paged_adamw_8bit" if device == "cuda" else "adamw_torch",
        gradient_checkpointing=True,
        bf16=False,
        fp16=False,
        tf32=False if device == "cuda" else None,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=device == "cpu",
        dataloader_num_workers=0,
        seed=0,
        **settings,
    )


def logged(figures: dict[str, list[float]]) -> Any:
    """A TrainerCallback keeping each step's logged figures named in LOGGED."""
    from transformers import TrainerCallback

    class Logged(TrainerCallback):  # type: ignore[misc]
        def on_log(
            self, _args: Any, _state: Any, _control: Any, logs: dict[str, float] | None = None, **__: Any
        ) -> None:
            for name, key in LOGGED.items():
                if logs and name in logs:
                    figures.setdefault(key, []).append(float(logs[name]))

    return Logged()


def count_decoding(model: Any, counts: dict[str, int]) -> None:
    """Count the forwards without gradients of one token a row: the decoding steps of a `generate`
    that keeps its KV cache (without it each new token is a forward over the whole rows)."""

    def seen(_module: Any, args: tuple[Any, ...]) -> None:
        if args and not torch.is_grad_enabled() and args[0].dim() == 2:
            key = "one_token" if args[0].shape[1] == 1 else "longer"
            counts[key] = counts.get(key, 0) + 1

    model.get_input_embeddings().register_forward_pre_hook(seen)


def run(spec: dict[str, Any]) -> dict[str, Any]:
    from datasets import load_dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

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
    figures: dict[str, list[float]] = {}
    settings = dict(spec["trl"])
    reward = format_reward(spec["reward"]["name"], spec["reward"]["format"]["pattern"])
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=grpo_config(work, settings, warm + steps, device),
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[timer(device, times, losses), logged(figures)],
    )
    cast = back_to_fp32(trainer.model)
    half = sorted({str(p.dtype) for p in trainer.model.parameters() if p.dtype in (torch.float16, torch.bfloat16)})
    decoding: dict[str, int] = {}
    count_decoding(trainer.model, decoding)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    timed = times[warm:]
    prompts = settings["per_device_train_batch_size"] // settings["num_generations"]
    result: dict[str, Any] = {
        "event": "trl-grpo",
        "device": device,
        "steps": len(timed),
        "warm": warm,
        "prompts_per_step": prompts,
        "step_s": round(sum(timed) / len(timed), 3) if timed else None,
        "prompts_s": round(prompts * len(timed) / sum(timed), 4) if timed else None,
        "step_seconds": [round(t, 3) for t in times],
        "load_s": round(load_s, 1),
        "half_params": half,
        "half_params_cast_by_trl": {"count": len(cast), "first": cast[:4]},
        "decoding_forwards": decoding,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        **figures,
    }
    if device == "cuda":
        result["peak_gib"] = [
            round(torch.cuda.max_memory_allocated(i) / 2**30, 2) for i in range(torch.cuda.device_count())
        ]
    return result


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))), flush=True)
