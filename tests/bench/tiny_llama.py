"""A random-init Llama small enough for CPU, with dimensions NF4 can quantise (multiples of 64)."""

from __future__ import annotations

from pathlib import Path


def write_tiny_llama(path: Path, layers: int = 2, hidden: int = 64, vocab: int = 256) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if (path / "config.json").exists():
        return path
    torch.manual_seed(1234)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    LlamaForCausalLM(config).to(torch.float16).save_pretrained(path)
    return path
