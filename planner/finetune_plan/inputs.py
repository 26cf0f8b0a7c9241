"""What the planner reads from a spec: the recipe, the GPU product, a config as a plain mapping.

The planner itself takes shapes and recipes; these are the translations from the API's words,
shared by `choose()` (the trainer's launch and `ftjob plan`) and the operator's grace period.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from finetune_api.objectives import OBJECTIVES
from finetune_api.spec import FineTuneJobSpec

from .gpu_products import DEFAULT_PRODUCT, GpuProduct, lookup
from .grpo.spec import terms_of, with_terms
from .memory import FP32, Attention, Recipe
from .recompute.ask import ActivationAsk


def compute_bytes(precision: str, product: GpuProduct) -> int:
    if precision == "fp32" or (precision == "auto" and not product.bf16):
        return FP32
    return 2


def recipe_from_spec(spec: FineTuneJobSpec, product: GpuProduct, attention: Attention = "materialised") -> Recipe:
    training = spec.training
    asked = ActivationAsk.of(training)
    # The objective's term: a row of its data is this many sequences through the model (a
    # preference pair two), so a micro-batch of batchSize rows holds that many times the tokens.
    # The planner may send them through one pass each instead, when only that fits (`pairs`).
    objective = OBJECTIVES.get(training.method)
    sequences = objective.sequences_per_row
    recipe = Recipe(
        max_length=training.max_length,
        batch_size=training.batch_size * sequences,
        gradient_accumulation=training.gradient_accumulation,
        lora_r=spec.lora.r,
        lora_targets=tuple(spec.lora.target_modules),
        lora_dropout=spec.lora.dropout > 0,
        # auto plans all-recompute first; `make_plan` then sizes the layers kept.
        gradient_checkpointing=asked.recomputes,
        offload=asked.offloads,
        quantization=spec.quantization.type,
        double_quant=spec.quantization.double_quant,
        optimizer=training.optimizer,
        compute_bytes=compute_bytes(spec.precision, product),
        attention=attention,
        packing=training.packing,
        sequences_per_row=sequences,
        sequence_names=objective.sequence_names,
        reference_forwards=objective.reference_forwards,
    )
    # GRPO's terms are the planner's own (`grpo.spec`): a prompt's group, its reference forward.
    return with_terms(recipe, terms_of(training))


def product_for(name: str | None, fallback: str) -> GpuProduct:
    """The product by the name torch reports, else the spec's label, else a P40."""
    for candidate in (name, fallback):
        if candidate:
            found = lookup(candidate)
            if found is not None:
                return found
    found = lookup(DEFAULT_PRODUCT)
    assert found is not None
    return found


def as_mapping(model_config: Any) -> Mapping[str, Any]:
    """A transformers PretrainedConfig or a plain dict."""
    if isinstance(model_config, Mapping):
        return model_config
    to_dict = getattr(model_config, "to_dict", None)
    if callable(to_dict):
        result = to_dict()
        if isinstance(result, Mapping):
            return result
    return dict(vars(model_config))
