"""The trainer's pre-flight: the plan for a TrainerConfig on the GPUs the pod really has.

Called before any weight is loaded, so a job that cannot fit fails in seconds with reason
WontFit and the numbers, and a job that fits gets its mode and per-GPU `max_memory`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from finetune_api.spec import FineTuneJobSpec
from finetune_api.trainer_config import TrainerConfig

from .gpu_products import DEFAULT_PRODUCT, GpuProduct, lookup
from .memory import FP32, GIB, Attention, Recipe
from .model_shape import shape_from_config
from .plan import ALL_MODES, Hardware, ModeChoice, Plan, make_plan
from .speed import Mode


def compute_bytes(precision: str, product: GpuProduct) -> int:
    if precision == "fp32" or (precision == "auto" and not product.bf16):
        return FP32
    return 2


def recipe_from_spec(spec: FineTuneJobSpec, product: GpuProduct, attention: Attention = "materialised") -> Recipe:
    training = spec.training
    return Recipe(
        max_length=training.max_length,
        batch_size=training.batch_size,
        lora_r=spec.lora.r,
        lora_targets=tuple(spec.lora.target_modules),
        lora_dropout=spec.lora.dropout > 0,
        gradient_checkpointing=training.gradient_checkpointing,
        quantization=spec.quantization.type,
        double_quant=spec.quantization.double_quant,
        optimizer=training.optimizer,
        compute_bytes=compute_bytes(spec.precision, product),
        attention=attention,
    )


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


def preflight(
    config: TrainerConfig,
    model_config: Mapping[str, Any],
    gpu_count: int,
    gpu_memory_bytes: int | None = None,
    gpu_name: str | None = None,
    *,
    mode: ModeChoice = "auto",
    allowed_modes: Sequence[Mode] = ALL_MODES,
    attention: Attention = "materialised",
    loss_chunks: Sequence[int] | None = None,
    epoch_tokens: int | None = None,
) -> Plan | None:
    """The plan for `config` on `gpu_count` visible GPUs of `gpu_memory_bytes` each (the
    smallest, when they differ); None on the CPU. Raises ModelConfigError for a config.json
    the planner cannot read.

    The trainer loads with `plan.device_map` (device_map mode; `plan.max_memory` is the
    equivalent budget for `device_map="auto"`), and computes the loss in chunks of
    `plan.recipe.loss_chunk_tokens` tokens when that is not 0.
    """
    if gpu_count < 1:
        return None
    product = product_for(gpu_name, config.spec.resources.gpu_product)
    memory_gib = gpu_memory_bytes / GIB if gpu_memory_bytes else product.memory_gib
    shape = shape_from_config(model_config, name=config.paths.model)
    recipe = recipe_from_spec(config.spec, product, attention)
    return make_plan(
        shape,
        recipe,
        Hardware(gpu_count, product, memory_gib),
        mode=mode,
        epoch_tokens=epoch_tokens,
        allowed_modes=allowed_modes,
        loss_chunks=loss_chunks,
    )


def _as_mapping(model_config: Any) -> Mapping[str, Any]:
    """A transformers PretrainedConfig or a plain dict."""
    if isinstance(model_config, Mapping):
        return model_config
    to_dict = getattr(model_config, "to_dict", None)
    if callable(to_dict):
        result = to_dict()
        if isinstance(result, Mapping):
            return result
    return dict(vars(model_config))


def trainer_preflight(
    config: TrainerConfig,
    hardware: Any,
    model_config: Any,
    *,
    allowed_modes: Sequence[Mode] = ("device_map",),
    attention: Attention = "materialised",
) -> Plan:
    """The trainer's call: `hardware.gpus` are the visible GPUs (`.name`, `.total_bytes`).

    Raises TrainerFailure(WontFit) with the plan's message when the job cannot fit; returns the
    plan otherwise (`plan.max_memory`, `plan.device_map`, `plan.summary`).
    """
    from finetune_api.reasons import ExitReason

    from ..failures import TrainerFailure
    from .model_shape import ModelConfigError

    gpus = list(getattr(hardware, "gpus", ()))
    try:
        plan = preflight(
            config,
            _as_mapping(model_config),
            len(gpus),
            gpu_memory_bytes=min(g.total_bytes for g in gpus) if gpus else None,
            gpu_name=gpus[0].name if gpus else None,
            allowed_modes=allowed_modes,
            mode="auto",
            attention=attention,
            loss_chunks=(0,),  # the trainer computes the loss over the whole sequence
        )
    except ModelConfigError as exc:
        raise TrainerFailure(ExitReason.InvalidConfig, str(exc)) from None
    if plan is None:
        raise TrainerFailure(ExitReason.InvalidConfig, "the planner was called without a GPU")
    if not plan.fits:
        raise TrainerFailure(ExitReason.WontFit, plan.message)
    return plan
