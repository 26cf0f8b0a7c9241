"""Supervised fine-tuning (`training.method: sft`): one row per sample (or samples packed into
rows), labels where the format and `dataset.trainOn` put them, and the next-token cross-entropy
summed over those labels inside the LM head (loss_head.LossHead, in chunks when planned)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from finetune_api.spec import FineTuneJobSpec

from ..data.batches import Row, collate, make_rows
from ..data.tokens import IGNORE
from ..model.loss_head import LossHead
from . import TrainingObjective

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def loss_sum(model: nn.Module, head: LossHead, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Summed next-token cross-entropy over the labelled tokens, computed by the LossHead."""
    head.labels = batch["labels"]
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    total: torch.Tensor = model(**inputs, use_cache=False).logits.reshape(())
    return total


class Sft(TrainingObjective):
    def rows(
        self, samples: Sequence[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, spec: FineTuneJobSpec
    ) -> list[Row]:
        training = spec.training
        return make_rows(samples, tokenizer, training.max_length, training.packing, spec.dataset.train_on)

    def collate(self, rows: Sequence[Row], pad_id: int, device: torch.device, packed: bool) -> dict[str, torch.Tensor]:
        return collate(rows, pad_id, device, packed)

    # Each evaluated row's summed answer-token cross-entropy and its count of those tokens.
    example_names = ("lossSum", "targets")

    def loss_sum(
        self, model: nn.Module, head: LossHead, batch: dict[str, torch.Tensor], totals: Sequence[float]
    ) -> torch.Tensor:
        if self.examples is None:
            return loss_sum(model, head, batch)
        return self.row_loss_sums(model, head, batch)

    def row_loss_sums(self, model: nn.Module, head: LossHead, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The same summed loss, kept per row (the head's per-sequence pass, as the preference
        objectives take it) for the evaluation's per-example figures."""
        assert self.examples is not None
        masks = (batch["labels"][:, 1:] != IGNORE).float().unsqueeze(0)
        head.labels = batch["labels"]
        head.row_masks = masks
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        sums: torch.Tensor = model(**inputs, use_cache=False).logits.reshape(-1)
        for value, count in zip(sums.detach().tolist(), masks[0].sum(dim=1).tolist(), strict=True):
            self.examples.append((float(value), float(count)))
        return sums.sum()
