"""End-of-run artefacts: the adapter, the optional merged model, `summary.json` — each written atomically."""

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from finetune_api.contract import ADAPTER_DIR, MERGED_DIR, public_model_name
from finetune_api.trainer_config import TrainerConfig

from .merge_stream import merge_folder

log = logging.getLogger(__name__)

SUMMARY_FILE = "summary.json"


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


def save_merged(config: TrainerConfig, adapter: Path, tokenizer: Any, output: Path) -> Path:
    """The base with the adapter added, streamed shard by shard (merge_stream.py): the host holds
    one shard and one layer, never the whole base, so the pod that trained can merge."""
    base = base_folder(config)

    def write(folder: Path) -> None:
        changed = merge_folder(base, adapter, folder)
        log.info("merged the adapter into %d weights of %s", len(changed), base)
        tokenizer.save_pretrained(str(folder))

    return write_atomically(output / MERGED_DIR, write)


def write_summary(output: Path, summary: dict[str, Any]) -> Path:
    path = output / SUMMARY_FILE
    temp = path.with_name(f".{SUMMARY_FILE}.tmp")
    temp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    with temp.open("rb") as handle:
        os.fsync(handle.fileno())
    temp.rename(path)
    return path
