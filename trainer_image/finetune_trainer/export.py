"""End-of-run artefacts: the adapter, the optional merged model, `summary.json` — each written atomically."""

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from finetune_api.contract import (
    ADAPTER_DIR,
    GGUF_ADAPTER_TYPE,
    MERGED_DIR,
    gguf_adapter_file,
    gguf_base_file,
    gguf_merged_file,
    public_model_name,
)
from finetune_api.trainer_config import TrainerConfig

from .gguf_export import convert_lora, convert_model
from .merge_stream import merge_folder

log = logging.getLogger(__name__)

SUMMARY_FILE = "summary.json"
# The merged folder the merged GGUF is converted from when `merged` itself was not asked for.
MERGED_FOR_GGUF = ".merged-for-gguf"


def write_atomically(final: Path, writer: Callable[[Path], None]) -> Path:
    """Write a folder under a temporary name, then swap it in: readers never see half of it."""
    temp = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir(parents=True)
    writer(temp)
    for folder, _, files in os.walk(temp):
        for name in files:
            fd = os.open(Path(folder) / name, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
    old = final.with_name(f".{final.name}.old")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    temp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final


ADAPTER_CONFIG = "adapter_config.json"


def config_name(model: str) -> str | None:
    """The `_name_or_path` the checkpoint's own config.json carries (AutoConfig replaces it with
    the folder it loaded from, so the file is read as it is); None for a hub id or no such key."""
    path = Path(model) / "config.json"
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None


def public_name(config: TrainerConfig) -> str:
    """What the adapter names as its base: the model's public name, not the pod's folder."""
    model = config.paths.model
    return public_model_name(config.spec, config_name(model), model)


def name_base(folder: Path, base: str) -> None:
    """PEFT writes the folder the pod loaded from; vLLM's resolver matches the served model's name."""
    path = folder / ADAPTER_CONFIG
    body = json.loads(path.read_text(encoding="utf-8"))
    body["base_model_name_or_path"] = base
    path.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def save_adapter(adapter: Any, tokenizer: Any, output: Path, base: str | None = None) -> Path:
    """PEFT's layout (adapter_config.json + adapter_model.safetensors) plus the tokenizer; the
    config names `base` as the base model when given."""

    def write(folder: Path) -> None:
        adapter.save(folder)
        if base is not None:
            name_base(folder, base)
        tokenizer.save_pretrained(str(folder))

    return write_atomically(output / ADAPTER_DIR, write)


def base_folder(config: TrainerConfig) -> Path:
    """The folder of the base's safetensors: the PVC folder, or the hub snapshot in the cache."""
    from .model_loading import checkpoint_files

    files = checkpoint_files(config)
    if not files:
        raise ValueError(f"spec.model: no safetensors files found for {config.paths.model} to merge into")
    return files[0].parent


def save_merged(config: TrainerConfig, adapter: Path, tokenizer: Any, output: Path, name: str = MERGED_DIR) -> Path:
    """The base with the adapter added, streamed shard by shard (merge_stream.py): the host holds
    one shard and one layer, never the whole base, so the pod that trained can merge."""
    base = base_folder(config)

    def write(folder: Path) -> None:
        changed = merge_folder(base, adapter, folder)
        log.info("merged the adapter into %d weights of %s", len(changed), base)
        tokenizer.save_pretrained(str(folder))

    return write_atomically(output / name, write)


def _atomic_file(final: Path, writer: Callable[[Path], object]) -> Path:
    """Write a file under a temporary name, then rename it: a reader never sees half a GGUF."""
    final.parent.mkdir(parents=True, exist_ok=True)
    temp = final.with_name(f".{final.name}.tmp")
    temp.unlink(missing_ok=True)
    writer(temp)
    temp.rename(final)
    return final


def save_formats(config: TrainerConfig, adapter: Path, tokenizer: Any, output: Path) -> dict[str, Path]:
    """Every format of spec.output.formats from the saved adapter: merged (streamed), the GGUF base
    and LoRA, the merged GGUF (converted from the streamed merge's folder, which is removed again
    when merged itself was not asked for). Returns what was written by format."""
    out = config.spec.output
    written: dict[str, Path] = {"peft": adapter}
    if written.keys() >= set(out.written):
        return written
    base = base_folder(config)
    kind = out.gguf_type
    if "merged" in out.written:
        written["merged"] = save_merged(config, adapter, tokenizer, output)
    if "gguf-lora" in out.written:
        _atomic_file(output / gguf_base_file(kind), lambda temp: convert_model(base, temp, kind))
        lora = output / gguf_adapter_file()
        written["gguf-lora"] = _atomic_file(lora, lambda temp: convert_lora(adapter, base, temp, GGUF_ADAPTER_TYPE))
    if "gguf" in out.written:
        merged = written.get("merged") or save_merged(config, adapter, tokenizer, output, MERGED_FOR_GGUF)
        target = output / gguf_merged_file(kind)
        written["gguf"] = _atomic_file(target, lambda temp: convert_model(merged, temp, kind))
        if "merged" not in written:
            shutil.rmtree(merged, ignore_errors=True)
    return written


def write_summary(output: Path, summary: dict[str, Any]) -> Path:
    path = output / SUMMARY_FILE
    temp = path.with_name(f".{SUMMARY_FILE}.tmp")
    temp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    with temp.open("rb") as handle:
        os.fsync(handle.fileno())
    temp.rename(path)
    return path
