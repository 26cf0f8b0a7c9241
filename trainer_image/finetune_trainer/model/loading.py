"""Load the base model the Pascal-safe way and wrap it with LoRA.

NF4 (or FP4) weights with double quantisation and a float32 compute dtype, `dtype=float32`
(transformers 5 would otherwise pick the checkpoint's bf16), norms and LM head cast to float32,
then PEFT LoRA with an initialisation seeded alike on every rank. Where the weights go depends
on the training mode (`modes`): its `device_map`, its quant storage dtype and where its weights
are quantised as they load, or, for a mode that streams (fsdp), the model built on the meta
device and read from the checkpoint as the mode wraps it (`modes.streaming`).
"""

from __future__ import annotations

import logging
import os
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from finetune_api.reasons import ExitReason
from finetune_api.trainer_config import TrainerConfig

from ..failures import TrainerFailure
from ..hardware.capabilities import Hardware, ResolvedPrecision
from ..memory import activations
from ..memory.budget import MemoryPlan
from ..modes import Mode
from ..modes.base import Placement
from ..modes.checkpoint_files import INDEX, CheckpointFiles, files_of, size_of
from ..modes.streaming import Stream, adapter_on_host, skeleton, sources
from . import attention as attention_kernel
from . import families
from .attention_choice import Attention
from .gpu_quantise import quantising_on

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

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


def checkpoint_files(config: TrainerConfig) -> list[Path]:
    """The model's safetensors files: the folder's, or the Hub snapshot's (downloaded into the
    cache from_pretrained uses, so nothing is fetched twice); [] when there are none or the
    snapshot cannot be had (the loader then reads the model as from_pretrained finds it)."""
    if config.spec.model.source.hub is None:
        return files_of(Path(_model_location(config)))
    from huggingface_hub import snapshot_download

    kwargs = _hub_kwargs(config)
    try:
        folder = snapshot_download(
            config.paths.model,
            revision=kwargs["revision"],
            token=kwargs["token"],
            cache_dir=kwargs["cache_dir"],
            allow_patterns=["*.safetensors", INDEX],
        )
    except (OSError, ValueError) as exc:
        log.warning("cannot list the model's safetensors files in the Hub cache: %s", str(exc).splitlines()[0])
        return []
    return files_of(Path(folder))


def load_model_config(config: TrainerConfig) -> PretrainedConfig:
    from transformers import AutoConfig

    try:
        model_config: PretrainedConfig = AutoConfig.from_pretrained(_model_location(config), **_hub_kwargs(config))
    except (OSError, ValueError) as exc:
        raise TrainerFailure(ExitReason.InvalidConfig, f"spec.model: cannot read the model config: {exc}") from None
    return model_config


def load_tokenizer(config: TrainerConfig) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(_model_location(config), **_hub_kwargs(config))
    except (OSError, ValueError) as exc:
        raise TrainerFailure(ExitReason.InvalidConfig, f"spec.model: cannot load the tokenizer: {exc}") from None
    if tokenizer.pad_token is None:
        # Padding positions are masked out of the loss, so reusing EOS is safe.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


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


def _load_kwargs(
    config: TrainerConfig,
    hardware: Hardware,
    *,
    precision: ResolvedPrecision,
    attention: Attention,
    plan: MemoryPlan,
    mode: Mode,
    device: torch.device,
) -> dict[str, Any]:
    """`from_pretrained`'s arguments: the mode's placement and quant storage, the plan's budget."""
    from transformers import BitsAndBytesConfig

    spec = config.spec
    dtype = DTYPES[precision]
    if attention == attention_kernel.NAME:
        attention_kernel.register()  # transformers looks the name up in its attention interface
    kwargs: dict[str, Any] = {
        "dtype": dtype,
        "device_map": mode.device_map(hardware, plan, device),
        "attn_implementation": attention,
        "low_cpu_mem_usage": True,
        **_hub_kwargs(config),
    }
    if plan.max_memory and kwargs["device_map"] == "auto":
        kwargs["max_memory"] = plan.max_memory
    if spec.quantization.type != "none":
        # transformers 5 leaves BitsAndBytesConfig.__init__ unannotated.
        kwargs["quantization_config"] = BitsAndBytesConfig(  # type: ignore[no-untyped-call]
            load_in_4bit=True,
            bnb_4bit_quant_type=spec.quantization.type,
            bnb_4bit_use_double_quant=spec.quantization.double_quant,
            bnb_4bit_compute_dtype=dtype,
            bnb_4bit_quant_storage=mode.quant_storage,
        )
    return kwargs


def _from_pretrained(
    config: TrainerConfig, hardware: Hardware, kwargs: dict[str, Any], mode: Mode, device: torch.device
) -> PreTrainedModel:
    """The base model, placed as `kwargs` asks; WontFit when it does not fit there."""
    from transformers import AutoModelForCausalLM

    try:
        with quantising_on(mode.quantise_on(hardware, device)):
            model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(_model_location(config), **kwargs)
    except ValueError as exc:
        text = str(exc)
        if "offload" in text.lower() or "dispatched on the cpu" in text.lower():
            raise TrainerFailure(
                ExitReason.WontFit,
                f"the model does not fit on {hardware.describe()} within the memory plan: {text.splitlines()[0]}",
            ) from None
        # The same folder fails the same way on every attempt (e.g. a kernel the family lacks): not retried.
        raise TrainerFailure(ExitReason.InvalidConfig, f"spec.model: cannot load the model: {text}") from None
    return model


# from_pretrained's arguments the meta skeleton takes (placement and the Hub are the stream's).
SKELETON_KWARGS = ("dtype", "attn_implementation", "low_cpu_mem_usage", "quantization_config")


CGROUP_MEMORY_MAX = Path("/sys/fs/cgroup/memory.max")


def pod_memory_limit() -> int | None:
    """The container's memory limit in bytes (cgroup v2), None when unlimited or unknown."""
    try:
        text = CGROUP_MEMORY_MAX.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _whole_load_fits(plan: MemoryPlan, why: str) -> None:
    """The pod was sized for streaming (`finetune_plan`'s host figure): a whole load on each of
    its processes that the pod's memory cannot hold is refused here, in one line, rather than
    killed by the kernel partway through."""
    per_process = plan.whole_load_host_gib_per_process
    limit = pod_memory_limit()
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if per_process is None or limit is None or limit >= processes * per_process * 2**30:
        log.warning("the model loads whole on each process: %s", why)
        return
    raise TrainerFailure(
        ExitReason.WontFit,
        f"spec.resources.memory: fsdp streams a checkpoint's safetensors files, but this one cannot be "
        f"streamed ({why}); loading it whole on each of the pod's {processes} processes needs about "
        f"{processes * per_process:.1f} GiB of host memory, the pod has {limit / 2**30:.1f} GiB: give the "
        f"model safetensors files or raise spec.resources.memory",
    )


def _streamed(
    config: TrainerConfig, kwargs: dict[str, Any], mode: Mode, device: torch.device, plan: MemoryPlan
) -> PreTrainedModel | None:
    """The model on the meta device with `mode.stream` set to read it, or None when this
    checkpoint cannot be streamed: it then loads as from_pretrained loads it, when the pod holds that."""
    files = checkpoint_files(config)
    if not files:
        _whole_load_fits(plan, "no safetensors files")
        return None
    reader = CheckpointFiles(files)
    try:
        model = skeleton(load_model_config(config), reader, {k: kwargs[k] for k in SKELETON_KWARGS if k in kwargs})
        found = sources(model, reader.names())
    except (KeyError, ValueError) as exc:
        found = f"cannot build the model on the meta device: {str(exc).splitlines()[0]}"
    if isinstance(found, str):
        reader.close()
        _whole_load_fits(plan, found)
        return None
    mode.stream = Stream(model, reader, found, device)
    return model


def _placement(model: PreTrainedModel, hardware: Hardware, asked: Placement, mode: Mode) -> set[str]:
    """Where the layers went; WontFit when a GPU run put some off the GPUs (a mode that loads
    on the host excepted)."""
    placed = set(map(str, (getattr(model, "hf_device_map", None) or {}).values()))
    if not placed and isinstance(asked, dict):
        placed = set(map(str, asked.values()))
    off_gpu = sorted(placed & {"cpu", "disk"})
    if hardware.on_gpu and off_gpu and not mode.loads_on_host:
        raise TrainerFailure(
            ExitReason.WontFit, f"the model does not fit on {hardware.describe()}: device_map put layers on {off_gpu}"
        )
    return placed


def _prepare(
    model: PreTrainedModel, config: TrainerConfig, precision: ResolvedPrecision, plan: MemoryPlan
) -> PreTrainedModel:
    """Norms and head in float32, the k-bit preparation, gradient checkpointing on the layers the
    plan recomputes (`activations`), no KV cache."""
    from peft import prepare_model_for_kbit_training

    spec = config.spec
    if precision == "fp32":
        cast_to_fp32(model)
    layers = len(activations.decoder_layers(model))
    layout = activations.chosen(spec, plan.layers, layers)
    checkpointing = layout.recomputed(layers) > 0
    if spec.quantization.type != "none":
        # peft 0.21 leaves prepare_model_for_kbit_training unannotated.
        model = prepare_model_for_kbit_training(  # type: ignore[no-untyped-call]
            model,
            use_gradient_checkpointing=checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False},
        )
    elif checkpointing:
        # transformers 5 leaves these two unannotated.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # type: ignore[no-untyped-call]
        model.enable_input_require_grads()  # type: ignore[no-untyped-call]
    activations.apply(model, layout)
    # Activation checkpointing recomputes layers; a KV cache has no use in training.
    model.config.use_cache = False
    return model


def _adapt(model: PreTrainedModel, config: TrainerConfig, seed: int) -> nn.Module:
    """PEFT LoRA on `model`, initialised alike on every rank."""
    from peft import LoraConfig, get_peft_model

    spec = config.spec
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
        streamed = any(p.is_meta for p in model.parameters())
        with adapter_on_host() if streamed else nullcontext():
            adapted: nn.Module = get_peft_model(model, lora)
    except ValueError as exc:
        raise TrainerFailure(ExitReason.InvalidConfig, f"spec.lora.targetModules: {str(exc).splitlines()[0]}") from None
    return adapted


def load_model(
    config: TrainerConfig,
    hardware: Hardware,
    precision: ResolvedPrecision,
    attention: Attention,
    plan: MemoryPlan,
    *,
    mode: Mode,
    device: torch.device,
    seed: int = 0,
) -> nn.Module:
    """The base model placed as `mode` says, prepared for k-bit training, with LoRA on it."""
    kwargs = _load_kwargs(
        config, hardware, precision=precision, attention=attention, plan=plan, mode=mode, device=device
    )
    model = _streamed(config, kwargs, mode, device, plan) if mode.streams else None
    if model is not None:
        placed = {"streamed"}
    else:
        model = _from_pretrained(config, hardware, kwargs, mode, device)
        placed = _placement(model, hardware, kwargs["device_map"], mode)
        # from_pretrained reads every tensor of the files (a folder's, or the Hub cache's).
        mode.bytes_read = size_of(checkpoint_files(config))
    adapted = _adapt(_prepare(model, config, precision, plan), config, seed)
    trainable = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    total = sum(p.numel() for p in adapted.parameters())
    log.info("model loaded: %s trainable of %s parameters, placement %s", trainable, total, placed or {"cpu"})
    return adapted
