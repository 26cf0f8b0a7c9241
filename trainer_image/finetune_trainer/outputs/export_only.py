"""`--export-only`: the output formats again, from the adapter a finished run saved, without
training (`ftjob export NAME`, e.g. once llama.cpp's converter takes the model, or after an
export that failed). On the CPU: the formats read the adapter folder and the base's files.

The adapter folder holds the tokenizer the run saved with it; the formats' checks run first, as
before training; the summary's `formats` and `exportFailures` are brought up to date. A format
that still cannot be written fails the run in one line naming it (InvalidConfig: the same input
fails again), with the adapter and what was written untouched.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from finetune_api.formats import ALWAYS
from finetune_api.layout import ADAPTER_DIR
from finetune_api.reasons import ExitReason
from finetune_api.trainer_config import TrainerConfig

from ..failures import TrainerFailure
from .checks import check_formats
from .export import ADAPTER_CONFIG, SUMMARY_FILE, save_formats, write_summary

log = logging.getLogger(__name__)


def _asked(config: TrainerConfig, only: Sequence[str]) -> list[str]:
    written = config.spec.output.written
    unknown = [name for name in only if name not in written]
    if unknown:
        raise TrainerFailure(
            ExitReason.InvalidConfig,
            f"--formats: {', '.join(unknown)}: not among the job's formats ({', '.join(written)})",
        )
    return [name for name in written if name != ALWAYS and (not only or name in only)]


def _recorded(output: Path) -> dict[str, Any]:
    try:
        found = json.loads((output / SUMMARY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def export_again(config: TrainerConfig, only: Sequence[str] = ()) -> dict[str, Any]:
    """Write the job's formats (or `only` those) from its saved adapter; what was written, by format."""
    from transformers import AutoTokenizer

    output = Path(config.paths.output)
    adapter = output / ADAPTER_DIR
    if not (adapter / ADAPTER_CONFIG).is_file():
        raise TrainerFailure(
            ExitReason.InvalidConfig, f"spec.output: {adapter}: no adapter to export (has the job finished training?)"
        )
    asked = _asked(config, only)
    check_formats(config)
    tokenizer = AutoTokenizer.from_pretrained(str(adapter))
    exported = save_formats(config, adapter, tokenizer, output, only=asked)
    # summary.json as the run wrote it, brought up to date (a file's record, not a plan's summary).
    record = _recorded(output)
    failures = {k: v for k, v in (record.get("exportFailures") or {}).items() if k not in asked}
    failures.update(exported.failed)
    formats = {**(record.get("formats") or {}), **{name: str(path) for name, path in exported.written.items()}}
    record.update(formats=formats, exportFailures=failures or None)
    if "merged" in exported.written:
        record["mergedPath"] = str(exported.written["merged"])
    write_summary(output, record)
    if exported.failed:
        said = "; ".join(f"{name}: {cause}" for name, cause in exported.failed.items())
        raise TrainerFailure(ExitReason.InvalidConfig, f"spec.output.formats: {said}")
    return {name: str(exported.written[name]) for name in asked}
