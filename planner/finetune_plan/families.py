"""The model families the trainer trains, what each needs, and what `lora.targetModules` means for each.

Torch-free, so that `ftjob validate --model-config`, `ftjob plan`, `ftjob check-data` and the
trainer's start all refuse the same models in the same one line, before any GPU time:
- a family is looked up by the config's `model_type` (else its `architectures`); a family not
  in the table is refused, mixture-of-experts ones with their own reason;
- its attention kernel: SDPA where transformers has it for the family, else eager (Gemma 2,
  whose attention soft-caps its scores), which the planner plans as a materialised matrix;
- its logit transform (Gemma 2's final soft-cap, Cohere's logit scale, Granite's divisor), which
  the trainer's loss head applies per logit as the model's own forward would;
- its per-layer linear modules, with the fused projections of Phi-3 (`qkv_proj`,
  `gate_up_proj`): `q_proj`, `k_proj`, `v_proj` map onto `qkv_proj` there, `gate_proj` and
  `up_proj` onto `gate_up_proj`; `all-linear` means every linear of a decoder layer (PEFT's
  meaning: every linear layer but the head).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal


class ModelConfigError(ValueError):
    """config.json lacks something the planner needs, or names a model it cannot train; the message says which."""


# Module names of a Llama-style decoder layer, the names `lora.targetModules` refers to.
ATTENTION_MODULES: Final = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES: Final = ("gate_proj", "up_proj", "down_proj")
ALL_LINEAR: Final = "all-linear"
TARGETS_FIELD: Final = "spec.lora.targetModules"
LLAMA_LINEARS: Final = ATTENTION_MODULES + MLP_MODULES
FUSED_LINEARS: Final = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
FUSED_NAMES: Final = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj"} | {
    "gate_proj": "gate_up_proj",
    "up_proj": "gate_up_proj",
}

Kernel = Literal["sdpa", "eager"]
# How the model's forward turns the head's output into logits: (kind, config key).
# softcap: cap * tanh(x / cap); scale: x * value; divide: x / value.
LogitTransform = tuple[Literal["softcap", "scale", "divide"], str]


class UnsupportedModel(ModelConfigError):
    """A model the trainer cannot train as asked (family, or a target): one line, naming why."""


@dataclass(frozen=True)
class Family:
    model_type: str
    architecture: str
    label: str
    kernel: Kernel = "sdpa"
    linears: tuple[str, ...] = LLAMA_LINEARS
    fused: Mapping[str, str] = field(default_factory=dict)
    logits: tuple[LogitTransform, ...] = ()
    why_eager: str = ""

    def describe(self) -> str:
        return f"{self.label} ({self.architecture})"


FAMILIES: Final[dict[str, Family]] = {
    f.model_type: f
    for f in (
        Family("llama", "LlamaForCausalLM", "Llama"),
        Family("mistral", "MistralForCausalLM", "Mistral"),
        Family("qwen2", "Qwen2ForCausalLM", "Qwen2"),
        Family("qwen3", "Qwen3ForCausalLM", "Qwen3"),
        Family("gemma", "GemmaForCausalLM", "Gemma"),
        Family(
            "gemma2",
            "Gemma2ForCausalLM",
            "Gemma 2",
            kernel="eager",
            logits=(("softcap", "final_logit_softcapping"),),
            why_eager="its attention soft-caps the scores, which transformers' SDPA path does not",
        ),
        Family("gemma3_text", "Gemma3ForCausalLM", "Gemma 3 (text)", logits=(("softcap", "final_logit_softcapping"),)),
        Family("phi3", "Phi3ForCausalLM", "Phi-3", linears=FUSED_LINEARS, fused=FUSED_NAMES),
        Family("cohere", "CohereForCausalLM", "Cohere", logits=(("scale", "logit_scale"),)),
        Family("granite", "GraniteForCausalLM", "Granite", logits=(("divide", "logits_scaling"),)),
    )
}
BY_ARCHITECTURE: Final = {f.architecture: f for f in FAMILIES.values()}

MIXTURE_OF_EXPERTS: Final = frozenset(
    {"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "dbrx", "olmoe", "jamba", "granitemoe"}
)
REFUSED: Final = {
    "gemma3": "the multimodal Gemma 3 is not supported; train its text model (model_type gemma3_text)",
}
# A config with neither model_type nor architectures (the planner's own tables, hand-written
# what-if files) is read as the Llama layout it is written in.
DEFAULT_FAMILY: Final = FAMILIES["llama"]


def supported_names() -> str:
    return ", ".join(FAMILIES)


def family_of(config: Mapping[str, Any]) -> Family:
    """The family of a config.json; raises UnsupportedModel with one line when it has none."""
    model_type = config.get("model_type")
    architectures = config.get("architectures") or []
    names = [a for a in architectures if isinstance(a, str)] if isinstance(architectures, list) else []
    if not model_type and not names:
        return DEFAULT_FAMILY
    arch = names[0] if names else ""
    named = f"model_type {model_type!r}" + (f" ({arch})" if arch else "") if model_type else f"architecture {arch}"
    if model_type in MIXTURE_OF_EXPERTS or any(config.get(k) for k in ("num_local_experts", "num_experts")):
        raise UnsupportedModel(
            f"config.json: {named} is a mixture-of-experts model, which the trainer does not train yet;"
            f" supported families: {supported_names()}"
        )
    if isinstance(model_type, str) and model_type in REFUSED:
        raise UnsupportedModel(f"config.json: {named}: {REFUSED[model_type]}")
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None and not model_type:
        family = next((BY_ARCHITECTURE[a] for a in names if a in BY_ARCHITECTURE), None)
    if family is None:
        raise UnsupportedModel(f"config.json: {named} is not a supported model family; supported: {supported_names()}")
    return family


def resolve_targets(
    family: Family, requested: Sequence[str], linears: Sequence[str] | None = None, where: str = ""
) -> tuple[str, ...]:
    """The per-layer module names `requested` adapts in `family` (in the layer's order).

    `linears` are the linear modules every decoder layer has (default: the family's table); a
    requested name that is not one of them, after mapping onto fused projections, raises
    UnsupportedModel naming the field and the layer's linear modules."""
    present = tuple(linears) if linears is not None else family.linears
    if ALL_LINEAR in requested:
        return present
    wanted: list[str] = []
    for name in requested:
        mapped = family.fused.get(name, name) if name not in present else name
        if mapped not in present:
            shown = f"{name} (fused into {mapped})" if mapped != name else name
            raise UnsupportedModel(
                f"{TARGETS_FIELD}: {shown} is not a linear module of every decoder layer of {family.describe()}"
                f"{where}; its linear modules: {', '.join(present)} (or {ALL_LINEAR})"
            )
        if mapped not in wanted:
            wanted.append(mapped)
    return tuple(n for n in present if n in wanted)


def check_model(config: Mapping[str, Any], requested: Sequence[str]) -> tuple[Family, tuple[str, ...]]:
    """The family and the modules to adapt, or UnsupportedModel (one line)."""
    family = family_of(config)
    return family, resolve_targets(family, requested)


def attention_line(family: Family) -> str:
    if family.kernel == "eager":
        return f"eager ({family.label}: {family.why_eager}); planned as a materialised attention matrix"
    return (
        "sdpa_expanded in fp32 (k and v expanded to every head, SDPA's memory-efficient kernel: no"
        " probabilities kept), sdpa in 16-bit"
    )


def describe(family: Family, targets: Sequence[str]) -> str:
    """One line for `ftjob plan` / `validate`: the family, its kernel, its logit transform, the targets."""
    parts = [family.describe(), f"attention {attention_line(family)}"]
    if family.logits:
        parts.append("logits " + ", ".join(f"{kind} by {key}" for kind, key in family.logits))
    parts.append(f"LoRA on {', '.join(targets)}")
    return "; ".join(parts)
