"""End-of-run artefacts: the adapter, the optional merged model, `summary.json` — each written atomically."""

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from finetune_api.contract import ADAPTER_DIR, MERGED_DIR
from finetune_api.trainer_config import TrainerConfig

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


def save_adapter(adapter: Any, tokenizer: Any, output: Path) -> Path:
    """PEFT's layout (adapter_config.json + adapter_model.safetensors) plus the tokenizer."""

    def write(folder: Path) -> None:
        adapter.save(folder)
        tokenizer.save_pretrained(str(folder))

    return write_atomically(output / ADAPTER_DIR, write)


def save_merged(config: TrainerConfig, adapter: Path, tokenizer: Any, output: Path) -> Path:
    """Base model in its own dtype (not quantised) plus the adapter, merged; on the CPU.

    Merging into 4-bit weights would round the adapter away, so the base is loaded unquantised
    in the checkpoint's dtype, on the CPU so GPU memory plays no part.
    """
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(config.paths.model, dtype="auto", device_map={"": "cpu"})
    merged = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    del base
    torch.set_grad_enabled(True)

    def write(folder: Path) -> None:
        merged.save_pretrained(str(folder), safe_serialization=True)
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
