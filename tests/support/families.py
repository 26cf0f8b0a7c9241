"""Tiny random-init models of every supported family, built from their transformers config classes.

Each is 64 hidden, 2 layers, 4 heads of 16, 2 KV heads, with the project's locally trained
tokenizer (`finetune_trainer.model.tiny_model.train_tokenizer`), saved as float32 safetensors: what a
PVC folder holds. Logit transforms are set small enough to matter: Gemma 2's soft-cap at 2, not
30, so a loss that skipped it, or soft-capped the summed loss, would be far off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SIZES: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}
HEAD_DIM = 16
LM_HEAD_STD = 0.15


# name -> (config class name, extra config keys)
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {"tie_word_embeddings": False}),
    "llama-tied": ("LlamaConfig", {"tie_word_embeddings": True}),
    "qwen2": ("Qwen2Config", {"tie_word_embeddings": False}),
    "qwen3": ("Qwen3Config", {"head_dim": HEAD_DIM, "tie_word_embeddings": False}),
    "mistral": ("MistralConfig", {"head_dim": HEAD_DIM}),
    "gemma": ("GemmaConfig", {"head_dim": HEAD_DIM}),
    "gemma2": ("Gemma2Config", {"head_dim": HEAD_DIM, "final_logit_softcapping": 2.0, "query_pre_attn_scalar": 16}),
    "gemma3": ("Gemma3TextConfig", {"head_dim": HEAD_DIM, "final_logit_softcapping": 2.0, "query_pre_attn_scalar": 16}),
    "phi3": ("Phi3Config", {"tie_word_embeddings": False}),
    "cohere": ("CohereConfig", {"logit_scale": 0.5}),
    "granite": ("GraniteConfig", {"logits_scaling": 4.0, "tie_word_embeddings": False}),
}

_TOKENIZER: list[Any] = []


def tokenizer() -> Any:
    if not _TOKENIZER:
        from finetune_trainer.model.tiny_model import train_tokenizer

        _TOKENIZER.append(train_tokenizer(512))
    return _TOKENIZER[0]


def make_family_model(name: str, folder: Path, *, seed: int = 0, config_class: str | None = None) -> Path:
    """Write the tiny model of family `name` (a key of FAMILIES) and the tokenizer into `folder`."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    class_name, extra = FAMILIES[name] if config_class is None else (config_class, {})
    tok = tokenizer()
    config = getattr(transformers, class_name)(
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **SIZES,
        **extra,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(torch.float32)
    head = model.get_output_embeddings()
    if head is not None and not getattr(config, "tie_word_embeddings", False):
        with torch.no_grad():
            head.weight.normal_(0.0, LM_HEAD_STD)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder), safe_serialization=True)
    tok.save_pretrained(str(folder))
    return folder
