"""The trainer's side of the training objectives (`training.method`, finetune_api.objectives).

An objective's entry names its implementation here by `module:Class`: a `TrainingObjective`,
which turns checked samples into rows, rows into a micro-batch, a micro-batch into the summed
loss the loop scales and backpropagates, and a finished step into its own progress figures.
Everything else (modes, checkpoints, the schedule, the gradient sum) is the same for every
objective.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from finetune_api.objectives import OBJECTIVES, Objective
from finetune_api.registry import load
from finetune_api.spec import FineTuneJobSpec

from ..data.batches import Row
from ..loss_head import LossHead


class TrainingObjective:
    """What an objective does in the trainer; a subclass overrides what differs from these."""

    def __init__(self, entry: Objective) -> None:
        self.entry = entry

    def rows(self, samples: Sequence[dict[str, Any]], tokenizer: Any, spec: FineTuneJobSpec) -> list[Row]:
        raise NotImplementedError

    def collate(self, rows: Sequence[Row], pad_id: int, device: torch.device, packed: bool) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def loss_sum(self, model: nn.Module, head: LossHead, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The micro-batch's loss summed over its targets (the loop divides by the step's count)."""
        raise NotImplementedError

    def step_metrics(self, loss: float, trained: int) -> dict[str, float]:
        """Figures of a finished step beside the loss, for the progress line and TensorBoard."""
        return {}


def for_spec(spec: FineTuneJobSpec) -> TrainingObjective:
    """The objective `spec.training.method` names, as its entry's implementation."""
    entry = OBJECTIVES.get(spec.training.method)
    implementation = load(entry.trainer)
    objective = implementation(entry)
    assert isinstance(objective, TrainingObjective), entry.trainer
    return objective
