"""The adapter's gradients and the step's loss figures summed over ranks in one collective.

The frozen NF4 weights carry no gradients, so what crosses the wire is only the adapter (a few
MB for r=8 on a 70B model) plus a few numbers. Every rank scales its losses by the step's
global token count before backward, so a plain sum gives the gradient of one process that ran
every micro-batch: the same math on any number of processes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist


def sum_over_ranks(params: Sequence[torch.nn.Parameter], figures: Sequence[float], world_size: int) -> list[float]:
    """Sum every param's gradient and `figures` over ranks, in place; returns the summed figures."""
    if world_size == 1:
        return list(figures)
    device = params[0].device
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1).to(device) for g in grads] + [torch.tensor(list(figures), device=device)])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for param, grad in zip(params, grads, strict=True):
        count = grad.numel()
        param.grad = flat[offset : offset + count].view_as(param).to(param.device)
        offset += count
    return [float(v) for v in flat[offset:].tolist()]


def sum_figures(figures: Sequence[float], world_size: int, device: torch.device) -> list[float]:
    if world_size == 1:
        return list(figures)
    values = torch.tensor(list(figures), dtype=torch.float64, device=device)
    dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return [float(v) for v in values.tolist()]


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
