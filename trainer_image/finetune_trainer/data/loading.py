"""From the configured source to checked `datasets.Dataset`s, or InvalidData naming every bad line."""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from finetune_api.contract import hub_token_env
from finetune_api.objectives.grpo import GRPO, GrpoSpec
from finetune_api.reasons import ExitReason
from finetune_api.spec import DatasetSource, HubDatasetSource
from finetune_api.trainer_config import TrainerConfig

from ..failures import TrainerFailure
from .checks import DataReport, check_records
from .records import DataSourceError, Record, read_records

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

MAX_PROBLEMS_IN_MESSAGE = 10


def _source(config: TrainerConfig, held_out: bool) -> tuple[str, DatasetSource, str]:
    """The field, the source and the path of the training data, or of the held-out source
    (`spec.dataset.eval`) with `held_out`."""
    dataset = config.spec.dataset
    if not held_out:
        return "spec.dataset", dataset.source, config.paths.dataset
    if dataset.eval is None or not config.paths.eval_dataset:
        raise TrainerFailure(ExitReason.InvalidConfig, "spec.dataset.eval: the trainer was given no path for it")
    return "spec.dataset.eval", dataset.eval, config.paths.eval_dataset


def _hub_records(config: TrainerConfig, hub: HubDatasetSource, held_out: bool) -> Iterator[Record]:
    from datasets import load_dataset

    named = hub_token_env(config.spec, "eval") if held_out else None
    own = os.environ.get(named) if named else None
    token = own or os.environ.get("HF_DATASET_TOKEN") or os.environ.get("HF_TOKEN")
    data = load_dataset(hub.id, revision=hub.revision, split=hub.split, token=token, cache_dir=config.paths.cache)
    for number, value in enumerate(data, start=1):
        yield Record(f"row {number}", value)


def records_for(config: TrainerConfig, held_out: bool = False) -> Iterator[Record]:
    _, source, path = _source(config, held_out)
    if source.hub is not None:
        return _hub_records(config, source.hub, held_out)
    return read_records(Path(path))


def _completion_length(config: TrainerConfig) -> int | None:
    """The tokens a prompt leaves its completion (GRPO's maxCompletionLength); None for the
    methods that sample nothing."""
    training = config.spec.training
    return training.settings_of(GrpoSpec).max_completion_length if training.method == GRPO.name else None


def check_dataset(
    config: TrainerConfig,
    tokenizer: PreTrainedTokenizerBase | None,
    model_config: PretrainedConfig | None,
    held_out: bool = False,
) -> DataReport:
    """The check pass (without a tokenizer, in the CPU input check: the records alone); raises
    InvalidData with the first problems, after logging all of them. `held_out`: the held-out
    source (spec.dataset.eval), checked as the training data is."""
    spec = config.spec
    field, _, path = _source(config, held_out)
    try:
        report = check_records(
            records_for(config, held_out),
            spec.dataset.format,
            tokenizer=tokenizer,
            model_config=model_config,
            max_length=spec.training.max_length,
            packing=spec.training.packing,
            train_on=spec.dataset.train_on,
            max_completion_length=_completion_length(config),
        )
    except DataSourceError as exc:
        raise TrainerFailure(ExitReason.InvalidData, f"{field}: {exc}") from None
    for warning in report.warnings:
        log.warning("data: %s", warning)
    if report.problems:
        for problem in report.problems:
            log.error("data: %s", problem)
        shown = "; ".join(str(p) for p in report.problems[:MAX_PROBLEMS_IN_MESSAGE])
        more = len(report.problems) - MAX_PROBLEMS_IN_MESSAGE
        raise TrainerFailure(
            ExitReason.InvalidData,
            f"{len(report.problems)} problem(s) in {path}: {shown}" + (f"; and {more} more" if more > 0 else ""),
        )
    if tokenizer is None:  # the pre-flight's check (input_check.py): records only, as check-data without --tokenizer
        log.info("data: %d records, %d samples well formed", report.total, len(report.samples))
        return report
    log.info(
        "data%s: %d records, %d samples ready: %d tokens, %d trained",
        " (held out)" if held_out else "",
        report.total,
        len(report.samples),
        report.tokens,
        report.trained_tokens,
    )
    return report


def split(
    samples: list[dict[str, Any]],
    eval_fraction: float | None,
    seed: int,
    held_out: list[dict[str, Any]] | None = None,
) -> tuple[Any, Any]:
    """(train, eval) Datasets; eval is None without evalFraction or a held-out source. The split
    is seeded, so a resume sees the same one; a held-out source (`held_out`, spec.dataset.eval)
    is the eval set whole, and every sample of the training data trains."""
    from datasets import Dataset

    if held_out is not None:
        return Dataset.from_list(samples), Dataset.from_list(held_out)
    if not eval_fraction:
        return Dataset.from_list(samples), None
    order = list(range(len(samples)))
    random.Random(seed).shuffle(order)
    held = max(1, round(len(samples) * eval_fraction))
    if held >= len(samples):
        raise TrainerFailure(
            ExitReason.InvalidData,
            f"spec.dataset.evalFraction {eval_fraction} leaves no training samples out of {len(samples)}",
        )
    eval_ids = set(order[:held])
    train = [s for i, s in enumerate(samples) if i not in eval_ids]
    held_out = [samples[i] for i in sorted(eval_ids)]
    return Dataset.from_list(train), Dataset.from_list(held_out)
