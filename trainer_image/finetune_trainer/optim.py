"""The adapter's optimizer and learning-rate schedule, by the spec's names.

The names are Hugging Face's `optim` values, so a spec reads the same as a TrainingArguments
user expects; the 8-bit and paged ones are bitsandbytes' (8-bit state needs sm_60+, which a
P40 has; on the CPU bitsandbytes runs them too).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from finetune_api.spec import TrainingSpec

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
# cosine_with_min_lr decays to this fraction of the peak, not to zero.
MIN_LR_RATE = 0.1


def make_optimizer(training: TrainingSpec, params: Sequence[torch.nn.Parameter]) -> torch.optim.Optimizer:
    name, lr, decay = training.optimizer, training.learning_rate, training.weight_decay
    groups: Any = [{"params": list(params)}]
    if name in ("paged_adamw_8bit", "paged_adamw_32bit", "adamw_8bit"):
        from bitsandbytes.optim.adamw import AdamW8bit, PagedAdamW8bit, PagedAdamW32bit

        kinds: dict[str, Any] = {
            "paged_adamw_8bit": PagedAdamW8bit,
            "paged_adamw_32bit": PagedAdamW32bit,
            "adamw_8bit": AdamW8bit,
        }
        optimizer: torch.optim.Optimizer = kinds[name](
            groups, lr=lr, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=decay
        )
        return optimizer
    if name == "adamw_torch":
        return torch.optim.AdamW(groups, lr=lr, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=decay)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        adafactor: torch.optim.Optimizer = Adafactor(  # type: ignore[no-untyped-call]
            groups, lr=lr, weight_decay=decay, scale_parameter=False, relative_step=False, warmup_init=False
        )
        return adafactor
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, weight_decay=decay)
    raise ValueError(f"spec.training.optimizer: unknown optimizer {name!r}")


def warmup_steps(training: TrainingSpec, total_steps: int) -> int:
    return math.ceil(training.warmup_ratio * total_steps)


def make_scheduler(training: TrainingSpec, optimizer: torch.optim.Optimizer, total_steps: int) -> Any:
    from transformers import get_scheduler

    extra = {"min_lr_rate": MIN_LR_RATE} if training.lr_scheduler == "cosine_with_min_lr" else None
    return get_scheduler(
        training.lr_scheduler,
        optimizer,
        num_warmup_steps=warmup_steps(training, total_steps),
        num_training_steps=total_steps,
        scheduler_specific_kwargs=extra,
    )
