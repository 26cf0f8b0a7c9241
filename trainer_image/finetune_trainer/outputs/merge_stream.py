"""The adapter merged into the base, streamed shard by shard from the base's safetensors.

Loading the whole base unquantised to merge it (PEFT's `merge_and_unload`) needs the model's
full size in host memory: 140 GB for a 70B model in bf16, far more than a pod planned for
QLoRA holds. Here each shard of the checkpoint is read through safetensors' memory map one
tensor at a time; a weight with a LoRA pair gets `scale * B @ A` added (in fp32, then cast back
to the weight's dtype) and the shard is written out before the next one is read. What the
process holds is one output shard plus one layer's fp32 delta; the mapped input pages belong to
the page cache and are dropped as needed.

The result is what `merge_and_unload` writes (same names, dtypes and shard layout), so every
reader of a Hugging Face folder, and llama.cpp's converter for the merged GGUF, takes it.
"""

from __future__ import annotations

import gc
import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..modes.checkpoint_files import files_of

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
# PEFT prefixes the base model's names with these in the adapter file.
PEFT_PREFIX = "base_model.model."
# Everything of a model folder but its weights, copied as they are.
SKIP_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


@dataclass(frozen=True)
class LoraPair:
    a: torch.Tensor  # r x in
    b: torch.Tensor  # out x r
    scale: float
    fan_in_fan_out: bool

    def delta(self) -> torch.Tensor:
        delta = (self.b.to(torch.float32) @ self.a.to(torch.float32)) * self.scale
        return delta.T if self.fan_in_fan_out else delta


def _pattern(patterns: object, module: str, default: float) -> float:
    """PEFT's per-module rank_pattern / alpha_pattern: the value of a key the module name ends with."""
    if isinstance(patterns, dict):
        for pattern, value in patterns.items():
            if module == pattern or module.endswith(f".{pattern}"):
                return float(value)
    return default


def _scale(config: dict[str, Any], module: str) -> float:
    """PEFT's scaling: alpha / r, alpha / sqrt(r) with rsLoRA."""
    rank = _pattern(config.get("rank_pattern"), module, float(config.get("r") or 8))
    alpha = _pattern(config.get("alpha_pattern"), module, float(config.get("lora_alpha") or rank))
    return alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)


def read_adapter(folder: Path) -> dict[str, LoraPair]:
    """The adapter's LoRA pairs by the base weight they change (`model.layers.0...q_proj.weight`)."""
    from safetensors.torch import load_file

    config = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    if config.get("use_dora"):
        raise ValueError("a DoRA adapter cannot be merged by the streamed merge")
    tensors = load_file(str(folder / ADAPTER_WEIGHTS))
    pairs: dict[str, LoraPair] = {}
    for name, a in tensors.items():
        if ".lora_A." not in name:
            continue
        module = name.split(".lora_A.")[0]
        b = tensors[name.replace(".lora_A.", ".lora_B.")]
        target = module.removeprefix(PEFT_PREFIX) + ".weight"
        pairs[target] = LoraPair(a, b, _scale(config, module), bool(config.get("fan_in_fan_out")))
    return pairs


def _shards(base: Path) -> list[str]:
    files = files_of(base)
    if not files:
        raise ValueError(f"{base}: no safetensors files to merge into")
    return [f.name for f in files]


def _merge_shard(source: Path, target: Path, pairs: dict[str, LoraPair], merged: set[str]) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    out: dict[str, torch.Tensor] = {}
    with safe_open(str(source), framework="pt") as handle:
        metadata = handle.metadata() or {"format": "pt"}
        for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
            tensor = handle.get_tensor(name)
            pair = pairs.get(name)
            if pair is not None:
                tensor = (tensor.to(torch.float32) + pair.delta()).to(tensor.dtype)
                merged.add(name)
            out[name] = tensor
    save_file(out, str(target), metadata=metadata)
    del out
    gc.collect()


def merge_folder(base: Path, adapter: Path, output: Path) -> list[str]:
    """Write base + adapter into `output` shard by shard; returns the weights that changed.
    Raises ValueError when an adapter pair names a weight the base lacks."""
    pairs = read_adapter(adapter)
    output.mkdir(parents=True, exist_ok=True)
    for item in base.iterdir():
        if item.is_file() and not item.name.endswith(SKIP_SUFFIXES):
            shutil.copyfile(item, output / item.name)
    merged: set[str] = set()
    for shard in _shards(base):
        _merge_shard(base / shard, output / shard, pairs, merged)
    missing = sorted(set(pairs) - merged)
    if missing:
        raise ValueError(f"the base has no weight {missing[0]} for the adapter ({len(missing)} missing)")
    return sorted(merged)
