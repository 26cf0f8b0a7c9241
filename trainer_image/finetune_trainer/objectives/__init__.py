"""The trainer's side of the training objectives (`training.method`, finetune_api.objectives).

An objective's entry names its implementation here by `module:Class`: a `TrainingObjective`,
which turns checked samples into rows, rows into a micro-batch, a micro-batch into the summed
loss the loop scales and backpropagates, and a finished step into its own progress figures.
Everything else (modes, checkpoints, the schedule, the gradient sum) is the same for every
objective.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from finetune_api.objectives import OBJECTIVES, Objective
from finetune_api.registry import load
from finetune_api.spec import FineTuneJobSpec

from ..data.batches import Row
from ..data.tokens import IGNORE
from ..model.loss_head import LossHead

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class TrainingObjective:
    """What an objective does in the trainer; a subclass overrides what differs from these."""

    def __init__(self, entry: Objective) -> None:
        self.entry = entry
        self.sums: list[float] = [0.0] * len(self.figure_names)
        # The plan's pair split (`finetune_plan.pairs`): a row's sequences through the model one
        # forward each, for an objective whose entry names them (`Objective.sequence_names`).
        self.split = False

    # The evaluation's per-example figures (evaluation/measure.py): while a list, `loss_sum` adds
    # one tuple per row of each micro-batch, padding rows too (`example_names` names what each
    # holds; empty: the objective keeps none); None while training, whose path is left as it is.
    examples: list[tuple[float, ...]] | None = None
    example_names: tuple[str, ...] = ()

    def configure(self, spec: FineTuneJobSpec) -> None:
        """Read the objective's own settings from the spec (DPO's `training.dpo`)."""

    # Optimizer steps each step's rows serve (data.batches.Schedule.repeats).
    repeats: int = 1

    def prepare_step(self, step: int, micro: Sequence[tuple[int, Sequence[Any]]], host: Any) -> None:
        """Before optimizer step `step`'s first micro-batch on every rank (`micro`: the rank's
        micro-batches, as the schedule gives them; `host`: the loop): what the step's batches
        need made first (GRPO's rollouts). Nothing for an objective whose data is fixed."""

    def micro_batch(
        self, number: int, rows: Sequence[Any], pad_id: int, device: torch.device, packed: bool
    ) -> dict[str, torch.Tensor]:
        """Global micro-batch `number`'s tensors, of `rows`: `collate`'s for fixed data."""
        return self.collate(rows, pad_id, device, packed)

    def tokens_of(self, rows: Sequence[Any], batch: dict[str, torch.Tensor]) -> int:
        """Tokens micro-batch `batch` put through the model for `rows` (a padding micro-batch's
        rows are not given): what tokensPerSecond counts."""
        return sum(r.tokens for r in rows)

    def trained(self, totals: Sequence[float]) -> float:
        """What the step trained, as progress counts it (`trained_name`): by default the loss's
        denominator, `counts()[0]`."""
        return totals[0]

    def rows(
        self, samples: Sequence[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, spec: FineTuneJobSpec
    ) -> list[Row]:
        raise NotImplementedError

    def collate(self, rows: Sequence[Any], pad_id: int, device: torch.device, packed: bool) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def padding(self, row: Any) -> Any:
        """A row like `row` that adds nothing to the loss: what a rank past the data's end runs
        when every rank must run every forward (fsdp)."""
        assert isinstance(row, Row)
        return Row(row.input_ids, [IGNORE] * len(row.labels), row.position_ids)

    def counts(self, rows: Sequence[Any]) -> list[float]:
        """What the rows add to the step's totals, summed over the ranks before its first
        micro-batch. The first total is what the loss is a mean over (the loop divides each
        micro-batch's `loss_sum` by it); an objective may add others its loss reads."""
        return [float(sum(r.targets for r in rows))]

    def loss_sum(
        self, model: nn.Module, head: LossHead, batch: dict[str, torch.Tensor], totals: Sequence[float]
    ) -> torch.Tensor:
        """The micro-batch's loss summed over its targets (the loop divides by `totals[0]`)."""
        raise NotImplementedError

    # Names of the figures `loss_sum` adds up in `sums` (the loop sums them over the ranks and
    # keeps them in a step stopped part-way); `step_metrics` turns them into the step's figures.
    figure_names: tuple[str, ...] = ()

    def start_step(self, sums: Sequence[float] = ()) -> None:
        self.sums = list(sums) if sums else [0.0] * len(self.figure_names)

    def step_metrics(self, loss: float, trained: int, sums: Sequence[float] = ()) -> dict[str, float]:
        """Figures of a finished step beside the loss, for the progress line and TensorBoard."""
        return {}

    # What the step's first total counts (`counts()[0]`, the loss's denominator), as progress,
    # status and summary.json name the run's sum of it: targets of the loss, or pairs.
    trained_name: str = "trainedTokens"
    # TensorBoard tags of `step_metrics`' figures under train/ (a figure not named: its own name).
    metric_tags: Mapping[str, str] = MappingProxyType({})

    def write_samples(self, step: int, folder: Path) -> None:
        """On rank 0 after a reported step: what the objective shows of that step in the output
        folder (GRPO's completions with their rewards). Nothing by default."""

    def metrics_text(self, metrics: Mapping[str, float]) -> str | None:
        """The step's figures in a few words, for `kubectl get -o wide` and `ftjob status`."""
        return None


def for_spec(spec: FineTuneJobSpec) -> TrainingObjective:
    """The objective `spec.training.method` names, as its entry's implementation."""
    entry = OBJECTIVES.get(spec.training.method)
    implementation = load(entry.trainer)
    objective = implementation(entry)
    assert isinstance(objective, TrainingObjective), entry.trainer
    objective.configure(spec)
    return objective
