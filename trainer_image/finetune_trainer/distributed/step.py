"""One optimizer step of data-parallel QLoRA on this rank's micro-batches."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .gradsync import average_gradients


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[torch.Tensor],
    params: Sequence[torch.nn.Parameter],
    *,
    world_size: int,
    max_grad_norm: float | None = None,
) -> torch.Tensor:
    """Accumulate over this rank's micro-batches, average over ranks, step; returns the local mean loss.

    Each rank scales by its own micro-batch count, so after the average the gradient equals
    that of one process accumulating over all ranks' micro-batches (the same math).
    """
    total = torch.zeros((), device=micro_batches[0].device)
    for ids in micro_batches:
        loss = model(input_ids=ids, labels=ids).loss
        (loss / len(micro_batches)).backward()
        total += loss.detach()
    average_gradients(params, world_size)
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total / len(micro_batches)
