"""Load the NF4 model whole onto one device and add fp32 LoRA: the per-rank model.

Same recipe as the single-process trainer (NF4 + double quant, fp32 compute, norms and lm_head
in fp32, PEFT LoRA), but `device_map` names one device instead of spreading the layers, because
here every GPU holds a complete copy and works on its own micro-batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class QloraRecipe:
    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    target_modules: Sequence[str] = field(default=("q_proj", "k_proj", "v_proj", "o_proj"))
    gradient_checkpointing: bool = True
    attn_implementation: str = "sdpa"
    double_quant: bool = True


def load(model_path: str, device: torch.device, recipe: QloraRecipe, seed: int) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    quant = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=torch.float32,
        bnb_4bit_use_double_quant=recipe.double_quant,
    )
    target = device.index if device.type == "cuda" else "cpu"
    model = AutoModelForCausalLM.from_pretrained(
        model_path,
        quantization_config=quant,
        device_map={"": target},
        # transformers 5 defaults to the checkpoint's dtype (bf16 for Llama-3): never on Pascal.
        dtype=torch.float32,
        low_cpu_mem_usage=True,
        attn_implementation=recipe.attn_implementation,
    )
    for name, module in model.named_modules():
        if "norm" in name.lower() or "lm_head" in name.lower():
            module.to(torch.float32)
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=recipe.gradient_checkpointing)
    # LoRA init draws from the CPU generator: seed it so every rank (and a rerun) starts alike.
    torch.manual_seed(seed)
    model = get_peft_model(
        model,
        LoraConfig(
            r=recipe.lora_r,
            lora_alpha=recipe.lora_alpha,
            lora_dropout=recipe.lora_dropout,
            target_modules=list(recipe.target_modules),
            task_type="CAUSAL_LM",
        ),
    )
    for param in model.parameters():
        if param.requires_grad and param.dtype != torch.float32:
            param.data = param.data.float()
    model.train()  # gradient checkpointing only acts in training mode
    return model


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]
