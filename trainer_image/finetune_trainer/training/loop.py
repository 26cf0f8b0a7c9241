"""The optimizer-step loop, the same for one process and for N.

Each step: every rank learns the step's global count of target tokens (one tiny collective),
runs its micro-batches scaling each loss sum by that count, then one collective sums the
adapter gradients with the loss and token figures. The result is the gradient one process
would get from all micro-batches, so N processes with accumulation k train the adapter that
one process with accumulation N x k trains. Each micro-batch's dropout is seeded by its global
number, not by the rank that runs it, which keeps that true with dropout on.

Given a stop request (SIGTERM), the ranks agree after each micro-batch whether to stop there;
a step stopped part-way returns a `Partial` (the gradients so far, summed over the ranks) for a
checkpoint, and a resumed step starts from one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from finetune_api.reasons import ExitReason

from .. import faults
from ..data.batches import Row, Schedule
from ..distributed.gradsync import sum_figures
from ..distributed.topology import Topology
from ..evaluation.passes import HeldOutPass
from ..failures import TrainerFailure
from ..memory.phases import PhaseProbe
from ..model.loss_head import LossHead
from ..model.precision_guard import GuardReport, fail_if_half, watch_activations
from ..modes import Mode, SingleProcess
from ..objectives import TrainingObjective
from ..state.train_state import Adapter, Partial, partial_of, restore_gradients


def micro_seed(seed: int, micro: int) -> int:
    return (seed * 1_000_003 + micro) % (2**63 - 1)


@dataclass
class StepFigures:
    loss: float
    tokens: int
    lr: float
    trained: int = 0  # the step's targets of the loss, over every rank
    sums: list[float] = field(default_factory=list)  # the objective's figures, over every rank


@dataclass
class Loop:
    model: nn.Module
    head: LossHead
    adapter: Adapter
    optimizer: torch.optim.Optimizer
    scheduler: LRScheduler
    # The training objective: its batches and its summed loss (objectives/, training.method).
    objective: TrainingObjective
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
    # The training mode: how the gradients are reduced, and whether every rank must run every
    # forward (FSDP: past the data's end a rank then runs a masked row).
    mode: Mode = field(default_factory=SingleProcess)
    guard: GuardReport | None = None
    last_checkpoint: Callable[[], str] = field(default=lambda: "no checkpoint written yet")
    # Cuts each training micro-batch's GPU memory into phases (set by the recipe on a GPU only:
    # elsewhere no hook is put on the loss head's input).
    probe: PhaseProbe | None = None

    @property
    def lockstep(self) -> bool:
        """Whether every rank must run every forward (fsdp)."""
        return self.mode.sharded

    def _padding(self, rows: list[Any]) -> list[Any]:
        return [self.objective.padding(rows[0])]

    @contextmanager
    def _first_step_guard(self) -> Iterator[None]:
        guard, self.guard = self.guard, None
        if guard is None:
            yield
            return
        with watch_activations(self.model, guard):
            yield
        fail_if_half(guard)

    def agree(self, *flags: bool) -> list[bool]:
        """Each flag true on every rank when it is true on any (one collective for all of them)."""
        counts = sum_figures([1.0 if flag else 0.0 for flag in flags], self.topology.world_size, self.device)
        return [count > 0 for count in counts]

    def step(
        self, step: int, *, resume: Partial | None = None, stop: Callable[[], bool] | None = None
    ) -> StepFigures | Partial:
        """Run 0-based optimizer step `step` (from `resume`'s point when given); raises
        NonFiniteLoss on every rank alike. When `stop()` turns true on any rank, every rank
        stops after the same micro-batch and the step so far comes back as a Partial."""
        world = self.topology.world_size
        slots = self.schedule.slots(step, self.topology.rank)
        micro = [(number, [self.rows[i] for i in ids]) for number, ids in slots]
        self.objective.prepare_step(step, micro, self)
        totals = sum_figures(self.objective.counts([r for _, rows in micro for r in rows]), world, self.device)
        targets = totals[0]
        scale = 1.0 / max(targets, 1.0)
        start = resume.micro_done if resume is not None else 0
        carried = resume if resume is not None and self.topology.rank == 0 else None
        restore_gradients(self.adapter, carried)
        self.objective.start_step(carried.sums if carried is not None else ())
        local_loss = carried.loss if carried is not None else 0.0
        local_tokens = carried.tokens if carried is not None else 0.0
        guard = self._first_step_guard()
        hooks = faults.current()
        with guard:
            for index, (number, chosen) in enumerate(micro):
                if index < start:
                    continue
                if chosen or self.mode.sharded:
                    rows = chosen or self._padding(self.rows)
                    torch.manual_seed(micro_seed(self.seed, number))
                    batch = self.objective.micro_batch(number, rows, self.pad_id, self.device, self.packed)
                    if self.probe is not None:
                        self.probe.forward_starts()
                    self.head.probe = self.probe
                    try:
                        total = self.objective.loss_sum(self.model, self.head, batch, totals)
                    finally:
                        self.head.probe = None
                    if hooks.nonfinite_at(step + 1):
                        total = total * float("nan")
                    # torch 2.7 leaves Tensor.backward unannotated.
                    (total * scale).backward()  # type: ignore[no-untyped-call]
                    if self.probe is not None:
                        self.probe.backward_done()
                    local_loss += float(total.detach())
                    local_tokens += self.objective.tokens_of(chosen, batch)
                hooks.after_micro(step + 1, index + 1)
                if stop is not None and index + 1 < len(micro) and self.agree(stop())[0]:
                    figures = self.mode.reduce(
                        self.adapter.params, [local_loss, float(local_tokens), *self.objective.sums], world
                    )
                    partial = partial_of(
                        self.adapter, step, index + 1, figures, world_size=world, accumulation=len(micro)
                    )
                    self.optimizer.zero_grad(set_to_none=True)
                    return partial
        loss_total, tokens, *sums = self.mode.reduce(
            self.adapter.params, [local_loss, float(local_tokens), *self.objective.sums], world
        )
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
        trained = int(self.objective.trained(totals))
        return StepFigures(loss=loss, tokens=int(tokens), lr=lr, trained=trained, sums=sums)

    def held_out(self) -> HeldOutPass:
        """The held-out pass on this loop's model, objective and device (evaluation/passes.py)."""
        return HeldOutPass(
            model=self.model,
            head=self.head,
            objective=self.objective,
            ranks=self.topology,
            device=self.device,
            pad_id=self.pad_id,
            packed=self.packed,
            batch_size=self.eval_batch_size,
            sharded=self.mode.sharded,
            drop_gradients=lambda: self.optimizer.zero_grad(set_to_none=True),
        )

    def evaluate(self) -> float | None:
        """Token-weighted eval loss over the held-out rows, split over the ranks: the held-out
        pass (evaluation/passes.py says why it runs as a training micro-batch does)."""
        if not self.eval_rows:
            return None
        return self.held_out().run(self.eval_rows)
