"""The held-out pass: the objective's summed loss over held-out rows, split over the ranks, in
eval micro-batches. The loop's evaluation at checkpoints (`training.loop.Loop.evaluate`) and the
base-against-tuned measure (`measure.py`) both take it, so there is one forward path for
held-out rows.

Each eval micro-batch runs as a training micro-batch does (gradients on, checkpointing on, so
no more memory than a step), with dropout off, and a zero backward; the gradients are dropped
after. Measured on the CPU (gloo, 2 ranks): a no-grad forward of the FSDP-sharded model gave a
wrong eval loss (5.47 against 4.59) and the steps after it left the one-process run; with
gradients on it gives the one-process loss. Where inside FSDP1 the no-grad path goes wrong was
not found. Every mode takes this one path, because a no-grad and a grad eval leave the later
steps different in their last bits (Adam then widens that), and the modes must train the same
adapter. With the adapter switched off (the base) nothing needs a gradient, and no backward
runs (as the sample answers do).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..data.batches import eval_slots
from ..distributed.gradsync import sum_figures
from ..distributed.topology import Topology
from ..model.dropout import dropout_off
from ..model.loss_head import LossHead
from ..objectives import TrainingObjective


@dataclass(frozen=True)
class HeldOutPass:
    """What a held-out pass runs on: the model as the loop trains it, its loss head, the
    objective, where and how wide its micro-batches are, and how its gradients are dropped."""

    model: nn.Module
    head: LossHead
    objective: TrainingObjective
    ranks: Topology
    device: torch.device
    pad_id: int
    packed: bool
    batch_size: int
    sharded: bool  # every rank runs every forward (fsdp): past the rows' end a padding row
    drop_gradients: Callable[[], None]

    def run(
        self,
        rows: Sequence[Any],
        each: Callable[[list[int]], None] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> float | None:
        """The objective's loss over `rows` (every rank holds all of them), a mean over its first
        total; `each(ids)` after every micro-batch with the rows it held. With `stop`, the ranks
        agree after each micro-batch whether to end the pass there: None when they did."""
        total = 0.0
        totals = self.objective.counts(rows)
        self.objective.start_step()
        world = self.ranks.world_size
        try:
            # torch 2.7 leaves enable_grad's __init__ unannotated.
            with dropout_off(self.model), torch.enable_grad():  # type: ignore[no-untyped-call]
                for ids in eval_slots(len(rows), self.batch_size, self.ranks.rank, world):
                    if ids or self.sharded:
                        chosen = [rows[i] for i in ids] or [self.objective.padding(rows[0])]
                        batch = self.objective.collate(chosen, self.pad_id, self.device, self.packed)
                        value = self.objective.loss_sum(self.model, self.head, batch, totals)
                        if value.requires_grad:
                            # torch 2.7 leaves Tensor.backward unannotated.
                            (value * 0.0).backward()  # type: ignore[no-untyped-call]
                        total += float(value.detach())
                        if each is not None:
                            each(ids)
                    if stop is not None and sum_figures([1.0 if stop() else 0.0], world, self.device)[0] > 0:
                        return None
        finally:
            self.drop_gradients()
        (total,) = sum_figures([total], world, self.device)
        return total / max(totals[0], 1.0)
