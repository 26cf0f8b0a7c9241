"""The optimizers `training.optimizer` names: one entry per optimizer, one module per kind.

An entry holds what each part needs of it: the name (the spec's choice, Hugging Face's `optim`
value), the state bytes it keeps per trainable parameter (the planner's memory and the
checkpoint's size), and the trainer's factory (`module:function`, called with the training spec
and the adapter's parameter groups). Every module of this package registers its entries when
imported; FINETUNE_PLUGINS adds others (finetune_api.registry).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from finetune_api.registry import Registry


@dataclass(frozen=True)
class Optimizer:
    name: str
    state_bytes_per_param: float  # optimizer state per trainable (FP32) parameter, in bytes
    factory: str  # the trainer's `module:function(training, groups) -> torch.optim.Optimizer`
    description: str
    order: int = 100  # where the spec lists it


OPTIMIZERS: Final[Registry[Optimizer]] = Registry("optimizer", __name__, "spec.training.optimizer")
DEFAULT: Final = "paged_adamw_8bit"


def register(entry: Optimizer) -> Optimizer:
    return OPTIMIZERS.register(entry)
