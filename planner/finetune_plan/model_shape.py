"""The dimensions of a decoder-only transformer, read from its Hugging Face `config.json`.

The planner needs only shapes, never weights: a 70B model is planned from a 700-byte file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from .families import ATTENTION_MODULES, LLAMA_LINEARS, MLP_MODULES, Family, ModelConfigError, family_of

__all__ = ["ATTENTION_MODULES", "MLP_MODULES", "ModelConfigError", "ModelShape", "known_model", "shape_from_config"]


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    name: str = ""
    # The linear modules of one decoder layer (Phi-3 fuses q/k/v and gate/up) and the family.
    linears: tuple[str, ...] = LLAMA_LINEARS
    family: Family | None = None
    # Soft-capping (cap * tanh(x / cap)) keeps its tanh for the backward: one more block of the
    # logits (final_logit_softcapping) or of each attention matrix (attn_logit_softcapping).
    logit_softcap: bool = False
    attention_softcap: bool = False

    @property
    def attention_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    def linear_dims(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of every linear in one layer."""
        h, i = self.hidden, self.intermediate
        every = {
            "q_proj": (h, self.attention_width),
            "k_proj": (h, self.kv_width),
            "v_proj": (h, self.kv_width),
            "qkv_proj": (h, self.attention_width + 2 * self.kv_width),
            "o_proj": (self.attention_width, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "gate_up_proj": (h, 2 * i),
            "down_proj": (i, h),
        }
        return {name: every[name] for name in self.linears if name in every}

    @property
    def linear_params_per_layer(self) -> int:
        return sum(a * b for a, b in self.linear_dims().values())

    @property
    def largest_linear_params(self) -> int:
        return max(a * b for a, b in self.linear_dims().values())

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """lm_head weights held apart from the embedding (0 when tied)."""
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def total_params(self) -> int:
        norms = (2 * self.layers + 1) * self.hidden
        return self.layers * self.linear_params_per_layer + self.embedding_params + self.head_params + norms

    def lora_params_per_layer(self, r: int, targets: tuple[str, ...]) -> int:
        dims = self.linear_dims()
        return sum(r * (dims[t][0] + dims[t][1]) for t in targets if t in dims)


def _int(config: Mapping[str, Any], *keys: str, default: int | None = None) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    if default is not None:
        return default
    raise ModelConfigError(f"config.json: missing positive integer {keys[0]!r}")


def shape_from_config(config: Mapping[str, Any], name: str = "") -> ModelShape:
    """Read the config of a supported family (see `families`); raise ModelConfigError."""
    if not isinstance(config, Mapping):
        raise ModelConfigError("config.json: expected a JSON object")
    family = family_of(config)
    if any(k in config for k in ("num_local_experts", "num_experts", "n_routed_experts")):
        raise ModelConfigError("config.json: mixture-of-experts models are not planned yet")
    hidden = _int(config, "hidden_size", "n_embd", "d_model")
    heads = _int(config, "num_attention_heads", "n_head")
    head_dim = _int(config, "head_dim", default=max(1, hidden // heads))
    return ModelShape(
        hidden=hidden,
        intermediate=_int(config, "intermediate_size", "ffn_dim", default=4 * hidden),
        layers=_int(config, "num_hidden_layers", "n_layer"),
        heads=heads,
        kv_heads=_int(config, "num_key_value_heads", default=heads),
        head_dim=head_dim,
        vocab=_int(config, "vocab_size"),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        name=name or str(config.get("_name_or_path") or config.get("model_type") or ""),
        linears=family.linears,
        family=family,
        logit_softcap=any(kind == "softcap" and config.get(key) for kind, key in family.logits),
        attention_softcap=family.kernel == "eager" and bool(config.get("attn_logit_softcapping")),
    )


# Public config values of models people ask about most, so a job whose model comes from the
# Hub can be planned without network access. Keys are lower-cased Hub ids.
_LLAMA3_VOCAB = 128256
KNOWN_MODELS: Final[dict[str, dict[str, Any]]] = {
    "meta-llama/llama-3.3-70b-instruct": {
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": _LLAMA3_VOCAB,
        "tie_word_embeddings": False,
    },
    "meta-llama/meta-llama-3-8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": _LLAMA3_VOCAB,
        "tie_word_embeddings": False,
    },
    "meta-llama/llama-3.2-1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": _LLAMA3_VOCAB,
        "tie_word_embeddings": True,
    },
}
KNOWN_MODELS["meta-llama/llama-3.1-70b-instruct"] = KNOWN_MODELS["meta-llama/llama-3.3-70b-instruct"]
KNOWN_MODELS["meta-llama/llama-3.1-70b"] = KNOWN_MODELS["meta-llama/llama-3.3-70b-instruct"]
KNOWN_MODELS["meta-llama/meta-llama-3-8b-instruct"] = KNOWN_MODELS["meta-llama/meta-llama-3-8b"]
KNOWN_MODELS["meta-llama/llama-3.1-8b"] = KNOWN_MODELS["meta-llama/meta-llama-3-8b"]
KNOWN_MODELS["meta-llama/llama-3.1-8b-instruct"] = KNOWN_MODELS["meta-llama/meta-llama-3-8b"]


def known_model(hub_id: str) -> dict[str, Any] | None:
    return KNOWN_MODELS.get(hub_id.lower())
