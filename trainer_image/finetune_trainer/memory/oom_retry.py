"""An attempt that runs out of GPU memory: retried once, one notch tighter, then final.

The rank that runs out says where (the step) and how far it got (its measured peak against the
plan's figure for its GPU) in an OutOfMemory failure (`at_step`). The pod's command, which made
the launch decision, settles it (`settle`): the first time it writes the tighter savers
(`finetune_plan.tighter`) to RECORD on the output volume and exits OutOfMemoryRetry, which the
Job retries without counting an attempt; the next attempt's decision reads RECORD
(`launch_plan.decide_pod`), plans with those savers and resumes from the last checkpoint. Once
RECORD exists the failure is final: OutOfMemory, with the plan and the peak.

A job of several nodes is not retried: its pods each decide their own launch, and one that did
not see the record would train another micro-batch than its peers.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import asdict
from pathlib import Path

from finetune_api.reasons import ExitReason
from finetune_api.trainer_config import TrainerConfig
from finetune_plan.tighter import Savers, tighter

from ..failures import TrainerFailure

log = logging.getLogger(__name__)

# In the job's output folder, next to `checkpoints/`: present once the one retry is decided.
RECORD = "oom-retry.json"
ADVICE = "lower spec.training.maxLength or batchSize, or add GPUs"


def at_step(where: str, peak_gib: float, planned_gib: float | None, device: str, detail: str) -> str:
    """A rank's account of its OOM, e.g. `at step 4 (peak 21.2 GiB of plan 21.9 GiB on cuda:0):
    CUDA out of memory. Tried to allocate 1.00 GiB`. On the CPU the peak is host memory."""
    if planned_gib is None:
        peak = f"peak {peak_gib:.2f} GiB of host memory; no GPU plan on the CPU"
    else:
        peak = f"peak {peak_gib:.2f} GiB of plan {planned_gib:.2f} GiB on {device}"
    return f"{where} ({peak}): {detail}"


def _training(config: TrainerConfig) -> dict[str, object]:
    """The spec's own settings a record tightens: a record made for others is not this job's
    (a FineTuneJob made again, with other settings, on the same output folder)."""
    training = config.spec.training
    return {
        "batchSize": training.batch_size,
        "gradientAccumulation": training.gradient_accumulation,
        "gradientCheckpointing": training.gradient_checkpointing,
    }


def _read(config: TrainerConfig) -> tuple[bool, Savers | None]:
    """(whether the retry is spent, its savers): a record for other settings spends nothing, an
    unreadable one spends the retry without a plan (so an OOM cannot loop on it)."""
    path = Path(config.paths.output) / RECORD
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if raw.get("training") != _training(config):
            log.warning("%s was written for other training settings; ignored", path)
            return False, None
        return True, Savers(**raw["savers"])
    except FileNotFoundError:
        return False, None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("%s is unreadable (%s); running the spec's own plan", path, exc)
        return True, None


def recorded(config: TrainerConfig) -> Savers | None:
    """The savers the retry runs with, when an earlier attempt of this job ran out of memory."""
    return _read(config)[1]


def _write(config: TrainerConfig, savers: Savers, message: str) -> bool:
    """The record, whole or not at all (a torn one would read as no retry at all)."""
    output = Path(config.paths.output)
    path = output / RECORD
    staging = path.with_suffix(".tmp")
    record = {"training": _training(config), "savers": asdict(savers), "message": message}
    try:
        output.mkdir(parents=True, exist_ok=True)
        with staging.open("w", encoding="utf-8") as out:
            json.dump(record, out)
            out.flush()
            os.fsync(out.fileno())
        staging.replace(path)
        return True
    except OSError as exc:
        log.error("cannot write %s: %s", path, exc)
        return False


def settle(config: TrainerConfig, ran: Savers, *, retried: bool, message: str) -> TrainerFailure:
    """What the pod ends with after a rank ran out of memory `message` (see `at_step`) with the
    savers `ran`: the one retry, once, else OutOfMemory with the plan and the peak."""
    # The launcher names the rank first (`rank 1: at step 4 ...`): `on rank 1 at step 4 ...`.
    message = re.sub(r"^rank (\d+): ", r"on rank \1 ", message)
    if retried or _read(config)[0]:
        return TrainerFailure(
            ExitReason.OutOfMemory, f"{message}; again on the retry's tighter plan ({ran.describe()}): {ADVICE}"
        )
    plan = f"plan: {ran.describe()}"
    if config.spec.resources.nodes > 1:
        return TrainerFailure(
            ExitReason.OutOfMemory, f"{message} ({plan}); a job of several nodes is not retried: {ADVICE}"
        )
    notch = tighter(ran, dropout=config.spec.lora.dropout > 0)
    if notch is None:
        return TrainerFailure(ExitReason.OutOfMemory, f"{message} ({plan}); no tighter plan keeps the math: {ADVICE}")
    said = f"OutOfMemory {message}: retrying once with a tighter plan: {notch.describe()}"
    if not _write(config, notch, said):
        return TrainerFailure(ExitReason.OutOfMemory, f"{message} ({plan}); the retry could not be recorded: {ADVICE}")
    return TrainerFailure(ExitReason.OutOfMemoryRetry, said)
