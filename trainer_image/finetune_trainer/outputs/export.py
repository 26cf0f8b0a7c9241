"""End-of-run artefacts: the adapter, the formats of spec.output.formats (each by its registry
entry's exporter, finetune_api.formats), `summary.json` — each written atomically."""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from finetune_api.contract import public_model_name
from finetune_api.formats import ALWAYS, FORMATS, FormatError
from finetune_api.layout import (
    ADAPTER_DIR,
    GGUF_ADAPTER_TYPE,
    MERGED_DIR,
    gguf_adapter_file,
    gguf_base_file,
    gguf_merged_file,
)
from finetune_api.registry import load
from finetune_api.trainer_config import TrainerConfig

from .. import faults
from .gguf_export import convert_lora, convert_model
from .merge_stream import merge_folder

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

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


def save_adapter(adapter: Any, tokenizer: PreTrainedTokenizerBase, output: Path, base: str | None = None) -> Path:
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
    from ..model.loading import checkpoint_files

    files = checkpoint_files(config)
    if not files:
        raise ValueError(f"spec.model: no safetensors files found for {config.paths.model} to merge into")
    return files[0].parent


def save_merged(
    config: TrainerConfig, adapter: Path, tokenizer: PreTrainedTokenizerBase, output: Path, name: str = MERGED_DIR
) -> Path:
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


class Export:
    """What an exporter reads: the job's config, the saved adapter folder, the tokenizer, the output
    folder and what was written before it (`written`, by format). The base's folder and the merged
    folder are found or made once for every format that needs them; a merged folder made only for
    another format is removed by `close`."""

    def __init__(self, config: TrainerConfig, adapter: Path, tokenizer: PreTrainedTokenizerBase, output: Path) -> None:
        self.config, self.adapter, self.tokenizer, self.output = config, adapter, tokenizer, output
        self.written: dict[str, Path] = {ALWAYS: adapter}
        self._base: Path | None = None
        self._scratch: Path | None = None

    def base(self) -> Path:
        if self._base is None:
            self._base = base_folder(self.config)
        return self._base

    def merged(self) -> Path:
        """The merged folder: the merged format's, else one made for the formats that read it."""
        if "merged" in self.written:
            return self.written["merged"]
        if self._scratch is None:
            self._scratch = save_merged(self.config, self.adapter, self.tokenizer, self.output, MERGED_FOR_GGUF)
        return self._scratch

    def close(self) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None


def export_merged(export: Export) -> Path:
    return save_merged(export.config, export.adapter, export.tokenizer, export.output)


def export_gguf_lora(export: Export) -> Path:
    """The base as GGUF of ggufType, then the adapter as a GGUF LoRA beside it."""
    kind, base, adapter = export.config.spec.output.gguf_type, export.base(), export.adapter
    _atomic_file(export.output / gguf_base_file(kind), lambda temp: convert_model(base, temp, kind))
    lora = export.output / gguf_adapter_file()
    return _atomic_file(lora, lambda temp: convert_lora(adapter, base, temp, GGUF_ADAPTER_TYPE))


def export_gguf(export: Export) -> Path:
    """The merged model (the streamed merge's folder) as one GGUF of ggufType."""
    kind, merged = export.config.spec.output.gguf_type, export.merged()
    return _atomic_file(export.output / gguf_merged_file(kind), lambda temp: convert_model(merged, temp, kind))


@dataclass(frozen=True)
class Exported:
    written: dict[str, Path]  # by format, peft (the adapter) first
    failed: dict[str, str]  # the formats that could not be written, and why (one line each)


def _cause(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if isinstance(exc, FormatError) else f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def save_formats(
    config: TrainerConfig,
    adapter: Path,
    tokenizer: PreTrainedTokenizerBase,
    output: Path,
    only: Sequence[str] | None = None,
) -> Exported:
    """Every written format (spec.output.formats, or `only` of them) from the saved adapter, each by
    its registry entry's exporter, in the registry's order. One that fails is said and skipped: the
    adapter and the checkpoints stay, the other formats are still written, and `ftjob export` can
    write it again once its cause is mended."""
    export = Export(config, adapter, tokenizer, output)
    failed: dict[str, str] = {}
    try:
        for name in config.spec.output.written:
            fmt = FORMATS.get(name)
            if fmt.exporter is None or (only is not None and name not in only):
                continue
            try:
                faults.current().before_export(name)
                export.written[name] = load(fmt.exporter)(export)
            except Exception as exc:  # any exporter's failure leaves the trained adapter standing
                if not isinstance(exc, FormatError):
                    log.exception("exporting %s", name)
                failed[name] = _cause(exc)
                log.error("%s: not written: %s", name, failed[name])
    finally:
        export.close()
    return Exported(export.written, failed)


def write_summary(output: Path, summary: dict[str, Any]) -> Path:
    path = output / SUMMARY_FILE
    temp = path.with_name(f".{SUMMARY_FILE}.tmp")
    temp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    with temp.open("rb") as handle:
        os.fsync(handle.fileno())
    temp.rename(path)
    return path


def export_failures(output: Path, since: float) -> dict[str, str]:
    """The formats the summary written since `since` (a run's start) says were not written."""
    path = output / SUMMARY_FILE
    try:
        if path.stat().st_mtime < since:
            return {}
        failed = json.loads(path.read_text(encoding="utf-8")).get("exportFailures")
    except (OSError, ValueError, AttributeError):
        return {}
    return {str(k): str(v) for k, v in failed.items()} if isinstance(failed, dict) else {}
