"""What the tests that hold an objective to TRL's own trainer share: the tiny model in fp32 and
the same LoRA on every linear layer on both sides (test_preference_trl.py, test_grpo_loss.py)."""

from pathlib import Path
from typing import Any

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def lora_config() -> Any:
    from peft import LoraConfig

    return LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS, bias="none", task_type="CAUSAL_LM")


def base_model(folder: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
