"""Load the base model the Pascal-safe way and wrap it with LoRA.

NF4 (or FP4) weights with double quantisation and a float32 compute dtype, `dtype=float32`
(transformers 5 would otherwise pick the checkpoint's bf16), norms and LM head cast to float32,
then PEFT LoRA with an initialisation seeded alike on every rank. Where the weights go depends
on the parallelism:
- dataParallel: a whole copy on this rank's device;
- fsdp: loaded on the host with float32 quant storage (FSDP flattens one float dtype per
  unit), each weight quantised on the rank's GPU on its way (`gpu_quantise`), then sharded to
  the GPUs unit by unit by `distributed.fsdp`: no GPU holds the model;
- deviceMap: one process, layers spread over the visible GPUs with the planner's placement.
"""

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from finetune_api.reasons import ExitReason
from finetune_api.trainer_config import TrainerConfig

from . import families
from .failures import TrainerFailure
from .gpu_quantise import quantising_on
from .hardware import Attention, Hardware, ResolvedPrecision
from .preflight import MemoryPlan

log = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
KEEP_FP32 = ("norm", "lm_head")


def _model_location(config: TrainerConfig) -> str:
    if config.spec.model.source.hub is not None:
        return config.paths.model
    folder = Path(config.paths.model)
    if not (folder / "config.json").is_file():
        raise TrainerFailure(
            ExitReason.InvalidConfig,
            f"spec.model.source.pvc: {folder} is not a model folder (no config.json there)",
        )
    return str(folder)


def _hub_kwargs(config: TrainerConfig) -> dict[str, Any]:
    import os

    hub = config.spec.model.source.hub
    if hub is None:
        return {}
    return {"revision": hub.revision, "token": os.environ.get("HF_TOKEN"), "cache_dir": config.paths.cache}


def load_model_config(config: TrainerConfig) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(_model_location(config), **_hub_kwargs(config))
    except (OSError, ValueError) as exc:
        raise TrainerFailure(ExitReason.InvalidConfig, f"spec.model: cannot read the model config: {exc}") from None


def load_tokenizer(config: TrainerConfig) -> Any:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(_model_location(config), **_hub_kwargs(config))
    except (OSError, ValueError) as exc:
        raise TrainerFailure(ExitReason.InvalidConfig, f"spec.model: cannot load the tokenizer: {exc}") from None
    if tokenizer.pad_token is None:
        # Padding positions are masked out of the loss, so reusing EOS is safe.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _device_map(hardware: Hardware, plan: MemoryPlan, parallelism: str, device: torch.device) -> Any:
    if not hardware.on_gpu or parallelism == "fsdp":
        return {"": "cpu"}
    if parallelism == "dataParallel" or len(hardware.gpus) == 1:
        return {"": device.index if device.type == "cuda" else hardware.gpus[0].index}
    # Naive model parallelism inside one process: layers spread over the GPUs, one busy at a time;
    # the planner's placement when it made one, else accelerate's within the per-GPU budget.
    return plan.device_map or "auto"


def cast_to_fp32(model: nn.Module, names: tuple[str, ...] = KEEP_FP32) -> int:
    """Cast floating parameters of norm and LM-head modules to float32 (quantised ones stay)."""
    count = 0
    for name, module in model.named_modules():
        if not any(key in name.lower() for key in names):
            continue
        for param in module.parameters(recurse=False):
            if param.is_floating_point() and param.dtype != torch.float32:
                param.data = param.data.to(torch.float32)
                count += 1
    return count


def load_model(
    config: TrainerConfig,
    hardware: Hardware,
    precision: ResolvedPrecision,
    attention: Attention,
    plan: MemoryPlan,
    *,
    parallelism: str = "dataParallel",
    device: torch.device | None = None,
    seed: int = 0,
) -> nn.Module:
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    spec = config.spec
    dtype = DTYPES[precision]
    quantized = spec.quantization.type != "none"
    kwargs: dict[str, Any] = {
        "dtype": dtype,
        "device_map": _device_map(hardware, plan, parallelism, device or torch.device("cpu")),
        "attn_implementation": attention,
        "low_cpu_mem_usage": True,
        **_hub_kwargs(config),
    }
    if plan.max_memory and kwargs["device_map"] == "auto":
        kwargs["max_memory"] = plan.max_memory
    if quantized:
        kwargs["quantization_config"] = BitsAndBytesConfig(  # type: ignore[no-untyped-call]
            load_in_4bit=True,
            bnb_4bit_quant_type=spec.quantization.type,
            bnb_4bit_use_double_quant=spec.quantization.double_quant,
            bnb_4bit_compute_dtype=dtype,
            # FSDP flattens one float dtype per unit: pack the 4-bit weights into float32.
            bnb_4bit_quant_storage=torch.float32 if parallelism == "fsdp" else torch.uint8,
        )
    # fsdp loads on the host; its weights are quantised on this rank's GPU, one at a time.
    quantiser = device if parallelism == "fsdp" and hardware.on_gpu and device is not None else torch.device("cpu")
    try:
        with quantising_on(quantiser):
            model = AutoModelForCausalLM.from_pretrained(_model_location(config), **kwargs)
    except ValueError as exc:
        text = str(exc)
        if "offload" in text.lower() or "dispatched on the cpu" in text.lower():
            raise TrainerFailure(
                ExitReason.WontFit,
                f"the model does not fit on {hardware.describe()} within the memory plan: {text.splitlines()[0]}",
            ) from None
        # The same folder fails the same way on every attempt (e.g. a kernel the family lacks): not retried.
        raise TrainerFailure(ExitReason.InvalidConfig, f"spec.model: cannot load the model: {text}") from None
    asked = kwargs["device_map"]
    placed = set(map(str, (getattr(model, "hf_device_map", None) or {}).values()))
    if not placed and isinstance(asked, dict):
        placed = set(map(str, asked.values()))
    off_gpu = sorted(placed & {"cpu", "disk"})
    if hardware.on_gpu and off_gpu and parallelism != "fsdp":
        raise TrainerFailure(
            ExitReason.WontFit, f"the model does not fit on {hardware.describe()}: device_map put layers on {off_gpu}"
        )
    if precision == "fp32":
        cast_to_fp32(model)
    checkpointing = spec.training.gradient_checkpointing
    if quantized:
        model = prepare_model_for_kbit_training(  # type: ignore[no-untyped-call]
            model,
            use_gradient_checkpointing=checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False},
        )
    elif checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # type: ignore[no-untyped-call]
        model.enable_input_require_grads()  # type: ignore[no-untyped-call]
    # Activation checkpointing recomputes layers; a KV cache has no use in training.
    model.config.use_cache = False
    lora = LoraConfig(
        r=spec.lora.r,
        lora_alpha=spec.lora.alpha,
        lora_dropout=spec.lora.dropout,
        # The requested names as this model's decoder layers name them (fused, all-linear).
        target_modules=families.targets(model, spec.lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    # LoRA's A matrices are drawn from the CPU generator: the same seed gives every rank the
    # same adapter, whatever each rank's loading did to the generator.
    torch.manual_seed(seed)
    try:
        adapted: nn.Module = get_peft_model(model, lora)
    except ValueError as exc:
        raise TrainerFailure(ExitReason.InvalidConfig, f"spec.lora.targetModules: {str(exc).splitlines()[0]}") from None
    trainable = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    total = sum(p.numel() for p in adapted.parameters())
    log.info("model loaded: %s trainable of %s parameters, placement %s", trainable, total, placed or {"cpu"})
    return adapted
