"""Public config.json values of the models the acceptance criteria name."""

from pathlib import Path
from typing import Any

LLAMA_33_70B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
}

# Llama-2-13B's public config.json: multi-head attention, 40 layers, hidden 5120, vocab 32000.
LLAMA_2_13B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 5120,
    "intermediate_size": 13824,
    "num_hidden_layers": 40,
    "num_attention_heads": 40,
    "num_key_value_heads": 40,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
}

LLAMA_3_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
}


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama-3.3-70b-4xp40.yaml"
