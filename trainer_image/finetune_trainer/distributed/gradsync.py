"""Average the trainable (LoRA) gradients over ranks with one collective per optimizer step.

The frozen NF4 weights carry no gradients, so what crosses the wire is only the adapter: a few
MB for r=8 on a 70B model, negligible next to a step's compute. One flat buffer keeps it to a
single all-reduce instead of one per tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist


def average_gradients(params: Sequence[torch.nn.Parameter], world_size: int) -> None:
    if world_size == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat.div_(world_size)
    offset = 0
    for param, grad in zip(params, grads, strict=True):
        count = grad.numel()
        param.grad = flat[offset : offset + count].view_as(param)
        offset += count


def broadcast_parameters(params: Sequence[torch.nn.Parameter]) -> None:
    """Start every rank from rank 0's adapter, whatever each rank's RNG did during set-up."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    with torch.no_grad():
        for param in params:
            dist.broadcast(param.data, src=0)


def all_equal(params: Sequence[torch.nn.Parameter]) -> bool:
    """True when every rank holds bit-identical trainable weights (a drift check)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return True
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        reference = flat.clone()
        dist.broadcast(reference, src=0)
        same = torch.tensor([1.0 if torch.equal(flat, reference) else 0.0], device=flat.device)
        dist.all_reduce(same, op=dist.ReduceOp.MIN)
        return bool(same.item() == 1.0)
