"""Checked samples to token rows, and the order of micro-batches that every rank agrees on.

Samples are tokenised by `tokens.tokenize`, the rule the data check counts with. With packing,
rows are filled best-fit-decreasing and each sample keeps its own position ids, which the
attention mask code reads as separate sequences (no attention across samples).

The schedule is a pure function of the seed, the step and the slot: global micro-batch `j` of
an optimizer step goes to rank `j % world`. A checkpoint therefore needs no data position
beyond its step, a job can resume on another process count, and 2 processes with
accumulation k see exactly the samples of 1 process with accumulation 2k.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .tokens import IGNORE, pieces, tokenize, trained

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class Row:
    input_ids: list[int]
    labels: list[int]
    position_ids: list[int]

    @property
    def targets(self) -> int:
        """Tokens that count in the loss (a label, shifted by one for next-token prediction)."""
        return trained(self.labels)

    @property
    def tokens(self) -> int:
        """Tokens the row puts through the model."""
        return len(self.input_ids)


def make_rows(
    samples: Sequence[dict[str, Any]],
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    packing: bool,
    train_on: str | None = None,
) -> list[Row]:
    """One row per sample (truncated), or samples packed into rows of at most max_length; each
    packed sample keeps its own labels, so a packed row's targets are exactly its samples'."""
    cut: list[tuple[list[int], list[int]]] = []
    for number, (ids, labels, _, problem) in enumerate(tokenize(samples, tokenizer, train_on), start=1):
        if problem is not None:  # the data check refuses these before any row is made
            raise ValueError(f"sample {number}: {problem[0]}: {problem[1]}")
        cut.extend(pieces(ids, labels, max_length, split=packing))
    if not packing:
        return [Row(ids, labels, list(range(len(ids)))) for ids, labels in cut]
    # Best-fit decreasing, ties broken by sample order so every process packs alike.
    order = sorted(range(len(cut)), key=lambda i: (-len(cut[i][0]), i))
    bins: list[list[int]] = []
    room: list[int] = []
    for index in order:
        size = len(cut[index][0])
        best = -1
        for b, free in enumerate(room):
            if size <= free and (best < 0 or free < room[best]):
                best = b
        if best < 0:
            bins.append([index])
            room.append(max_length - size)
        else:
            bins[best].append(index)
            room[best] -= size
    return [_packed_row([cut[i] for i in sorted(members)]) for members in bins]


def _packed_row(members: list[tuple[list[int], list[int]]]) -> Row:
    ids: list[int] = []
    labels: list[int] = []
    positions: list[int] = []
    for piece_ids, piece_labels in members:
        ids += piece_ids
        # The first token of a packed sample is never the target of the previous one.
        labels += [IGNORE, *piece_labels[1:]]
        positions += list(range(len(piece_ids)))
    return Row(ids, labels, positions)


def collate(rows: Sequence[Row], pad_id: int, device: torch.device, packed: bool) -> dict[str, torch.Tensor]:
    """Right-padded tensors; packed rows carry only position ids (the mask follows from them)."""
    width = max(len(r.input_ids) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    positions = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        n = len(row.input_ids)
        ids[i, :n] = torch.tensor(row.input_ids)
        labels[i, :n] = torch.tensor(row.labels)
        # Padding continues as a sequence of its own, so packed samples never see it.
        positions[i, :n] = torch.tensor(row.position_ids)
        positions[i, n:] = torch.arange(width - n)
        mask[i, :n] = 1
    batch = {"input_ids": ids, "labels": labels, "position_ids": positions}
    if not packed:
        batch["attention_mask"] = mask
    return {k: v.to(device) for k, v in batch.items()}


@dataclass(frozen=True)
class Schedule:
    """Which rows each rank trains on in each optimizer step."""

    rows: int
    batch_size: int
    accumulation: int  # micro-batches per process per optimizer step
    world: int
    seed: int
    total_steps: int
    # Optimizer steps each step's rows serve (GRPO's numIterations: one batch of rollouts, several
    # updates); 1 for every other objective.
    repeats: int = 1

    @classmethod
    def make(
        cls,
        *,
        rows: int,
        batch_size: int,
        accumulation: int,
        world: int,
        seed: int,
        max_steps: int | None,
        epochs: float | None,
        repeats: int = 1,
    ) -> Schedule:
        per_step = accumulation * world
        steps_per_epoch = max(1, math.ceil(math.ceil(rows / batch_size) / per_step))
        total = max_steps or max(1, math.ceil((epochs or 1.0) * steps_per_epoch)) * repeats
        return cls(rows, batch_size, accumulation, world, seed, total, repeats)

    @property
    def per_step(self) -> int:
        return self.accumulation * self.world

    @property
    def steps_per_epoch(self) -> int:
        return max(1, math.ceil(math.ceil(self.rows / self.batch_size) / self.per_step))

    def epoch_of(self, step: int) -> float:
        """Epochs done after `step` optimizer steps (fractional)."""
        return step / (self.steps_per_epoch * self.repeats)

    def order(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return [int(i) for i in torch.randperm(self.rows, generator=generator)]

    def slots(self, step: int, rank: int) -> list[tuple[int, list[int]]]:
        """(global micro-batch number, row indices) for each of the rank's micro-batches of
        0-based optimizer step `step`; an empty list of rows is a padding micro-batch past the
        epoch's end. The number seeds that micro-batch's dropout on whichever rank runs it."""
        epoch, within = divmod(step // self.repeats, self.steps_per_epoch)
        order = self.order(epoch)
        out: list[tuple[int, list[int]]] = []
        for j in range(rank, self.per_step, self.world):
            micro = within * self.per_step + j
            chosen = order[micro * self.batch_size : (micro + 1) * self.batch_size]
            out.append((step * self.per_step + j, chosen))
        return out


def eval_slots(rows: int, batch_size: int, rank: int, world: int) -> list[list[int]]:
    """The rank's eval micro-batches; every rank gets the same count (padding ones are empty)."""
    micro = math.ceil(rows / batch_size)
    per_rank = math.ceil(micro / world)
    out: list[list[int]] = []
    for k in range(per_rank):
        m = k * world + rank
        out.append(list(range(m * batch_size, min(rows, (m + 1) * batch_size))) if m < micro else [])
    return out
