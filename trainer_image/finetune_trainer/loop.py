"""The optimizer-step loop, the same for one process and for N.

Each step: every rank learns the step's global count of target tokens (one tiny collective),
runs its micro-batches scaling each loss sum by that count, then one collective sums the
adapter gradients with the loss and token figures. The result is the gradient one process
would get from all micro-batches, so N processes with accumulation k train the adapter that
one process with accumulation N x k trains. Each micro-batch's dropout is seeded by its global
number, not by the rank that runs it, which keeps that true with dropout on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from finetune_api.reasons import ExitReason

from . import test_hooks
from .data.batches import IGNORE, Row, Schedule, collate, eval_slots
from .distributed.gradsync import sum_figures, sum_over_ranks
from .distributed.topology import Topology
from .failures import TrainerFailure
from .loss_head import LossHead
from .precision_guard import GuardReport, fail_if_half, watch_activations
from .train_state import Adapter


def micro_seed(seed: int, micro: int) -> int:
    return (seed * 1_000_003 + micro) % (2**63 - 1)


def loss_sum(model: nn.Module, head: LossHead, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Summed next-token cross-entropy over the labelled tokens, computed by the LossHead."""
    head.labels = batch["labels"]
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    total: torch.Tensor = model(**inputs, use_cache=False).logits.reshape(())
    return total


@dataclass
class StepFigures:
    loss: float
    tokens: int
    lr: float


@dataclass
class Loop:
    model: nn.Module
    head: LossHead
    adapter: Adapter
    optimizer: torch.optim.Optimizer
    scheduler: Any
    schedule: Schedule
    rows: list[Row]
    eval_rows: list[Row] | None
    topology: Topology
    device: torch.device
    pad_id: int
    packed: bool
    seed: int
    max_grad_norm: float | None
    eval_batch_size: int
    # FSDP needs every rank in every forward: past the data's end a rank runs a masked row.
    sharded: bool = False
    guard: GuardReport | None = None
    last_checkpoint: Callable[[], str] = field(default=lambda: "no checkpoint written yet")

    def _padding(self, rows: list[Row]) -> list[Row]:
        first = rows[0]
        return [Row(first.input_ids, [IGNORE] * len(first.labels), first.position_ids)]

    @contextmanager
    def _first_step_guard(self) -> Iterator[None]:
        guard, self.guard = self.guard, None
        if guard is None:
            yield
            return
        with watch_activations(self.model, guard):
            yield
        fail_if_half(guard)

    def step(self, step: int) -> StepFigures:
        """Run 0-based optimizer step `step`; raises NonFiniteLoss on every rank alike."""
        world = self.topology.world_size
        slots = self.schedule.slots(step, self.topology.rank)
        micro = [(number, [self.rows[i] for i in ids]) for number, ids in slots]
        local_targets = sum(r.targets for _, rows in micro for r in rows)
        (targets,) = sum_figures([local_targets], world, self.device)
        scale = 1.0 / max(targets, 1.0)
        local_loss, local_tokens = 0.0, 0
        guard = self._first_step_guard()
        with guard:
            for number, chosen in micro:
                if not chosen and not self.sharded:
                    continue
                rows = chosen or self._padding(self.rows)
                torch.manual_seed(micro_seed(self.seed, number))
                total = loss_sum(self.model, self.head, collate(rows, self.pad_id, self.device, self.packed))
                if test_hooks.nonfinite_at(step + 1):
                    total = total * float("nan")
                (total * scale).backward()  # type: ignore[no-untyped-call]
                local_loss += float(total.detach())
                local_tokens += sum(len(r.input_ids) for r in chosen)
        loss_total, tokens = sum_over_ranks(self.adapter.params, [local_loss, float(local_tokens)], world)
        loss = loss_total / max(targets, 1.0)
        if not math.isfinite(loss):
            self.optimizer.zero_grad(set_to_none=True)
            raise TrainerFailure(
                ExitReason.NonFiniteLoss,
                f"loss is {loss} at step {step + 1}; training stopped, {self.last_checkpoint()}. "
                "Lower the learning rate or check the data",
            )
        if self.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.adapter.params, self.max_grad_norm)
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepFigures(loss=loss, tokens=int(tokens), lr=lr)

    def evaluate(self) -> float | None:
        """Token-weighted eval loss over the held-out rows, split over the ranks."""
        if not self.eval_rows:
            return None
        self.model.eval()
        total, targets = 0.0, 0
        try:
            with torch.no_grad():
                for ids in eval_slots(
                    len(self.eval_rows), self.eval_batch_size, self.topology.rank, self.topology.world_size
                ):
                    if not ids and not self.sharded:
                        continue
                    rows = [self.eval_rows[i] for i in ids] or self._padding(self.eval_rows)
                    total += float(
                        loss_sum(self.model, self.head, collate(rows, self.pad_id, self.device, self.packed))
                    )
                    targets += sum(r.targets for r in rows)
        finally:
            self.model.train()
        total, count = sum_figures([total, float(targets)], self.topology.world_size, self.device)
        return total / max(count, 1.0)
