"""The adapter's optimizer and learning-rate schedule, by the spec's names: the optimizer from its
registry entry (finetune_api.optimizers), whose factory is one of the functions below.

The names are Hugging Face's `optim` values, so a spec reads the same as a TrainingArguments
user expects; the 8-bit and paged ones are bitsandbytes' (8-bit state needs sm_60+, which a
P40 has; on the CPU bitsandbytes runs them too).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch.optim.lr_scheduler import LRScheduler
from torch.optim.optimizer import ParamsT

from finetune_api.optimizers import OPTIMIZERS
from finetune_api.registry import load
from finetune_api.spec import TrainingSpec

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
# cosine_with_min_lr decays to this fraction of the peak, not to zero.
MIN_LR_RATE = 0.1


def make_optimizer(training: TrainingSpec, params: Sequence[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The optimizer `training.optimizer` names, by its registry entry's factory."""
    factory = load(OPTIMIZERS.get(training.optimizer).factory)
    optimizer: torch.optim.Optimizer = factory(training, [{"params": list(params)}])
    return optimizer


# The factories the built-in entries name (finetune_api.optimizers): (training, groups) -> optimizer.


def _bitsandbytes(kind: str, training: TrainingSpec, groups: ParamsT) -> torch.optim.Optimizer:
    from bitsandbytes.optim import adamw

    optimizer: torch.optim.Optimizer = getattr(adamw, kind)(
        groups, lr=training.learning_rate, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=training.weight_decay
    )
    return optimizer


def paged_adamw_8bit(training: TrainingSpec, groups: ParamsT) -> torch.optim.Optimizer:
    return _bitsandbytes("PagedAdamW8bit", training, groups)


def paged_adamw_32bit(training: TrainingSpec, groups: ParamsT) -> torch.optim.Optimizer:
    return _bitsandbytes("PagedAdamW32bit", training, groups)


def adamw_8bit(training: TrainingSpec, groups: ParamsT) -> torch.optim.Optimizer:
    return _bitsandbytes("AdamW8bit", training, groups)


def adamw_torch(training: TrainingSpec, groups: ParamsT) -> torch.optim.Optimizer:
    lr, decay = training.learning_rate, training.weight_decay
    return torch.optim.AdamW(groups, lr=lr, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=decay)


def adafactor(training: TrainingSpec, groups: ParamsT) -> torch.optim.Optimizer:
    from transformers.optimization import Adafactor

    # transformers 5 leaves Adafactor.__init__ unannotated.
    optimizer: torch.optim.Optimizer = Adafactor(  # type: ignore[no-untyped-call]
        groups,
        lr=training.learning_rate,
        weight_decay=training.weight_decay,
        scale_parameter=False,
        relative_step=False,
        warmup_init=False,
    )
    return optimizer


def sgd(training: TrainingSpec, groups: ParamsT) -> torch.optim.Optimizer:
    return torch.optim.SGD(groups, lr=training.learning_rate, weight_decay=training.weight_decay)


def warmup_steps(training: TrainingSpec, total_steps: int) -> int:
    return math.ceil(training.warmup_ratio * total_steps)


def make_scheduler(training: TrainingSpec, optimizer: torch.optim.Optimizer, total_steps: int) -> LRScheduler:
    from transformers import get_scheduler

    extra = {"min_lr_rate": MIN_LR_RATE} if training.lr_scheduler == "cosine_with_min_lr" else None
    scheduler: LRScheduler = get_scheduler(
        training.lr_scheduler,
        optimizer,
        num_warmup_steps=warmup_steps(training, total_steps),
        num_training_steps=total_steps,
        scheduler_specific_kwargs=extra,
    )
    return scheduler
